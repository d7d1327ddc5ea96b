// Test-only: a deterministic stand-in for the model, behind the same
// interfaces as the real engine (generation_service.h), so the server's tests
// run without weights: in process (tests/server), and over HTTP through
// `muse_fake serve` (fake_serve.cc: `muse serve`'s flags and loop over this
// backend). Never linked into the `muse` binary.
//
// Vocabulary: ids 0..255 are bytes; 256.. are specials (below). The chat
// "template" writes a line per message; the "model" reads its own prompt and
// plans its answer:
//   - always a short reasoning block: <|think|>The user said: …<|/think|>
//   - a tool call (<|tool|>name\n{json args}<|/tool|>) when tools are given and
//     tool_choice is required/named, or auto and the last user message says
//     "call" / "weather" / "tool"; "parallel" calls two tools;
//   - otherwise words; "echo: TEXT" answers TEXT verbatim; "sleep:N" delays
//     the first token by N ms (a long prefill); "error:engine" fails mid-way.
// Greedy output depends only on the prompt; sampled output on (prompt, seed,
// choice index), or on a random seed when none is given.
#pragma once

#include <memory>
#include <string>

#include "muse/server/generation_service.h"

namespace muse::server {

namespace fake_vocab {
inline constexpr int32_t kBegin = 256;     // <|begin|>
inline constexpr int32_t kEot = 257;       // <|eot|>  (EOS)
inline constexpr int32_t kThink = 258;     // <|think|>
inline constexpr int32_t kEndThink = 259;  // <|/think|>
inline constexpr int32_t kTool = 260;      // <|tool|>
inline constexpr int32_t kEndTool = 261;   // <|/tool|>
inline constexpr int32_t kSize = 512;      // ids 262..511 exist but are unused
const char* special_text(int32_t id);      // nullptr for non-specials
}  // namespace fake_vocab

struct FakeModelOptions {
  int max_model_len = 4096;
  int max_num_seqs = 256;            // sequences decoded at once; more wait
  int max_num_batched_tokens = 2048; // prefill tokens per step (chunked prefill)
  int max_waiting = 4096;            // queued requests beyond which submit says Overloaded
  double step_ms = 2.0;              // one engine step (one token per running sequence)
  int load_ms = 0;                   // simulated loading time
  int64_t default_seed = 0;          // --seed
};

// Both halves of the fake, sharing one vocabulary.
ServeBackend make_fake_backend(const FakeModelOptions& options);

}  // namespace muse::server
