# test_model_cuda: the whole model on the CUDA backend (fixtures against the
# fp32 reference with the bf16 reference's own gap as the yardstick, batch
# invariance, determinism). Labelled `cuda` (scripts/test-cuda.sh) and `unit`:
# without a GPU every test skips with a clear message.
if(TARGET test_model_cuda)
  set_tests_properties(model_cuda PROPERTIES LABELS "unit;cuda" TIMEOUT 900)
endif()
