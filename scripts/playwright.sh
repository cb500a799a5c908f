#!/usr/bin/env bash
# Installs playwright-core from npm into target/ui-node (once; later calls
# reuse it) and prints the directory whose node_modules holds it. The /ui
# dashboard's test (bins/ember/tests/ui.rs) runs its driver with NODE_PATH
# there and Debian's chromium (no browser is downloaded: playwright-core
# ships none).
#
#   export EMBER_PLAYWRIGHT_DIR=$(scripts/playwright.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target="${CARGO_TARGET_DIR:-$PWD/target}"
dir="$target/ui-node"
version="${EMBER_PLAYWRIGHT_VERSION:-1.49.1}"
if [[ ! -f "$dir/node_modules/playwright-core/package.json" ]] ||
  ! grep -q "\"version\": \"$version\"" "$dir/node_modules/playwright-core/package.json"; then
  mkdir -p "$dir"
  npm install --silent --no-audit --no-fund --prefix "$dir" "playwright-core@$version" >&2
fi
echo "$dir"
