#!/usr/bin/env bash
# Builds muse and starts the OpenAI/Anthropic-compatible server on the
# embedded default model (models/muse-tiny), on port 8000. Extra arguments go
# to `muse serve` (e.g. --port 8080, or a model directory).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -B build -S . -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)" --target muse
exec build/muse serve "$@"
