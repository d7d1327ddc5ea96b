#!/usr/bin/env bash
# One complete pass on the GPU machine with a test binary built elsewhere
# (build-cuda/test_backend_cuda, carried): the tests, the decode timings, and
# compute-sanitizer memcheck, racecheck, initcheck and synccheck. Logs go to
# $OUT (or ./gpu-logs); a summary is printed last.
B=${1:-build-cuda/test_backend_cuda}
source "$(dirname "$0")/gpu_pass.sh"
step tests 110 "$B"
step timing 60 "$B" --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_DecodeShapes*'
small='-*LongContext*:*Timing*'
step memcheck 120 "$CS" --tool memcheck --error-exitcode 9 "$B" --gtest_filter='-*Timing*'
step racecheck 60 "$CS" --tool racecheck --error-exitcode 9 "$B" --gtest_filter="$small:*OddShapes*"
step initcheck 30 "$CS" --tool initcheck --error-exitcode 9 "$B" --gtest_filter="$small:*OddShapes*"
step synccheck 30 "$CS" --tool synccheck --error-exitcode 9 "$B" --gtest_filter="$small:*OddShapes*"
echo "== tests"
grep -E "^\[  (PASSED|FAILED) |tests ran|FAILED TEST" "$OUT/tests.log" | head -30
sed -n '/^op  /,$p' "$OUT/tests.log" | head -40
grep -B3 -A8 "Failure" "$OUT/tests.log" | head -60
echo "== timing"
grep -E " us " "$OUT/timing.log"
for t in memcheck racecheck initcheck synccheck; do
  echo "== $t"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/$t.log" | head -5
done
cat "$OUT/summary.txt"
