// The backend factory: --device names, and a clear error (never a crash)
// when the CUDA backend is not built in or no GPU is present.
#include <gtest/gtest.h>

#include <vector>

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

// Profiling can be switched per step (a benchmark times its runs with it
// off and profiles one extra run): the report holds the steps run while it
// was on, and nothing else.
TEST(BackendFactory, ProfilingSwitchesBetweenSteps) {
  BackendOptions o;
  o.cpu.threads = 1;
  auto made = create_backend(o);
  ASSERT_TRUE(made.ok()) << made.message();
  Backend& b = **made;
  std::vector<float> v(64, 0.25f);
  auto t = b.import_weight(DType::F32, {2, 32}, v.data(), false);
  ASSERT_TRUE(t.ok()) << t.message();
  b.softcap(*t, 0.5f, 10.0f);
  ASSERT_TRUE(b.execute().ok());
  EXPECT_TRUE(b.profile_report().empty()) << "created with profiling off";
  b.set_profiling(true);
  b.swiglu(*t, *t, *t);
  ASSERT_TRUE(b.execute().ok());
  b.set_profiling(false);
  b.softcap(*t, 0.5f, 10.0f);
  ASSERT_TRUE(b.execute().ok());
  const std::string rep = b.profile_report();
  EXPECT_NE(rep.find("swiglu"), std::string::npos) << rep;
  EXPECT_EQ(rep.find("softcap"), std::string::npos) << "timed while profiling was off:\n" << rep;
  b.profile_reset();
  EXPECT_TRUE(b.profile_report().empty());
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
