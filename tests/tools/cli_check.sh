#!/usr/bin/env bash
# Bad input: every case must exit with code 2 and print one line naming the problem, before any
# work is done; good input must not. Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
source tests/lib/check.sh  # pass, fail, expect_error
check_suite cli
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'too short' >"$tmp/short.txt"
head -c 100 /dev/urandom >"$tmp/bad.model"
bindir=${NZ_BIN_DIR:-build/bin}  # the programs (NZ_BIN_DIR: another build folder)
bin=$bindir/stage0_ddp

expect_error heads_not_dividing "--heads 5" $bin --preset tiny --heads 5
expect_error seq_too_long "longer than the model's context" $bin --preset tiny --seq 1000
expect_error zero_batch "--batch 0" $bin --batch 0
expect_error negative_steps "--steps -3" $bin --steps -3
expect_error not_a_number "--lr abc" $bin --lr abc
expect_error unknown_preset "unknown preset" $bin --preset huge
expect_error unknown_precision "unknown precision" $bin --precision fp8
expect_error unknown_attention "unknown attention" $bin --attention sparse
expect_error unknown_flag "unknown flag --bogus" $bin --bogus 1
expect_error loss_scale_without_fp16 "for --precision fp16 only" $bin --loss-scale 1024
expect_error loss_scale_below_min "below --loss-scale-min" $bin --precision fp16 --loss-scale 2 --loss-scale-min 4
expect_error loss_scale_backoff_range "--loss-scale-backoff 2" $bin --precision fp16 --loss-scale-backoff 2
expect_error missing_data "cannot read" $bin --data /nonexistent/file.txt
expect_error short_data "shorter than one batch" $bin --preset tiny --seq 16 --data "$tmp/short.txt"
expect_error missing_value "needs a value" $bin --steps
expect_error unknown_device "unknown device" $bin --device tpu
# a rung whose line in stages.txt says cpu-only (zeropp) refuses the GPU in one line
expect_error cpu_only_rung_on_cuda "zeropp runs on the CPU backend only" $bindir/zeropp --device cuda
expect_error eval_bad_model "not a nanoZeRO model file" $bindir/gpt_eval --model "$tmp/bad.model" --data data/corpus.txt
expect_error eval_missing_model "cannot open" $bindir/gpt_eval --model "$tmp/none.model" --data data/corpus.txt
expect_error sample_no_model "--model PATH is required" $bindir/gpt_sample --prompt hi

# A truncated model file: clear error, and the good file next to it is untouched.
mpirun -np 1 $bin --preset tiny --seq 16 --steps 1 --quiet --eval-windows 2 --save-model "$tmp/good.model" >/dev/null 2>&1
head -c 200 "$tmp/good.model" >"$tmp/cut.model"
expect_error eval_truncated_model "truncated" $bindir/gpt_eval --model "$tmp/cut.model" --data data/corpus.txt
sum_before=$(md5sum <"$tmp/good.model")
expect_error save_unwritable "cannot write" $bin --preset tiny --seq 16 --steps 1 --quiet --eval-windows 2 --save-model /nonexistent/dir/m.model
if [ "$sum_before" = "$(md5sum <"$tmp/good.model")" ]; then echo "NZRESULT PASS cli.good_model_untouched"; else echo "NZRESULT FAIL cli.good_model_untouched"; fi

# --help lists every flag the issues rely on.
help=$($bin --help)
missing=""
for f in --preset --layers --dim --heads --batch --seq --accum --steps --lr --warmup --weight-decay --clip \
         --seed --precision --data --log-json --eval-every --save-model --device --ckpt-dir --ckpt-every \
         --ckpt-keep --resume --watchdog --loss-scale --loss-scale-window --loss-scale-hysteresis \
         --loss-scale-backoff --loss-scale-min --ckpt-overwrite --resume-changed; do
  grep -q -- "$f" <<<"$help" || missing+=" $f"
