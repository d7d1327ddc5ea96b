// From a parsed body to a running GenerationJob: validation, model name,
// capability checks, the model's sampling defaults and the constraint,
// rendering/tokenizing, the context-length check; then each prompt's copy of
// the validated GenerationRequest gets its ids and resolved max_tokens.
#include "muse/core/log.h"
#include "muse/server/generation_job.h"

namespace muse::server {

using State = ServerContext;

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

ApiError context_error(const State& s, int prompt, int64_t max_tokens, const char* param) {
  int ctx = s.backend.adapter->info().max_model_len;
  std::string msg = "This model's maximum context length is " + std::to_string(ctx) + " tokens. However, you requested " +
                    std::to_string(int64_t(prompt) + max_tokens) + " tokens (" + std::to_string(prompt) + " in the " +
                    (std::string(param) == "prompt" ? "prompt" : "messages") + ", " + std::to_string(max_tokens) +
                    " in the completion). Please reduce the length of the " + (std::string(param) == "prompt" ? "prompt" : "messages") +
                    " or completion.";
  return invalid_param(param, std::move(msg), "context_length_exceeded");
}

// A text refused by its length alone (exceeds_context()): the message says
// how many tokens it has at least.
ApiError too_long(const State& s, size_t bytes, const char* param) {
  const ModelInfo& info = s.backend.adapter->info();
  int64_t at_least = int64_t(bytes / size_t(std::max(1, info.max_token_bytes)));
  return invalid_param(param, "This model's maximum context length is " + std::to_string(info.max_model_len) +
                                  " tokens. However, the " + std::string(param) + " has at least " + std::to_string(at_least) +
                                  " tokens (" + std::to_string(bytes) + " bytes). Please reduce the length of the " + param + ".",
                       "context_length_exceeded");
}

std::optional<ApiError> check_model(const State& s, const ApiRequest& req) {
  if (req.model.empty()) return std::nullopt;
  for (const auto& name : s.opt.served_model_names)
    if (name == req.model) return std::nullopt;
  ApiError e;
  e.status = 404;
  e.param = "model";
  e.code = "model_not_found";
  e.message = "The model `" + req.model + "` does not exist. Served models: " + join(s.opt.served_model_names) + ".";
  return e;
}

std::optional<ApiError> check_capabilities(const State& s, const ApiRequest& req) {
  const ModelInfo& info = s.backend.adapter->info();
  if (!req.response_format.is_null() && !info.supports_structured_output)
    return invalid_param("response_format", "response_format \"" + req.response_format.get_string("type", "") +
                                                "\" is not supported by this server yet (no structured-output engine).",
                         "unsupported_value");
  bool forced = req.tool_choice.kind == ToolChoice::Kind::Required || req.tool_choice.kind == ToolChoice::Kind::Named;
  if (forced && !req.response_format.is_null())  // one grammar per output: neither may be dropped silently
    return invalid_param("tool_choice", "tool_choice \"required\" or a named tool cannot be combined with response_format "
                                        "(a forced call has no answer body for the schema).",
                         "unsupported_value");
  if (forced && !info.supports_forced_tool_choice)
    return invalid_param("tool_choice", "tool_choice \"required\" or a named tool is not supported by this server yet.", "unsupported_value");
  if (!req.tools.is_null() && req.tool_choice.kind == ToolChoice::Kind::Auto && !s.opt.enable_auto_tool_choice)
    return invalid_param("tool_choice", "\"auto\" tool choice requires --enable-auto-tool-choice to be set.", "unsupported_value");
  if (req.generation.prompt_logprobs >= 0 && !info.supports_prompt_logprobs)
    return invalid_param("echo", "echo with logprobs (prompt logprobs) is not supported by this server yet.", "unsupported_value");
  return std::nullopt;
}

// What admission adds to the validated request before it is copied per
// prompt: generation_config.json's sampling defaults for what the request
// left out, and the constraint its response_format or tool_choice asks for.
void complete_engine_request(const State& s, ApiRequest& req) {
  SamplingConfig& sampling = req.generation.sampling;
  const SamplingGiven& given = req.sampling_given;
  const Json& defaults = s.backend.adapter->info().default_sampling;
  if (s.opt.use_generation_config && defaults.is_object()) {
    if (!given.temperature) sampling.temperature = defaults.get_double("temperature", sampling.temperature);
    if (!given.top_p) sampling.top_p = defaults.get_double("top_p", sampling.top_p);
    if (!given.top_k) sampling.top_k = int(defaults.get_int("top_k", sampling.top_k));
    if (!given.min_p) sampling.min_p = defaults.get_double("min_p", sampling.min_p);
    if (!given.repetition_penalty)
      sampling.repetition_penalty = defaults.get_double("repetition_penalty", sampling.repetition_penalty);
  }
  if (!req.response_format.is_null()) {
    Json c = Json::object();
    std::string type = req.response_format.get_string("type", "");
    c.set("type", type);
    if (type == "json_schema") c.set("schema", *req.response_format.find("json_schema")->find("schema"));
    c.set("chat", req.endpoint != Endpoint::Completions);  // completions: the whole text is the JSON
    req.generation.constraint = std::move(c);
  } else if (req.tool_choice.kind == ToolChoice::Kind::Required || req.tool_choice.kind == ToolChoice::Kind::Named) {
    Json c = Json::object();
    c.set("type", "tool_call");
    c.set("name", req.tool_choice.kind == ToolChoice::Kind::Named ? Json(req.tool_choice.name) : Json());
    c.set("tools", req.tools);
    c.set("parallel_tool_calls", req.parallel_tool_calls);
    req.generation.constraint = std::move(c);
  }
}

// Bytes a whole response can reach, generously: per generated token its
// text and framing, and per logprob entry a JSON object with its bytes.
std::optional<ApiError> check_response_size(const State& s, const ApiRequest& req, const std::vector<GenerationJob::Part>& parts) {
  if (req.stream) return std::nullopt;
  constexpr double kPerToken = 32, kPerLogprob = 96;
  double worst = 0;
  for (const auto& p : parts) {
    const int k = p.request.logprobs;
    double per_token = kPerToken + (k >= 0 ? (k + 1) * kPerLogprob : 0);
    worst += double(p.request.n) * double(p.request.max_tokens) * per_token;
    if (p.request.prompt_logprobs >= 0)
      worst += double(p.request.n) * double(p.request.prompt.size()) * (p.request.prompt_logprobs + 1) * kPerLogprob;
  }
  if (worst <= double(s.opt.max_response_bytes)) return std::nullopt;
  const std::string limit = std::to_string(s.opt.max_response_bytes >> 20) + " MiB";
  return invalid_param(req.endpoint == Endpoint::Completions || req.endpoint == Endpoint::Messages ? "max_tokens" : "n",
                       "This request's whole response could reach " + std::to_string(int64_t(worst / (1 << 20))) +
                           " MiB, over this server's limit of " + limit +
                           " for a non-streamed response. Lower n, max_tokens or the logprobs count, or set \"stream\": true.",
                       "response_too_large");
}

}  // namespace

