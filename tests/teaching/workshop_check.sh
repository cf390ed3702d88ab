#!/usr/bin/env bash
# notebooks/00_workshop.md works as written: every `make TARGET` it (or the Dockerfile it points to)
# names is a target of the Makefile; every exercise it names (E=NAME) exists; every notebook it names
# is in notebooks/; every `make diff A=.. B=..` and every zero_estimate command in it runs; the slots
# follow each other from 0:00 to 2:00 and each one that runs a command says how long the command
# takes (a measured time, not a guess left blank). And `make notebooks`' script refuses a bad port or
# address in one line (exit 2) before installing anything. Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
plan=notebooks/00_workshop.md
res() { if [ "$2" = 0 ]; then echo "NZRESULT PASS workshop.$1"; else echo "NZRESULT FAIL workshop.$1 $3"; fi; }

# make targets named in the plan and in the Dockerfile
# (as commands: after a backtick, at the start of a line of a code block, after `nanozero` in a
# docker run line, or in the Dockerfile's CMD)
targets=$( { grep -o '\(`\|^ *\|nanozero \)make [a-z][a-z-]*' "$plan" Dockerfile 2>/dev/null
             grep -o '^CMD \["make", "[a-z-]*"' Dockerfile 2>/dev/null | tr -d '[",' | sed 's/CMD //'; } |
           sed 's/.*make //' | sort -u)
missing=""
for t in $targets; do grep -q "^$t:" Makefile || missing+="$t "; done
[ -f Dockerfile ] && [ -z "$missing" ]
res make_targets_exist $? "(not in the Makefile: ${missing:-none}; Dockerfile $([ -f Dockerfile ] && echo present || echo missing))"

# exercises named in the plan
known=$(make -s --no-print-directory exercise | awk 'NR > 1 { print $1 }')
missing=""
for e in $(grep -o ' E=[a-z][a-z0-9_]*\|`\(stage[0-9]\|offload\|comm\|bug\)_[a-z0-9_]*`' "$plan" | tr -d '` ' | sed 's/^E=//' | sort -u); do
  grep -qx "$e" <<<"$known" || missing+="$e "
done
[ -n "$known" ] && [ -z "$missing" ]; res exercises_exist $? "(unknown: $missing)"

# notebooks named in the plan
missing=""
for n in $(grep -o '0[0-9]_[a-z_]*\.ipynb' "$plan" | sort -u); do [ -f "notebooks/$n" ] || missing+="$n "; done
[ -z "$missing" ]; res notebooks_exist $? "(missing: $missing)"

# the diffs and the estimator commands, run as written
bad=""
while read -r a b; do
  out=$(make -s --no-print-directory diff A="$a" B="$b" 2>&1); rc=$?
  [ $rc = 0 ] && grep -q '^+' <<<"$out" || bad+="make diff A=$a B=$b (exit $rc); "
done < <(grep -o 'make diff A=[a-z0-9_]* B=[a-z0-9_]*' "$plan" | sed 's/make diff A=//; s/ B=/ /' | sort -u)
while read -r cmd; do
  read -ra argv <<<"$cmd"
  out=$(build/bin/zero_estimate "${argv[@]:1}" 2>&1); rc=$?
  [ $rc = 0 ] && [ -n "$out" ] || bad+="$cmd (exit $rc: $(head -1 <<<"$out")); "
done < <(grep -o 'zero_estimate [^`]*' "$plan" | sed 's/answers\.txt.*//' | grep -v -- '--check' | sort -u)
[ -z "$bad" ]; res commands_run $? "($bad)"

# the slots: contiguous from 0:00 to 2:00; a measured time in every slot that runs a command
python3 - "$plan" <<'PY'
import re, sys
rows = [l.split("|")[1:-1] for l in open(sys.argv[1]) if re.match(r"\|\s*\d:\d\d–\d:\d\d", l)]
def mins(t):
    h, m = t.split(":")
    return int(h) * 60 + int(m)
problems, end = [], 0
for cells in rows:
    start, stop = (mins(t) for t in cells[0].strip().split("–"))
    if start != end:
        problems.append(f"{cells[0].strip()} starts at {start} min, the slot before ends at {end}")
    end = stop
    runs = len(cells) > 2 and "`" in cells[2]
    timed = len(cells) > 3 and re.search(r"\d|instant", cells[3])
    if runs and not timed:
        problems.append(f"{cells[0].strip()} runs a command but gives no time for it")
if end != 120:
    problems.append(f"the slots end at {end} min, not 2:00")
ok = len(rows) >= 8 and not problems
print(f"NZRESULT {'PASS' if ok else 'FAIL'} workshop.slots_fill_two_hours_with_measured_times"
      + ("" if ok else f" ({len(rows)} slots; " + "; ".join(problems) + ")"))
PY

# make notebooks: bad input is one line and exit 2, before anything is installed
while read -r label bad_env; do
  out=$(env "$bad_env" bash scripts/notebooks.sh 2>&1); rc=$?
  [ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q '^error: ' <<<"$out"
  res "make_notebooks_refuses_$label" $? "($bad_env: exit $rc: $out)"
done <<'EOF'
a_port_that_is_not_a_number NOTEBOOK_PORT=eighty
a_port_past_65535 NOTEBOOK_PORT=70000
an_address_with_a_semicolon NOTEBOOK_IP=my;host
EOF
