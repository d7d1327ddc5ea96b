// GenerationService over the real engine: loads the Engine, runs the
// Scheduler (engine/scheduler.h), and turns each sequence's tokens into
// GenerationOutputs: streaming detokenization to whole UTF-8 characters, stop
// strings cut across token boundaries (never leaked; the stop string ends the
// sequence), the stop token's text left out (as vLLM), logprobs with the
// tokens' raw bytes.
#pragma once

#include <memory>
#include <string>

#include "muse/engine/scheduler.h"
#include "muse/server/generation_service.h"
#include "muse/server/muse_adapter.h"

namespace muse::server {

struct EngineServiceOptions {
  std::string model_dir;
  EngineOptions engine;
  SchedulerOptions scheduler;
  int64_t seed = 0;  // seeds the per-request seeds of requests that give none (0: random)
};

std::shared_ptr<GenerationService> make_engine_service(EngineServiceOptions options,
                                                       std::shared_ptr<const MuseModelAdapter> adapter);

}  // namespace muse::server
