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
"$here/install.sh" || exit $?
cd "$here"
exec node --test --test-reporter=spec "${files[@]}"
