// trainer.h — everything a training run needs that is NOT the ZeRO idea of its stage: MPI and the
// command line, the model and its data, the learning rate, the per-step log line, validation, the
// model file, the memory table and the JSON report. Each stage's train.cpp owns only its model
// state (what is sharded, what is gathered, which collective runs where).
//
// Defined in three files: trainer_setup.cpp (the set-up: the flags checked, the batch settled, the
// model made), trainer.cpp (the step protocol: checkpoints, step bookkeeping, validation, finish) and
// report.cpp (what the run reports at the end: the summary, the per-rank memory table, the JSON report).
// The model file is written by model_file.h, MFU computed by mfu.h.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/check.h"  // NZ_CHECK (elem_ptr)
#include "input/cli.h"
#include "comm.h"
#include "compression_setup.h"  // Compression: --qat and --prune-mask, on any rung
#include "input/data.h"
#include "io/held_params.h"  // HeldParams: what checkpoints read where a rung holds no params buffer
#include "ledger.h"
#include "loss_scale.h"
#include "model.h"
#include "optim.h"
#include "rung.h"  // Topology, RungHooks, RungSetUp, RungColumns: what a rung hands the Trainer
#include "lr_schedule.h"
#include "zero_formulas.h"

namespace nz {

struct CheckpointConfig;  // io/checkpoint.h: the trainer keeps it; the stages never see it

// How a stage makes a unit's full parameters available: stages 0-2 point into their full buffer;
// stage3 gathers the unit and releases it afterwards.
struct UnitAccess {
  std::function<const void*(int u)> acquire;
  std::function<void(int u)> release = [](int) {};
};

class Trainer {
 public:
  // topology_of: the rung's (rung.h), where its ranks are not N replicas of the whole model;
  // set_up: the rung's own flag checks and set-up hooks (rung.h), where it has any
  Trainer(int argc, char** argv, Stage stage, TopologyOf topology_of = nullptr, RungSetUp set_up = nullptr);
  ~Trainer();

  Comm comm;
  Args args;  // the command line; the core below takes only the config structs made from it
  Stage stage;
  RungColumns columns;  // the rung's line of stages.txt (rung.h): what it runs on, what it takes
  // The command line's settings for each part of the core, filled from args in one place
  // (trainer_setup.cpp, configs_from_args): the optimizer, the learning-rate curve (and, private below, the
  // checkpoints').
  AdamWConfig adamw;
  LrScheduleConfig lr_schedule;
  Compression compression;  // --qat, --prune-mask: what the model computes with, any rung (compression_setup.h)
  Layout layout;
  DType dtype;
  size_t elem_bytes;  // of the storage type
  std::unique_ptr<DataLoader> data;
  std::unique_ptr<GPT> model;
  UnitAccess unit_access;  // set by the stage once its parameters exist (validation, model file)
  // Where this rank stands (rung.h): the data-parallel replicas, the units it runs (the model above
  // holds those), the activation slots. The layout is padded for the replicas.
  Topology topology;
  RungHooks hooks;  // a rung's own validation forward, memory formulas, report (rung.h); empty: defaults

  int world() const { return comm.size(); }
  int rank() const { return comm.rank(); }
  // Data parallelism: the replicas of the model and which one this rank is (N and its rank, unless
  // the rung's topology says otherwise). The batch, the data and the gradient average are per replica.
  int dp_world() const { return topology.dp_world; }
  int dp_rank() const { return topology.dp_rank; }
  // The scale that turns a sum over replicas and micro-steps into their mean: 1 / (D * accum).
  float grad_average_scale() const { return 1.0f / float(dp_world() * args.accum); }

  // The initial parameters of unit u (identical on every rank and stage), in the storage type,
  // slice `part` of it copied to dst (device memory, or host memory: at = Location::Host).
  void init_params(int u, Slice part, void* dst, Location at = Location::Device);
  // Micro-batch k of `step` for this rank, loaded into the model.
  void load_micro_batch(int step, int k);
  // The batch last loaded (load_micro_batch, or evaluation's before hooks.forward_loss): B x seq
  // tokens and targets on the host, for a rung with a model of its own (Topology::own_model).
  const int* batch_tokens() const { return tokens_.data(); }
  const int* batch_targets() const { return targets_.data(); }
  // The optimizer's clock: the learning rate and Adam's 1-based step count of this step's update.
  // Both count the updates applied so far, which is the step index unless fp16 skipped steps
  // (loss_scale.h: a skipped step moves neither the learning-rate curve nor Adam, as in DeepSpeed).
  float lr() const { return lr_at(lr_schedule, updates_done_); }
  int adam_step() const { return updates_done_ + 1; }
  // fp16 loss scaling (loss_scale.h): the scale this step's backward multiplied the loss by (1 in
  // fp32 and bf16). Gradients are stored scaled; the stages divide the norm and the update by it.
  float loss_scale() const { return step_loss_scale_; }
  // Once per step, when the gradient norm is known (grad_norm: of the unscaled gradients, summed
  // over every rank's slices). fp16: an inf or NaN on any rank — agreed in one collective — makes
  // the step a skipped one: it is logged (end_step) and this returns true, so the stage skips its
  // optimizer step and leaves params, moments and the Adam step count untouched. fp32, bf16: false.
  bool skip_step(int step, double loss_sum, double grad_norm);

