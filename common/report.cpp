// report.cpp — what a run reports when it ends: the summary lines, the GPU memory check, the
// per-rank memory table against the formulas, and the JSON report (--log-json). Rank 0 prints;
// every rank takes part, since each contributes its own numbers.

#include <cstdio>
#include <sstream>

#include "io/atomic_file.h"    // AtomicFile: the report written whole or not at all
#include "runtime/device.h"         // current_device, cuda_rt
#include "runtime/json.h"           // JsonWriter
#include "mfu.h"            // flops_per_token, peak_flops, mfu
#include "profile.h"        // StepProfile: NZ_PROFILE=1's line and JSON
#include "trainer.h"        // Trainer, whose report members this file defines
#include "zero_formulas.h"  // expected_state_bytes, activation_bytes, expected_*_elems

namespace nz {

double Trainer::mfu_at(double tokens_per_s) const {
  return mfu(flops_per_token(args.cfg, args.seq, layout.num_params), tokens_per_s, dtype, comm.gpus_in_use());
}

double Trainer::hfu_at(double tokens_per_s) const {
  const double recompute = args.activation_checkpointing ? recompute_flops_per_token(args.cfg, args.seq) : 0;
  return mfu(flops_per_token(args.cfg, args.seq, layout.num_params) + recompute, tokens_per_s, dtype,
             comm.gpus_in_use());
}

// Rank 0's closing lines: the losses, the mean step time (without the first, warm-up step) and,
// on GPUs, the throughput and MFU.
void Trainer::print_summary(double total_s) {
  if (rank() != 0) return;
  double ms = 0;
  int n = 0;
  for (size_t i = steps_.size() > 1 ? 1 : 0; i < steps_.size(); i++, n++) ms += steps_[i].ms;
  if (steps_.empty())  // resumed from a checkpoint that already has every step: no train loss to show
    printf("done: no step left to run (%d of %d done before this run) | validation loss %.6f (unigram "
           "baseline %.4f)\n",
           args.steps, args.steps, last_val_loss_, data->unigram_baseline());
  else
    printf("done: %d steps in %.1f s | final train loss %.6f | validation loss %.6f (unigram baseline %.4f) | "
           "%.1f ms/step\n",
           args.steps, total_s, steps_.back().loss, last_val_loss_, data->unigram_baseline(), n ? ms / n : 0.0);
  if (StepProfile::get().steps_timed() > 0) printf("%s\n", StepProfile::get().line(args.steps).c_str());
  if (dtype == DType::F16) {  // how many steps fp16's loss scaling skipped
    int skipped = 0;
    for (const StepRecord& s : steps_) skipped += s.skipped;
    printf("fp16: %d of %zu steps skipped for overflow (no update), loss scale %g at the last\n", skipped,
           steps_.size(), steps_.empty() ? 0.0 : double(steps_.back().loss_scale));
  }
  if (current_device() == Device::CUDA && n > 0) {
    const double tokens = double(dp_world()) * args.accum * args.batch * args.seq;
    const double tok_s = tokens / (ms / n / 1000);
    char mfu_str[48] = "MFU ? (unknown GPU: set NZ_PEAK_TFLOPS)";
    if (mfu_at(tok_s) > 0) snprintf(mfu_str, sizeof mfu_str, "MFU %.1f%%", 100 * mfu_at(tok_s));
    printf("throughput: %.0f tokens/s | %s (%.3g FLOPs per token = 6 x %zu params + 12 x %d layers x %d seq x "
           "%d dim; %d GPU%s)\n",
           tok_s, mfu_str, flops_per_token(args.cfg, args.seq, layout.num_params), layout.num_params,
           args.cfg.layers, args.seq, args.cfg.dim, comm.gpus_in_use(), comm.gpus_in_use() == 1 ? "" : "s");
    if (args.activation_checkpointing && hfu_at(tok_s) > 0)  // the recomputed forward, which MFU leaves out
      printf("activation checkpointing: HFU %.1f%% (+%.3g FLOPs per token recomputed)\n", 100 * hfu_at(tok_s),
             recompute_flops_per_token(args.cfg, args.seq));
  }
}

// The ledger against the GPU's own count: what cudaMemGetInfo says is in use, minus what the
// ledger holds now, is what the ledger does not track (CUDA context, cuBLAS and NCCL
// workspaces, the kernels' scratch, allocation rounding). Ranks sharing a GPU are summed.
void Trainer::print_gpu_memory_check() {
  size_t free_bytes = 0, total_bytes = 0;
  cuda_rt::mem_get_info(&free_bytes, &total_bytes);
  const double used = double(total_bytes - free_bytes);
  const double now = comm.sum_on_my_gpu(double(Ledger::get().current_total(Location::Device)));
  const double peak = comm.sum_on_my_gpu(double(Ledger::get().peak_total(Location::Device)));
  gpu_in_use_bytes_ = used, gpu_ledger_peak_bytes_ = peak, gpu_ledger_now_bytes_ = now;
  if (rank() == 0)
    printf("GPU memory (rank 0's GPU, %d rank%s): ledger peak %s, now %s | in use %s (cudaMemGetInfo "
           "total - free) | not in the ledger %s (CUDA context, library workspaces, scratch, rounding) | "
           "above the baseline %s (the baseline: %s in use once the context, cuBLAS and NCCL were up, before "
           "the model)\n",
           comm.ranks_on_my_gpu(), comm.ranks_on_my_gpu() == 1 ? "" : "s", fmt_bytes(peak).c_str(),
           fmt_bytes(now).c_str(), fmt_bytes(used).c_str(), fmt_bytes(used - now).c_str(),
           fmt_bytes(used - gpu_baseline_bytes_).c_str(), fmt_bytes(gpu_baseline_bytes_).c_str());
}

// One line per rank of peak bytes by category, then the formula, then the verdict.
void Trainer::print_memory_table() {
  const Ledger& led = Ledger::get();
  std::ostringstream mine;
  for (int c = 0; c < kNumCategories; c++) mine << led.peak(Category(c)) << ' ';
  mine << led.peak_total(Location::Device) << ' ' << led.peak_total(Location::Host) << ' '
       << led.peak(Category::Scratch, Location::Device);  // --qat's copy (nothing else there on the CPU)
  std::string all = comm.gather_strings(mine.str(), "\n");
  if (rank() != 0) return;
  const StateBytes f0 = state_bytes(layout, dtype);  // the rung's (rung.h), or the stage's
  const QatConfig& qat = compression.qat;
  const uint64_t acts0 =
      expected_activation_bytes(args.cfg, args.batch, args.seq, dtype, args.activation_checkpointing, model->attention());
  // rank r's formula: the stage's, or the rung's own for that rank (hooks.state_formula)
  auto f_of = [&](int r) { return hooks.state_formula ? hooks.state_formula(r) : f0; };
  auto acts_of = [&](int r) { return hooks.activation_formula ? hooks.activation_formula(r) : acts0; };
  const Category cols[] = {Category::Params, Category::Grads, Category::Master, Category::AdamM,
                           Category::AdamV, Category::Activations, Category::CommBuffers, Category::Gathered};
  printf("\nper-rank memory, peak bytes (%s, %d ranks, %s; formulas: zero_formulas.h)\n", stage_name(stage),
         world(), dtype_name(dtype));
  printf("%-9s", "");
  for (Category c : cols) printf(" %12s", category_name(c));
  printf(" %14s %14s\n", "device total", "host total");
  std::istringstream in(all);
  std::string line;
  bool all_match = true;
  int r = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    uint64_t v[kNumCategories + 3] = {};
    for (uint64_t& x : v) ls >> x;
    if (!ls) {  // a row that is not numbers can match nothing (and must not pass for a match)
      printf("rank %-4d (its row did not read as %d numbers: '%.60s')\n", r++, kNumCategories + 3, line.c_str());
      all_match = false;
      continue;
    }
    const StateBytes f = f_of(r);
    const uint64_t acts = acts_of(r);
    printf("rank %-4d", r++);
    for (Category c : cols) printf(" %12llu", (unsigned long long)v[int(c)]);
    printf(" %14llu %14llu\n", (unsigned long long)v[kNumCategories], (unsigned long long)v[kNumCategories + 1]);
    for (Category c : cols) {
      uint64_t want = c == Category::Activations ? acts : f.of(c);
      if (c == Category::Gathered ? v[int(c)] > want : v[int(c)] != want) all_match = false;
    }
    if (qat.on() && !hooks.state_formula && v[kNumCategories + 2] != qat_bytes(layout, dtype, qat)) all_match = false;
    if (hooks.state_formula) {  // each rank's own formula, under its row
      printf("%-9s", "formula");
      for (Category c : cols) printf(" %12llu", (unsigned long long)(c == Category::Activations ? acts : f.of(c)));
      printf("\n");
    }
  }
  if (r != world()) {  // every rank's row, or no verdict of a match
    printf("(%d rows gathered for %d ranks)\n", r, world());
    all_match = false;
  }
  const StateBytes f = f0;
  const uint64_t acts = acts0;
  if (!hooks.state_formula) printf("%-9s", "formula");
  if (!hooks.state_formula)
    for (Category c : cols) printf(" %12llu", (unsigned long long)(c == Category::Activations ? acts : f.of(c)));
  printf("%sledger %s the formulas on every rank (model state %s per rank; Ψ = %zu, padded %zu, shard %zu)\n",
         hooks.state_formula ? "" : "\n", all_match ? "matches" : "DOES NOT MATCH",
         hooks.state_formula ? "in the formula rows above," : fmt_bytes(double(f.total())).c_str(), layout.num_params,
         layout.padded_total, layout.shard_total);
  // the fake-quantized unit (zero_formulas.h, qat_bytes): device scratch, on every rank alike (a rung
  // whose ranks hold different units, hooks.state_formula: qat_bytes with their range, not checked here)
  if (qat.on() && !hooks.state_formula)
    printf("qat: %s, blocks of %zu%s: the fake-quantized unit, formula %llu bytes per rank (device scratch)\n",
           qat.bits == 8 ? "int8" : "int4", qat.block, qat.skip_embed ? ", embedding kept" : "",
           (unsigned long long)qat_bytes(layout, dtype, qat));
}


