// cli.h — the trainers' command line: one parser for every rung (parse_args), --config's DeepSpeed
// file read into the same flags (ds_config.h). A rung's own flags (offload's, the pipeline's,
// ZeRO++'s) are refused by the other rungs, naming the ones that take them. The tools' flags go
// through tool_flags.h; what they share with the trainers is below (check_output_file,
// check_not_inside, parse_bytes, default_data_path). The core never sees Args: the trainer turns it
// into each part's config struct (trainer.cpp). Bad values get one line (flag, value, what is
// valid) and exit code 2 before anything is allocated.
#pragma once
#include <algorithm>  // std::max
#include <map>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "runtime/check.h"  // fmt_bytes (for the files that print sizes beside the flags)
#include "layout.h"

namespace nz {

struct Args {
  // model
  std::string preset = "small";
  int layers = -1, dim = -1, heads = -1;  // -1: the preset's value
  GPTConfig cfg;                          // the preset with the overrides applied
  // batch and learning rate
  int batch = 4;     // micro-batch per rank
  bool batch_auto = false;      // --batch auto: the largest that fits --memory-budget (Trainer sets batch)
  uint64_t memory_budget = 0;   // bytes per rank; 0: the GPU's free memory (--batch auto)
  int global_batch = 0;         // sequences per optimizer step over all ranks; 0: batch x accum x N
  int seq = 64;      // sequence length
  int accum = 1;     // gradient accumulation steps
  int steps = 200;
  float lr = 3e-3f;  // peak learning rate
  int warmup = 20;   // linear warm-up steps, then cosine decay to lr/10
  // --lr-curve, the learning rate after the warm-up (lr_schedule.h, lr_at): cosine to lr/10 (this project's), or
  // DeepSpeed's WarmupLR ("warmup": constant) and WarmupDecayLR ("warmup-decay": linear to 0), or
  // "constant": lr at every step, no warm-up (DeepSpeed without a scheduler section)
  std::string lr_schedule = "cosine";
  float warmup_min_lr = 0;            // DeepSpeed's WarmupLR, WarmupDecayLR: where the warm-up starts
  std::string warmup_type = "log";    // DeepSpeed's WarmupLR, WarmupDecayLR: log (its default) or linear warm-up
  int lr_total_steps = 0;             // warmup-decay: the step where it reaches 0 (0: --steps)
  float weight_decay = 0.1f;
  float clip = 1.0f; // global gradient-norm clipping; 0 turns it off
  uint64_t seed = 1337;
  std::string precision = "fp32";
  DType dtype = DType::F32;
  // fp16 loss scaling (loss_scale.h), DeepSpeed's defaults
  float loss_scale = 65536;        // the initial scale, 2^16
  int loss_scale_window = 1000;    // clean steps in a row before the scale doubles; 0: a static scale
  int loss_scale_hysteresis = 2;   // overflows tolerated before the scale is lowered
  float loss_scale_backoff = 0.5f; // the scale is multiplied by this on a (hysteresis-th) overflow
  float loss_scale_min = 1;        // it never goes below this
  bool loss_scale_given = false;   // a --loss-scale* flag was given (fp16 only)
  // DeepSpeed's config file (ds_config.h): its path, and what needs the world size to check
  std::string config;
  long long train_batch_size = 0;  // 0: not given; else micro-batch x accum x world (resolve_batch)
  bool batch_given = false, accum_given = false;  // by the file or the command line
  // The flags whose value the file set (and the command line did not): flag -> "--config FILE:
  // key VALUE", the key and value as written in the file. An error names what the user wrote:
  // origin("--accum", "4") is "--accum 4" when typed, the config's key when the file set it.
  std::map<std::string, std::string> config_keys;
  std::vector<std::string> config_notes;  // one line per key that changes nothing here (the trainer prints them)
  std::string origin(const std::string& flag, const std::string& value) const {
    auto it = config_keys.find(flag);
    return it != config_keys.end() ? it->second : flag + " " + value;
  }
  // data and outputs
  std::string data;  // default: the corpus that ships with the project
  std::string log_json;
  int eval_every = 50;
  int eval_windows = 32;  // validation windows of --seq tokens, spread over the ranks
  std::string save_model;
  // backend
  std::string device = "auto";
  std::string kernels = "fast";   // fast (BLAS / cuBLAS) | reference (the hand-written kernels)
  std::string attention = "gemm"; // CUDA fast path: gemm (batched cuBLAS) | flash (no T x T matrix)
  // stage-specific
  int prefetch = 1;                  // stage3, infinity: gather the next unit while this one computes
  std::string offload_param = "cpu"; // infinity: cpu | disk (the parameter slices and optimizer state)
  std::string offload_to = "cpu";    // offload: cpu | disk
  std::string offload_dir;           // offload, infinity on disk: where the files go
  // the model state kept beyond the device goes to disk (each flag is refused by the rungs that do not use it)
  bool state_on_disk() const { return offload_to == "disk" || offload_param == "disk"; }
  long offload_chunk = 1 << 20;      // offload disk: elements streamed per chunk
  int pipeline = 1;                  // pipeline: P segments (the ranks are P segments x N/P replicas)
  std::string schedule = "1f1b";     // pipeline: gpipe | 1f1b
  std::string partition;             // pipeline: the first unit of segments 1..P-1 ("" : balance parameters)
  int zero = 0;                      // pipeline: ZeRO inside each segment's replicas (0 or 1; 2 and 3 refused)
  int tensor = 1;                    // tensor: T tensor ranks (the ranks are N/T replicas x T, T fastest)
  bool sequence_parallel = false;    // tensor: Megatron's sequence parallelism in the layer norms' regions
  // begin ulysses flags
  int sp = 1;                        // ulysses: S ranks split each sequence (N = S x D replicas)
  std::string sp_mode = "ulysses";   // ulysses: ulysses (all-to-all of heads) | ring (keys and values around a ring)
  int ctx = -1;                      // the context (wpe's rows; -1: the preset's): long sequences
  // end ulysses flags
  // zeropp (ZeRO++): int8 weight gathers, a node-local secondary shard, int4 gradient reduction
  bool qwz = false;                  // qwZ: all-gather the parameters as int8 blocks
  int hpz = 0;                       // hpZ: nodes of G ranks; backward gathers inside the node (0: off)
  bool qgz = false;                  // qgZ: reduce-scatter the gradients as int4 blocks (all-to-all)
  bool qgz_flat = false;             // qgZ as one all-to-all over all ranks, not inside then across nodes
  int node_size = 0;                 // --ranks-per-node: simulated nodes of G ranks (0: --hpz's, else all)
  long qw_block = 256, qg_block = 256;  // values per fp32 scale (powers of two)
  // zeropp: the block every unit's slices are whole multiples of (units padded to N x this); 1 when
  // nothing is quantized
  size_t quant_pad_block() const {
    size_t b = 1;
    if (qwz) b = std::max(b, size_t(qw_block));
    if (qgz) b = std::max(b, size_t(qg_block));
    return b;
  }
  // quantization-aware training (qat.h, docs/compression.md): every trainer
  int qat_bits = 0;                  // --qat int8 | int4: 8 or 4; 0: off
  long qat_block = 64;               // --qat-block: values per fp32 scale (a power of two)
  bool qat_skip_embed = false;       // --qat-skip embedding: the tied embedding stays exact
  // --optimizer muon (muon.h): Muon for the blocks' matrices, AdamW for the rest, each at its own rate
  std::string optimizer = "adamw";   // adamw | muon
  float muon_lr = -1, adam_lr = -1;  // peak rates on --lr's curve; -1: --lr
  std::string muon_shard = "owners"; // stages 1-3: owners | gather-all | whole-matrices (muon_formulas.h)
  bool quiet = false;                // no per-step lines (tests)
  bool activation_checkpointing = false;  // keep block inputs only; recompute each block in its backward
  // checkpoints and fault tolerance (docs/checkpoints.md)
  std::string ckpt_dir;  // where checkpoints go (DIR/step-N); none without it
  int ckpt_every = 0;    // a checkpoint every K steps (and one at the end); 0: only at the end
  int ckpt_keep = 2;     // keep the newest M checkpoints
  std::string resume;    // a checkpoint, a --ckpt-dir, or "auto" (the newest valid one in --ckpt-dir)
  bool ckpt_overwrite = false;  // remove another run's checkpoints from --ckpt-dir instead of refusing it
  bool resume_changed = false;  // resume with settings other than the checkpoint's (else refused)
  // pruning (prune.h): fine-tune a pruned model file (build/bin/prune), its pruned weights kept at 0
  std::string prune_mask;
  int watchdog = 300;    // seconds without progress on any rank before the job is ended, naming the rank; 0: off
};

// Parses and validates argv; prints --help and exits 0; on bad input prints one line, exits 2.
Args parse_args(int argc, char** argv, const char* program);
// The default corpus path (data/corpus.txt, found next to the build tree or in the working dir).
std::string default_data_path();
// An output file (--save-model, --log-json, a tool's --out): exits 2 with one line unless it names
// a file (not a directory, nor ending in '/') in a writable directory.
void check_output_file(const char* flag, const std::string& path);
// Exits 2 with one line if `path` (given with `flag`) is directory `dir` (given with `dir_flag`) or
// lies anywhere inside it, however either is spelled (symbolic links, "..", a path not made yet):
// an output written into a checkpoint would damage it, or be removed with it.
void check_not_inside(const char* flag, const std::string& path, const char* dir_flag, const std::string& dir);
// --config's train_batch_size (ds_config.h) against the micro-batch and accumulation in force (from the file or the command
// line) and the world size: checks them when all three are given, else derives the missing one
// (DeepSpeed's rule); one line and exit 2 when they cannot agree or the derived one is out of
// range. A no-op without train_batch_size, or with --global-batch (the command line's own).
void resolve_batch(Args& a, int world);
// "64MiB", "2GB", "1.5GiB", "500kB", "123456" (bytes) -> bytes; a bad size exits 2 naming `flag`.
uint64_t parse_bytes(const std::string& flag, const std::string& v);

}  // namespace nz
