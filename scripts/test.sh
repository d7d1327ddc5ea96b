#!/usr/bin/env bash
# Builds muse and runs the whole test suite (what CI runs, via .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
cmake -B build -S . -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

# Sanitizer build (ASan + UBSan, LSan at exit), only the two programs the load
# test needs: 256 concurrent streams against the real engine on
# models/muse-tiny, ~30% of clients hanging up, a KV cache small enough to
# force preemption. Any sanitizer report makes `muse serve` exit non-zero and
# the test fail. (~6.5 min build + ~2 min run on 2 cores.)
cmake -B build-asan -S . -DCMAKE_BUILD_TYPE=Release -DMUSE_CUDA=OFF -DMUSE_SANITIZE=address,undefined
cmake --build build-asan -j"$jobs" --target muse server_load_test
build-asan/server_load_test --muse build-asan/muse --clients 256 --real --max-tokens 16 \
  -- --max-num-seqs 64 --max-model-len 512 --kv-cache-memory-bytes 8M --block-size 16
