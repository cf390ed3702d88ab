#!/usr/bin/env bash
# The explorer (docs/explorer.md) against the native zero_estimate: its WebAssembly under Node, byte
# for byte (tests/tools/explorer_wasm_check.py), and the page in headless Chromium and Firefox
# (tests/tools/explorer_check.py: 300 random configurations in Chromium, 100 in Firefox). A browser that is not installed, or no page (no em++ to build it), is one SKIP line saying
# what is missing; scripts/install_deps.sh --explorer installs them all (make test runs it); a browser
# that is installed but does not start is one FAIL line saying why. Also install_deps.sh's explorer
# parts (apt locked, make explore's --explore) and make explore's server. Prints NZRESULT lines for
# tests/run_all.sh.
cd "$(dirname "$0")/../.."
bin=${NZ_BIN_DIR:-build/bin}
page=${NZ_EXPLORER_DIR:-$bin/../explorer}
res() { if [ "$2" = 0 ]; then echo "NZRESULT PASS explorer.$1"; else echo "NZRESULT FAIL explorer.$1 $3"; fi; }

# The browser checks run in a process group of their own (setsid: the Python, chromedriver, the browsers
# and what they start), which is ended on every way out of this script: a failed or killed check leaves
# nothing running. A process still in the group when its check has returned is a FAIL naming it.
groups=()
in_group() {  # in_group CMD...: runs CMD as its own process group; its exit code
  setsid "$@" &
  local g=$!
  groups+=("$g")
  wait "$g"
}
group_procs() {  # group_procs PGID: its live processes, "PID COMMAND" a line (from /proc: no procps needed)
  local g=$1 f line pid
  for f in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null <"$f" || continue
    set -- ${line##*) }  # after the command's name: state, ppid, pgrp, ...
    [ "$3" = "$g" ] && [ "$1" != Z ] || continue
    pid=${f#/proc/}; pid=${pid%/stat}
    echo "$pid $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | cut -c1-70)"
  done
}
alive() { local g; for g in "${groups[@]}"; do [ -n "$(group_procs "$g")" ] && return 0; done; return 1; }
end_groups() {  # SIGTERM (the Python closes its browsers), up to 5 s, then SIGKILL
  local g i
  for g in "${groups[@]}"; do kill -TERM -- "-$g" 2>/dev/null; done
  for i in $(seq 50); do alive || break; sleep 0.1; done
  for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
}
# the browsers' profiles and logs go to a folder of the check's own, removed on every exit
work=$(mktemp -d "${TMPDIR:-/tmp}/explorer_check.XXXXXX")
trap 'end_groups; rm -rf "$work"' EXIT
trap 'exit 143' TERM INT HUP
left_in_group() {  # left_in_group LABEL: FAIL if the last group still has a process, then ends them
  local g=${groups[-1]} left
  left=$(group_procs "$g" | paste -sd';')
  [ -z "$left" ]
  res "$1" $? "(still running after the check: $left)"
  end_groups
  return 0
}

# scripts/install_deps.sh's explorer parts, as root, with apt stood in for by one whose lock another
# process holds (every real command on PATH but the explorer's, which it then tries to install):
# apt's own message is shown and the lock named, not only "did not install"; and --explore (make
# explore) installs the page's compiler alone, without the notebooks' .venv or the browsers
deps=$(mktemp -d)
mkdir -p "$deps/scripts" "$deps/bin"
cp scripts/install_deps.sh "$deps/scripts/"
for c in bash sh env gcc g++ make mpicxx mpirun python3 timeout id ls mktemp grep head tail rm cmp cp cat dirname sed; do
  p=$(command -v "$c") && ln -s "$p" "$deps/bin/$c"
done
# (the trainers' packages, if this machine lacks any, install; the explorer's find the lock held)
printf '#!/bin/sh\ncase "$*" in *emscripten*|*chromium*|*firefox*) ;; *) exit 0 ;; esac\n%s\n%s\nexit 100\n' \
  'echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)" >&2' \
  'echo "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?" >&2' \
  >"$deps/bin/apt-get"
printf '#!/bin/sh\nexit 0\n' >"$deps/bin/apt-cache"
chmod +x "$deps/bin/apt-get" "$deps/bin/apt-cache"
if [ "$(id -u)" = 0 ]; then
  out=$(PATH=$deps/bin timeout 60 bash "$deps/scripts/install_deps.sh" --explorer 2>&1)
  held=$(grep -c '^E: Could not get lock' <<<"$out"); failed=$(grep -c 'did not install\|not installed' <<<"$out")
  [ "$failed" = 4 ] && [ "$held" -ge 1 ] && grep -q 'apt is locked by another process' <<<"$out"
  res install_deps_shows_apts_message_when_apt_is_locked $? "($held of apt's lock lines for $failed packages not installed: $(tr '\n' '|' <<<"$out" | cut -c1-300))"
  echo '# (no packages)' >"$deps/requirements.txt"
  out=$(PATH=$deps/bin timeout 60 bash "$deps/scripts/install_deps.sh" --explore 2>&1)
  grep -q '^installing for the explorer: emscripten$' <<<"$out" && ! grep -q 'venv' <<<"$out" && [ ! -e "$deps/.venv" ]
  res install_deps_for_make_explore_installs_the_compiler_alone $? "($(tr '\n' '|' <<<"$out" | cut -c1-300))"
else
  echo "NZRESULT SKIP explorer.install_deps (not root: install_deps.sh prints the apt command instead of running it)"
fi
rm -rf "$deps"

# make explore's server (scripts/explore.sh): bad settings are one line and exit 2, before serving
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
while read -r label bad_env dir; do
  out=$(env "$bad_env" timeout 10 bash scripts/explore.sh "$dir" 2>&1); rc=$?
  [ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q '^error: ' <<<"$out"
  res "make_explore_refuses_$label" $? "($bad_env $dir: exit $rc: $out)"
done <<EOF
a_port_that_is_not_a_number EXPLORE_PORT=eighty $page
an_address_with_a_semicolon EXPLORE_IP=my;host $page
a_folder_without_the_page EXPLORE_PORT=$port /nonexistent
EOF
# a port already taken: one line, exit 2, not the server's traceback
python3 -c 'import socket, sys, time; s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); time.sleep(8)' "$port" &
holder=$!
sleep 0.5
out=$(EXPLORE_PORT=$port timeout 10 bash scripts/explore.sh "$page" 2>&1); rc=$?
kill $holder 2>/dev/null; wait $holder 2>/dev/null
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q '^error: EXPLORE_PORT=.* in use' <<<"$out"
res make_explore_refuses_a_port_in_use $? "(exit $rc: $out)"
if [ ! -f "$page/zero_estimate.js" ]; then
  echo "NZRESULT SKIP explorer.page (no page in $page: make explorer builds it, with em++ from emscripten," \
       "which bash scripts/install_deps.sh --explorer installs)"
  exit 0
fi
# the WebAssembly under Node against the native build, byte for byte (no browser needed)
if command -v node >/dev/null 2>&1; then
  timeout -k 10 150 python3 tests/tools/explorer_wasm_check.py "$page" "$bin/zero_estimate" ||
    echo "NZRESULT FAIL explorer.wasm_run (explorer_wasm_check.py exited with $?)"
else
  echo "NZRESULT SKIP explorer.wasm (node not installed; emscripten brings it: bash scripts/install_deps.sh --explorer)"
fi
browsers=()
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  browsers+=(chromium:300)
else
  echo "NZRESULT SKIP explorer.chromium (chromium and chromium-driver not installed; bash scripts/install_deps.sh --explorer installs them)"
fi
if command -v firefox-esr >/dev/null 2>&1 || command -v firefox >/dev/null 2>&1; then
  browsers+=(firefox:100)
else
  echo "NZRESULT SKIP explorer.firefox (firefox-esr not installed; bash scripts/install_deps.sh --explorer installs it)"
fi
[ ${#browsers[@]} -gt 0 ] || exit 0
# a browser that cannot start: one line saying why, and nothing left running (the same path a machine
# takes where Chromium does not start; here TMPDIR names no folder, so it cannot make its profile)
if command -v chromedriver >/dev/null 2>&1; then
  said=$(mktemp)
  in_group env TMPDIR=/nonexistent/explorer_check timeout -k 5 120 python3 -c '
import sys; sys.path.insert(0, "tests/lib")
from webdriver import Browser, WebDriverError
try:
    Browser()
except WebDriverError as e:
    print(e); sys.exit(3)' >"$said" 2>&1; rc=$?
  out=$(cat "$said"); rm -f "$said"
  [ $rc = 3 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q 'chromium did not start.*TMPDIR=' <<<"$out"
  res a_browser_that_does_not_start_is_one_line $? "(exit $rc: $out)"
  left_in_group a_browser_that_does_not_start_leaves_nothing_running
fi
in_group env TMPDIR="$work" timeout -k 10 420 python3 tests/tools/explorer_check.py "$page" "$bin/zero_estimate" "${browsers[@]}" ||
  echo "NZRESULT FAIL explorer.browser_run (explorer_check.py exited with $?)"
left_in_group browsers_leave_nothing_running
exit 0