done
if [ -z "$missing" ]; then echo "NZRESULT PASS cli.help_lists_flags"; else echo "NZRESULT FAIL cli.help_lists_flags (missing:$missing)"; fi

# ---- outputs: checked before training; nothing already written is damaged ----
tiny="--preset tiny --seq 16 --steps 1 --quiet --eval-windows 2"
unchanged() {  # name, file, md5 before
  if [ "$(md5sum <"$2")" = "$3" ]; then echo "NZRESULT PASS cli.$1"; else echo "NZRESULT FAIL cli.$1 ($2 was changed)"; fi
}
cp data/corpus.txt "$tmp/corpus.txt"
sum=$(md5sum <"$tmp/corpus.txt")
expect_error save_model_is_data "the same file" $bin $tiny --data "$tmp/corpus.txt" --save-model "$tmp/corpus.txt"
expect_error save_model_is_data_by_another_name "the same file" $bin $tiny --data "$tmp/corpus.txt" --save-model "$tmp/./corpus.txt"
unchanged data_untouched "$tmp/corpus.txt" "$sum"
sum=$(md5sum <"$tmp/good.model")
expect_error log_json_is_save_model "the same file" $bin $tiny --save-model "$tmp/good.model" --log-json "$tmp/good.model"
unchanged model_untouched_by_log_json "$tmp/good.model" "$sum"
mkdir -p "$tmp/adir"
expect_error save_model_is_a_directory "a directory" $bin $tiny --save-model "$tmp/adir"
expect_error save_model_ends_in_slash "a directory" $bin $tiny --save-model "$tmp/new/"
expect_error log_json_is_a_directory "a directory" $bin $tiny --log-json "$tmp/adir"
expect_error ckpt_dir_is_a_file "not a directory" $bin $tiny --ckpt-dir "$tmp/good.model"
expect_error ckpt_dir_unmakeable "cannot be made" $bin $tiny --ckpt-dir /nonexistent/a/b
expect_error ckpt_every_without_dir "needs --ckpt-dir" $bin $tiny --ckpt-every 2
expect_error resume_auto_without_dir "needs --ckpt-dir" $bin $tiny --resume auto
expect_error resume_missing "not a directory" $bin $tiny --resume "$tmp/none"
expect_error resume_not_a_checkpoint "no checkpoints" $bin $tiny --resume "$tmp/adir"
# nothing written into the checkpoint directory but checkpoints, nor into the one resumed from;
# however spelled, made yet or not (checked before training: one line, nothing left behind)
expect_error save_model_is_ckpt_dir "--save-model $tmp/ck: is --ckpt-dir $tmp/ck" $bin $tiny --ckpt-dir "$tmp/ck" --save-model "$tmp/ck"
if ls "$tmp"/ck* >/dev/null 2>&1; then echo "NZRESULT FAIL cli.save_model_is_ckpt_dir_leaves_nothing ($(ls -d "$tmp"/ck*))"
else echo "NZRESULT PASS cli.save_model_is_ckpt_dir_leaves_nothing"; fi
expect_error log_json_is_ckpt_dir "is --ckpt-dir" $bin $tiny --ckpt-dir "$tmp/adir/../ck2" --log-json "$tmp/ck2"
mkdir -p "$tmp/ckd" && cp data/corpus.txt "$tmp/ckd/c.txt"
expect_error log_json_inside_ckpt_dir "lies inside --ckpt-dir" $bin $tiny --ckpt-dir "$tmp/ckd" --log-json "$tmp/ckd/r.json"
ln -s "$tmp/ckd" "$tmp/alias"
expect_error save_model_inside_ckpt_dir_by_symlink "lies inside --ckpt-dir" $bin $tiny --ckpt-dir "$tmp/ckd" --save-model "$tmp/alias/m.model"
expect_error data_inside_ckpt_dir "--data $tmp/ckd/c.txt: lies inside --ckpt-dir" $bin $tiny --ckpt-dir "$tmp/ckd" --data "$tmp/ckd/c.txt"
if [ "$(ls "$tmp/ckd")" = c.txt ]; then echo "NZRESULT PASS cli.refused_ckpt_dir_untouched"
else echo "NZRESULT FAIL cli.refused_ckpt_dir_untouched ($(ls "$tmp/ckd"))"; fi

