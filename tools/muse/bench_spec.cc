// muse bench --speculative DIR: speculative decoding on a real checkpoint
// (muse-tiny on the CPU) over the gate prompts, greedy. For each batch size,
// tokens/s without the drafter, then with k = 1..4 and adaptive width, the
// mean accepted length (tokens per verify step, the bonus included) and
// whether the output equals the drafter-less one (it must, bitwise).
#include <chrono>
#include <cstdio>

#include "bench_options.h"
#include "muse/core/json.h"
#include "muse/core/log.h"
#include "muse/core/mapped_file.h"
#include "muse/engine/scheduler.h"
#include "muse/engine/token_collector.h"
#include "muse/engine/speculation.h"

namespace muse::tool {

namespace {


struct Result1 {
  double seconds = 0;
  int64_t generated = 0;
  double decode_seconds = 0;  // Σ per request: first token to last
  int64_t decoded = 0;        // Σ per request: tokens after the first
  std::vector<std::vector<int32_t>> outputs;
  SpecDecodeStats spec;
};

Result1 run_once(Engine& e, const SchedulerOptions& so, const std::vector<std::vector<int32_t>>& prompts,
                 int64_t max_tokens) {
  Result1 r;
  Scheduler sched(e, so);  // start-up measurements (adaptive) happen here, outside the timing
  std::vector<std::shared_ptr<TokenCollector>> sinks;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest g;
    g.id = "b" + std::to_string(i);
    g.prompt = prompts[i];
    g.max_tokens = max_tokens;
    auto s = std::make_shared<TokenCollector>();
    if (sched.submit(std::move(g), s).status != Scheduler::SubmitStatus::Ok) s->finish_without_running();
    sinks.push_back(s);
  }
  for (auto& s : sinks) s->wait();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& s : sinks) {
    r.generated += int64_t(s->tokens.size());
    r.decoded += std::max<int64_t>(0, int64_t(s->tokens.size()) - 1);
    r.decode_seconds += s->summary.decode_seconds;
    r.outputs.push_back(s->tokens);
  }
  r.spec = sched.stats().spec;
  return r;
}

}  // namespace

