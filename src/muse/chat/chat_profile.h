// Per-checkpoint chat profiles: everything about a model family's chat
// format that is not template text, as data (chat-format.md §6). A template
// that differs only in stops, maps, recipients or escaping is a new row;
// only a new mechanism (say, a new channel kind) needs code.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "muse/core/json.h"

namespace muse::chat {

// How a Muse turn is framed and where each recipient's text goes (§4.1).
struct FramingFormat {
  // Framing markers: special tokens, recognised by id when ids are known and
  // by spelling in text-only input.
  std::string start = "<|start|>", message = "<|message|>", end_message = "<|eom|>", end_turn = "<|eot|>",
              end_of_text = "<|end_of_text|>";
  int32_t start_id = 200022, message_id = 200023, end_message_id = 200007, end_turn_id = 200008,
          end_of_text_id = 200001;
  std::string assistant_role = "assistant";
  std::string recipient_prefix = "to=";  // " to=R" after the role
  std::vector<std::string> reasoning_recipients = {"self"};
  std::vector<std::string> content_recipients = {"user"};
  bool missing_recipient_is_reasoning = false;  // Glimmer: content; Spark (vLLM `muse`): reasoning
  // ATEM tool-call syntax (§2.3).
  std::string calls_open = "<atem:function_calls>", calls_close = "</atem:function_calls>";
  std::string invoke_open = "<atem:invoke", invoke_close = "</atem:invoke>";
  std::string param_open = "<atem:parameter", param_close = "</atem:parameter>";
};

enum class CallerTextEscaping { None, SparkEsc };

struct ChatProfile {
  std::string name;                      // "muse_glimmer", "muse_spark", "generic"
  std::vector<std::string> model_types;  // config.json model_type values selecting this row
  std::vector<std::string> template_sha256;         // pinned templates
  std::vector<std::string> legacy_template_sha256;  // accepted with a warning
  bool is_muse = false;                  // Muse request mapping and response parsing apply
  std::string bos_token;                 // default when the tokenizer config has none
  std::vector<int32_t> stop_token_ids;   // never <|eom|>
  // reasoning_effort -> the template kwarg (empty kwarg: not mapped).
  std::string effort_kwarg;
  std::vector<std::pair<std::string, Json>> effort_map;
  std::vector<std::string> known_template_efforts;  // values passed through unchanged
  // OpenAI content part type -> template part type; "" drops the part. Types
  // not listed are a 400 for Muse profiles.
  std::vector<std::pair<std::string, std::string>> part_map;
  // Role renames before rendering (developer -> system).
  std::vector<std::pair<std::string, std::string>> role_map;
  CallerTextEscaping escaping = CallerTextEscaping::None;
  FramingFormat framing;
};

const ChatProfile& muse_glimmer_profile();
const ChatProfile& muse_spark_profile();
// Any other template: messages pass through as Hugging Face would see them.
const ChatProfile& generic_profile();

// Picks the row: a pinned template hash first, then config.json's
// model_type, else the generic row. `legacy` is set when the template is a
// known older revision (render as shipped, with a warning).
const ChatProfile& select_profile(std::string_view template_sha256, std::string_view model_type, bool* legacy);

}  // namespace muse::chat