# ---- every input is safe from every output: --prune-mask and --config as well as --data ----
# An output (--save-model, --log-json) naming an input file, or --ckpt-dir holding it, is refused
# before training, on each rung that reads them; the input keeps its bytes. The inputs are real (a
# pruned model, a config for the rung), so a run that did not refuse would overwrite them.
$bindir/prune --model "$tmp/good.model" --out "$tmp/in.nzp" --sparsity 0.5 >/dev/null 2>&1
for stage in stage2 stage3; do
  echo "{\"zero_optimization\": {\"stage\": ${stage#stage}}}" >"$tmp/in.json"
  for input in prune-mask config; do
    [ $input = prune-mask ] && file=$tmp/in.nzp || file=$tmp/in.json
    sum=$(md5sum <"$file")
    for output in save-model log-json; do
      expect_error "${input}_is_${output}_$stage" "--$output $file and --$input $file: the same file" \
        $bindir/$stage $tiny --$input "$file" --$output "$file"
      unchanged "${input}_untouched_by_${output}_$stage" "$file" "$sum"
    done
    mkdir -p "$tmp/inck" && cp "$file" "$tmp/inck/"
    expect_error "${input}_inside_ckpt_dir_$stage" "--$input $tmp/inck/${file##*/}: lies inside --ckpt-dir" \
      $bindir/$stage $tiny --$input "$tmp/inck/${file##*/}" --ckpt-dir "$tmp/inck"
    rm -rf "$tmp/inck"
  done
done

# ---- the model file: a checksum, and a header checked before anything is allocated ----
# (layout: docs/files.md, "Model file": magic 8, version 4, five int32 at 12..31, the count at 32..39)
patch() {  # file, offset, python expression for the bytes
  python3 -c "import sys,struct; f=open(sys.argv[1],'r+b'); f.seek(int(sys.argv[2])); f.write($3); f.close()" "$1" "$2"
}
cp "$tmp/good.model" "$tmp/flip.model"
python3 -c "import sys; f=open(sys.argv[1],'r+b'); f.seek(1000); b=f.read(1); f.seek(1000); f.write(bytes([b[0]^0x40])); f.close()" "$tmp/flip.model"
expect_error model_flipped_bit "checksum mismatch" $bindir/gpt_eval --model "$tmp/flip.model" --data data/corpus.txt
head -c 40 "$tmp/good.model" >"$tmp/huge.model"
patch "$tmp/huge.model" 32 "struct.pack('<Q', 50000000000000)"
expect_error model_huge_count "inconsistent header" $bindir/gpt_eval --model "$tmp/huge.model" --data data/corpus.txt
cp "$tmp/good.model" "$tmp/vocab16.model"
patch "$tmp/vocab16.model" 12 "struct.pack('<i', 16)"
expect_error model_vocab_16 "inconsistent header" $bindir/gpt_sample --model "$tmp/vocab16.model" --prompt hi
expect_error model_not_a_file "not a regular file" $bindir/gpt_eval --model "$tmp/adir" --data data/corpus.txt
# a NaN weight under a valid checksum (what a diverged run saves): refused by every reader, named
cp "$tmp/good.model" "$tmp/nan.model"
python3 tests/lib/craft_files.py nan_model "$tmp/nan.model" 9000  # wte is 256 x 32 = 8192 weights: wpe[808]
expect_error eval_nan_weight "weight 9000 (unit embed, wpe\[808\]) is nan" $bindir/gpt_eval --model "$tmp/nan.model" --data data/corpus.txt --windows 4
expect_error sample_nan_weight "weight 9000 (unit embed, wpe\[808\]) is nan" $bindir/gpt_sample --model "$tmp/nan.model" --prompt hi
# A version 1 file (no checksum) still loads, with a note, and scores exactly as the version 2 file.
head -c -4 "$tmp/good.model" >"$tmp/v1.model"
patch "$tmp/v1.model" 8 "struct.pack('<I', 1)"
v2=$($bindir/gpt_eval --model "$tmp/good.model" --data data/corpus.txt --windows 4 2>&1)
v1=$($bindir/gpt_eval --model "$tmp/v1.model" --data data/corpus.txt --windows 4 2>&1)
if grep -q "version 1 model file" <<<"$v1" && [ "$(grep -v '^note' <<<"$v1")" = "$v2" ]; then echo "NZRESULT PASS cli.model_version_1_loads"
else echo "NZRESULT FAIL cli.model_version_1_loads (v1: $v1 / v2: $v2)"; fi

