// The reference fixtures under tests/data/fixtures (reference.json +
// logits.f32), shared by the CPU forward tests and the CUDA fixture tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/mapped_file.h"
#include "muse/engine/engine.h"
#include "muse/sampling/sampler.h"

namespace muse::fixtures {

namespace fs = std::filesystem;

struct Fixture {
  // dir holds reference.json and logits.f32; model_dir the checkpoint (dir itself, unless
  // reference.json names one: the muse-tiny fixture points at models/muse-tiny instead of
  // copying its weights).
  std::string name, dir, model_dir;
  std::vector<int32_t> prompt, generated;
  int64_t num_rows = 0, vocab = 0;
  double tolerance_rel = 2e-3;
  std::vector<float> logits;  // [num_rows, vocab]
};

inline std::string fixtures_root() { return std::string(MUSE_SOURCE_DIR) + "/tests/data/fixtures"; }

inline std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fixtures_root(), ec))
    if (e.is_directory() && fs::exists(e.path() / "reference.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline std::vector<int32_t> int_list(const Json* j) {
  std::vector<int32_t> v;
  if (j && j->is_array())
    for (const Json& x : j->as_array()) v.push_back(int32_t(x.as_int()));
  return v;
}

inline Fixture load_fixture(const std::string& name) {
  Fixture f;
  f.name = name;
  f.dir = fixtures_root() + "/" + name;
  auto text = read_file(f.dir + "/reference.json");
  EXPECT_TRUE(text.ok()) << name;
  auto j = Json::parse(*text);
  EXPECT_TRUE(j.ok()) << name;
  f.prompt = int_list(j->find("prompt_ids"));
  f.generated = int_list(j->find("generated_ids"));
  f.num_rows = j->get_int("num_rows", 0);
  f.vocab = j->get_int("vocab_size", 0);
  f.tolerance_rel = j->get_double("tolerance_rel", 2e-3);
  const std::string model_dir = j->get_string("model_dir", "");
  f.model_dir = model_dir.empty() ? f.dir : std::string(MUSE_SOURCE_DIR) + "/" + model_dir;
  auto bin = read_file(f.dir + "/" + j->get_string("logits_file", "logits.f32"));
  EXPECT_TRUE(bin.ok()) << name;
  f.logits.resize(bin->size() / 4);
  std::memcpy(f.logits.data(), bin->data(), f.logits.size() * 4);
  EXPECT_EQ(int64_t(f.logits.size()), f.num_rows * f.vocab) << name;
  EXPECT_EQ(int64_t(f.prompt.size()) + int64_t(f.generated.size()) - 1, f.num_rows) << name;
  return f;
}

struct RunResult {
  std::vector<float> rows;  // every prompt row + every fed generated token
  std::vector<int32_t> ids;
};

// Opens f's model with `o`, prefills its prompt (in chunks of
// o.max_batch_tokens), then decodes `decode` tokens greedily, feeding each
// back, the last too when feed_last (a fixture's recorded rows stop before
// it). `what` names the run in failures.
inline RunResult run_greedy(const Fixture& f, const EngineOptions& o, int64_t decode, bool feed_last,
                            const std::string& what) {
  auto engine = Engine::open(f.model_dir, o);
  EXPECT_TRUE(engine.ok()) << what << ": " << (engine.ok() ? "" : engine.message());
  RunResult r;
  if (!engine.ok()) return r;
  auto session = (*engine)->new_session();
  EXPECT_TRUE(session.ok());
  auto logits = (*session)->feed(f.prompt, LogitsWanted::All);
  EXPECT_TRUE(logits.ok()) << (logits.ok() ? "" : logits.message());
  if (!logits.ok()) return r;
  r.rows = *logits;
  const int64_t V = (*engine)->config().vocab_size;
  for (int64_t k = 0; k < decode; ++k) {
    std::span<const float> last(r.rows.data() + r.rows.size() - size_t(V), size_t(V));
    r.ids.push_back(argmax(last, (*engine)->config().sampled_vocab_size));
    if (k + 1 == decode && !feed_last) break;
    auto next = (*session)->feed(std::span<const int32_t>(&r.ids.back(), 1));
    EXPECT_TRUE(next.ok());
    if (!next.ok()) break;
    r.rows.insert(r.rows.end(), next->begin(), next->end());
  }
  return r;
}

}  // namespace muse::fixtures
