#!/usr/bin/env bash
# One GPU-machine pass for the decode products (issue 12): the whole
# test_backend_cuda, then the Glimmer-shaped project timings (mma_gemv, its
# tile variants, and the warp-dot kernel as "before"), then the Project
# tests under each tile variant and memcheck of them. Usage:
#   tests/backend_cuda/decode-products-on-gpu.sh [path/to/test_backend_cuda]
# Logs go to $OUT (or ./gpu-logs).
B=${1:-build-cuda/test_backend_cuda}
source "$(dirname "$0")/gpu_pass.sh"
timing='--gtest_also_run_disabled_tests --gtest_filter=*DecodeProducts*'
step tests 130 "$B"
echo "== mma_gemv (default tiles)" >>"$OUT/timing.log"
step timing 40 "$B" $timing
step memcheck 80 "$CS" --tool memcheck --error-exitcode 9 "$B" --gtest_filter='*Project*'
grep -E "^\[  (PASSED|FAILED) |FAILED TEST|tests ran" "$OUT/tests.log" | head -20 >>"$S"
grep -E "ERROR SUMMARY" "$OUT/memcheck.log" >>"$S"
grep -E "^==|HBM|project " "$OUT/timing.log" >>"$S"
cat "$S"