# ---- flags and data ----
expect_error quiet_with_value "--quiet takes no value" $bin $tiny --quiet=1
expect_error batch_auto_cpu_no_budget "--batch auto on the CPU needs --memory-budget" $bin $tiny --device cpu --batch auto
expect_error batch_auto_no_gpu "no GPU memory to measure" env CUDA_VISIBLE_DEVICES= $bin $tiny --batch auto
expect_error batch_auto_bad_size "--memory-budget 12XB: expected a size in bytes" $bin $tiny --batch auto --memory-budget 12XB
expect_error batch_auto_too_small "a micro-batch of 1 needs" $bin $tiny --batch auto --memory-budget 10kB
expect_error budget_without_auto "it sizes --batch auto" $bin $tiny --memory-budget 1GB
expect_error global_batch_and_accum "give one of them" $bin $tiny --global-batch 8 --accum 2
expect_error global_batch_not_multiple "not a multiple of --batch 3" $bin $tiny --batch 3 --global-batch 8
expect_error estimate_fit_bad_size "--fit 1QB: expected a size in bytes" $bindir/zero_estimate --fit 1QB
expect_error estimate_fit_raw "--fit needs a model shape" $bindir/zero_estimate --params 7B --fit 80GB
expect_error estimate_zeropp_pipeline "--zeropp with --pipeline" $bindir/zero_estimate --preset tiny --zeropp 2 --pipeline 2 --world 4
expect_error estimate_zeropp_fit "--fit with --zeropp" $bindir/zero_estimate --preset tiny --zeropp 2 --fit 1GB --world 4
expect_error estimate_tensor_checkpointing "--tensor with --activation-checkpointing" $bindir/zero_estimate --preset tiny --tensor 2 --activation-checkpointing
expect_error checkpointing_with_value "--activation-checkpointing takes no value" $bin $tiny --activation-checkpointing=yes
expect_error equals_bad_value "--steps abc" $bin $tiny --steps=abc
out=$(mpirun -np 1 $bin --preset tiny --seq 16 --quiet --eval-windows 2 --steps=2 --batch=2 2>&1)
if [ $? = 0 ] && grep -q "^done: 2 steps" <<<"$out"; then echo "NZRESULT PASS cli.equals_form_parsed"
else echo "NZRESULT FAIL cli.equals_form_parsed ($out)"; fi
expect_error out_of_range_names_limit "from 1 to 65536" $bin --batch 100000
expect_error seed_not_a_number "--seed abc" $bin --seed abc
expect_error sample_seed_not_a_number "--seed abc" $bindir/gpt_sample --model "$tmp/good.model" --seed abc
expect_error sample_window_past_context "--window 500: longer than the model's context" $bindir/gpt_sample --model "$tmp/good.model" --window 500
mkfifo "$tmp/fifo"
expect_error data_fifo "not a regular file" timeout 20 $bin $tiny --data "$tmp/fifo"
expect_error data_dev_zero "not a regular file" timeout 20 $bin $tiny --data /dev/zero
expect_error data_directory "not a regular file" $bin $tiny --data "$tmp/adir"
expect_error eval_data_fifo "regular file" timeout 20 $bindir/gpt_eval --model "$tmp/good.model" --data "$tmp/fifo"
# The "too little data" message states the true minimum: a file of that size trains, one byte less does not.
msg=$($bin --preset tiny --batch 3 --seq 16 --data "$tmp/short.txt" 2>&1)
need=$(sed -n 's/.*needs at least \([0-9]*\) bytes.*/\1/p' <<<"$msg")
head -c "$need" data/corpus.txt >"$tmp/exact.txt"
head -c $((need - 1)) data/corpus.txt >"$tmp/less.txt"
ok_exact=$(mpirun -np 1 $bin --preset tiny --batch 3 --seq 16 --steps 1 --quiet --eval-windows 1 --data "$tmp/exact.txt" >/dev/null 2>&1; echo $?)
out_less=$($bin --preset tiny --batch 3 --seq 16 --data "$tmp/less.txt" 2>&1; echo "rc=$?")
if [ -n "$need" ] && [ "$ok_exact" = 0 ] && grep -q "rc=2" <<<"$out_less" && grep -q "needs at least $need bytes" <<<"$out_less"
then echo "NZRESULT PASS cli.short_data_states_true_minimum ($need bytes)"
else echo "NZRESULT FAIL cli.short_data_states_true_minimum (need '$need', exact-size run exit $ok_exact, one less: $out_less)"; fi

