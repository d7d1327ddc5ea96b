// `--device cuda` with more ranks than visible GPUs is refused by name,
// before anything loads; CPU ranks need no device.
#include <gtest/gtest.h>

#include "muse/backends/cuda/cuda_backend.h"
#include "muse/engine/engine.h"

namespace muse {
namespace {

TEST(ParallelDevices, CudaWithTooFewGpusIsRefusedByName) {
  EXPECT_TRUE(check_devices(Device::Cpu, 8).ok());
  Status s = check_devices(Device::Cuda, 64);
  ASSERT_FALSE(s.ok());
  if (cuda_backend_built() && cuda_device_count() > 0) {
    EXPECT_NE(s.message().find("--tensor-parallel-size 64 --device cuda: needs 64 GPUs"), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("sees " + std::to_string(cuda_device_count())), std::string::npos) << s.message();
  } else {
    EXPECT_NE(s.message().find("--device cuda"), std::string::npos) << s.message();
  }
  // The engine refuses the same before loading weights.
  EngineOptions o;
  o.backend.device = Device::Cuda;
  o.parallel = {64, true};
  auto e = Engine::open(std::string(MUSE_SOURCE_DIR) + "/models/muse-tiny", o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("--device cuda"), std::string::npos) << e.message();
}

}  // namespace
}  // namespace muse