  // Step bookkeeping: labels the ledger timeline, times the step, counts its communication.
  void begin_step(int step);
  void phase(const char* name);  // labels the ledger timeline; a heartbeat for the watchdog
  // loss_sum: this rank's summed token losses over its micro-batches. Prints the step line,
  // records it, and runs validation when due.
  void end_step(int step, double loss_sum, double grad_norm);
  // Final validation, the model file, the memory table and the JSON report. A model file or report
  // that cannot be written, or no checkpoint written at all (--ckpt-dir), ends the run with one
  // line and exit code 1 once everything else is written (check.h, run_error).
  void finish();

  // Checkpoints (io/checkpoint.h, docs/checkpoints.md). The stage registers what it holds — its params
  // buffer (held: all units, or its own slices in stage3) and its optimizer (optim.h) — once both
  // are initialised; with --resume they are overwritten here from the checkpoint, and
  // the step loop starts at first_step(). end_step() writes a checkpoint when one is due
  // (--ckpt-dir, --ckpt-every).
  void checkpoint_state(Buffer& params, ParamsHeld held, OptimizerState& optimizer);
  // or its own slices, held away from a buffer (io/held_params.h)
  void checkpoint_state(HeldParams& slices, OptimizerState& optimizer);
  int first_step() const { return first_step_; }

 private:
  // --batch auto (the largest micro-batch whose predicted peak fits the memory budget) and
  // --global-batch (the accumulation that reaches it): sets args.batch and args.accum.
  void settle_batch();
  void configs_from_args();  // adamw, the learning-rate curve, checkpoint from args
  // The model-state bytes per rank of layout L: the rung's (hooks.model_state_bytes), or the stage's.
  StateBytes state_bytes(const Layout& L, DType dt) const;
  // Mean validation loss over args.eval_windows windows, split over the ranks.
  double evaluate();
  // report.cpp
  double mfu_at(double tokens_per_s) const;  // this run's MFU (mfu.h); 0 on the CPU
  double hfu_at(double tokens_per_s) const;  // the same, counting activation checkpointing's recompute
  void print_summary(double total_s);        // "done:" and, on GPUs, "throughput:"
  void print_gpu_memory_check();             // the ledger against cudaMemGetInfo
  // CUDA: cudaMemGetInfo's total - free once the context, cuBLAS and NCCL are up, before the model;
  // and, at the end (print_gpu_memory_check), in use and the ledger's figures, for --log-json
  double gpu_baseline_bytes_ = 0, gpu_in_use_bytes_ = 0, gpu_ledger_peak_bytes_ = 0, gpu_ledger_now_bytes_ = 0;
  void print_memory_table();
  std::string write_report();  // "" or, on every rank, why --log-json could not be written
  LossScaler loss_scaler_;
  int updates_done_ = 0;          // optimizer updates applied before this step
  float step_loss_scale_ = 1;     // the scale of this step's backward
  bool step_skipped_ = false;
  std::vector<int> tokens_, targets_;
  std::chrono::steady_clock::time_point t_step_, t_start_;
  CommStats comm_at_step_start_;
  double last_val_loss_ = -1;
  struct StepRecord {
    int step;
    double loss, lr, grad_norm, ms, tokens_per_s;
    double recompute_flops;  // activation checkpointing's extra forward, all ranks (0 without it)
    CommStats comm;
    float loss_scale;  // fp16: the scale of this step's backward
    bool skipped;      // fp16: the gradients overflowed, no update
  };
  std::vector<StepRecord> steps_;
  std::vector<std::pair<int, double>> evals_;
  std::vector<double> peak_device_mb_;  // per rank, at the last step
  // checkpoints
  struct HeldState held_state();  // what checkpoint_state registered (checkpoint.h)
  void register_held(OptimizerState& optimizer);  // both checkpoint_state: the optimizer, and --resume
  std::unique_ptr<CheckpointConfig> checkpoint_;
  Buffer* held_params_ = nullptr;
  HeldParams* held_slices_ = nullptr;
  ParamsHeld params_held_ = ParamsHeld::AllUnits;
  OptimizerState* held_optimizer_ = nullptr;
  std::string resume_from_;  // the checkpoint --resume found ("" for none)
  uint64_t run_id_ = 0;      // checkpoint.h: claim_checkpoint_dir
  int ckpts_written_ = 0, ckpts_failed_ = 0;
  int first_step_ = 0;
  double verify_ms_ = 0;   // finding and verifying the checkpoint to resume from
  int current_step_ = -1;  // for the watchdog's messages
  std::unique_ptr<class Watchdog> watchdog_;  // watchdog.h
};

// Typed pointer to element `index` of a buffer of storage-type elements. An index past the end is
// stopped here, with the buffer's name, rather than becoming a crash somewhere later.
inline void* elem_ptr(const Buffer& b, size_t index, size_t elem_bytes) {
  NZ_CHECK(index * elem_bytes < b.bytes(), "element %zu is past the end of buffer \"%s\" (%zu elements)", index,
           b.name().c_str(), b.bytes() / elem_bytes);
  return static_cast<char*>(b.data()) + index * elem_bytes;
}

}  // namespace nz
