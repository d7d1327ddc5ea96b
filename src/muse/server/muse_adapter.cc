#include "muse/server/muse_adapter.h"

#include <deque>

#include "muse/chat/request_render.h"
#include "muse/chat/response_parser.h"
#include "muse/core/log.h"
#include "muse/core/mapped_file.h"

namespace muse::server {

namespace {

// Splits one choice's output into reasoning / content / tool calls with
// chat::ResponseParser. The engine delivers ids and, separately, their text
// (whole UTF-8 characters, stop strings cut, the final stop token's text left
// out), so the two are lined up here: special tokens are found in the text by
// their spelling and handed to the parser by id (framing is recognised on
// ids, chat-format.md §4.1); the ordinary text between them goes in as text.
// A special whose text never arrives (the EOS that ended generation) is fed
// by id at the end. Without a Muse profile, specials are dropped and all text
// is content.
class TokenAlignedParser : public OutputParser {
 public:
  TokenAlignedParser(const Tokenizer& tok, const chat::FramingFormat* framing, chat::ResponseParserOptions options,
                     bool tools_enabled)
      : tok_(tok), tools_enabled_(tools_enabled) {
    if (framing) parser_ = std::make_unique<chat::ResponseParser>(*framing, std::move(options));
  }

  void feed(std::span<const int32_t> ids, std::string_view text, ParsedDelta& out) override {
    ids_.insert(ids_.end(), ids.begin(), ids.end());
    buf_.append(text);
    align(false, out);
  }

  void finish(FinishReason why, ParsedDelta& out) override {
    align(true, out);
    if (parser_) add(parser_->finish(why == FinishReason::Stop ? chat::FinishCause::Stop : chat::FinishCause::Length), out);
  }

 private:
  bool is_marker(int32_t id) const { return tok_.is_special(id); }

  void add(const chat::ResponseDelta& d, ParsedDelta& out) {
    out.reasoning += d.reasoning;
    out.content += d.content;
    for (const auto& c : d.tool_calls) {
      if (tools_enabled_) out.tool_calls.push_back({int(c.index), c.name, c.arguments});
      else out.content += atem_text(c.name, c.arguments);  // tool_choice none / no tools: the call stays text
    }
  }

  // The call as the model wrote it (near enough: ATEM, values as decoded).
  static std::string atem_text(const std::string& name, const std::string& arguments) {
    std::string out = "<atem:function_calls>\n<atem:invoke name=\"" + name + "\">\n";
    auto args = Json::parse(arguments);
    if (args.ok() && args->is_object())
      for (const auto& [k, v] : args->as_object())
        out += "<atem:parameter name=\"" + k + "\">" + (v.is_string() ? v.as_string() : v.dump()) + "</atem:parameter>\n";
    return out + "</atem:invoke>\n</atem:function_calls>";
  }

  void push_text(std::string_view text, ParsedDelta& out) {
    if (text.empty()) return;
    if (parser_) add(parser_->push_token(-1, text, false), out);
    else out.content += text;
  }

  void push_marker(int32_t id, std::string_view spelling, ParsedDelta& out) {
    if (parser_) add(parser_->push_token(id, spelling, true), out);
  }

  // Ordinary ids [0, k) are consumed: they count as reasoning when the parser
  // is in a reasoning body (their text goes in right after this).
  void consume_ordinary(size_t k, ParsedDelta& out) {
    if (parser_ && parser_->channel() == chat::Channel::Reasoning) out.reasoning_tokens += int(k);
    ids_.erase(ids_.begin(), ids_.begin() + ptrdiff_t(k));
  }

  void align(bool final, ParsedDelta& out) {
    for (;;) {
      size_t k = 0;
      while (k < ids_.size() && !is_marker(ids_[k])) ++k;
      if (k == ids_.size()) {  // only ordinary ids: all the text is theirs
        consume_ordinary(k, out);
        push_text(buf_, out);
        buf_.clear();
        return;
      }
      const int32_t id = ids_[k];
      const std::string spelling = tok_.decode({id}, false);
      const size_t at = spelling.empty() ? std::string::npos : buf_.find(spelling);
      if (at == std::string::npos) {
        if (!final) {
          // Its text has not arrived: release what cannot be its beginning.
          size_t hold = 0;
          for (size_t len = std::min(buf_.size(), spelling.size()); len > 0; --len)
            if (buf_.compare(buf_.size() - len, len, spelling, 0, len) == 0) {
              hold = len;
              break;
            }
          consume_ordinary(k, out);
          push_text(std::string_view(buf_).substr(0, buf_.size() - hold), out);
          buf_.erase(0, buf_.size() - hold);
          return;
        }
        consume_ordinary(k, out);
        push_text(buf_, out);
        buf_.clear();
        ids_.pop_front();
        push_marker(id, spelling, out);
        continue;
      }
      consume_ordinary(k, out);
      push_text(std::string_view(buf_).substr(0, at), out);
      buf_.erase(0, at + spelling.size());
      ids_.pop_front();
      push_marker(id, spelling, out);
    }
  }

