# Sourced by the one-pass GPU-machine scripts in this folder (run-on-gpu.sh,
# decode-products-on-gpu.sh, quant-on-gpu.sh): from the repository root, the
# log folder $OUT (default ./gpu-logs) with its summary.txt ($S), the CUDA
# libraries on the path, compute-sanitizer as $CS, and `step`, which runs one
# bounded command into $OUT/NAME.log (appended: a script may write a header
# first or run a step name twice) and records its exit status and time.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
S="$OUT/summary.txt"
nvidia-smi -L | tee "$S"
step() {  # name, timeout, command...
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  timeout "$limit" "$@" >>"$OUT/$name.log" 2>&1
  echo "$name: rc=$? ($((SECONDS - t0)) s)" | tee -a "$S"
}
