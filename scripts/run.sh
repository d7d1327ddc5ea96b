#!/usr/bin/env bash
# Builds muse and starts it on the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -B build -S . -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)" --target muse
exec build/muse run "$@"
