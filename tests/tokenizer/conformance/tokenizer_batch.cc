// Encodes and decodes every chunk of the conformance corpus with one
// tokenizer.json and writes one JSON line per chunk:
//   {"file": "chunk_000.txt", "ids": [...], "decoded": "...", "stream_ok": true}
// The node driver (tests/tokenizer/js/conformance.mjs) compares these with
// the JavaScript reference and with Hugging Face's recorded hashes.
//
//   tokenizer_batch TOKENIZER_JSON CORPUS_DIR OUT.jsonl
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/mapped_file.h"
#include "muse/tokenizer/streaming_detokenizer.h"
#include "muse/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: tokenizer_batch TOKENIZER_JSON CORPUS_DIR OUT.jsonl\n");
    return 2;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto tok = muse::Tokenizer::from_file(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "tokenizer_batch: %s\n", tok.message().c_str());
    return 1;
  }
  auto t1 = std::chrono::steady_clock::now();
  std::string dir = argv[2];
  auto manifest_text = muse::read_file(dir + "/manifest.json");
  if (!manifest_text.ok()) {
    std::fprintf(stderr, "tokenizer_batch: %s\n", manifest_text.message().c_str());
    return 1;
  }
  auto manifest = muse::Json::parse(*manifest_text);
  const muse::Json* chunks = manifest.ok() ? manifest->find("chunks") : nullptr;
  if (!chunks || !chunks->is_array()) {
    std::fprintf(stderr, "tokenizer_batch: %s/manifest.json has no chunks list\n", dir.c_str());
    return 1;
  }
  std::string out;
  double encode_s = 0;
  size_t bytes = 0, stream_mismatch = 0;
  for (const muse::Json& c : chunks->as_array()) {
    std::string file = c.get_string("file", "");
    auto text = muse::read_file(dir + "/" + file);
    if (!text.ok()) {
      std::fprintf(stderr, "tokenizer_batch: %s\n", text.message().c_str());
      return 1;
    }
    auto e0 = std::chrono::steady_clock::now();
    std::vector<int32_t> ids = tok->encode(*text);
    encode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count();
    bytes += text->size();
    std::string decoded = tok->decode(ids);
    // The streaming detokenizer, fed one id at a time, must give the same text.
    muse::StreamingDetokenizer stream(*tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.feed(id);
    streamed += stream.flush();
    bool stream_ok = streamed == decoded;
    if (!stream_ok) ++stream_mismatch;
    out += "{\"file\": " + muse::json_quote(file) + ", \"ids\": [";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ",";
      out += std::to_string(ids[i]);
    }
    out += "], \"decoded\": " + muse::json_quote(decoded) + ", \"stream_ok\": " + (stream_ok ? "true" : "false") + "}\n";
  }
  muse::Status st = muse::write_file(argv[3], out);
  if (!st.ok()) {
    std::fprintf(stderr, "tokenizer_batch: %s\n", st.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "tokenizer_batch: %s: load %.2f s, encode %.1f MB/s (%zu bytes), stream mismatches %zu\n",
               tok->describe().c_str(), std::chrono::duration<double>(t1 - t0).count(), bytes / 1e6 / encode_s, bytes,
               stream_mismatch);
  return 0;
}