std::optional<PreparedGeneration> prepare_generation(const State& s, HttpExchange& ex_ref, Endpoint endpoint, Json body) {
  // Errors are answered on the (deferred) exchange; the caller replays them.
  struct Answer {
    const State& s;
    HttpExchange& ex;
    std::optional<PreparedGeneration> operator()(const ApiError& e) {
      ex.respond(s.error_response(e, ex.request().path));
      return std::nullopt;
    }
  } answer{s, ex_ref};
  ApiRequest req;
  ValidationLimits limits = s.limits();
  std::optional<ApiError> err = endpoint == Endpoint::ChatCompletions ? parse_chat_request(body, limits, &req)
                                : endpoint == Endpoint::Completions   ? parse_completion_request(body, limits, &req)
                                : endpoint == Endpoint::Responses     ? parse_responses_request(body, limits, &req)
                                                                      : parse_messages_request(body, limits, &req);
  if (!err) err = check_model(s, req);
  if (!err) err = check_capabilities(s, req);
  if (err) return answer(*err);
  complete_engine_request(s, req);

  const ModelInfo& info = s.backend.adapter->info();
  const char* id_prefix = endpoint == Endpoint::ChatCompletions ? "chatcmpl-"
                          : endpoint == Endpoint::Completions   ? "cmpl-"
                          : endpoint == Endpoint::Responses     ? "resp_"
                                                                : "msg_";
  std::string id = random_id(id_prefix, 24);
  std::vector<GenerationJob::Part> parts;
  int prompt_tokens = 0;
  const char* prompt_param = endpoint == Endpoint::Completions ? "prompt" : endpoint == Endpoint::Responses ? "input" : "messages";

  auto add_part = [&](std::vector<int32_t> ids, std::string echo_text) -> std::optional<ApiError> {
    int p = int(ids.size());
    if (p == 0) return invalid_param(prompt_param, "The prompt is empty.");
    int64_t max_tokens = req.max_tokens ? *req.max_tokens : int64_t(info.max_model_len) - p;
    if (p >= info.max_model_len || int64_t(p) + max_tokens > info.max_model_len)
      return context_error(s, p, req.max_tokens ? max_tokens : 1, req.max_tokens ? "max_tokens" : prompt_param);
    if (req.generation.sampling.min_tokens > max_tokens)
      return invalid_param("min_tokens", "Invalid 'min_tokens': must be <= max_tokens (" + std::to_string(max_tokens) + ").");
    GenerationJob::Part part{req.generation, std::move(echo_text)};  // the validated request, per prompt
    part.request.id = parts.empty() ? id : id + "-" + std::to_string(parts.size());
    part.request.prompt = std::move(ids);
    part.request.max_tokens = max_tokens;
    prompt_tokens += p;
    parts.push_back(std::move(part));
    return std::nullopt;
  };

  if (endpoint == Endpoint::Completions) {
    for (auto& prompt : req.prompts) {
      std::optional<ApiError> e;
      if (auto* text = std::get_if<std::string>(&prompt)) {
        if (exceeds_context(info, text->size())) return answer(too_long(s, text->size(), "prompt"));
        auto ids = s.backend.adapter->tokenize(*text, /*add_special_tokens=*/true);
        if (!ids.ok()) return answer(invalid_param("prompt", ids.message()));
        e = add_part(std::move(ids).value(), req.echo ? *text : "");
      } else {
        auto& ids = std::get<std::vector<int32_t>>(prompt);
        std::string echo;
        if (req.echo) {
          auto t = s.backend.adapter->detokenize(ids, req.generation.skip_special_tokens);
          if (!t.ok()) return answer(invalid_param("prompt", t.message()));
          echo = sanitize_utf8(*t);
        }
        e = add_part(std::move(ids), std::move(echo));
      }
      if (e) return answer(*e);
    }
  } else {
    auto rendered = s.backend.adapter->render_chat(req.body, endpoint == Endpoint::Messages ? ChatApi::Anthropic : ChatApi::OpenAI);
    // Template and conversion errors are the request's fault: 400, never 500.
    if (!rendered.ok()) return answer(invalid_param(prompt_param, rendered.message()));
    if (rendered->exceeds_context) return answer(too_long(s, rendered->text.size(), prompt_param));
    if (auto e = add_part(std::move(rendered->ids), "")) return answer(*e);
  }

  if (auto e = check_response_size(s, req, parts)) return answer(*e);
  return PreparedGeneration{std::move(req), std::move(id), std::move(parts), prompt_tokens};
}

