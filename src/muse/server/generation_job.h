// One generation request, from admission to the last byte (both in
// generation_job.cc). prepare_generation() turns a body into the engine
// requests (validation, rendering, the context check) on a request-pool
// thread; the GenerationJob then submits them to the GenerationService,
// receives the engine's outputs through a thread-safe inbox (the engine
// thread only enqueues and wakes the I/O thread), runs the response parser
// per choice, and writes SSE frames or the whole body through a
// ResponseWriter. A client disconnect cancels it.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "muse/server/server_context.h"

namespace muse::server {

class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  // One prompt's engine request (completions may have several).
  struct Part {
    GenerationRequest request;  // moved to the engine by start()
    std::string echo_text;      // completions with echo
  };

  GenerationJob(ServerContext* ctx, std::shared_ptr<HttpExchange> ex, ApiRequest req, std::string id, int prompt_tokens);
  // Submits every part; on failure answers the error and returns false.
  bool start(std::vector<Part> parts, const std::shared_ptr<IoPoster>& poster);
  void drain();             // I/O thread: handle what the engine delivered
  void cancel();            // asks the engine to stop every part
  void keepalive(std::chrono::steady_clock::time_point now);

  struct Inbox;  // engine thread -> I/O thread hand-over (generation_job.cc)

 private:
  struct Choice {
    std::unique_ptr<OutputParser> parser;
    std::vector<std::string> tool_ids;  // by tool-call index
    bool saw_tool_call = false;
    FinishReason finish = FinishReason::None;
    bool finished = false;
    bool sent_echo = false;
    int completion_tokens = 0;
    int reasoning_tokens = 0;
    std::optional<std::chrono::steady_clock::time_point> last_token;
  };

  void internal_failure(const char* what);
  void on_output(int part, GenerationOutput out);
  void on_summary(int part, const GenerationSummary& summary);
  void finalize();
  void write(std::string bytes);
  UsageInfo usage() const;

  ServerContext* ctx_;
  std::shared_ptr<HttpExchange> ex_;
  ApiRequest req_;
  std::string id_;
  std::unique_ptr<ResponseWriter> writer_;
  std::shared_ptr<Inbox> inbox_;
  std::vector<Part> parts_;
  std::vector<std::string> part_ids_;  // the engine's request ids, by part
  std::vector<Choice> choices_;
  std::vector<bool> part_done_;
  int parts_done_ = 0;
  int prompt_tokens_ = 0, cached_tokens_ = 0;
  std::string engine_error_;
  double queue_s_ = 0, prefill_s_ = 0, decode_s_ = 0;
  bool client_gone_ = false;
  bool finalized_ = false;
  bool failed_ = false;  // an internal error: later outputs are ignored
  std::chrono::steady_clock::time_point arrival_, last_write_;
  std::optional<std::chrono::steady_clock::time_point> first_token_;
};

// A generation request ready for the engine: validated, rendered,
// tokenized, within the context.
struct PreparedGeneration {
  ApiRequest request;
  std::string id;
  std::vector<GenerationJob::Part> parts;
  int prompt_tokens = 0;
};

// Request-pool thread: validation, rendering, tokenizing, the context and
// response-size checks. A refusal is answered on `ex` (a deferred exchange
// the I/O thread replays) and nullopt returned. Reads only immutable state.
std::optional<PreparedGeneration> prepare_generation(const ServerContext& ctx, HttpExchange& ex, Endpoint endpoint, Json body);
// I/O thread: the job is registered, submitted and (if streaming) started.
void start_generation(ServerContext& ctx, std::shared_ptr<HttpExchange> ex, PreparedGeneration p);

// POST /v1/messages/count_tokens (request-pool thread, like prepare_generation)
void handle_count_tokens(const ServerContext& ctx, HttpExchange& ex, const Json& body);
// Cancels every running generation (shutdown after the grace period).
void cancel_all_jobs(ServerContext& ctx);
// Writes keep-alive comments on streams that have been silent too long.
void send_keepalives(ServerContext& ctx);

}  // namespace muse::server
