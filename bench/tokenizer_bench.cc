// Single-thread tokenizer throughput on the conformance corpus.
//
//   bench_tokenizer_bench --corpus DIR [--runs 7] [--json OUT.json] NAME=tokenizer.json ...
//
// For each tokenizer: load time; one cold pass (fresh word cache, right after
// loading); then --runs timed passes over the whole corpus, encode and
// decode, reported as median (min–max) MB/s of input text. One thread, as
// scripts/tokenizer/hf_reference.py measures Hugging Face tokenizers.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/mapped_file.h"
#include "muse/tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  std::string corpus, json_out;
  int runs = 7;
  std::vector<std::pair<std::string, std::string>> tokenizers;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--corpus" && i + 1 < argc) corpus = argv[++i];
    else if (a == "--runs" && i + 1 < argc) runs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--json" && i + 1 < argc) json_out = argv[++i];
    else if (a.find('=') != std::string::npos) tokenizers.push_back({a.substr(0, a.find('=')), a.substr(a.find('=') + 1)});
    else {
      std::fprintf(stderr, "usage: %s --corpus DIR [--runs N] [--json OUT] NAME=tokenizer.json ...\n", argv[0]);
      return 2;
    }
  }
  if (corpus.empty() || tokenizers.empty()) {
    std::fprintf(stderr, "usage: %s --corpus DIR [--runs N] [--json OUT] NAME=tokenizer.json ...\n", argv[0]);
    return 2;
  }
  auto manifest_text = muse::read_file(corpus + "/manifest.json");
  if (!manifest_text.ok()) {
    std::fprintf(stderr, "%s\n", manifest_text.message().c_str());
    return 1;
  }
  auto manifest = muse::Json::parse(*manifest_text);
  std::vector<std::string> texts;
  size_t bytes = 0;
  for (const muse::Json& c : manifest->find("chunks")->as_array()) {
    auto t = muse::read_file(corpus + "/" + c.get_string("file", ""));
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.message().c_str());
      return 1;
    }
    bytes += t->size();
    texts.push_back(std::move(*t));
  }
  std::printf("corpus: %zu chunks, %zu bytes; %d timed runs each, one thread\n", texts.size(), bytes, runs);
  std::printf("%-12s %8s %10s %24s %24s %9s\n", "tokenizer", "load s", "cold MB/s", "encode MB/s med (min-max)",
              "decode MB/s med (min-max)", "ids");
  muse::Json results = muse::Json::object();
  for (const auto& [name, path] : tokenizers) {
    auto t0 = Clock::now();
    auto tok = muse::Tokenizer::from_file(path);
    double load_s = seconds_since(t0);
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), tok.message().c_str());
      return 1;
    }
    std::vector<std::vector<int32_t>> ids(texts.size());
    auto pass = [&] {
      auto s = Clock::now();
      for (size_t i = 0; i < texts.size(); ++i) {
        ids[i].clear();
        tok->encode_to(texts[i], ids[i]);
      }
      return bytes / 1e6 / seconds_since(s);
    };
    double cold = pass();
    std::vector<double> enc, dec;
    size_t n_ids = 0, decoded_bytes = 0;
    for (int r = 0; r < runs; ++r) enc.push_back(pass());
    for (const auto& v : ids) n_ids += v.size();
    for (int r = 0; r < runs; ++r) {
      auto s = Clock::now();
      decoded_bytes = 0;
      for (const auto& v : ids) decoded_bytes += tok->decode(v).size();
      dec.push_back(bytes / 1e6 / seconds_since(s));
    }
    auto [emin, emax] = std::minmax_element(enc.begin(), enc.end());
    auto [dmin, dmax] = std::minmax_element(dec.begin(), dec.end());
    char e_col[64], d_col[64];
    std::snprintf(e_col, sizeof e_col, "%.2f (%.2f-%.2f)", median(enc), *emin, *emax);
    std::snprintf(d_col, sizeof d_col, "%.1f (%.1f-%.1f)", median(dec), *dmin, *dmax);
    std::printf("%-12s %8.2f %10.2f %24s %24s %9zu\n", name.c_str(), load_s, cold, e_col, d_col, n_ids);
    std::fflush(stdout);
    muse::Json r = muse::Json::object();
    r.set("load_s", load_s);
    r.set("cold_mb_s", cold);
    muse::Json e = muse::Json::array(), d = muse::Json::array();
    for (double x : enc) e.push_back(x);
    for (double x : dec) d.push_back(x);
    r.set("encode_mb_s", e);
    r.set("encode_median_mb_s", median(enc));
    r.set("decode_mb_s", d);
    r.set("decode_median_mb_s", median(dec));
    r.set("ids", int64_t(n_ids));
    r.set("describe", tok->describe());
    results.set(name, r);
  }
  if (!json_out.empty()) {
    muse::Json all = muse::Json::object();
    all.set("corpus_bytes", int64_t(bytes));
    all.set("runs", runs);
    all.set("tokenizers", results);
    muse::Status st = muse::write_file(json_out, all.dump(muse::JsonDumpOptions::python(1, false)) + "\n");
    if (!st.ok()) std::fprintf(stderr, "%s\n", st.message().c_str());
  }
  return 0;
}
