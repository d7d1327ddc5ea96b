// The backend factory: --device names, and a clear error (never a crash)
// when the CUDA backend is not built in or no GPU is present.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "muse/backends/factory/backend_factory.h"

namespace muse::testing {
namespace {

TEST(BackendFactory, DeviceNames) {
  EXPECT_EQ(*parse_device("cpu"), Device::Cpu);
  EXPECT_EQ(*parse_device("cuda"), Device::Cuda);
  auto bad = parse_device("tpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("'tpu'"), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("cpu, cuda"), std::string::npos) << bad.message();
}

TEST(BackendFactory, CpuAlwaysWorks) {
  EXPECT_TRUE(check_device(Device::Cpu).ok());
  BackendOptions o;
  o.cpu.threads = 1;
  auto b = create_backend(o);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_NE((*b)->name().find("cpu"), std::string::npos);
}

TEST(BackendFactory, CudaIsAClearErrorWhereItCannotRun) {
  Status st = check_device(Device::Cuda);
  if (st.ok()) GTEST_SKIP() << "a CUDA GPU is present: the error path is not reachable here";
  const std::string want = cuda_backend_built() ? "no CUDA GPU" : "built without the CUDA backend";
  EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
  BackendOptions o;
  o.device = Device::Cuda;
  auto b = create_backend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.message().find("--device cuda"), std::string::npos) << b.message();
  // The engine reports it too, and nothing is left half-built.
  EngineOptions eo;
  eo.backend.device = Device::Cuda;
  ModelConfig c = tiny_config(true);
  auto e = Engine::create(c, std::make_unique<RandomWeightSource>(c, RandomWeightOptions{}), eo);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("--device cuda"), std::string::npos) << e.message();
}

}  // namespace
}  // namespace muse::testing