int bench_spec(const BenchOptions& o) {
  auto fail = [](const std::string& m) { return std::fprintf(stderr, "muse bench: %s\n", m.c_str()), 1; };
  auto text = read_file(o.spec_prompts);
  if (!text.ok()) return fail(text.message());
  auto j = Json::parse(*text);
  if (!j.ok() || !j->find("prompts")) return fail(o.spec_prompts + ": expected {\"prompts\": [[ids...], ...]}");
  set_log_level(LogLevel::Warn);  // the table is the output
  std::vector<std::vector<int32_t>> prompts;
  int64_t longest = 0;
  for (const Json& p : j->find("prompts")->as_array()) {
    std::vector<int32_t> ids;
    for (const Json& t : p.as_array()) ids.push_back(int32_t(t.as_int()));
    longest = std::max<int64_t>(longest, int64_t(ids.size()));
    prompts.push_back(std::move(ids));
  }
  const std::vector<int64_t> batches = o.batches_given ? o.batches : std::vector<int64_t>{1, 8};
  const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
  SpeculativeConfig sc;
  sc.enabled = true;
  sc.method = SpecMethod::DSpark;
  sc.model = o.spec_drafter.empty() ? o.spec_target + "/drafter" : o.spec_drafter;
  EngineOptions eo;
  eo.backend.cpu.threads = o.threads;
  if (o.device == "cuda") eo.backend.device = Device::Cuda;  // the target on the GPU; the drafter stays on the host
  eo.max_sequences = max_batch;
  eo.max_model_len = longest + o.tokens + 8;
  eo.max_batch_tokens = 512;
  if (Status st = prepare_speculation(sc, o.spec_target, &eo); !st.ok()) return fail(st.message());
  auto engine = Engine::open(o.spec_target, eo);
  if (!engine.ok()) return fail(engine.message());
  auto drafter = load_drafter(sc, **engine);
  if (!drafter.ok()) return fail(drafter.message());
  SchedulerOptions base;
  for (int64_t id : (*engine)->config().eos_token_ids) base.eos_token_ids.push_back(int32_t(id));
  if (auto gen = read_file(o.spec_target + "/generation_config.json"); gen.ok())
    if (auto g = Json::parse(*gen); g.ok())
      if (const Json* e = g->find("eos_token_id"); e && e->is_array())
        for (const Json& id : e->as_array())
          if (id.is_int() && std::find(base.eos_token_ids.begin(), base.eos_token_ids.end(), id.as_int()) == base.eos_token_ids.end())
            base.eos_token_ids.push_back(int32_t(id.as_int()));
  base.sampled_vocab_size = (*drafter)->config().sampling_vocab;

  std::printf("speculative decoding bench: %s + %s, %zu gate prompts, greedy, max %lld tokens each, %s\n",
              o.spec_target.c_str(), sc.model.c_str(), prompts.size(), (long long)o.tokens,
              (*engine)->backend().name().c_str());
  std::printf("%-6s %-10s %8s %10s %9s %12s %9s %9s %9s %s\n", "batch", "drafter", "tokens", "wall tok/s", "speed-up",
              "decode tok/s", "speed-up", "accepted", "draft ms", "same output");
  Json results = Json::array();
  // Configurations: no drafter, k = 1..4, adaptive (up to 4).
  std::vector<std::pair<std::string, SchedulerOptions>> configs{{"none", base}};
  for (int k = 1; k <= 5; ++k) {
    SchedulerOptions so = base;
    so.speculative = sc;
    so.speculative.num_speculative_tokens = k == 5 ? 4 : k;
    so.speculative.enable_adaptive_verification = k == 5;
    so.drafter = *drafter;
    configs.emplace_back(k == 5 ? "adaptive" : "k=" + std::to_string(k), so);
  }
  for (int64_t batch : batches) {
    // Batch 1: one request at a time; batch B: waves of B at once. The
    // configurations take turns within each run and the fastest run of
    // each is kept: the machine is shared, and the least-disturbed run is
    // the best estimate of what the code does.
    std::vector<Result1> best(configs.size());
    for (int rep = 0; rep < o.runs; ++rep)
      for (size_t c = 0; c < configs.size(); ++c) {
        Result1 r;
        for (size_t i = 0; i < prompts.size(); i += size_t(batch)) {
          std::vector<std::vector<int32_t>> wave(prompts.begin() + ptrdiff_t(i),
                                                 prompts.begin() + ptrdiff_t(std::min(prompts.size(), i + size_t(batch))));
          Result1 w = run_once(**engine, configs[c].second, wave, o.tokens);
          r.seconds += w.seconds;
          r.generated += w.generated;
          r.decoded += w.decoded;
          r.decode_seconds += w.decode_seconds;
          r.outputs.insert(r.outputs.end(), w.outputs.begin(), w.outputs.end());
          r.spec.drafts += w.spec.drafts;
          r.spec.accepted_tokens += w.spec.accepted_tokens;
          r.spec.draft_tokens += w.spec.draft_tokens;
          r.spec.draft_seconds += w.spec.draft_seconds;
        }
        if (rep == 0 || r.seconds < best[c].seconds) best[c] = std::move(r);
      }
    const Result1& ref = best[0];
    const double ref_wall = double(ref.generated) / ref.seconds, ref_dec = double(ref.decoded) / ref.decode_seconds;
    for (size_t c = 0; c < configs.size(); ++c) {
      const Result1& r = best[c];
      const double wall = double(r.generated) / r.seconds, dec = double(r.decoded) / r.decode_seconds;
      const double mean = r.spec.drafts ? 1.0 + double(r.spec.accepted_tokens) / double(r.spec.drafts) : 0.0;
      const bool same = r.outputs == ref.outputs;
      // Drafting time per block (one sequence, one verify step).
      const double draft_ms = r.spec.drafts ? 1e3 * r.spec.draft_seconds / double(r.spec.drafts) : 0.0;
      std::printf("%-6lld %-10s %8lld %10.1f %8.2fx %12.1f %8.2fx %9s %9.2f %s\n", (long long)batch,
                  configs[c].first.c_str(), (long long)r.generated, wall, wall / ref_wall, dec, dec / ref_dec,
                  c == 0 ? "-" : std::to_string(mean).substr(0, 4).c_str(), draft_ms, c == 0 ? "-" : same ? "yes" : "NO");
      Json row = Json::object();
      row.set("batch", batch);
      row.set("drafter", configs[c].first);
      row.set("wall_tokens_per_second", wall);
      row.set("decode_tokens_per_second", dec);
      row.set("mean_accepted_length", mean);
      row.set("same_output", same);
      results.push_back(std::move(row));
    }
  }
  if (o.json) std::printf("%s\n", results.dump().c_str());
  return 0;
}

}  // namespace muse::tool
