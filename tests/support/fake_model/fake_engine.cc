// The fake model's engine half: plans each choice's whole output from the
// prompt (see fake_model.h), then releases one token per running sequence per
// step, honouring max_num_seqs, chunked prefill, stop conditions and cancel,
// like the real scheduler would.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_set>

#include "fake_model_internal.h"
#include "muse/core/log.h"
#include "muse/server/stop_matcher.h"

namespace muse::server::fake {
namespace {

using namespace fake_vocab;
using Clock = std::chrono::steady_clock;

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0x100000001b3ull;
}

size_t utf8_floor(std::string_view s, size_t cut) {
  while (cut > 0 && cut < s.size() && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

// Length of the complete-UTF-8 prefix of `s` (an incomplete tail is held).
size_t complete_utf8_prefix(std::string_view s) {
  size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead
    size_t need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

const char* kWords[] = {"the",  "quick", "brown", "fox",   "jumps", "over",  "lazy", "dog",
                        "café", "naïve", "日本語", "😀",    "muse",  "token", "sky",  "river"};

std::string value_for(const std::string& name, const Json& schema) {
  std::string type = schema.get_string("type", "string");
  if (type == "integer") return "3";
  if (type == "number") return "1.5";
  if (type == "boolean") return "true";
  if (type == "array") return "[\"a\",\"b\"]";
  if (type == "object") return "{\"k\":\"v\"}";
  if (name.find("city") != std::string::npos) return "\"Paris\"";
  return json_quote("x-" + name + " ü");
}

std::string arguments_for(const Json& params) {
  std::string out = "{";
  if (const Json* props = params.find("properties"); props && props->is_object()) {
    bool first = true;
    for (const auto& [name, schema] : props->as_object()) {
      if (!first) out += ",";
      first = false;
      out += json_quote(name) + ":" + value_for(name, schema);
    }
  }
  return out + "}";
}

struct PromptFacts {
  Json tools = Json::array();
  std::string tool_choice = "auto";
  std::string last_user;
  bool last_is_tool_result = false;
  bool chat = false;  // rendered by the fake template (else a raw completion prompt)
};

PromptFacts read_prompt(const std::string& text) {
  PromptFacts f;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    if (line.starts_with("[tools] ")) {
      if (auto j = Json::parse(line.substr(8)); j.ok()) f.tools = *j;
    } else if (line.starts_with("[tool_choice] ")) {
      f.tool_choice = std::string(line.substr(14));
    } else if (line.starts_with("[user] ")) {
      f.last_user = std::string(line.substr(7));
      f.last_is_tool_result = f.last_user.find("[tool_result]") != std::string::npos;
    } else if (line.starts_with("[tool] ")) {
      f.last_is_tool_result = true;
    }
    pos = end + 1;
  }
  f.chat = text.ends_with("[assistant]");
  if (!f.chat) f.last_user = text;  // a raw completion prompt: read it as the request
  return f;
}

struct Sequence {
  int index = 0;
  std::vector<int32_t> plan;
  size_t pos = 0;
  int generated = 0;
  std::string held;  // bytes waiting for a whole UTF-8 character
  StopStringMatcher stops;
  bool finished = false;
  bool sent_prompt_logprobs = false;
};

struct Job {
  GenerationRequest req;
  std::shared_ptr<GenerationSink> sink;
  std::vector<Sequence> seqs;
  Clock::time_point arrival, scheduled, first_token, last_token;
  bool has_first_token = false;
  int prefill_remaining = 0;
  Clock::time_point wake_at;  // "sleep:N": no token before this
  int fail_after = -1;        // "error:engine": fail after this many tokens
  bool cancelled = false;
};

class FakeEngine : public GenerationService {
 public:
  explicit FakeEngine(const FakeModelOptions& o) : opt_(o) {}
  ~FakeEngine() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  Status load(const LoadProgressFn& progress) override {
    const int parts = 20;
    for (int i = 1; i <= parts; ++i) {
      if (opt_.load_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opt_.load_ms / parts));
      if (progress) progress({uint64_t(i) << 26, uint64_t(parts) << 26, uint64_t(i) * 10, uint64_t(parts) * 10});
    }
    worker_ = std::thread([this] { run(); });
    return Status::Ok();
  }

  std::optional<SubmitError> submit(GenerationRequest req, std::shared_ptr<GenerationSink> sink) override {
    if (req.n > opt_.max_num_seqs)
      return SubmitError{SubmitError::Kind::Invalid, "n=" + std::to_string(req.n) + " exceeds --max-num-seqs " +
                                                        std::to_string(opt_.max_num_seqs)};
    auto job = std::make_unique<Job>();
    job->arrival = Clock::now();
    job->sink = std::move(sink);
    job->req = std::move(req);
    {
      std::lock_guard lock(mu_);
      if (!worker_.joinable() || stopping_) return SubmitError{SubmitError::Kind::Unavailable, "the model is not loaded"};
      if (int(incoming_.size()) + waiting_count_.load() >= opt_.max_waiting)
        return SubmitError{SubmitError::Kind::Overloaded, "too many requests are waiting"};
      incoming_.push_back(std::move(job));
    }
    cv_.notify_all();
    return std::nullopt;
  }

  void cancel(const std::string& request_id) override {
    {
      std::lock_guard lock(mu_);
      cancelled_.insert(request_id);
    }
    cv_.notify_all();
  }

  EngineStats stats() const override {
    EngineStats s;
    s.num_requests_running = running_count_.load();
    s.num_requests_waiting = waiting_count_.load();
    s.kv_cache_usage = double(running_seqs_.load()) / std::max(1, opt_.max_num_seqs);
    return s;
  }

 private:
  void plan(Job& job) {
    std::string prompt = decode_bytes(job.req.prompt, /*skip_special=*/true);
    PromptFacts facts = read_prompt(prompt);
    uint64_t prompt_hash = 1469598103934665603ull;
    for (int32_t id : job.req.prompt) prompt_hash = mix(prompt_hash, uint64_t(id));
    const auto& s = job.req.sampling;
    bool greedy = s.temperature == 0;
    uint64_t request_salt = s.seed ? uint64_t(*s.seed) : (opt_.default_seed ? uint64_t(opt_.default_seed) : std::random_device{}());

    if (auto at = facts.last_user.find("sleep:"); at != std::string::npos)
      job.wake_at = Clock::now() + std::chrono::milliseconds(std::atoi(facts.last_user.c_str() + at + 6));
    if (facts.last_user.find("error:engine") != std::string::npos) job.fail_after = 3;
    job.prefill_remaining = int(job.req.prompt.size());

    for (int i = 0; i < job.req.n; ++i) {
      Sequence seq{i, {}, 0, 0, "", StopStringMatcher(job.req.stop_strings, job.req.include_stop_str_in_output)};
      std::mt19937_64 rng(greedy ? prompt_hash : mix(mix(prompt_hash, request_salt), uint64_t(i) + 1));
      std::string snippet = facts.last_user.substr(0, utf8_floor(facts.last_user, std::min<size_t>(32, facts.last_user.size())));
      std::vector<int32_t>& p = seq.plan;
      auto add = [&](std::string_view t) { for (unsigned char c : t) p.push_back(c); };
      if (facts.chat) {
        p.push_back(kThink);
        add("The user said: " + snippet + ".");
        p.push_back(kEndThink);
      }

      bool has_tools = facts.tools.is_array() && !facts.tools.as_array().empty();
      const std::string& choice = facts.tool_choice;
      bool wants_call = choice == "required" || choice.starts_with("name:") ||
                        (choice == "auto" && !facts.last_is_tool_result &&
                         (facts.last_user.find("call") != std::string::npos ||
                          facts.last_user.find("weather") != std::string::npos ||
                          facts.last_user.find("tool") != std::string::npos));
      if (has_tools && choice != "none" && wants_call) {
        std::vector<const Json*> targets;
        for (const auto& t : facts.tools.as_array())
          if (!choice.starts_with("name:") || t.get_string("name", "") == choice.substr(5)) targets.push_back(&t);
        if (targets.empty()) targets.push_back(&facts.tools.as_array()[0]);
        size_t calls = facts.last_user.find("parallel") != std::string::npos ? 2 : 1;
        for (size_t c = 0; c < calls; ++c) {
          const Json* t = targets[c % targets.size()];
          p.push_back(kTool);
          add(t->get_string("name", "") + "\n");
          const Json* params = t->find("parameters");
          add(arguments_for(params ? *params : Json::object()));
          p.push_back(kEndTool);
        }
      } else if (facts.last_user.starts_with("echo:")) {
        std::string_view rest = std::string_view(facts.last_user).substr(5);
        if (rest.starts_with(" ")) rest.remove_prefix(1);
        add(rest);
      } else {
        int words = 6 + int(rng() % 10);
        for (int w = 0; w < words; ++w) add(std::string(w ? " " : "") + kWords[rng() % 16]);
        add(".");
      }
      // ignore_eos: keep talking until max_tokens; min_tokens: pad before EOS.
      while (job.req.ignore_eos ? int(p.size()) < job.req.max_tokens : int(p.size()) < s.min_tokens)
        add(std::string(" ") + kWords[rng() % 16]);
      if (!job.req.ignore_eos) p.push_back(kEot);
      job.seqs.push_back(std::move(seq));
    }
  }

  TokenLogprob logprob_of(int32_t tok, const Sequence& seq, int k) const {
    auto text = [](int32_t id) {
      const char* sp = special_text(id);
      return sp ? std::string(sp) : std::string(1, char(id));
    };
    uint64_t h = mix(mix(uint64_t(tok), seq.generated), uint64_t(seq.index));
    TokenLogprob lp{tok, text(tok), -double(h % 1000) / 500.0, {}};
    for (int i = 0; i < k; ++i) {
      int32_t alt = i == 0 ? tok : int32_t((tok + 31 * i) % 256);
      lp.top.push_back({alt, text(alt), lp.logprob - 0.25 * i});
    }
    return lp;
  }

  // Advances one sequence by one token; returns its delivery.
  GenerationOutput step(Job& job, Sequence& seq) {
    GenerationOutput out;
    out.index = seq.index;
    if (job.req.prompt_logprobs >= 0 && !seq.sent_prompt_logprobs) {
      seq.sent_prompt_logprobs = true;
      for (size_t i = 0; i < job.req.prompt.size(); ++i) {
        Sequence fake_seq{int(i), {}, 0, int(i)};
        TokenLogprob lp = logprob_of(job.req.prompt[i], fake_seq, i == 0 ? 0 : job.req.prompt_logprobs);
        if (i == 0) lp.logprob = std::nan("");
        out.prompt_logprobs.push_back(std::move(lp));
      }
    }
    int32_t tok = seq.pos < seq.plan.size() ? seq.plan[seq.pos++] : kEot;
    ++seq.generated;
    out.token_ids.push_back(tok);
    if (job.req.logprobs >= 0) out.logprobs.push_back(logprob_of(tok, seq, job.req.logprobs));

    const auto& stop_ids = job.req.stop_token_ids;
    bool is_eos = tok == kEot && !job.req.ignore_eos;
    bool is_stop_id = std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end();
    if (is_stop_id && !is_eos) {
      out.finish = FinishReason::Stop;
      out.stop_token = tok;
    } else if (is_eos) {
      out.finish = FinishReason::Stop;
    } else {
      if (const char* sp = special_text(tok)) {
        if (!job.req.skip_special_tokens) seq.held += sp;
      } else {
        seq.held.push_back(char(tok));
      }
      size_t cut = complete_utf8_prefix(seq.held);
      out.text = seq.stops.push(std::string_view(seq.held).substr(0, cut));
      seq.held.erase(0, cut);
      if (seq.stops.matched()) {
        out.finish = FinishReason::Stop;
        out.stop_string = seq.stops.matched_string();
      } else if (seq.generated >= job.req.max_tokens) {
        out.finish = FinishReason::Length;
      }
    }
    if (out.finish != FinishReason::None && !seq.stops.matched()) out.text += seq.stops.push(seq.held) + seq.stops.flush();
    if (out.finish != FinishReason::None) seq.finished = true;
    return out;
  }

  void complete(Job& job, FinishReason reason_for_unfinished, std::string error) {
    for (auto& seq : job.seqs) {
      if (seq.finished) continue;
      seq.finished = true;
      GenerationOutput out;
      out.index = seq.index;
      out.finish = reason_for_unfinished;
      job.sink->on_output(std::move(out));
    }
    GenerationSummary sum;
    sum.prompt_tokens = int(job.req.prompt.size());
    for (auto& seq : job.seqs) sum.completion_tokens.push_back(seq.generated);
    auto secs = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
    auto now = Clock::now();
    sum.queue_seconds = secs(job.scheduled - job.arrival);
    sum.prefill_seconds = job.has_first_token ? secs(job.first_token - job.scheduled) : secs(now - job.scheduled);
    sum.decode_seconds = job.has_first_token ? secs(job.last_token - job.first_token) : 0;
    sum.error = std::move(error);
    job.sink->on_complete(std::move(sum));
  }

  void run() {
    std::deque<std::unique_ptr<Job>> waiting;
    std::vector<std::unique_ptr<Job>> running;
    int running_seqs = 0;
    for (;;) {
      std::unordered_set<std::string> cancels;
      {
        std::unique_lock lock(mu_);
        if (running.empty() && waiting.empty() && incoming_.empty() && cancelled_.empty())
          cv_.wait(lock, [&] { return stopping_ || !incoming_.empty() || !cancelled_.empty(); });
        if (stopping_) break;
        for (auto& j : incoming_) waiting.push_back(std::move(j));
        incoming_.clear();
        cancels.swap(cancelled_);
      }
      for (auto* list : {&running}) (void)list;
      // Cancellation applies to waiting and running jobs alike.
      for (auto it = waiting.begin(); it != waiting.end();) {
        if (cancels.count((*it)->req.id)) {
          (*it)->scheduled = Clock::now();
          complete(**it, FinishReason::Abort, "");
          it = waiting.erase(it);
        } else {
          ++it;
        }
      }
      for (auto& j : running)
        if (cancels.count(j->req.id)) j->cancelled = true;
      // Admit in arrival order while sequences fit.
      while (!waiting.empty() && running_seqs + waiting.front()->req.n <= opt_.max_num_seqs) {
        auto job = std::move(waiting.front());
        waiting.pop_front();
        job->scheduled = Clock::now();
        plan(*job);
        running_seqs += job->req.n;
        running.push_back(std::move(job));
      }
      waiting_count_ = int(waiting.size());
      running_count_ = int(running.size());
      running_seqs_ = running_seqs;

      int prefill_budget = opt_.max_num_batched_tokens;
      auto now = Clock::now();
      for (auto it = running.begin(); it != running.end();) {
        Job& job = **it;
        bool done = false;
        if (job.cancelled) {
          complete(job, FinishReason::Abort, "");
          done = true;
        } else if (job.prefill_remaining > 0) {
          int take = std::min(job.prefill_remaining, prefill_budget);
          job.prefill_remaining -= take;
          prefill_budget -= take;
        } else if (now >= job.wake_at) {
          bool all_finished = true;
          for (auto& seq : job.seqs) {
            if (seq.finished) continue;
            if (job.fail_after >= 0 && seq.generated >= job.fail_after) continue;
            job.sink->on_output(step(job, seq));
            all_finished &= seq.finished;
          }
          if (!job.has_first_token) {
            job.has_first_token = true;
            job.first_token = now;
          }
          job.last_token = now;
          bool failed = job.fail_after >= 0 &&
                        std::all_of(job.seqs.begin(), job.seqs.end(),
                                    [&](const Sequence& s) { return s.finished || s.generated >= job.fail_after; });
          if (failed && !all_finished) {
            complete(job, FinishReason::Error, "fake engine failure (error:engine)");
            done = true;
          } else if (all_finished) {
            complete(job, FinishReason::None, "");
            done = true;
          }
        }
        if (done) {
          running_seqs -= job.req.n;
          it = running.erase(it);
        } else {
          ++it;
        }
      }
      running_count_ = int(running.size());
      running_seqs_ = running_seqs;
      if (!running.empty() || !waiting.empty())
        std::this_thread::sleep_for(std::chrono::microseconds(int64_t(opt_.step_ms * 1000)));
    }
    // Shutting down: everything still here is aborted.
    for (auto& j : running) complete(*j, FinishReason::Abort, "");
    for (auto& j : waiting) {
      j->scheduled = Clock::now();
      complete(*j, FinishReason::Abort, "");
    }
  }

  FakeModelOptions opt_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Job>> incoming_;
  std::unordered_set<std::string> cancelled_;
  bool stopping_ = false;
  std::thread worker_;
  std::atomic<int> running_count_{0}, waiting_count_{0}, running_seqs_{0};
};

}  // namespace

std::shared_ptr<GenerationService> make_fake_engine(const FakeModelOptions& options) {
  return std::make_shared<FakeEngine>(options);
}

}  // namespace muse::server::fake
