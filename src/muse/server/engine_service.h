// GenerationService over the real engine: loads the Engine, runs the
// Scheduler (engine/scheduler.h), and turns each sequence's tokens into
// GenerationOutputs: streaming detokenization to whole UTF-8 characters, stop
// strings cut across token boundaries (never leaked; the stop string ends the
// sequence), the stop token's text left out (as vLLM), logprobs with the
// tokens' raw bytes. `muse serve` (backend_factory.cc) and `muse run`
// (tools/muse/cmd_run.cc) both generate through it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "muse/core/json.h"
#include "muse/engine/scheduler.h"
#include "muse/server/generation_service.h"
#include "muse/tokenizer/tokenizer.h"

namespace muse::server {

// GenerationRequest::constraint -> a factory of each sequence's TokenConstraint.
using ConstraintFactoryFn =
    std::function<Result<std::function<std::unique_ptr<TokenConstraint>()>>(const Json& constraint)>;

struct EngineServiceOptions {
  std::string model_dir;
  EngineOptions engine;
  SchedulerOptions scheduler;
  int64_t seed = 0;  // seeds the per-request seeds of requests that give none (0: random)
  // Detokenizes outputs and spells logprob tokens; empty (a checkpoint
  // without tokenizer files): token ids only, every text empty.
  Tokenizer tokenizer;
  // Empty: requests with a constraint are refused.
  ConstraintFactoryFn constraints;
};

class EngineService : public GenerationService {
 public:
  // The loaded engine's backend, e.g. "cpu (avx512, 16 threads)"; empty before load().
  virtual std::string backend_name() const = 0;
};

std::shared_ptr<EngineService> make_engine_service(EngineServiceOptions options);

}  // namespace muse::server
