#!/usr/bin/env bash
# Installs the Debian 12 packages muse builds and tests with. Idempotent: it
# only calls apt-get when something is missing. Run as root (or with sudo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config git ca-certificates
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
)

# Areas list extra Debian packages in scripts/deps/<area>.txt (one per line).
here=$(cd "$(dirname "$0")" && pwd)
for f in "$here"/deps/*.txt; do
  [ -f "$f" ] || continue
  while read -r p; do
    p=${p%%#*}; p=$(echo "$p" | tr -d '[:space:]')
    [ -n "$p" ] && packages+=("$p")
  done < "$f"
done

# Node.js drives the client-library tests; a node from elsewhere (nodesource,
# which bundles npm and conflicts with Debian's npm package) is fine.
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
