# test_backend_cuda: labelled `cuda` (scripts/test-cuda.sh runs `ctest -L cuda`)
# and `unit` (the CPU suite runs it too, where every test skips with a clear
# message). It links only what it tests: the CUDA backend when it is built,
# plus the CPU backend (cross-check) and core/model; the per-op references
# are computed in double in the tests themselves.
if(TARGET test_backend_cuda)
  set_property(TARGET test_backend_cuda PROPERTY LINK_LIBRARIES muse_backend_cpu muse_model muse_core GTest::gtest GTest::gtest_main)
  if(TARGET muse_backend_cuda)
    target_link_libraries(test_backend_cuda PRIVATE muse_backend_cuda)
  endif()
  set_tests_properties(backend_cuda PROPERTIES LABELS "unit;cuda" TIMEOUT 900)
endif()