# ---- gpt_sample: temperature near 0 is greedy (temperature 0), never NUL bytes ----
g0=$($bindir/gpt_sample --model "$tmp/good.model" --prompt "The " --length 40 --temperature 0 --seed 1 | od -An -tx1)
g1=$($bindir/gpt_sample --model "$tmp/good.model" --prompt "The " --length 40 --temperature 1e-9 --seed 2 | od -An -tx1)
if [ -n "$g0" ] && [ "$g0" = "$g1" ] && ! grep -qw 00 <<<"$g0"; then echo "NZRESULT PASS cli.sample_cold_is_greedy"
else echo "NZRESULT FAIL cli.sample_cold_is_greedy (t=0: $g0 / t=1e-9: $g1)"; fi

# ---- consolidate: bad input is one line ----
expect_error consolidate_no_args "--ckpt DIR and --out FILE are required" $bindir/consolidate
expect_error consolidate_missing_ckpt "not a directory" $bindir/consolidate --ckpt "$tmp/none" --out "$tmp/c.model"
expect_error consolidate_not_a_checkpoint "no checkpoints" $bindir/consolidate --ckpt "$tmp/adir" --out "$tmp/c.model"
expect_error consolidate_out_is_a_directory "a directory" $bindir/consolidate --ckpt "$tmp/adir" --out "$tmp/adir"
# --out inside the checkpoint it reads (its own MANIFEST): refused, the checkpoint untouched
mpirun -np 1 $bin $tiny --steps 2 --ckpt-dir "$tmp/cons" --save-model "$tmp/cons.model" >/dev/null 2>&1
sum=$(md5sum <"$tmp/cons/step-00000002/MANIFEST")
expect_error consolidate_out_is_its_manifest "--out $tmp/cons/step-00000002/MANIFEST: lies inside --ckpt" \
  $bindir/consolidate --ckpt "$tmp/cons/step-00000002" --out "$tmp/cons/step-00000002/MANIFEST"
unchanged consolidate_input_untouched "$tmp/cons/step-00000002/MANIFEST" "$sum"
ln -s "$tmp/cons/step-00000002/MANIFEST" "$tmp/x.adam_m"  # --with-optimizer's OUT.adam_m, by a symbolic link
expect_error consolidate_optimizer_out_inside "--out $tmp/x.adam_m: lies inside --ckpt" \
  $bindir/consolidate --ckpt "$tmp/cons" --out "$tmp/x" --with-optimizer
