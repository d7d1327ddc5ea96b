// Encode/decode from many threads at once, with two tokenizers alternating
// (the per-thread caches are keyed by tokenizer): results equal one thread's.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "muse/tokenizer/tokenizer.h"
#include "tiny_tokenizers.h"

namespace muse {
namespace {

TEST(Threads, ConcurrentEncodeMatchesSingleThread) {
  auto a = Tokenizer::from_json(testing::byte_level_tokenizer({{"t", "h"}, {"th", "e"}, {" ", "the"}}, {{"<|s|>"}}).dump());
  auto b = Tokenizer::from_json(testing::sentencepiece_tokenizer({"\xE2\x96\x81", "t", "h", "e"}, {{"t", "h"}, {"th", "e"}}).dump());
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) {
    std::string s;
    for (int k = 0; k < 1 + i % 17; ++k) s += (k % 3 ? " the" : "<|s|>the\xE4\xB8\xAD") + std::to_string(i * k);
    texts.push_back(s);
  }
  std::vector<std::vector<int32_t>> want_a, want_b;
  for (const auto& t : texts) {
    want_a.push_back(a->encode(t));
    want_b.push_back(b->encode(t));
  }
  std::vector<int> bad(8, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < 8; ++w) {
    threads.emplace_back([&, w] {
      for (int rep = 0; rep < 5; ++rep)
        for (size_t i = 0; i < texts.size(); ++i) {
          size_t k = (i + size_t(w) * 7) % texts.size();
          if (a->encode(texts[k]) != want_a[k]) ++bad[size_t(w)];
          if (b->encode(texts[k]) != want_b[k]) ++bad[size_t(w)];
          if (a->decode(want_a[k]) != texts[k]) ++bad[size_t(w)];
        }
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < 8; ++w) EXPECT_EQ(bad[size_t(w)], 0) << "thread " << w;
}

TEST(Threads, TooManyPreTokenizerStepsIsAnErrorNotADeepStack) {
  Json j = testing::byte_level_tokenizer({});
  Json steps = Json::array();
  for (int i = 0; i < 5000; ++i) steps.push_back(Json::parse(R"({"type": "WhitespaceSplit"})").value());
  Json seq = Json::object();
  seq.set("type", "Sequence");
  seq.set("pretokenizers", steps);
  j.set("pre_tokenizer", seq);
  auto t = Tokenizer::from_json(j.dump());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("more than 64 steps"), std::string::npos) << t.message();
}

}  // namespace
}  // namespace muse
