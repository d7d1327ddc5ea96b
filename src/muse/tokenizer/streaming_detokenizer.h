// Text as tokens arrive, for streaming responses.
//
//   muse::StreamingDetokenizer detok(tokenizer);
//   for (int32_t id : generated) send(detok.feed(id));
//   send(detok.flush());
//
// feed() returns only whole characters: bytes of a character split across
// byte-level or byte-fallback tokens are held until it completes (a byte
// that can never complete one becomes U+FFFD at once). The concatenated
// output equals tokenizer.decode(all ids) for every decoder chain real
// tokenizers use, with one exception: a run of byte-fallback tokens that is
// not valid UTF-8, which Hugging Face turns into one U+FFFD per token and we
// into one per maximal invalid subpart (valid characters in the run survive).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "muse/tokenizer/tokenizer.h"

namespace muse {

class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(Tokenizer tokenizer, bool skip_special_tokens = false);

  // Newly complete text after `id` (often empty).
  std::string feed(int32_t id);
  // Whatever is still held back (an incomplete character becomes U+FFFD);
  // the detokenizer is then ready for a new stream.
  std::string flush();
  void reset();

 private:
  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  // The last emitted token (context, so decoders that treat the first token
  // specially see it as not first) plus the tokens since.
  std::vector<int32_t> window_;
  size_t consumed_ = 0;  // bytes of the window's raw decode already emitted
  std::string raw_;      // the window's raw decode
};

}  // namespace muse
