#!/usr/bin/env bash
# The explorer (docs/explorer.md) in headless Chromium against the native zero_estimate:
# tests/tools/explorer_check.py says what it checks. Without a browser or without the page (no em++
# to build it) it prints one SKIP line saying what is missing; scripts/install_deps.sh --explorer
# installs all three (make test runs it). Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
bin=${NZ_BIN_DIR:-build/bin}
page=${NZ_EXPLORER_DIR:-$bin/../explorer}
missing=""
command -v chromium >/dev/null 2>&1 || missing+=" chromium"
command -v chromedriver >/dev/null 2>&1 || missing+=" chromium-driver"
if [ -n "$missing" ]; then
  echo "NZRESULT SKIP explorer.browser (not installed:$missing; bash scripts/install_deps.sh --explorer installs it)"
  exit 0
fi
if [ ! -f "$page/zero_estimate.js" ]; then
  echo "NZRESULT SKIP explorer.browser (no page in $page: make explorer builds it, with em++ from emscripten," \
       "which bash scripts/install_deps.sh --explorer installs)"
  exit 0
fi
timeout -k 10 300 python3 tests/tools/explorer_check.py "$page" "$bin/zero_estimate" 300 ||
  echo "NZRESULT FAIL explorer.browser_run (explorer_check.py exited with $?)"
