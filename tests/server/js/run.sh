#!/usr/bin/env bash
# Runs the client-library tests (default: clients.test.mjs, against
# `muse_fake serve`, the fake model: give build/muse_fake; real_engine.test.mjs
# and tests/tiny/gates.test.mjs start the real engine on models/muse-tiny:
# give build/muse).
# Usage: run.sh MUSE_BINARY [TEST_FILE...]. Exits 77 (ctest SKIP) when node/npm
# or the npm registry is unavailable.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export MUSE_BIN=${1:?usage: run.sh MUSE_BINARY [TEST_FILE...]}
shift
files=()
for f in "$@"; do files+=("$(cd "$(dirname "$f")" && pwd)/$(basename "$f")"); done
[ ${#files[@]} -eq 0 ] && files=("$here/clients.test.mjs")
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIP: node/npm not installed"; exit 77
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 18 ]; then echo "SKIP: node $major is older than 18"; exit 77; fi
cd "$here"
if [ ! -d node_modules/openai ] || [ ! -d node_modules/@anthropic-ai/sdk ] || [ package-lock.json -nt node_modules ]; then
  if ! timeout 300 npm ci --no-audit --no-fund --loglevel=error; then
    echo "SKIP: could not install the npm packages (offline?)"; exit 77
  fi
fi
exec node --test --test-reporter=spec "${files[@]}"