  const Tokenizer& tok_;
  bool tools_enabled_;
  std::unique_ptr<chat::ResponseParser> parser_;
  std::deque<int32_t> ids_;
  std::string buf_;
};

Result<Json> read_json(const std::string& path) {
  MUSE_ASSIGN_OR_RETURN(std::string text, read_file(path));
  auto j = Json::parse(text);
  if (!j.ok()) return make_error(path + ": " + j.message());
  if (!j->is_object()) return make_error(path + ": the top level must be a JSON object");
  return std::move(j).value();
}

}  // namespace

Json sampling_defaults_from_generation_config(const Json& g) {
  Json out = Json::object();
  if (!g.is_object()) return out;
  for (const char* key : {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"}) {
    const Json* v = g.find(key);
    if (v && (v->is_number())) out.set(key, *v);
  }
  return out;
}

Result<std::shared_ptr<MuseModelAdapter>> MuseModelAdapter::create(const EngineServeOptions& o, const ModelConfig& config,
                                                                   int max_model_len) {
  std::shared_ptr<MuseModelAdapter> a(new MuseModelAdapter());
  const std::string tok_dir = o.tokenizer.empty() ? o.model : o.tokenizer;
  MUSE_ASSIGN_OR_RETURN(a->files_, load_tokenizer_files(tok_dir));
  MUSE_ASSIGN_OR_RETURN(std::string model_type, chat::read_model_type(o.model));
  auto tpl = chat::ChatTemplate::from_tokenizer_files(a->files_, model_type, o.chat_template);
  if (tpl.ok()) {
    a->template_ = std::make_unique<chat::ChatTemplate>(std::move(tpl).value());
    if (a->template_->legacy()) LOG_WARN("the chat template is a known older revision of the %s template; rendering it as shipped",
                                          a->template_->profile().name.c_str());
    // The profile's markers, with this tokenizer's ids (small models built on
    // the Muse format renumber the special tokens).
    a->framing_ = a->template_->profile().framing;
    auto resolve = [&](const std::string& spelling, int32_t& id) {
      int32_t t = a->files_.tokenizer.token_to_id(spelling);
      if (t >= 0) id = t;
    };
    resolve(a->framing_.start, a->framing_.start_id);
    resolve(a->framing_.message, a->framing_.message_id);
    resolve(a->framing_.end_message, a->framing_.end_message_id);
    resolve(a->framing_.end_turn, a->framing_.end_turn_id);
    resolve(a->framing_.end_of_text, a->framing_.end_of_text_id);
  } else if (!o.chat_template.empty()) {
    return tpl.error();
  } else {
    a->template_error_ = tpl.message();
    LOG_WARN("%s; chat endpoints will answer 400", tpl.message().c_str());
  }

  ModelInfo& info = a->info_;
  info.max_model_len = max_model_len;
  info.vocab_size = int(config.vocab_size);
  info.eos_token_ids = a->files_.eos_token_ids;
  if (info.eos_token_ids.empty())
    for (int64_t id : config.eos_token_ids) info.eos_token_ids.push_back(int32_t(id));
  if (o.generation_config != "vllm") {
    const std::string dir = o.generation_config == "auto" ? o.model : o.generation_config;
    const std::string path = dir + "/generation_config.json";
    if (file_exists(path)) {
      MUSE_ASSIGN_OR_RETURN(Json g, read_json(path));
      info.default_sampling = sampling_defaults_from_generation_config(g);
    } else if (o.generation_config != "auto") {
      return make_error("--generation-config: no generation_config.json in '" + dir + "'");
    }
  }
  info.supports_structured_output = a->template_ && a->template_->profile().is_muse;
  info.supports_forced_tool_choice = info.supports_structured_output;
  info.supports_prompt_logprobs = true;
  for (int32_t id = 0; id < a->files_.tokenizer.id_limit(); ++id)
    info.max_token_bytes = std::max(info.max_token_bytes, int(a->files_.tokenizer.decode({id}, false).size()));
  return a;
}

std::string MuseModelAdapter::profile_name() const { return template_ ? template_->profile().name : "none"; }

Result<std::vector<int32_t>> MuseModelAdapter::tokenize(std::string_view text, bool add_special_tokens) const {
  return files_.tokenizer.encode(text, add_special_tokens);
}

Result<std::string> MuseModelAdapter::detokenize(std::span<const int32_t> ids, bool skip_special_tokens) const {
  for (int32_t id : ids)
    if (id < 0 || id >= info_.vocab_size)
      return make_error("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(info_.vocab_size) + ")");
  return files_.tokenizer.decode(std::vector<int32_t>(ids.begin(), ids.end()), skip_special_tokens);
}

Result<RenderedPrompt> MuseModelAdapter::render_chat(const Json& request, ChatApi api) const {
  if (!template_) return make_error(template_error_);
  chat::ChatRenderOptions ro;
  ro.api = api == ChatApi::Anthropic ? chat::RequestApi::AnthropicMessages : chat::RequestApi::OpenAIChat;
  MUSE_ASSIGN_OR_RETURN(std::string text, chat::render_chat_prompt(request, *template_, ro));
  RenderedPrompt p;
  // Tokenizing stops before it starts when the text cannot fit: a 60 MiB
  // prompt costs a length check, not seconds of tokenizing.
  if (server::exceeds_context(info_, text.size())) p.exceeds_context = true;
  else p.ids = files_.tokenizer.encode(text, /*add_special_tokens=*/false);  // the template writes BOS itself
  p.text = std::move(text);
  return p;
}

Result<std::function<std::unique_ptr<TokenConstraint>()>> MuseModelAdapter::constraint_factory(const Json& c) const {
  using Factory = std::function<std::unique_ptr<TokenConstraint>()>;
  const std::string type = c.get_string("type", "");
  if (!template_ || !template_->profile().is_muse)
    return make_error("constrained generation ('" + type + "') needs a Muse chat template");
  std::call_once(grammar_vocab_once_, [&] {
    grammar_vocab_ = chat::GrammarVocabulary::build(files_.tokenizer, framing_, info_.vocab_size);
  });
  auto vocab = grammar_vocab_;
  if (type == "tool_call") {
    const Json* tools_json = c.find("tools");
    MUSE_ASSIGN_OR_RETURN(chat::ToolSet tools, chat::ToolSet::from_json(tools_json ? *tools_json : Json()));
    std::vector<std::string> names;
    const Json* name = c.find("name");
    if (name && name->is_string()) {
      names.push_back(name->as_string());
    } else {
      for (const auto& t : tools.tools()) names.push_back(t.name);
    }
    const bool single = (name && name->is_string()) || !c.get_bool("parallel_tool_calls", true);
    auto grammar = chat::ToolCallGrammar::make(framing_, tools, names, single);
    if (!grammar.ok()) return make_error("tool_choice: " + grammar.message());
    auto g = std::make_shared<const chat::ToolCallGrammar>(std::move(grammar).value());
    return Factory([g, vocab] { return std::make_unique<chat::ToolCallConstraint>(g, vocab); });
  }
  if (type == "json_object" || type == "json_schema") {
    auto grammar = chat::StructuredAnswerGrammar::make(framing_, type == "json_schema" ? c.find("schema") : nullptr,
                                                       /*framed=*/c.get_bool("chat", true));
    if (!grammar.ok()) return make_error("response_format: " + grammar.message());
    auto g = std::make_shared<const chat::StructuredAnswerGrammar>(std::move(grammar).value());
    return Factory([g, vocab] { return std::make_unique<chat::StructuredAnswerConstraint>(g, vocab); });
  }
  return make_error("constrained generation of type '" + type + "' is not supported");
}

std::unique_ptr<OutputParser> MuseModelAdapter::make_output_parser(const ParserOptions& options) const {
  chat::ResponseParserOptions po;
  if (options.tools_enabled && options.tools.is_array()) {
    auto tools = chat::ToolSet::from_json(options.tools);
    if (tools.ok()) po.tools = std::move(tools).value();
    else LOG_WARN("response parser: the request's tools could not be read (%s); values are decoded without schemas",
                  tools.message().c_str());
  }
  const bool muse = template_ && template_->profile().is_muse;
  return std::make_unique<TokenAlignedParser>(files_.tokenizer, muse ? &framing_ : nullptr, std::move(po), options.tools_enabled);
}

}  // namespace muse::server