void start_generation(ServerContext& s, std::shared_ptr<HttpExchange> ex, PreparedGeneration p) {
  if (ex->closed()) return;  // the client left while the request was prepared
  auto job = std::make_shared<GenerationJob>(&s, ex, std::move(p.request), p.id, p.prompt_tokens);
  s.jobs.insert(job);
  if (!job->start(std::move(p.parts), s.poster)) s.jobs.erase(job);
}

void handle_count_tokens(const State& s, HttpExchange& ex, const Json& body) {
  Json with_max = body;
  if (!with_max.find("max_tokens")) with_max.set("max_tokens", 1);
  ApiRequest req;
  if (auto e = parse_messages_request(with_max, s.limits(), &req)) return s.respond_error(ex, *e);
  if (auto e = check_model(s, req)) return s.respond_error(ex, *e);
  auto rendered = s.backend.adapter->render_chat(body, ChatApi::Anthropic);
  if (!rendered.ok()) return s.respond_error(ex, invalid_param("messages", rendered.message()));
  if (rendered->exceeds_context) return s.respond_error(ex, too_long(s, rendered->text.size(), "messages"));
  Json out = Json::object();
  out.set("input_tokens", int64_t(rendered->ids.size()));
  HttpResponse r;
  r.body = out.dump();
  ex.respond(std::move(r));
}

}  // namespace muse::server