unchanged consolidate_input_untouched_by_link "$tmp/cons/step-00000002/MANIFEST" "$sum"
# and --save-model inside the checkpoint a run resumes from
expect_error save_model_inside_resumed_checkpoint "lies inside --resume" $bin $tiny --steps 3 \
  --resume "$tmp/cons/step-00000002" --save-model "$tmp/cons/step-00000002/rank-00000.shard"
unchanged resumed_checkpoint_untouched "$tmp/cons/step-00000002/MANIFEST" "$sum"

# ---- flags a stage does not use are refused, naming the stage that uses them ----
expect_error offload_flag_on_stage2 "--offload-to disk: stage2 does not use it, expected it with build/bin/offload" \
  $bindir/stage2 $tiny --offload-to disk --offload-dir "$tmp/adir"
expect_error offload_chunk_on_stage3 "--offload-chunk 100: stage3 does not use it" $bindir/stage3 $tiny --offload-chunk 100
expect_error prefetch_on_stage1 "--prefetch 0: stage1 does not use it, expected it with build/bin/stage3" \
  $bindir/stage1 $tiny --prefetch=0

# ---- a flag that would be ignored, or a value no run can use, is one line naming the limit ----
expect_error offload_dir_without_disk_offload "--offload-dir $tmp/adir: the disk tier's directory, and offload keeps its state in cpu memory, expected it with --offload-to disk" \
  $bindir/offload $tiny --offload-dir "$tmp/adir"
expect_error offload_dir_without_disk_infinity "--offload-dir $tmp/adir: the disk tier's directory, and infinity keeps its state in cpu memory, expected it with --offload-param disk" \
  $bindir/infinity $tiny --offload-dir "$tmp/adir"
expect_error qw_block_without_qwz "--qw-block 64: it sets the blocks of --qwz, expected it with --qwz" $bindir/zeropp $tiny --qgz --qw-block 64
expect_error qg_block_without_qgz "--qg-block 64: it sets the blocks of --qgz, expected it with --qgz" $bindir/zeropp $tiny --qwz --qg-block=64
expect_error partition_empty "--partition '': no segment boundaries" $bindir/pipeline $tiny --partition ''
expect_error zero_negative "--zero -1: expected 0 or 1" $bindir/pipeline $tiny --zero -1
expect_error zero_huge "--zero 4294967297: expected 0 or 1" $bindir/pipeline $tiny --zero 4294967297
expect_error loss_scale_tiny "--loss-scale 1e-30: out of range: expected a scale from 1 (below 1 it shrinks the gradients" \
  $bin $tiny --precision fp16 --loss-scale 1e-30 --loss-scale-min 1e-7
expect_error loss_scale_huge "--loss-scale 1e31: out of range: expected a scale from 1 .* to 1e+30" $bin $tiny --precision fp16 --loss-scale 1e31
expect_error loss_scale_min_tiny "--loss-scale-min 1e-30: out of range: expected a scale from 5.96046e-08 (2^-24" \
  $bin $tiny --precision fp16 --loss-scale-min 1e-30
expect_error warmup_decay_total_before_warmup "--lr-total-steps 10: fewer steps than the warm-up (--warmup 20)" \
  $bin $tiny --lr-schedule warmup-decay --lr-total-steps 10 --warmup 20
expect_error warmup_decay_steps_before_warmup "--steps 5 (the total): fewer steps than the warm-up (--warmup 20)" \
  $bin $tiny --steps 5 --lr-schedule warmup-decay --warmup 20
