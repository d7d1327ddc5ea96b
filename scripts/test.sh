#!/usr/bin/env bash
# Builds muse and runs the whole test suite (what CI runs, via .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase prints its time, so CI logs show where the minutes go (budget: the
# whole script under 20 minutes on 2 cores; figures in bench/NOTES.md "Test suite").
phase_start=$SECONDS
phase() {
  echo "test.sh: $1 took $((SECONDS - phase_start)) s (total $((SECONDS / 60)) min $((SECONDS % 60)) s)"
  phase_start=$SECONDS
}
scripts/install-deps.sh
phase "install-deps"
jobs=$(nproc)
cmake -B build -S . -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
phase "release build"
ctest --test-dir build --output-on-failure -j"$jobs"
phase "ctest"

# Sanitizer build (ASan + UBSan, LSan at exit), only the two programs the load
# test needs: 256 concurrent streams against the real engine on
# models/muse-tiny, ~30% of clients hanging up, a KV cache small enough to
# force preemption. Any sanitizer report makes `muse serve` exit non-zero and
# the test fail. (~6.5 min build + ~2 min run on 2 cores.)
# -O1: the sanitizers need no more, and the build is the slowest phase of the
# script (the optimizer is most of an instrumented -O3 compile).
cmake -B build-asan -S . -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" -DMUSE_CUDA=OFF \
  -DMUSE_SANITIZE=address,undefined
cmake --build build-asan -j"$jobs" --target muse server_load_test
phase "asan build"
build-asan/server_load_test --muse build-asan/muse --clients 256 --real --max-tokens 16 \
  -- --max-num-seqs 64 --max-model-len 512 --kv-cache-memory-bytes 8M --block-size 16
phase "asan load test"
