#!/usr/bin/env bash
# The whole model on the GPU machine, one pass (issues 11 and 12), with
# binaries built elsewhere (BUILD, default build-gpu: muse, test_model_cuda,
# server_load_test, carried with the shared libraries the GPU machine lacks in
# BUILD/lib). Logs under $OUT; a summary last.
#   1. the reference's own bf16 gap per fixture (scripts/cuda/reference_bf16_gap.py),
#      copied beside each fixture so test_model_cuda can use it;
#   2. test_model_cuda (fixtures within 2x that gap, batch invariance, determinism),
#      and under compute-sanitizer memcheck (one fixture);
#   3. muse run --device cuda vs --device cpu on muse-tiny (greedy text);
#   4. the real-engine load test against muse serve --device cuda;
#   5. muse bench --device cuda (Glimmer 30B, Spark slice) and PyTorch's matmuls.
# STEPS selects (default "ref tests sanitize run load bench peers").
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build-gpu}
OUT=${OUT:-gpu-logs}
STEPS=${STEPS:-"ref tests sanitize run load bench peers"}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi -L | tee "$OUT/gpu.txt"
want() { [[ " $STEPS " == *" $1 "* ]]; }
step() {  # name, timeout, command...
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "$name: rc=$? ($((SECONDS - t0)) s)" | tee -a "$OUT/summary.txt"
}
if want ref; then
  step ref_gap 240 python3 scripts/cuda/reference_bf16_gap.py --out "$OUT/fixtures"
  for d in "$OUT"/fixtures/*/; do
    n=$(basename "$d")
    [ -f "$d/bf16_reference.json" ] && cp "$d/bf16_reference.json" "tests/data/fixtures/$n/"
  done
fi
want tests && step model_cuda 300 "$B/test_model_cuda"
want sanitize && step memcheck 240 "$CS" --tool memcheck --error-exitcode 9 "$B/test_model_cuda" \
  --gtest_filter='*spark_a*:*glimmer_a*'
if want run; then
  prompt="What is the capital of France?"
  "$B/muse" run --prompt "$prompt" --max-tokens 48 --device cpu >"$OUT/run_cpu.txt" 2>"$OUT/run_cpu.err"
  timeout 120 "$B/muse" run --prompt "$prompt" --max-tokens 48 --device cuda >"$OUT/run_cuda.txt" 2>"$OUT/run_cuda.err"
  echo "run_cuda: rc=$?" | tee -a "$OUT/summary.txt"
  if cmp -s "$OUT/run_cpu.txt" "$OUT/run_cuda.txt"; then echo "run: cuda text == cpu text" | tee -a "$OUT/summary.txt"
  else echo "run: cuda text differs from cpu text" | tee -a "$OUT/summary.txt"; fi
fi
want load && step load_cuda 300 "$B/server_load_test" --muse "$B/muse" --clients 64 --real --max-tokens 16 \
  -- --device cuda --max-num-seqs 32 --max-model-len 512
if want bench; then
  step bench_glimmer 420 "$B/muse" bench --device cuda --model glimmer-30b --batch 1,4,16,64 --context 1024,32768 \
    --tokens 8 --runs 3 --prefill-tokens 8192 --profile
  step bench_spark 300 "$B/muse" bench --device cuda --model spark-slice --batch 1,16,64 --context 1024 \
    --tokens 8 --runs 3 --prefill-tokens 0 --profile
fi
want peers && step peers 180 python3 scripts/cuda/peer_matmuls.py --model glimmer-30b --batch 1,16,64
echo "== summary"
cat "$OUT/summary.txt"
grep -h "^\[ cuda" "$OUT/model_cuda.log" 2>/dev/null
grep -hE "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$OUT/model_cuda.log" 2>/dev/null | head
grep -h "ERROR SUMMARY" "$OUT/memcheck.log" 2>/dev/null
tail -n 20 "$OUT/bench_glimmer.log" 2>/dev/null
tail -n 12 "$OUT/bench_spark.log" 2>/dev/null
grep -h "^batch" "$OUT/peers.log" 2>/dev/null
