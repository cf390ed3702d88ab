#!/usr/bin/env bash
# docs/faq.md's commands, run again: every ```console block is `$ command` lines, each followed by
# lines of its output; each command runs (bash, from the repository root, 300 s at most) and every
# quoted line must be a line of what it prints (tests/faq/doc_lines.py: runs of spaces compared as
# one, decimals within 0.2% since another CPU may round their last digits apart; `...` stands for
# lines left out). A quoted number the program no longer prints fails here, naming the line. A
# command that runs another suite of make test (bugs_check.sh) is compared by that suite, not run twice.
# Prints NZRESULT lines for tests/run_all.sh. Binaries: build/bin (the commands name them).
cd "$(dirname "$0")/../.."
[ -x build/bin/zero_estimate ] || { echo "NZRESULT FAIL faq.doc (no build/bin/zero_estimate: run make)"; exit 0; }
timeout -k 10 900 python3 - docs/faq.md <<'PY'
import re, subprocess, sys
sys.path.insert(0, "tests/faq")
from doc_lines import missing as missing_lines
text = open(sys.argv[1]).read()
blocks = re.findall(r"```console\n(.*?)```", text, re.S)
norm = lambda s: " ".join(s.split())
n = 0
for block in blocks:
    cmd, quoted = None, []
    for line in block.splitlines() + ["$ "]:  # a sentinel ends the last command
        if line.startswith("$ "):
            if cmd and "tests/faq/bugs_check.sh" in cmd:
                n += 1
                print(f"NZRESULT PASS faq.doc.command{n} ({cmd[:60]}: its quoted lines are compared by bugs_check.sh)")
            elif cmd:
                n += 1
                p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)
                missing = missing_lines(quoted, p.stdout.splitlines())
                ok = p.returncode == 0 and not missing and quoted
                print(f"NZRESULT {'PASS' if ok else 'FAIL'} faq.doc.command{n} ({cmd[:90]})" + ("" if ok else
                      f": exit {p.returncode}, {len(missing)} quoted line(s) not printed, first: {missing[:1]} {p.stderr[-200:]}"))
            cmd, quoted = line[2:].strip(), []
        elif line.strip() and line.strip() != "...":
            quoted.append(line)
print(f"NZRESULT {'PASS' if n >= 10 else 'FAIL'} faq.doc.every_answer_has_its_command ({n} commands)")
PY