// --log-json: the run's configuration, the formulas, the step log and every rank's ledger and
// comm counts, in one file that rank 0 writes (atomic_file.h: never half a report).
std::string Trainer::write_report() {
  JsonWriter mine;
  mine.begin_object();
  mine.kv("rank", rank());
  mine.key("ledger");
  mine.raw(Ledger::get().to_json());
  mine.key("comm");
  mine.raw(comm.stats().to_json());
  mine.end_object();
  std::string ranks = comm.gather_strings(mine.str(), ",");
  if (args.log_json.empty()) return "";
  if (rank() != 0) return comm.control_broadcast("");

  JsonWriter j;
  j.begin_object();
  j.kv("stage", stage_name(stage));
  j.kv("world", world());
  if (!hooks.report_json.empty() || hooks.report_of) {  // the rung's own object (rung.h)
    j.key(hooks.report_key.c_str());
    j.raw(hooks.report_of ? hooks.report_of() : hooks.report_json);
  }
  j.kv("preset", args.preset);
  j.key("config");
  j.begin_object();
  j.kv("vocab", args.cfg.vocab);
  j.kv("ctx", args.cfg.ctx);
  j.kv("layers", args.cfg.layers);
  j.kv("dim", args.cfg.dim);
  j.kv("heads", args.cfg.heads);
  j.end_object();
  j.kv("precision", dtype_name(dtype));
  j.kv("device", current_device() == Device::CUDA ? "cuda" : "cpu");
  j.kv("collectives", comm.uses_nccl() ? "nccl" : comm.one_rank_on_gpu() ? "local" : "mpi");
  j.kv("kernels", args.kernels);
  j.kv("attention", args.attention);
  if (current_device() == Device::CUDA) {
    j.kv("gpu", std::string(cuda_rt::device_name()));
    j.kv("gpus", comm.gpus_in_use());
    j.kv("flops_per_token", flops_per_token(args.cfg, args.seq, layout.num_params));
    j.kv("peak_flops_per_gpu", peak_flops(dtype));
    j.key("gpu_memory");  // rank 0's GPU, its ranks summed (print_gpu_memory_check)
    j.begin_object();
    j.kv("baseline_bytes", uint64_t(gpu_baseline_bytes_));
    j.kv("in_use_bytes", uint64_t(gpu_in_use_bytes_));
    j.kv("above_baseline_bytes", int64_t(gpu_in_use_bytes_) - int64_t(gpu_baseline_bytes_));
    j.kv("ledger_peak_bytes", uint64_t(gpu_ledger_peak_bytes_));
    j.kv("ledger_now_bytes", uint64_t(gpu_ledger_now_bytes_));
    j.kv("ranks_on_gpu", comm.ranks_on_my_gpu());
    j.end_object();
  }
  if (StepProfile::get().steps_timed() > 0) {  // NZ_PROFILE=1: rank 0's breakdown (profile.h)
    j.key("profile");
    j.raw(StepProfile::get().json());
  }
  j.kv("batch", args.batch);
  j.kv("seq", args.seq);
  j.kv("accum", args.accum);
  j.kv("activation_checkpointing", args.activation_checkpointing);
  j.kv("batch_auto", args.batch_auto);
  j.kv("memory_budget", args.memory_budget);  // bytes per rank (--batch auto), 0 without
  j.kv("global_batch", args.global_batch);
  j.kv("steps", args.steps);
  j.key("settings");  // the optimizer, learning-rate curve, loss-scale and offload settings in force (flags or --config)
  j.begin_object();
  j.kv("config", args.config);
  j.kv("lr", double(args.lr));
  j.kv("weight_decay", double(args.weight_decay));
  j.kv("clip", double(args.clip));
  j.kv("warmup", args.warmup);
  j.kv("lr_schedule", args.lr_schedule);
  j.kv("warmup_min_lr", double(args.warmup_min_lr));
  j.kv("warmup_type", args.warmup_type);
  j.kv("lr_total_steps", args.lr_total_steps);
  j.kv("loss_scale", double(args.loss_scale));
  j.kv("loss_scale_window", args.loss_scale_window);
  j.kv("loss_scale_hysteresis", args.loss_scale_hysteresis);
  j.kv("loss_scale_min", double(args.loss_scale_min));
  j.kv("offload_to", args.offload_to);
  j.kv("offload_param", args.offload_param);
  j.kv("offload_dir", args.offload_dir);
  j.end_object();
  j.kv("num_params", uint64_t(layout.num_params));
  j.kv("padded_params", uint64_t(layout.padded_total));
  j.kv("shard_params", uint64_t(layout.shard_total));
  j.kv("max_unit_padded", uint64_t(layout.max_unit_padded));
  j.key("units");
  j.begin_array();
  for (const Unit& u : layout.units) {
    j.begin_object();
    j.kv("name", u.name);
    j.kv("numel", uint64_t(u.numel));
    j.kv("padded", uint64_t(u.padded));
    j.end_object();
  }
  j.end_array();
  // The formulas of rank r: the stage's (or the rung's, rung.h), the same on every rank; with an
  // optimizer whose state and messages differ per rank (Muon), rank r's own: its model state
  // (state_formula), its messages beyond the stage's and its work space (optimizer_*).
  const bool per_rank = bool(hooks.optimizer_comm_elems);
  auto formula_of = [&](int r) {
    const StateBytes f = per_rank ? hooks.state_formula(r) : state_bytes(layout, dtype);
    j.begin_object();
    for (Category c : {Category::Params, Category::Grads, Category::Master, Category::AdamM, Category::AdamV,
                       Category::CommBuffers, Category::Gathered})
      j.kv(category_name(c), f.of(c));
    j.kv("activations",
         expected_activation_bytes(args.cfg, args.batch, args.seq, dtype, args.activation_checkpointing,
                                   model->attention()));
    // --qat's fake-quantized unit (device scratch; 0 without; the whole model's: a rank that holds some
    // units only holds qat_bytes of those)
    j.kv("qat", qat_bytes(layout, dtype, compression.qat));
    j.kv("host", f.host);  // everything off the device; of it on disk (--offload-to or --offload-param disk):
    const Location tier = args.state_on_disk() ? Location::Disk : Location::Host;
    j.kv("disk", offload_state_bytes(stage, layout, dtype, tier).disk);
    const uint64_t extra = per_rank ? hooks.optimizer_comm_elems(r) : 0;
    j.kv("comm_elems_per_step", expected_comm_elems(stage, layout, args.accum) + extra);
    if (per_rank) {
      j.kv("optimizer_comm_elems_per_step", extra);  // of comm_elems_per_step: the optimizer's own
      j.kv("optimizer_work", hooks.optimizer_work_bytes(r));  // ledger: scratch, device
    }
    j.kv("link_elems_per_step", expected_link_elems(stage, layout, args.accum));
    j.kv("overflow_flag_elems_per_step", expected_overflow_flag_elems(layout, dtype));
    j.end_object();
  };
  j.key("formula");  // rank 0's, the rank whose ledger a reader compares first
  formula_of(0);
  if (per_rank) {
    j.key("formula_ranks");
    j.begin_array();
    for (int r = 0; r < world(); r++) formula_of(r);
    j.end_array();
  }
  j.key("steps_log");
  j.begin_array();
  for (const StepRecord& s : steps_) {
    j.begin_object();
    j.kv("step", s.step + 1);
    j.kv("loss", s.loss);
    j.kv("lr", s.lr);
    j.kv("grad_norm", s.grad_norm);
    if (dtype == DType::F16) {
      j.kv("loss_scale", double(s.loss_scale));
      j.kv("skipped", s.skipped);
      j.kv("overflow_flag_elems", s.comm.op[int(CommOp::OverflowFlag)].elems_sent);
    }
    j.kv("ms", s.ms);
    j.kv("tokens_per_s", s.tokens_per_s);
    if (mfu_at(s.tokens_per_s) > 0) j.kv("mfu", mfu_at(s.tokens_per_s));  // GPUs only
    j.kv("recompute_flops", s.recompute_flops);  // activation checkpointing's extra forward (0 without)
    j.kv("comm_elems", s.comm.model_elems_sent());
    j.kv("comm_bytes", s.comm.model_bytes_sent());
    j.kv("comm_bytes_across_nodes", s.comm.model_bytes_across_nodes());
    j.kv("to_host_elems", s.comm.link.to_host_elems);
    j.kv("to_device_elems", s.comm.link.to_device_elems);
    j.end_object();
  }
  j.end_array();
  j.key("evals");
  j.begin_array();
  for (auto& [step, loss] : evals_) {
    j.begin_object();
    j.kv("step", step);
    j.kv("val_loss", loss);
    j.end_object();
  }
  j.end_array();
  j.kv("final_val_loss", last_val_loss_);
  j.kv("unigram_baseline", data->unigram_baseline());
  j.key("ranks");
  j.raw("[" + ranks + "]");
  j.end_object();

  AtomicFile out(args.log_json);  // a fresh temporary file, fsync'd, renamed: never half a report
  out.write(j.str().data(), j.str().size());
  return comm.control_broadcast(out.commit() ? "" : out.error());
}

}  // namespace nz
