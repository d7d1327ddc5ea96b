#include "muse/server/metrics.h"

#include <cstdio>

namespace muse::server {
namespace {

std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

// vLLM's 1-2-5 token-count buckets up to the context length.
std::vector<double> one_two_five(int max) {
  std::vector<double> b;
  for (double base = 1;; base *= 10)
    for (double m : {1.0, 2.0, 5.0}) {
      if (base * m > max) return b;
      b.push_back(base * m);
    }
}

const std::vector<double> kTtft = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                   1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItl = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                  0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kLatency = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                      30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

void Histogram::observe(double x) {
  size_t i = 0;
  while (i < bounds_.size() && x > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += x;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{" + labels + ",le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_bucket{" + labels + ",le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum{" + labels + "} " + num(sum_) + "\n";
  out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics(std::string model_name, int max_model_len)
    : model_label_("model_name=\"" + escape_label(model_name) + "\""),
      prompt_len_(one_two_five(max_model_len)), gen_len_(one_two_five(max_model_len)),
      ttft_(kTtft), itl_(kItl), e2e_(kLatency), queue_(kLatency), prefill_(kLatency), decode_(kLatency) {}

void ServerMetrics::http_request(const std::string& handler, const std::string& method, int status) {
  std::string key = "handler=\"" + escape_label(handler) + "\",method=\"" + escape_label(method) + "\",status=\"" +
                    std::to_string(status / 100) + "xx\"";
  ++http_requests_[key];
}

void ServerMetrics::request_finished(const FinishedRequest& r) {
  ++success_[r.finished_reason];
  prompt_tokens_ += uint64_t(r.prompt_tokens);
  generation_tokens_ += uint64_t(r.generation_tokens);
  prompt_len_.observe(r.prompt_tokens);
  gen_len_.observe(r.generation_tokens);
  e2e_.observe(r.e2e_seconds);
  if (r.ttft_seconds >= 0) ttft_.observe(r.ttft_seconds);
  queue_.observe(r.queue_seconds);
  prefill_.observe(r.prefill_seconds);
  decode_.observe(r.decode_seconds);
}

std::string ServerMetrics::render(const EngineStats& e, size_t open_connections) const {
  std::string out;
  const std::string& L = model_label_;
  // A metric with one sample under the model label; `value` is already text.
  auto one = [&](const char* name, const char* type, const char* help, const std::string& value) {
    header(out, name, type, help);
    out += std::string(name) + "{" + L + "} " + value + "\n";
  };
  one("muse:num_requests_running", "gauge", "Number of requests in model execution batches.", std::to_string(e.num_requests_running));
  one("muse:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", std::to_string(e.num_requests_waiting));
  one("muse:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", num(e.kv_cache_usage));
  one("muse:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", std::to_string(e.prefix_cache_queries));
  one("muse:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", std::to_string(e.prefix_cache_hits));
  one("muse:num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.", std::to_string(e.num_preemptions));
  one("muse:engine_steps_total", "counter", "Model steps run by the engine loop.", std::to_string(e.engine_steps));
  one("muse:engine_busy_seconds_total", "counter", "Time the engine loop spent on steps (scheduling, model, sampling, output).", num(e.engine_busy_seconds));
  one("muse:engine_model_seconds_total", "counter", "Of the busy time, the time inside the model's forward step.", num(e.engine_model_seconds));
  if (e.spec_decode) {
    // vLLM's spec_decode counters (vllm/v1/spec_decode/metrics.py), muse: prefix.
    one("muse:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", std::to_string(e.spec_drafts));
    one("muse:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", std::to_string(e.spec_draft_tokens));
    one("muse:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
        std::to_string(e.spec_accepted_tokens));
    header(out, "muse:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.");
    for (size_t p = 0; p < e.spec_accepted_per_pos.size(); ++p)
      out += "muse:spec_decode_num_accepted_tokens_per_pos_total{" + L + ",position=\"" + std::to_string(p) + "\"} " +
             std::to_string(e.spec_accepted_per_pos[p]) + "\n";
  }
  one("muse:prompt_tokens_total", "counter", "Number of prefill tokens processed.", std::to_string(prompt_tokens_));
  one("muse:generation_tokens_total", "counter", "Number of generation tokens processed.", std::to_string(generation_tokens_));
  header(out, "muse:request_success_total", "counter", "Count of finished requests by finished reason.");
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    auto it = success_.find(reason);
    out += "muse:request_success_total{" + L + ",finished_reason=\"" + reason + "\"} " +
           std::to_string(it == success_.end() ? 0 : it->second) + "\n";
  }
  struct H { const char* name; const char* help; const Histogram* h; };
  for (const H& h : {H{"muse:request_prompt_tokens", "Number of prefill tokens processed.", &prompt_len_},
                     H{"muse:request_generation_tokens", "Number of generation tokens processed.", &gen_len_},
                     H{"muse:time_to_first_token_seconds", "Histogram of time to first token in seconds.", &ttft_},
                     H{"muse:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &itl_},
                     H{"muse:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", &e2e_},
                     H{"muse:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", &queue_},
                     H{"muse:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", &prefill_},
                     H{"muse:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", &decode_}}) {
    header(out, h.name, "histogram", h.help);
    h.h->render(out, h.name, L);
  }
  one("muse:http_requests_client_disconnected_total", "counter",
      "Requests whose client disconnected before the response was complete.", std::to_string(disconnected_));
  one("muse:http_open_connections", "gauge", "Open HTTP connections.", std::to_string(open_connections));
  header(out, "http_requests_total", "counter", "Total number of requests by handler, method and status.");
  for (const auto& [labels, count] : http_requests_) out += "http_requests_total{" + labels + "} " + std::to_string(count) + "\n";
  return out;
}

}  // namespace muse::server
