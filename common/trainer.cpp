// trainer.cpp — the step protocol: checkpoints, micro-batches, the step line, validation, the end.
// (trainer.h; the set-up is trainer_setup.cpp, the reports report.cpp)
#include "trainer.h"

#include <algorithm>     // std::all_of
#include <cstdio>
#include <cstring>      // strcmp: the phase names

#include <cmath>         // std::isfinite

#include "runtime/check.h"       // NZ_CHECK
#include "io/model_file.h"  // save_model_from_units
#include "io/checkpoint.h"        // save_checkpoint, find_resume_checkpoint, load_checkpoint
#include "watchdog.h"            // Watchdog: a rank that stops making progress ends the job
#include "profile.h"             // StepProfile: NZ_PROFILE=1's per-phase breakdown
#include "mfu.h"         // peak_flops, flops_per_token, recompute_flops_per_token

namespace nz {

void Trainer::checkpoint_state(HeldParams& slices, OptimizerState& optimizer) {
  held_slices_ = &slices;
  params_held_ = ParamsHeld::OwnSlices;
  register_held(optimizer);
}

void Trainer::checkpoint_state(Buffer& params, ParamsHeld held, OptimizerState& optimizer) {
  held_params_ = &params;
  params_held_ = held;
  register_held(optimizer);
}

void Trainer::register_held(OptimizerState& optimizer) {
  held_optimizer_ = &optimizer;
  if (resume_from_.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  first_step_ = load_checkpoint(comm, *checkpoint_, held_state(), resume_from_);
  if (compression.pruning())  // --prune-mask: what the checkpoint held dense is pruned from here on
    compression.zero_pruned_held(layout, params_held_ == ParamsHeld::OwnSlices, rank(), *held_params_, elem_bytes,
                                 optimizer);
  comm.control_barrier();  // every rank has loaded
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (rank() == 0) {
    printf("resumed from %s: %d of %d steps done, verified (every shard's size and CRC-32C) in %.1f ms, loaded "
           "in %.1f ms\n", resume_from_.c_str(), first_step_, args.steps, verify_ms_, ms);
    fflush(stdout);
  }
}

HeldState Trainer::held_state() {
  HeldState h;
  h.L = &layout;
  h.dt = dtype;
  h.params = held_params_;
  h.slices = held_slices_;
  h.params_full = params_held_ != ParamsHeld::OwnSlices;  // else this rank's slices
  if (params_held_ == ParamsHeld::SegmentUnits) h.first_unit = topology.first_unit, h.end_unit = topology.end_unit;
  h.data_world = dp_world();
  h.opt = held_optimizer_;
  h.scaler = &loss_scaler_;
  h.rank = rank();
  h.run_id = run_id_;
  if (held_slices_) return h;  // (sized by construction)
  size_t held_elems = 0;
  for (int u = 0; u < layout.num_units(); u++) held_elems += h.params_range(u).size();
  NZ_CHECK(held_params_->bytes() == held_elems * elem_bytes,
           "checkpoint_state: a params buffer of %zu bytes, but the stage says it holds %s", held_params_->bytes(),
           h.params_full ? (h.holds(0) && h.holds(layout.num_units() - 1) ? "all units" : "its segment's units")
                         : "its own slices");
  return h;
}

void Trainer::load_micro_batch(int step, int k) {
  StepProfile::get().phase(StepProfile::Other);  // until the stage says "forward"
  data->train_batch(step, k, args.accum, dp_world(), dp_rank(), tokens_.data(), targets_.data());
  model->set_batch(tokens_.data(), targets_.data(), args.batch);
}

void Trainer::phase(const char* name) {
  Ledger::get().set_phase(name);
  StepProfile::get().phase(strcmp(name, "forward") == 0    ? StepProfile::Forward
                           : strcmp(name, "backward") == 0 ? StepProfile::Backward
                           : strcmp(name, "optimizer") == 0 ? StepProfile::Optimizer
                                                             : StepProfile::Other);
  if (watchdog_) watchdog_->progress(current_step_, name);
}

void Trainer::begin_step(int step) {
  current_step_ = step;
  updates_done_ = step - loss_scaler_.skipped();
  step_loss_scale_ = loss_scaler_.scale();
  step_skipped_ = false;
  model->set_loss_scale(step_loss_scale_);
  Ledger::get().set_step(step);
  phase("forward");
  device_sync();
  t_step_ = std::chrono::steady_clock::now();
  comm_at_step_start_ = comm.stats();
  StepProfile::get().begin_step();
}

bool Trainer::skip_step(int step, double loss_sum, double grad_norm) {
  // an inf or NaN anywhere in the gradients makes the squared norm inf or NaN. grad_norm is global
  // (summed over the ranks), so every rank passes the same verdict; the scaler's one-element
  // all-reduce confirms it (loss_scale.h says why it is kept: counted as overflow_flag).
  if (!loss_scaler_.overflowed(comm, !std::isfinite(grad_norm))) return false;
  step_skipped_ = true;
  end_step(step, loss_sum, grad_norm);
  return true;
}

void Trainer::end_step(int step, double loss_sum, double grad_norm) {
  StepProfile::get().end_step();
  device_sync();
  // NZ_PROFILE: read after the sync that is here anyway; the first two steps are warm-up when there are more than 4
  StepProfile::get().add_step(step, args.steps - first_step_ <= 4 || step - first_step_ >= 2);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_step_).count();
  CommStats step_comm = comm.stats() - comm_at_step_start_;
  phase("log");
  double loss = loss_sum;
  comm.sum_scalars(&loss, 1);
  const double tokens = double(dp_world()) * args.accum * args.batch * args.seq;
  loss /= tokens;
  double worst_ms = ms;  // the step is as slow as the slowest rank
  std::vector<double> all_ms = comm.gather_scalar(ms);
  for (double x : all_ms) worst_ms = std::max(worst_ms, x);
  std::vector<double> peaks = comm.gather_scalar(double(Ledger::get().peak_total(Location::Device)));
  // the extra forward of activation checkpointing, over all ranks (not in MFU: mfu.h)
  const double recompute = args.activation_checkpointing ? tokens * recompute_flops_per_token(args.cfg, args.seq) : 0;
  StepRecord rec{step,      loss,      lr(),    grad_norm,        worst_ms, tokens / (worst_ms / 1000.0),
                 recompute, step_comm, step_loss_scale_, step_skipped_};
  steps_.push_back(rec);
  if (rank() == 0 && !args.quiet) {
    std::string peak_str;
    double max_peak = 0;
    for (double p : peaks) max_peak = std::max(max_peak, p);
    if (peaks.size() <= 4) {
      for (double p : peaks) peak_str += (peak_str.empty() ? "" : "/") + fmt_bytes(p);
    } else {
      peak_str = "max " + fmt_bytes(max_peak);
    }
    printf("step %5d/%d | loss %.6f | lr %.2e | norm %8.4f | %7.1f ms | %8.0f tok/s | peak device mem %s",
           step + 1, args.steps, loss, rec.lr, grad_norm, worst_ms, rec.tokens_per_s, peak_str.c_str());
    if (recompute > 0) printf(" | recompute %.3g GFLOP", recompute / 1e9);
    if (mfu_at(rec.tokens_per_s) > 0) printf(" | MFU %.1f%%", 100 * mfu_at(rec.tokens_per_s));  // GPUs only
    if (recompute > 0 && hfu_at(rec.tokens_per_s) > 0) printf(" | HFU %.1f%%", 100 * hfu_at(rec.tokens_per_s));
    if (loss_scaler_.enabled()) printf(" | loss scale %g%s", double(rec.loss_scale), rec.skipped ? ", overflow: skipped" : "");
    printf("\n");
    fflush(stdout);
  }
  if (args.eval_every > 0 && (step + 1) % args.eval_every == 0 && step + 1 < args.steps) {
    double v = evaluate();
    evals_.push_back({step + 1, v});
    if (rank() == 0 && !args.quiet) printf("step %5d | validation loss %.6f\n", step + 1, v);
  }
  const bool ckpt_due = step + 1 == args.steps || (args.ckpt_every > 0 && (step + 1) % args.ckpt_every == 0);
  if (!args.ckpt_dir.empty() && ckpt_due) {
    if (!held_params_ && !held_slices_) user_error("--ckpt-dir: this trainer does not register its state (Trainer::checkpoint_state)");
    phase("checkpoint");
    (save_checkpoint(comm, *checkpoint_, stage, held_state(), step + 1) ? ckpts_written_ : ckpts_failed_)++;
  }
}

double Trainer::evaluate() {
  NZ_CHECK(unit_access.acquire != nullptr, "the stage did not set Trainer::unit_access");
  phase("eval");
  const int W = std::min(args.eval_windows, data->num_val_windows());
  const int N = dp_world(), B = args.batch, T = args.seq;
  // Rank r takes windows r, r + N, r + 2N, ...; every rank runs the same number of batches
  // (stage3 gathers are collective), padding with a dummy window that is not counted.
  const int per_rank = (W + N - 1) / N;
  const int batches = (per_rank + B - 1) / B;
  double sum = 0;
  for (int bi = 0; bi < batches; bi++) {
    int b = 0;
    for (; b < B; b++) {
      int j = (bi * B + b) * N + dp_rank();
      if (j >= W || bi * B + b >= per_rank) break;
      data->val_window(j, tokens_.data() + size_t(b) * T, targets_.data() + size_t(b) * T);
    }
    const int real = b;
    if (real == 0) data->val_window(0, tokens_.data(), targets_.data());
    model->set_batch(tokens_.data(), targets_.data(), std::max(real, 1));
    double s = 0;
    if (hooks.forward_loss) {
      s = hooks.forward_loss();
    } else {
      for (int u = 0; u < layout.num_units(); u++) {
        model->forward(u, unit_access.acquire(u));
        unit_access.release(u);
      }
      model->head_forward(unit_access.acquire(layout.embed_unit()));
      s = model->take_loss_sum();
      unit_access.release(layout.embed_unit());
    }
    if (real > 0) sum += s;
  }
  comm.sum_scalars(&sum, 1);
  return sum / (double(W) * T);
}

void Trainer::finish() {
  Ledger::get().set_step(args.steps);
  last_val_loss_ = evaluate();
  evals_.push_back({args.steps, last_val_loss_});
  double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count();
  print_summary(total_s);
  if (held_slices_ && rank() == 0 && !held_slices_->io_summary().empty())  // e.g. slices on disk
    printf("%s\n", held_slices_->io_summary().c_str());
  if (current_device() == Device::CUDA) print_gpu_memory_check();
  std::string failed;  // what could not be written: said once everything else is written
  if (!args.save_model.empty()) {
    phase("save");
    // every rank takes part (stage3 gathers each unit); rank 0 writes
    std::string why;
    size_t n = save_model_from_units(comm, args.save_model, args.cfg, layout, dtype, rank() == 0, unit_access.acquire,
                                     unit_access.release, &why);
    if (!why.empty()) failed += "; --save-model " + args.save_model + ": " + why;
    else if (rank() == 0) printf("model written to %s (%zu parameters, fp32)\n", args.save_model.c_str(), n);
  }
  print_memory_table();
  const std::string report_failed = write_report();
  if (!report_failed.empty()) failed += "; --log-json " + args.log_json + ": " + report_failed;
  if (!args.ckpt_dir.empty() && ckpts_written_ == 0 && ckpts_failed_ > 0)
    failed += "; no checkpoint written in " + args.ckpt_dir + " (" + std::to_string(ckpts_failed_) +
              (ckpts_failed_ == 1 ? " try" : " tries") + " failed; see the warnings above)";
  fflush(stdout);
  if (!failed.empty())
    run_error("the run finished, but%s; expected every output written: free space or choose writable paths and run "
              "again (--resume auto goes on from its newest checkpoint)", failed.c_str() + 1);
  // fp16: a run whose every step overflowed never updated the model. Its report and model file
  // are written (to see why); then it fails, on every rank alike (the skips were agreed).
  const bool all_skipped = !steps_.empty() && std::all_of(steps_.begin(), steps_.end(), [](const StepRecord& s) { return s.skipped; });
  char initial[32];
  snprintf(initial, sizeof initial, "%g", double(args.loss_scale));
  if (all_skipped)
    user_error("fp16: all %zu steps of this run were skipped (the gradients overflowed at every step; loss scale %g at "
               "the last, %s), expected at least one update: the model is untrained; lower %s, or %s",
               steps_.size(), double(steps_.back().loss_scale),
               args.loss_scale_window > 0 ? "dynamic" : "static",
               args.origin("--loss-scale", initial).c_str(),
               args.loss_scale_window > 0 ? "run more steps" : "use a dynamic scale (--loss-scale-window > 0)");
}

}  // namespace nz
