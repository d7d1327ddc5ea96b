// DFlash parity with transformers 5.17 (issue 15, dspark.md "What the engine
// must do" 1): replays every draft block transformers' own
// DFlashTokenCandidateGenerator proposed for a tiny random Muse Glimmer
// target + MuseGlimmerAssistantModel (tests/data/fixtures/dflash, made by
// scripts/spec/dflash_reference.py on the GPU machine), from the same
// committed context:
//   - the target's taps (muse's residual stream after each target_layer_ids
//     layer) equal the hidden states the generator handed the assistant;
//   - the drafter, fed those reference taps, proposes the same blocks, and
//     its draft logits match at the reference's top ids (the drafter alone);
//   - fed muse's own taps, it proposes the same blocks again (end to end);
//   - muse's target picks the same greedy tokens as the reference run.
// Skips when the fixture is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>

#include "muse/core/json.h"
#include "muse/core/mapped_file.h"
#include "muse/engine/speculation.h"

namespace muse {
namespace {

const std::string kDir = "tests/data/fixtures/dflash";
// fp32 on both sides with different summation orders; the random networks
// amplify rounding, so these are a few times what the fixture measured
// (docs/speculative.md, "DFlash parity").
constexpr double kTapTolerance = 1e-4;    // of max |reference tap| over the compared rows
constexpr double kLogitTolerance = 1e-4;  // of the row's max |reference logit|

std::vector<int32_t> ints(const Json& array) {
  std::vector<int32_t> out;
  for (const Json& v : array.as_array()) out.push_back(int32_t(v.as_int()));
  return out;
}

struct Tally {
  int blocks = 0, rows = 0;
  int mismatched_rows_ref = 0, mismatched_rows_own = 0, greedy_mismatches = 0;
  double tap_rel = 0, logit_rel = 0;
};

// One reference run: commit the context block by block through muse's
// target, and draft each block twice (reference taps, muse's taps).
void replay_run(const Json& run, Engine& engine, const Drafter& drafter, Tally* tally) {
  const std::vector<int32_t> tokens = ints(*run.find("tokens"));
  const int64_t prompt_len = run.find("prompt_len")->as_int(), W = engine.tap_width();
  auto taps_bytes = read_file(kDir + "/" + run.find("taps_file")->as_string());
  ASSERT_TRUE(taps_bytes.ok()) << taps_bytes.message();
  const int64_t taps_rows = run.find("taps_rows")->as_int();
  ASSERT_EQ(int64_t(taps_bytes->size()), taps_rows * W * 4) << "taps file is not [taps_rows, tap_width] float32";
  std::vector<float> ref_taps(size_t(taps_rows * W));
  std::memcpy(ref_taps.data(), taps_bytes->data(), taps_bytes->size());

  auto session = engine.new_session();
  ASSERT_TRUE(session.ok()) << session.message();
  DraftContext from_ref = drafter.new_context(engine.max_model_len());
  DraftContext from_own = drafter.new_context(engine.max_model_len());
  const int64_t SV = drafter.config().sampling_vocab;
  int64_t fed = 0;
  for (const Json& b : run.find("blocks")->as_array()) {
    const int64_t a = b.find("anchor_pos")->as_int();
    ASSERT_EQ(b.find("context_first")->as_int(), fed) << "blocks must tile the context";
    ASSERT_EQ(fed + b.find("context_rows")->as_int(), a);
    ASSERT_LE(a, taps_rows);
    ASSERT_EQ(tokens[size_t(a)], int32_t(b.find("anchor")->as_int()));
    // Commit [fed, a): muse's taps against the reference's, and muse's greedy
    // choice at every generated position against the reference tokens.
    const int64_t n = a - fed;
    StepItem it{session->get(), std::span<const int32_t>(tokens).subspan(size_t(fed), size_t(n)), LogitsWanted::All};
    ASSERT_TRUE(engine.step(std::span<const StepItem>(&it, 1)).ok());
    const std::span<const float> own = engine.taps(0);
    ASSERT_EQ(int64_t(own.size()), n * W);
    double diff = 0, scale = 0;
    for (int64_t e = 0; e < n * W; ++e) {
      const float r = ref_taps[size_t(fed * W + e)];
      diff = std::max(diff, double(std::fabs(own[size_t(e)] - r)));
      scale = std::max(scale, double(std::fabs(r)));
    }
    tally->tap_rel = std::max(tally->tap_rel, diff / scale);
    const std::span<const float> logits = engine.logits(0);
    const int64_t V = engine.config().vocab_size;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t pos = fed + r;
      if (pos + 1 < prompt_len) continue;  // prompt rows predict prompt tokens
      const float* row = logits.data() + r * V;
      if (int32_t(std::max_element(row, row + V) - row) != tokens[size_t(pos + 1)]) ++tally->greedy_mismatches;
    }
    drafter.append_context(from_ref, ref_taps.data() + fed * W, n, fed);
    drafter.append_context(from_own, own.data(), n, fed);
    fed = a;

    // The drafts, and the logits at the reference's top ids.
    const std::vector<int32_t> want = ints(*b.find("drafts"));
    DraftBlock block_ref, block_own;
    drafter.draft(from_ref, tokens[size_t(a)], a, DraftSampling{}, &block_ref);
    drafter.draft(from_own, tokens[size_t(a)], a, DraftSampling{}, &block_own);
    ASSERT_EQ(block_ref.tokens.size(), want.size()) << "block at position " << a;
    std::vector<float> U;
    drafter.base_logits(from_ref, tokens[size_t(a)], a, &U);
    const JsonArray& top = b.find("top")->as_array();
    const JsonArray& max_abs = b.find("max_abs_logit")->as_array();
    for (size_t d = 0; d < want.size(); ++d) {
      if (block_ref.tokens[d] != want[d]) ++tally->mismatched_rows_ref;
      if (block_own.tokens[d] != want[d]) ++tally->mismatched_rows_own;
      double worst = 0;
      for (const Json& pair : top[d].as_array()) {
        const int64_t id = pair.as_array()[0].as_int();
        worst = std::max(worst, std::fabs(double(U[d * size_t(SV) + size_t(id)]) - pair.as_array()[1].as_double()));
      }
      tally->logit_rel = std::max(tally->logit_rel, worst / max_abs[d].as_double());
      ++tally->rows;
    }
    EXPECT_EQ(block_ref.tokens, want) << "block at position " << a << " (drafter from the reference taps)";
    EXPECT_EQ(block_own.tokens, want) << "block at position " << a << " (drafter from muse's taps)";
    ++tally->blocks;
  }
}

TEST(DFlashFixture, DraftBlocksMatchTransformers) {
  if (!file_exists(kDir + "/blocks.json"))
    GTEST_SKIP() << kDir << "/blocks.json is absent: make it with `python3 scripts/spec/dflash_reference.py --out " << kDir
                 << "` (needs torch + transformers 5.17)";
  auto text = read_file(kDir + "/blocks.json");
  ASSERT_TRUE(text.ok()) << text.message();
  auto j = Json::parse(*text);
  ASSERT_TRUE(j.ok()) << j.message();
  const JsonArray& runs = j->find("runs")->as_array();
  ASSERT_FALSE(runs.empty());
  // The reference's own checks: its taps are the outputs of the target_layer_ids
  // layers, and the generator's output is plain greedy decoding's.
  for (const Json& t : j->find("tap_sources")->as_array())
    EXPECT_EQ(t.find("best")->as_string(), "layer " + std::to_string(j->find("assistant_config")
                                                                          ->find("target_layer_ids")
                                                                          ->as_array()[size_t(t.find("slot")->as_int())]
                                                                          .as_int()) +
                                                 " output");
  int64_t longest = 0;
  for (const Json& r : runs) {
    EXPECT_TRUE(r.find("same_as_plain_greedy")->as_bool());
    longest = std::max<int64_t>(longest, int64_t(r.find("tokens")->size()));
  }

  SpeculativeConfig sc;
  sc.enabled = true;
  sc.method = SpecMethod::DFlash;
  sc.model = kDir + "/assistant";
  EngineOptions eo;
  eo.load.language_model_only = true;  // the save_pretrained target carries a tiny vision tower
  eo.max_model_len = longest + 8;
  ASSERT_TRUE(prepare_speculation(sc, kDir + "/target", &eo).ok());
  auto engine = Engine::open(kDir + "/target", eo);
  ASSERT_TRUE(engine.ok()) << engine.message();
  auto drafter = load_drafter(sc, **engine);
  ASSERT_TRUE(drafter.ok()) << drafter.message();
  ASSERT_EQ((*drafter)->config().sampling_vocab, (*engine)->config().vocab_size)
      << "the reference drafts over the whole vocabulary";

  Tally tally;
  for (const Json& run : runs) {
    replay_run(run, **engine, **drafter, &tally);
    if (HasFatalFailure()) return;
  }
  std::cout << "DFlash parity: " << runs.size() << " runs, " << tally.blocks << " blocks, " << tally.rows
            << " draft rows; mismatched rows " << tally.mismatched_rows_ref << " (reference taps), "
            << tally.mismatched_rows_own << " (muse's taps); greedy mismatches " << tally.greedy_mismatches
            << "; max tap diff " << tally.tap_rel << " of max |tap|, max logit diff " << tally.logit_rel
            << " of max |logit|\n";
  EXPECT_GT(tally.blocks, 0);
  EXPECT_EQ(tally.greedy_mismatches, 0);
  EXPECT_LE(tally.tap_rel, kTapTolerance);
  EXPECT_LE(tally.logit_rel, kLogitTolerance);
}

}  // namespace
}  // namespace muse
