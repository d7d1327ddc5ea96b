// ModelAdapter for real checkpoints: the model directory's tokenizer.json,
// chat template (with its chat profile) and generation_config.json, and the
// Muse response parser.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "muse/chat/chat_template.h"
#include "muse/chat/grammar_constraint.h"
#include "muse/model/config.h"
#include "muse/server/generation_service.h"
#include "muse/server/serve_options.h"
#include "muse/tokenizer/tokenizer_files.h"

namespace muse::server {

class MuseModelAdapter : public ModelAdapter {
 public:
  // Reads the tokenizer files (from --tokenizer or the model directory), the
  // chat template (--chat-template overrides) and the sampling defaults
  // (--generation-config). `max_model_len` is the context actually served.
  static Result<std::shared_ptr<MuseModelAdapter>> create(const EngineServeOptions& options, const ModelConfig& config,
                                                          int max_model_len);

  const ModelInfo& info() const override { return info_; }
  Result<std::vector<int32_t>> tokenize(std::string_view text, bool add_special_tokens) const override;
  Result<std::string> detokenize(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  Result<RenderedPrompt> render_chat(const Json& request, ChatApi api) const override;
  std::unique_ptr<OutputParser> make_output_parser(const ParserOptions& options) const override;

  const Tokenizer& tokenizer() const { return files_.tokenizer; }
  // Per-sequence constraints for GenerationRequest::constraint: a forced
  // tool call (chat/tool_call_grammar.h) or structured output
  // (chat/json_schema_grammar.h). Errors are the client's (400).
  Result<std::function<std::unique_ptr<TokenConstraint>()>> constraint_factory(const Json& constraint) const;
  // The chat profile's name ("muse_glimmer", "muse_spark", "generic"), or
  // "none" without a chat template.
  std::string profile_name() const;

 private:
  MuseModelAdapter() = default;

  TokenizerFiles files_;
  std::unique_ptr<chat::ChatTemplate> template_;  // null: the model has no chat template
  std::string template_error_;
  chat::FramingFormat framing_;  // the profile's, with this tokenizer's marker ids
  ModelInfo info_;
  // The vocabulary as grammars see it, built on first use (~the vocabulary's
  // decode time) and shared by all constrained sequences.
  mutable std::once_flag grammar_vocab_once_;
  mutable std::shared_ptr<const chat::GrammarVocabulary> grammar_vocab_;
};

// Sampling defaults from a generation_config.json object, as vLLM reads them
// (temperature, top_p, top_k, min_p, repetition_penalty; do_sample is ignored).
Json sampling_defaults_from_generation_config(const Json& generation_config);

}  // namespace muse::server
