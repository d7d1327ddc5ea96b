// Cost of a constrained decoding step: computing the allowed-token mask of
// the output grammars (chat/grammar_constraint.h) over a real vocabulary, in
// the states a generation spends its time in.
//
//   bench_grammar_bench TOKENIZER.json [--runs 9]
//
// For each state: median (min–max) milliseconds for one full mask with
// fill_mask (ids grouped by first byte), the same with one allows() per id,
// and how many ids are admitted (the two must agree). The mask is computed once per sampled token per
// constrained sequence, so these milliseconds add to the step time directly.
// The framing markers are the Muse spellings; a tokenizer without them (any
// public one) still gives the per-token cost, which is what is measured.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "muse/chat/grammar_constraint.h"
#include "muse/tokenizer/tokenizer.h"

namespace {

using namespace muse;
using namespace muse::chat;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class G>
void measure(const char* name, const std::shared_ptr<const G>& g, const std::shared_ptr<const GrammarVocabulary>& vocab,
             const std::vector<std::pair<bool, std::string>>& prefix, int runs) {
  GrammarConstraint<G> con(g, vocab);
  // Drive the constraint to the state: text goes in as single-byte ids when
  // the vocabulary has them (byte-level vocabularies do), markers by kind.
  auto id_of_byte = [&](char c) -> int32_t {
    for (size_t i = 0; i < vocab->bytes.size(); ++i)
      if (vocab->kind[i] == GrammarVocabulary::kText && vocab->bytes[i].size() == 1 && vocab->bytes[i][0] == c) return int32_t(i);
    return -1;
  };
  for (const auto& [marker, text] : prefix) {
    if (marker) {
      for (size_t i = 0; i < vocab->kind.size(); ++i)
        if (vocab->kind[i] == int8_t(text[0])) {
          con.accept(int32_t(i));
          break;
        }
      continue;
    }
    for (char c : text) {
      int32_t id = id_of_byte(c);
      if (id < 0) {
        std::fprintf(stderr, "the vocabulary has no single-byte token for '%c'\n", c);
        std::exit(2);
      }
      con.accept(id);
    }
  }
  const int32_t n = int32_t(vocab->kind.size());
  std::vector<double> per_id, mask_ms;
  std::vector<uint8_t> mask(static_cast<size_t>(n));
  size_t admitted = 0;
  for (int r = 0; r < runs; ++r) {
    auto t0 = Clock::now();
    size_t a = 0;
    for (int32_t id = 0; id < n; ++id) a += con.allows(id);
    per_id.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    t0 = Clock::now();
    con.fill_mask(mask);
    mask_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    size_t b = 0;
    for (uint8_t x : mask) b += x;
    if (a != b) {
      std::fprintf(stderr, "%s: fill_mask admits %zu ids, allows() %zu\n", name, b, a);
      std::exit(1);
    }
    admitted = a;
  }
  std::printf("%-36s fill_mask %7.3f ms (%.3f-%.3f)   per-id allows() %7.3f ms   admitted %7zu of %d\n", name,
              median(mask_ms), *std::min_element(mask_ms.begin(), mask_ms.end()),
              *std::max_element(mask_ms.begin(), mask_ms.end()), median(per_id), admitted, n);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_grammar_bench TOKENIZER.json [--runs N]\n");
    return 2;
  }
  int runs = 9;
  for (int i = 2; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--runs") runs = std::max(1, std::atoi(argv[i + 1]));
  auto tok = Tokenizer::from_file(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.message().c_str());
    return 2;
  }
  // The five framing markers take the vocabulary's last five ids (a public
  // tokenizer has no Muse specials; the per-token cost is what is measured).
  FramingFormat f = muse_glimmer_profile().framing;
  const int32_t last = tok->id_limit() - 1;
  f.start_id = last - 4;
  f.message_id = last - 3;
  f.end_message_id = last - 2;
  f.end_turn_id = last - 1;
  f.end_of_text_id = last;
  auto vocab = GrammarVocabulary::build(*tok, f, tok->id_limit());
  auto tools = *ToolSet::from_json(*Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
      "required": ["city"]}}}])"));
  auto tg = std::make_shared<const ToolCallGrammar>(*ToolCallGrammar::make(f, tools, {"get_weather"}, true));
  auto schema = *Json::parse(R"({"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array",
      "items": {"type": "string"}}, "n": {"type": "integer"}}, "required": ["name"], "additionalProperties": false})");
  auto jg = std::make_shared<const StructuredAnswerGrammar>(*StructuredAnswerGrammar::make(f, &schema));
  auto marker = [](GrammarMarker m) { return std::make_pair(true, std::string(1, char(m))); };
  auto text = [](std::string s) { return std::make_pair(false, std::move(s)); };
  std::printf("vocabulary: %d ids (%s)\n", int(vocab->kind.size()), argv[1]);
  measure("tool call: start (header)", tg, vocab, {}, runs);
  measure("tool call: reasoning body", tg, vocab, {text(" to=self"), marker(GrammarMarker::Message), text("Let me")}, runs);
  measure("tool call: string value", tg, vocab,
          {text(" to=get_weather"), marker(GrammarMarker::Message),
           text("<atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Par")},
          runs);
  measure("tool call: between parameters", tg, vocab,
          {text(" to=get_weather"), marker(GrammarMarker::Message),
           text("<atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Paris</atem:parameter>\n")},
          runs);
  measure("json schema: inside a string", jg, vocab, {text(" to=user"), marker(GrammarMarker::Message), text("{\"name\":\"Al")}, runs);
  measure("json schema: after a value (nested)", jg, vocab,
          {text(" to=user"), marker(GrammarMarker::Message), text("{\"tags\":[\"a\"")}, runs);
  return 0;
}
