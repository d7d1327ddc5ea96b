// DFlash parity: replays the draft blocks transformers' DFlashTokenCandidateGenerator
// proposed for a tiny random Muse Glimmer + MuseGlimmerAssistantModel
// (scripts/spec/dflash_reference.py, run where torch and transformers 5.17
// are installed). Skips when the fixture is absent.
#include <gtest/gtest.h>

#include "muse/core/json.h"
#include "muse/core/mapped_file.h"
#include "muse/engine/speculation.h"

namespace muse {
namespace {

const std::string kDir = "tests/data/fixtures/dflash";

TEST(DFlashFixture, DraftBlocksMatchTransformers) {
  if (!file_exists(kDir + "/blocks.json"))
    GTEST_SKIP() << kDir << "/blocks.json is absent: make it with `python3 scripts/spec/dflash_reference.py --out " << kDir
                 << "` (needs torch + transformers 5.17)";
  auto text = read_file(kDir + "/blocks.json");
  ASSERT_TRUE(text.ok());
  auto j = Json::parse(*text);
  ASSERT_TRUE(j.ok()) << j.message();
  std::vector<int32_t> tokens;
  for (const Json& t : j->find("tokens")->as_array()) tokens.push_back(int32_t(t.as_int()));

  SpeculativeConfig sc;
  sc.enabled = true;
  sc.method = SpecMethod::DFlash;
  sc.model = kDir + "/assistant";
  EngineOptions eo;
  eo.max_model_len = int64_t(tokens.size()) + 8;
  ASSERT_TRUE(prepare_speculation(sc, kDir + "/target", &eo).ok());
  auto engine = Engine::open(kDir + "/target", eo);
  ASSERT_TRUE(engine.ok()) << engine.message();
  auto drafter = load_drafter(sc, **engine);
  ASSERT_TRUE(drafter.ok()) << drafter.message();
  auto session = (*engine)->new_session();
  ASSERT_TRUE(session.ok());
  DraftContext ctx = (*drafter)->new_context();
  int64_t fed = 0;
  int compared = 0;
  for (const Json& b : j->find("blocks")->as_array()) {
    const int64_t a = b.find("anchor_pos")->as_int();
    ASSERT_LT(a, int64_t(tokens.size()));
    if (a > fed) {  // commit the context up to the anchor, taps included
      StepItem it{session->get(), std::span<const int32_t>(tokens).subspan(size_t(fed), size_t(a - fed)), LogitsWanted::None};
      ASSERT_TRUE((*engine)->step(std::span<const StepItem>(&it, 1)).ok());
      (*drafter)->append_context(ctx, (*engine)->taps(0).data(), a - fed, fed);
      fed = a;
    }
    DraftBlock block;
    (*drafter)->draft(ctx, tokens[size_t(a)], a, DraftSampling{}, &block);
    std::vector<int32_t> want;
    for (const Json& d : b.find("drafts")->as_array()) want.push_back(int32_t(d.as_int()));
    block.tokens.resize(std::min(block.tokens.size(), want.size()));
    EXPECT_EQ(block.tokens, want) << "block at position " << a;
    ++compared;
  }
  EXPECT_GT(compared, 0);
}

}  // namespace
}  // namespace muse
