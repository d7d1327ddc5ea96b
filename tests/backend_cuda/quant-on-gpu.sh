#!/usr/bin/env bash
# One GPU-machine pass for quantized weights on CUDA (issue 13): the op tests
# (QuantTest.*), the model-level ones (CudaQuantModel.*), memcheck of the
# decoding kernels, and issue 13's decode figures (muse bench --device cuda,
# the Spark slice with 12 layers of quantized experts (FP8: 8 layers, as 12
# do not fit), batches 1, 16, 64) per format. Usage:
#   tests/backend_cuda/quant-on-gpu.sh [build dir with test_backend_cuda, test_model_cuda, muse]
# Logs go to $OUT (or ./gpu-logs); a summary is printed last. Each step is
# bounded; the whole pass takes a few minutes.
D=${1:-build-cuda}
source "$(dirname "$0")/gpu_pass.sh"
step quant_tests 240 "$D/test_backend_cuda" --gtest_filter='QuantTest.*'
step quant_model 120 "$D/test_model_cuda" --gtest_filter='Formats/CudaQuantModel.*'
step quant_memcheck 150 "$CS" --tool memcheck --error-exitcode 9 "$D/test_backend_cuda" \
  --gtest_filter='QuantTest.ProjectRowIsBatchInvariantAndDeterministic:QuantTest.UnsupportedInputsAreRefusedByName'
step quant_timing 150 "$D/test_backend_cuda" --gtest_also_run_disabled_tests --gtest_filter='*QuantTiming*'
for q in nvfp4 mxfp4 fp8 int4; do
  layers=12
  [ "$q" = fp8 ] && layers=8  # 12 layers of 8-bit experts (155 GB) do not fit the H200
  step "bench_$q" 150 "$D/muse" bench --device cuda --model spark-slice --layers "$layers" --quantization "$q" \
    --batch 1,16,64 --context 1024 --prefill-tokens 0 --runs 3
done
{
  echo "== tests"
  grep -hE "^\[  (PASSED|FAILED) |FAILED TEST|tests ran" "$OUT/quant_tests.log" "$OUT/quant_model.log" | head -30
  grep -h -A6 "Failure" "$OUT/quant_tests.log" "$OUT/quant_model.log" | head -60
  grep -hE "^\[ (nvfp4|mxfp4|fp8|int4) \]" "$OUT/quant_model.log"
  sed -n '/^op  /,$p' "$OUT/quant_tests.log" | head -30
  echo "== kernel timings (Spark shapes)"
  grep -E " us .* of HBM|^HBM" "$OUT/quant_timing.log"
  echo "== memcheck"
  grep -E "ERROR SUMMARY" "$OUT/quant_memcheck.log"
  for q in nvfp4 mxfp4 fp8 int4; do
    echo "== bench $q"
    grep -vE "^\s*$" "$OUT/bench_$q.log" | tail -8
  done
} | tee -a "$S"
