#!/usr/bin/env bash
# Installs the pinned npm packages of tests/server/js (npm ci, package-lock.json)
# when they are missing or older than the lock file. Several tests use this one
# node_modules (server_clients_js, server_clients_js_real, tiny_gates): ctest
# runs this script first as their setup fixture (server_js_npm), and a lock on
# the directory makes any two callers (ctest -j, a second build directory, a
# hand run of run.sh) install one after the other, never into the same
# node_modules at once.
# Exit: 0 installed or already up to date; 77 (ctest SKIP) when node/npm or
# the npm registry is unavailable.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIP: node/npm not installed"; exit 77
fi
up_to_date() {
  [ -d "$here/node_modules/openai" ] && [ -d "$here/node_modules/@anthropic-ai/sdk" ] &&
    [ ! "$here/package-lock.json" -nt "$here/node_modules" ]
}
exec 9<"$here"
flock 9
if up_to_date; then exit 0; fi
cd "$here"
if ! timeout 300 npm ci --no-audit --no-fund --loglevel=error; then
  echo "SKIP: could not install the npm packages (offline?)"; exit 77
fi
