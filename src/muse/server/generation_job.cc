// One generation request, from admission to the last byte.
//
// Admission (request-pool thread): the body is validated into an ApiRequest
// (api_request.cc) whose `generation` is the engine request; then the model
// name, capability checks, the model's sampling defaults and the constraint,
// rendering and tokenizing (the ModelAdapter), the context-length and
// response-size checks; each prompt gets its copy of the GenerationRequest
// with its ids and resolved max_tokens.
//
// The job (I/O thread): submits each part to the GenerationService (moved),
// receives outputs through a thread-safe inbox, runs the response parser per
// choice, and writes SSE frames or the body (see generation_job.h).
#include "muse/server/generation_job.h"

#include <ctime>

#include "muse/core/log.h"

namespace muse::server {

// ---------------------------------------------------------------------------
// Admission
// ---------------------------------------------------------------------------

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

ApiError context_error(const ServerContext& s, int prompt, int64_t max_tokens, const char* param) {
  const std::string what = std::string(param) == "prompt" ? "prompt" : "messages";
  return context_length_exceeded(param, s.backend.adapter->info().max_model_len,
                                 "you requested " + std::to_string(int64_t(prompt) + max_tokens) + " tokens (" +
                                     std::to_string(prompt) + " in the " + what + ", " + std::to_string(max_tokens) +
                                     " in the completion)",
                                 what + " or completion");
}

// A text refused by its length alone (exceeds_context()): the message says
// how many tokens it has at least.
ApiError too_long(const ServerContext& s, size_t bytes, const char* param) {
  const ModelInfo& info = s.backend.adapter->info();
  int64_t at_least = int64_t(bytes / size_t(std::max(1, info.max_token_bytes)));
  return context_length_exceeded(param, info.max_model_len,
                                 "the " + std::string(param) + " has at least " + std::to_string(at_least) + " tokens (" +
                                     std::to_string(bytes) + " bytes)",
                                 param);
}

std::optional<ApiError> check_model(const ServerContext& s, const ApiRequest& req) {
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

std::optional<ApiError> check_capabilities(const ServerContext& s, const ApiRequest& req) {
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
void complete_engine_request(const ServerContext& s, ApiRequest& req) {
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
std::optional<ApiError> check_response_size(const ServerContext& s, const ApiRequest& req, const std::vector<GenerationJob::Part>& parts) {
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

std::optional<PreparedGeneration> prepare_generation(const ServerContext& s, HttpExchange& ex_ref, Endpoint endpoint, Json body) {
  // Errors are answered on the (deferred) exchange; the caller replays them.
  struct Answer {
    const ServerContext& s;
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

void handle_count_tokens(const ServerContext& s, HttpExchange& ex, const Json& body) {
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

// ---------------------------------------------------------------------------
// The job
// ---------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

// Filled on the engine's thread, emptied on the I/O thread.
struct GenerationJob::Inbox {
  struct Event {
    int part = 0;
    std::optional<GenerationOutput> output;
    std::optional<GenerationSummary> summary;
  };
  std::mutex mu;
  std::vector<Event> events;
  bool wake_pending = false;
};

namespace {

class JobSink : public GenerationSink {
 public:
  JobSink(std::shared_ptr<GenerationJob::Inbox> inbox, std::shared_ptr<IoPoster> poster, std::weak_ptr<GenerationJob> job, int part)
      : inbox_(std::move(inbox)), poster_(std::move(poster)), job_(std::move(job)), part_(part) {}
  void on_output(GenerationOutput output) override { push({part_, std::move(output), std::nullopt}); }
  void on_complete(GenerationSummary summary) override { push({part_, std::nullopt, std::move(summary)}); }

 private:
  void push(GenerationJob::Inbox::Event e) {
    bool wake;
    {
      std::lock_guard lock(inbox_->mu);
      inbox_->events.push_back(std::move(e));
      wake = !inbox_->wake_pending;
      inbox_->wake_pending = true;
    }
    // One wake-up per batch of events, however many tokens it carries.
    if (wake)
      poster_->post([job = job_] {
        if (auto j = job.lock()) j->drain();
      });
  }
  std::shared_ptr<GenerationJob::Inbox> inbox_;
  std::shared_ptr<IoPoster> poster_;
  std::weak_ptr<GenerationJob> job_;
  int part_;
};

const char* finish_name(FinishReason f) {
  switch (f) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::Error: return "error";
    case FinishReason::None: break;
  }
  return "stop";
}

}  // namespace

GenerationJob::GenerationJob(ServerContext* ctx, std::shared_ptr<HttpExchange> ex, ApiRequest req, std::string id, int prompt_tokens)
    : ctx_(ctx), ex_(std::move(ex)), req_(std::move(req)), id_(std::move(id)), inbox_(std::make_shared<Inbox>()),
      prompt_tokens_(prompt_tokens), arrival_(Clock::now()), last_write_(arrival_) {}

bool GenerationJob::start(std::vector<Part> parts, const std::shared_ptr<IoPoster>& poster) {
  parts_ = std::move(parts);
  part_done_.assign(parts_.size(), false);
  choices_.resize(parts_.size() * size_t(req_.generation.n));
  ParserOptions popt;
  popt.tools_enabled = !req_.tools.is_null() && req_.tool_choice.kind != ToolChoice::Kind::None;
  popt.tools = req_.tools;
  if (req_.endpoint != Endpoint::Completions)
    for (auto& c : choices_) c.parser = ctx_->backend.adapter->make_output_parser(popt);

  WriterOptions wopt;
  wopt.id = id_;
  wopt.model = req_.model.empty() ? ctx_->served_name() : req_.model;
  wopt.created = int64_t(std::time(nullptr));
  wopt.choices = int(choices_.size());
  wopt.include_usage = req_.include_usage || (req_.stream && ctx_->opt.force_include_usage);
  wopt.continuous_usage = req_.continuous_usage;
  wopt.include_reasoning = req_.include_reasoning;
  wopt.reasoning_fields = ctx_->opt.reasoning_fields;
  wopt.prompt_tokens = prompt_tokens_;
  writer_ = req_.endpoint == Endpoint::ChatCompletions ? make_chat_writer(wopt)
            : req_.endpoint == Endpoint::Completions   ? make_completion_writer(wopt)
            : req_.endpoint == Endpoint::Responses     ? make_responses_writer(wopt)
                                                       : make_messages_writer(wopt);

  auto self = shared_from_this();
  const int64_t max_tokens = parts_[0].request.max_tokens;  // for the log line
  for (size_t p = 0; p < parts_.size(); ++p) {
    auto sink = std::make_shared<JobSink>(inbox_, poster, weak_from_this(), int(p));
    // The request itself moves on to the engine; the job keeps its id (cancel).
    part_ids_.push_back(parts_[p].request.id);
    if (auto err = ctx_->backend.service->submit(std::move(parts_[p].request), sink)) {
      ApiError e;
      switch (err->kind) {
        case SubmitError::Kind::Invalid: e = invalid_param("", err->message); break;
        case SubmitError::Kind::Overloaded: e = ApiError{429, "rate_limit_error", err->message + " Retry shortly.", "", "server_overloaded"}; break;
        case SubmitError::Kind::Unavailable: e = ApiError{503, "service_unavailable", err->message, "", "model_unavailable"}; break;
      }
      // Parts already queued are cancelled; their summaries are still awaited.
      for (size_t q = 0; q < p; ++q) ctx_->backend.service->cancel(part_ids_[q]);
      for (size_t q = p; q < parts_.size(); ++q) {
        part_done_[q] = true;
        ++parts_done_;
      }
      client_gone_ = true;  // nothing more is written
      ctx_->respond_error(*ex_, e);
      if (parts_done_ == int(parts_.size())) finalized_ = true;
      return p > 0;  // keep the job registered while cancelled parts drain
    }
  }
  if (ctx_->opt.log_requests)
    LOG_INFO("[%s] %s from %s: prompt %d tokens, max_tokens %lld, n %d%s", id_.c_str(), ex_->request().path.c_str(),
             ex_->request().remote.c_str(), prompt_tokens_, (long long)max_tokens, req_.generation.n,
             req_.stream ? ", stream" : "");
  if (req_.stream) {
    ex_->start_stream(200, "text/event-stream", {{"X-Request-Id", id_}});
    write(writer_->stream_start());
  }
  std::weak_ptr<GenerationJob> weak = self;
  ex_->on_close([weak] {
    auto j = weak.lock();
    if (!j || j->finalized_) return;
    j->client_gone_ = true;
    j->ctx_->metrics->client_disconnected();
    LOG_INFO("[%s] client disconnected; cancelling", j->id_.c_str());
    j->cancel();
  });
  return true;
}

void GenerationJob::cancel() {
  for (size_t p = 0; p < part_ids_.size(); ++p)
    if (!part_done_[p]) ctx_->backend.service->cancel(part_ids_[p]);
}

void GenerationJob::write(std::string bytes) {
  if (bytes.empty() || client_gone_) return;
  last_write_ = Clock::now();
  ex_->write(std::move(bytes));
}

void GenerationJob::keepalive(Clock::time_point now) {
  if (!req_.stream || client_gone_ || finalized_) return;
  if (std::chrono::duration<double>(now - last_write_).count() >= ctx_->opt.sse_keepalive_seconds) write(writer_->keepalive());
}

UsageInfo GenerationJob::usage() const {
  UsageInfo u;
  u.prompt_tokens = prompt_tokens_;
  u.cached_tokens = cached_tokens_;
  for (const auto& c : choices_) {
    u.completion_tokens += c.completion_tokens;
    u.reasoning_tokens += c.reasoning_tokens;
  }
  return u;
}

void GenerationJob::drain() {
  std::vector<Inbox::Event> events;
  {
    std::lock_guard lock(inbox_->mu);
    events.swap(inbox_->events);
    inbox_->wake_pending = false;
  }
  for (auto& e : events) {
    // Defence in depth: an exception from the parser or a writer fails this
    // request (500, or an error frame on a stream), never the server. The
    // events after it are still handled: the summary among them is what
    // finalizes the request (dropping it left a stream open, kept alive by
    // keep-alive comments, forever).
    try {
      if (e.output) on_output(e.part, std::move(*e.output));
      else if (e.summary) on_summary(e.part, *e.summary);
    } catch (const std::exception& ex) {
      internal_failure(ex.what());
    } catch (...) {
      internal_failure("unknown exception");
    }
  }
}

void GenerationJob::internal_failure(const char* what) {
  LOG_ERROR("[%s] internal error while producing the response: %s; the request fails, the server continues", id_.c_str(), what);
  if (!failed_) {
    failed_ = true;
    cancel();
  }
  if (engine_error_.empty()) engine_error_ = std::string("internal error: ") + what;
  if (finalized_) {  // finalize() itself threw part-way: close what it could not
    if (!ex_->finished()) {
      if (req_.stream) ex_->end_stream();
      else internal_error(*ctx_, *ex_, what);
    }
    ctx_->jobs.erase(shared_from_this());
  }
}

void GenerationJob::on_output(int part, GenerationOutput out) {
  if (failed_ || out.index < 0 || out.index >= req_.generation.n) return;
  int index = part * req_.generation.n + out.index;
  Choice& c = choices_[size_t(index)];
  if (c.finished) return;
  auto now = Clock::now();
  if (!out.token_ids.empty()) {
    if (!first_token_) first_token_ = now;
    if (c.last_token) ctx_->metrics->inter_token_latency(std::chrono::duration<double>(now - *c.last_token).count() / double(out.token_ids.size()));
    c.last_token = now;
  }
  c.completion_tokens += int(out.token_ids.size());

  ChoiceDelta d;
  if (req_.endpoint == Endpoint::Completions) {
    if (req_.echo && !c.sent_echo) {
      c.sent_echo = true;
      d.echo_text = parts_[size_t(part)].echo_text;
      if (req_.generation.logprobs >= 0) d.prompt_logprobs = std::move(out.prompt_logprobs);
    }
    d.text = std::move(out.text);
  } else {
    ParsedDelta pd;
    c.parser->feed(out.token_ids, out.text, pd);
    if (out.finish != FinishReason::None) c.parser->finish(out.finish, pd);
    c.reasoning_tokens += pd.reasoning_tokens;
    d.reasoning = std::move(pd.reasoning);
    d.content = std::move(pd.content);
    for (auto& tc : pd.tool_calls) {
      // parallel_tool_calls=false keeps the first call only.
      if (!req_.parallel_tool_calls && tc.index > 0) continue;
      if (tc.index < 0 || tc.index > 1024) continue;
      ToolCallOut t;
      t.index = tc.index;
      t.arguments = std::move(tc.arguments);
      if (size_t(tc.index) >= c.tool_ids.size()) c.tool_ids.resize(size_t(tc.index) + 1);
      if (c.tool_ids[size_t(tc.index)].empty()) {
        // The first delta of a call names it and gets its id.
        c.tool_ids[size_t(tc.index)] = random_id(req_.endpoint == Endpoint::Messages ? "toolu_" : "call_", 24);
        t.id = c.tool_ids[size_t(tc.index)];
        t.name = tc.name.empty() ? "unknown" : std::move(tc.name);
      }
      c.saw_tool_call = true;
      d.tool_calls.push_back(std::move(t));
    }
  }
  if (req_.generation.logprobs >= 0) d.logprobs = std::move(out.logprobs);

  if (!d.empty()) {
    if (req_.stream) write(writer_->stream_delta(index, d, usage()));
    else writer_->add(index, d);
  }
  if (out.finish != FinishReason::None) {
    c.finished = true;
    c.finish = out.finish;
    if (out.finish == FinishReason::Error) return;  // reported once, as an error, in finalize()
    FinishInfo f;
    f.reason = out.finish == FinishReason::Stop && c.saw_tool_call ? "tool_calls" : finish_name(out.finish);
    if (out.stop_string) f.stop_reason = *out.stop_string;
    else if (out.stop_token) f.stop_reason = int64_t(*out.stop_token);
    if (req_.stream) write(writer_->stream_finish(index, f));
    else writer_->finish(index, f);
  }
}

void GenerationJob::on_summary(int part, const GenerationSummary& s) {
  if (part < 0 || size_t(part) >= parts_.size() || part_done_[size_t(part)]) return;
  part_done_[size_t(part)] = true;
  ++parts_done_;
  cached_tokens_ += s.cached_prompt_tokens;
  for (size_t i = 0; i < s.completion_tokens.size() && i < size_t(req_.generation.n); ++i)
    choices_[size_t(part) * size_t(req_.generation.n) + i].completion_tokens = s.completion_tokens[i];
  queue_s_ = std::max(queue_s_, s.queue_seconds);
  prefill_s_ = std::max(prefill_s_, s.prefill_seconds);
  decode_s_ = std::max(decode_s_, s.decode_seconds);
  if (!s.error.empty() && engine_error_.empty()) engine_error_ = s.error;
  if (parts_done_ == int(parts_.size())) finalize();
}

void GenerationJob::finalize() {
  if (finalized_) return;
  finalized_ = true;
  UsageInfo u = usage();
  FinishedRequest fr;
  bool aborted = client_gone_, length = false;
  for (const auto& c : choices_) {
    aborted |= c.finish == FinishReason::Abort;
    length |= c.finish == FinishReason::Length;
  }
  fr.prompt_tokens = u.prompt_tokens;
  fr.generation_tokens = u.completion_tokens;
  fr.e2e_seconds = std::chrono::duration<double>(Clock::now() - arrival_).count();
  fr.ttft_seconds = first_token_ ? std::chrono::duration<double>(*first_token_ - arrival_).count() : -1;
  fr.queue_seconds = queue_s_;
  fr.prefill_seconds = prefill_s_;
  fr.decode_seconds = decode_s_;

  if (!engine_error_.empty()) {
    LOG_ERROR("[%s] engine error: %s", id_.c_str(), engine_error_.c_str());
    ApiError e{500, "server_error", "The engine failed while generating: " + engine_error_, "", "engine_error"};
    if (req_.stream) {
      write(writer_->stream_error(e));
      ex_->end_stream();
    } else if (!client_gone_) {
      ctx_->respond_error(*ex_, e);
    }
  } else if (req_.stream) {
    write(writer_->stream_end(u));
    ex_->end_stream();
  } else if (!client_gone_) {
    HttpResponse r;
    r.body = writer_->body(u);
    r.headers.emplace_back("X-Request-Id", id_);
    ex_->respond(std::move(r));
  }
  // Counted once the answer is handed over: a response that could not be
  // (the client went away first) is an abort, never a success.
  aborted |= ex_->closed();
  fr.finished_reason = !engine_error_.empty() ? "error" : aborted ? "abort" : length ? "length" : "stop";
  ctx_->metrics->request_finished(fr);
  if (ctx_->opt.log_requests)
    LOG_INFO("[%s] finished%s: %d prompt + %d completion tokens in %.3f s", id_.c_str(), aborted ? " (client gone)" : "",
             u.prompt_tokens, u.completion_tokens, fr.e2e_seconds);
  ctx_->jobs.erase(shared_from_this());
}

void cancel_all_jobs(ServerContext& ctx) {
  for (const auto& j : ctx.jobs) j->cancel();
}

void send_keepalives(ServerContext& ctx) {
  auto now = Clock::now();
  for (const auto& j : ctx.jobs) j->keepalive(now);
}

}  // namespace muse::server
