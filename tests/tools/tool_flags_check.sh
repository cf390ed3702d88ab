#!/usr/bin/env bash
# The tools' command lines (common/input/tool_flags.h: consolidate, gpt_eval, gpt_sample, prune,
# generate): --help prints the tool's own usage whole and exits 0; a flag without its value, an
# unknown flag and a value out of range are one line (naming the flag, the value, what is expected)
# and exit 2, before anything is read. Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
source tests/lib/check.sh  # pass, fail, expect_error
check_suite tool_flags
bindir=${NZ_BIN_DIR:-build/bin}  # the programs (NZ_BIN_DIR: another build folder)

for tool in consolidate gpt_eval gpt_sample prune generate; do
  out=$(timeout 60 "$bindir/$tool" --help 2>&1)
  rc=$?
  if [ $rc = 0 ] && [ "$(head -1 <<<"$out" | cut -d' ' -f1-2)" = "usage: $tool" ]; then pass "${tool}_help"
  else fail "${tool}_help" "exit $rc, want 0 and 'usage: $tool' first; got: $(head -c 200 <<<"$out")"; fi
  flag=--model
  [ $tool = consolidate ] && flag=--ckpt  # its input
  expect_error "${tool}_no_value" "^error: $flag needs a value; see $tool --help$" timeout 60 "$bindir/$tool" $flag
  expect_error "${tool}_unknown" "^error: unknown flag --bogus; see $tool --help$" timeout 60 "$bindir/$tool" --bogus 1
done
# The usages are printed as written, not as printf formats: a percent sign is one.
if timeout 60 "$bindir/gpt_eval" --help | grep -q 'its last 10%, as the trainers split it'; then pass gpt_eval_help_percent
else fail gpt_eval_help_percent "gpt_eval --help lacks 'its last 10%, as'"; fi
if timeout 60 "$bindir/generate" --help | grep -q 'continues line b % lines$' &&
   timeout 60 "$bindir/generate" --help | grep -q 'randomly initialised tiny, small, gpt2 (timing only)$'; then
  pass generate_help_whole
else fail generate_help_whole "generate --help lacks its '%' line or the presets' names"; fi

# Values: whole numbers in range, 0 or 1, numbers in range.
expect_error eval_seq_zero "^error: --seq 0: expected a positive whole number$" timeout 60 "$bindir/gpt_eval" --seq 0
expect_error eval_windows_text "^error: --windows ten: expected a positive whole number$" timeout 60 "$bindir/gpt_eval" --windows ten
expect_error eval_embed_two "^error: --int8-embed 2: expected 0 or 1$" timeout 60 "$bindir/gpt_eval" --int8-embed 2
expect_error sample_length_big "^error: --length 1000001: expected a whole number in 1..1000000$" timeout 60 "$bindir/gpt_sample" --length 1000001
expect_error sample_temperature "^error: --temperature -1: expected a number from 0 (greedy) to 100$" timeout 60 "$bindir/gpt_sample" --temperature -1
expect_error generate_batch_zero "^error: --batch 0: expected a whole number from 1 to " timeout 60 "$bindir/generate" --batch 0
expect_error generate_cache_two "^error: --kv-cache 2: expected a whole number from 0 to 1$" timeout 60 "$bindir/generate" --kv-cache 2
expect_error generate_seed_huge "^error: --seed 99999999999999999999: expected a whole number from 0 to 2147483647$" \
  timeout 60 "$bindir/generate" --seed 99999999999999999999