echo '{"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 50, "total_num_steps": 40}}}' >"$tmp/wd.json"
expect_error warmup_decay_config_total_before_warmup "--config $tmp/wd.json: scheduler.params.total_num_steps 40: fewer steps than the warm-up (--config $tmp/wd.json: scheduler.params.warmup_num_steps 50)" \
  $bin $tiny --config "$tmp/wd.json"
# the loss scale at its lowest still trains (fp16, a static scale of 1: DeepSpeed's floor)
out=$(mpirun -np 1 $bin $tiny --steps 2 --precision fp16 --loss-scale 1 --loss-scale-window 0 2>&1)
if [ $? = 0 ] && grep -q "^done: 2 steps" <<<"$out"; then echo "NZRESULT PASS cli.loss_scale_of_1_trains"
else echo "NZRESULT FAIL cli.loss_scale_of_1_trains ($(tail -2 <<<"$out"))"; fi

# ---- a model that cannot fit is one line, before anything is allocated ----
expect_error model_cannot_fit "expected at most the" $bin $tiny --preset tiny --layers 1000 --dim 65536 --heads 4096

# ---- --lr-curve constant: lr at every step, and no --warmup beside it; --lr-schedule, its old
# name, does the same ("schedule" is the pipeline's --schedule) ----
for name in --lr-curve --lr-schedule; do
  out=$(mpirun -np 1 $bin --preset tiny --seq 16 --steps 3 --eval-windows 2 --lr 2e-3 $name constant 2>&1)
  if [ "$(grep -c '^step .* lr 2.00e-03 ' <<<"$out")" = 3 ]; then echo "NZRESULT PASS cli.lr_curve_constant$name"
  else echo "NZRESULT FAIL cli.lr_curve_constant$name ($out)"; fi
done
expect_error constant_with_warmup "--warmup 5: the learning rate is constant (--lr-curve constant), expected no warm-up; add --lr-curve cosine" \
  $bin $tiny --lr-curve constant --warmup 5
expect_error constant_with_warmup_old_name "--warmup 5: the learning rate is constant" $bin $tiny --lr-schedule constant --warmup 5
expect_error lr_curve_unknown "--lr-curve step: unknown learning-rate curve; valid: cosine, warmup, warmup-decay, constant" \
  $bin $tiny --lr-curve step
if grep -qE -- "--lr-schedule +S +the old name of --lr-curve" <<<"$help"; then echo "NZRESULT PASS cli.help_names_lr_schedule_as_the_old_name"
else echo "NZRESULT FAIL cli.help_names_lr_schedule_as_the_old_name ($(grep -A1 -- '--lr-schedule' <<<"$help"))"; fi

# ---- fp16: a run whose every step overflowed says so and fails; its report is still written ----
out=$(mpirun -np 1 $bin $tiny --steps 2 --precision fp16 --loss-scale 1e30 --loss-scale-window 0 --log-json "$tmp/skip.json" 2>&1)
rc=$?
if [ $rc = 2 ] && grep -q "^fp16: 2 of 2 steps skipped" <<<"$out" && grep -q "^error: fp16: all 2 steps of this run were skipped" <<<"$out" &&
   [ -s "$tmp/skip.json" ]; then echo "NZRESULT PASS cli.fp16_every_step_skipped_fails"
else echo "NZRESULT FAIL cli.fp16_every_step_skipped_fails (exit $rc; $out)"; fi

