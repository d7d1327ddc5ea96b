// A step allocates nothing after warm-up: no heap allocation (operator new
// is counted while a step runs) and no backend buffer. This is what lets a
// GPU backend replay a recorded step: everything a step touches already
// exists.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "engine_test_util.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<uint64_t> g_allocations{0};
}  // namespace

// Counting replacements of the global allocation functions (this test
// binary only). Everything else passes through to malloc.
void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  const size_t al = size_t(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace muse::testing {
namespace {

class StepAllocations : public ::testing::TestWithParam<bool> {};

TEST_P(StepAllocations, DecodeAndPrefillStepsAllocateNothingAfterWarmUp) {
  EngineOptions o;
  o.max_sequences = 3;
  o.max_batch_tokens = 16;
  o.prefix_caching = true;  // block hashing and registration allocate nothing either
  o.kv_max_rollback = 2;    // so that blocks are registered (and sliding ones released) within the rounds
  auto e = tiny_engine(GetParam(), 2, o);
  ASSERT_TRUE(e);
  auto a = e->new_session(), b = e->new_session(), c = e->new_session();
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const auto pa = some_tokens(7, 1), pb = some_tokens(5, 2), pc = some_tokens(12, 3);
  std::vector<int32_t> next = {5, 6, 7};
  // Mixed steps (a prefill chunk with decode tokens) and decode steps, with
  // every logits mode; the first rounds grow whatever grows.
  auto round = [&](int i) -> bool {
    StepItem decode[] = {{a->get(), std::span<const int32_t>(&next[0], 1)},
                         {b->get(), std::span<const int32_t>(&next[1], 1), LogitsWanted::All}};
    StepItem mixed[] = {{a->get(), std::span<const int32_t>(&next[0], 1)},
                        {c->get(), std::span<const int32_t>(pc.data(), 4 + size_t(i % 3)), LogitsWanted::None},
                        {b->get(), std::span<const int32_t>(&next[1], 1)}};
    if (!e->step(i % 2 ? std::span<const StepItem>(decode) : std::span<const StepItem>(mixed)).ok()) return false;
    for (size_t k = 0; k < (i % 2 ? 2u : 3u); ++k) {
      auto l = e->logits(k);
      if (!l.empty()) next[k % 2] = int32_t(4 + (size_t(l[0] * 1000.0f) & 63));
    }
    return true;
  };
  ASSERT_TRUE((*a)->feed(pa).ok());
  ASSERT_TRUE((*b)->feed(pb).ok());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(round(i)) << i;
  const uint64_t buffers = e->backend().buffers_created();
  g_allocations = 0;
  g_counting = true;
  bool ok = true;
  for (int i = 6; i < 14 && ok; ++i) ok = round(i);
  g_counting = false;
  ASSERT_TRUE(ok);
  EXPECT_EQ(g_allocations.load(), 0u) << "heap allocations in 8 engine steps after warm-up";
  EXPECT_EQ(e->backend().buffers_created(), buffers) << "backend buffers created by a step";
}

INSTANTIATE_TEST_SUITE_P(Engine, StepAllocations, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "spark" : "glimmer"; });

}  // namespace
}  // namespace muse::testing
