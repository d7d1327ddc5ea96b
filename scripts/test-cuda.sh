#!/usr/bin/env bash
# Builds muse with the CUDA backend (build dir build-cuda, sm_90) and runs
# every test labelled `cuda`. Where no GPU is present those tests skip with a
# clear message, so this also passes (honestly) on the CPU-only CI machine.
#
#   scripts/test-cuda.sh              build + ctest -L cuda
#   scripts/test-cuda.sh --sanitize   also compute-sanitizer memcheck and racecheck
#                                     on test_backend_cuda (needs a GPU)
# JOBS=N limits build parallelism (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-$(nproc)}
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(cd .. && pwd)}
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -B build-cuda -S . -DCMAKE_BUILD_TYPE=Release -DMUSE_CUDA=ON "${launcher[@]}"
cmake --build build-cuda -j"$jobs"
ctest --test-dir build-cuda -L cuda --output-on-failure

if [[ "${1:-}" == "--sanitize" ]]; then
  sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
  # A smaller run: the sanitizers slow kernels down ~100x.
  filter='-*LongContext*:*OddShapes*'
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool"
    "$sanitizer" --tool "$tool" --error-exitcode 1 build-cuda/test_backend_cuda --gtest_filter="$filter"
  done
fi