# ---- train_resilient.sh: the user's --resume is the first launch's; relaunches take --resume auto ----
cat >"$tmp/job.sh" <<'JOB'
#!/usr/bin/env bash
# fails on its first launch (exit 3), succeeds on the next; each launch's arguments go to $LAUNCHES
echo "$*" >>"$LAUNCHES"
[ "$(wc -l <"$LAUNCHES")" -ge 2 ]
JOB
chmod +x "$tmp/job.sh"
resilient() {  # name, then the job's arguments
  local name=$1
  shift
  rm -f "$tmp/launches"
  LAUNCHES="$tmp/launches" scripts/train_resilient.sh --restarts 2 -- "$tmp/job.sh" "$@" >/dev/null 2>&1
}
resilient given --ckpt-dir "$tmp/ck" --resume "$tmp/ck/step-5" --steps 10
first=$(sed -n 1p "$tmp/launches") second=$(sed -n 2p "$tmp/launches")
if [ "$first" = "--ckpt-dir $tmp/ck --resume $tmp/ck/step-5 --steps 10" ] && [ "$second" = "--ckpt-dir $tmp/ck --steps 10 --resume auto" ]
then echo "NZRESULT PASS cli.resilient_keeps_users_resume_on_first_launch"
else echo "NZRESULT FAIL cli.resilient_keeps_users_resume_on_first_launch (first: '$first'; second: '$second')"; fi
resilient given_eq --ckpt-dir="$tmp/ck" --resume="$tmp/ck/step-5"
first=$(sed -n 1p "$tmp/launches") second=$(sed -n 2p "$tmp/launches")
if [ "$first" = "--ckpt-dir=$tmp/ck --resume=$tmp/ck/step-5" ] && [ "$second" = "--ckpt-dir=$tmp/ck --resume auto" ]
then echo "NZRESULT PASS cli.resilient_keeps_users_resume_equals_form"
else echo "NZRESULT FAIL cli.resilient_keeps_users_resume_equals_form (first: '$first'; second: '$second')"; fi
resilient none --ckpt-dir "$tmp/ck"
if [ "$(cat "$tmp/launches")" = "--ckpt-dir $tmp/ck --resume auto
--ckpt-dir $tmp/ck --resume auto" ]; then echo "NZRESULT PASS cli.resilient_resume_auto_without_users"
else echo "NZRESULT FAIL cli.resilient_resume_auto_without_users ($(cat "$tmp/launches"))"; fi
# --restarts without its number: the script's own line, exit 2 (not the shell's message)
expect_error resilient_restarts_without_number "train_resilient.sh: --restarts needs a number (relaunches allowed), e.g. --restarts 3" \
  scripts/train_resilient.sh --restarts
expect_error resilient_restarts_before_command "train_resilient.sh: --restarts needs a number" \
  scripts/train_resilient.sh --restarts -- true --ckpt-dir "$tmp/ck"

# ---- a file-size limit (ulimit -f) is a failed write from the very start, never SIGXFSZ ----
# MPI's start-up writes shared-memory files of a few MB: under a 3 MB limit it cannot start, and
# says so (a note naming the limit first), but no process is killed by the signal (exit 25 from
# mpirun, 153 from a shell); under 8 MB the run trains, with the note.
for launch in "mpirun -np 2" ""; do
  out=$( (ulimit -f 3000; $launch $bin $tiny 2>&1) ); rc=$?
  name=file_size_limit_not_a_kill_$([ -n "$launch" ] && echo mpirun || echo singleton)
  if [ $rc != 25 ] && [ $rc != 153 ] && [ $rc != 0 ] && ! grep -q "File size limit exceeded" <<<"$out" &&
     grep -q "^note: the file-size limit (ulimit -f) is 3.07 MB" <<<"$out"; then echo "NZRESULT PASS cli.$name (exit $rc)"
  else echo "NZRESULT FAIL cli.$name (exit $rc: $(head -c 300 <<<"$out"))"; fi
done
out=$( (ulimit -f 8000; mpirun -np 2 $bin $tiny --save-model "$tmp/limited.model" 2>&1) ); rc=$?
if [ $rc = 0 ] && [ -s "$tmp/limited.model" ] && grep -q "^note: the file-size limit (ulimit -f) is 8.19 MB" <<<"$out"
then echo "NZRESULT PASS cli.file_size_limit_trains_when_mpi_fits"
else echo "NZRESULT FAIL cli.file_size_limit_trains_when_mpi_fits (exit $rc: $(head -c 300 <<<"$out"))"; fi
