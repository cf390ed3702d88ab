// cli.h — the command line, parsed once and identical for every stage and tool.
// Bad values get one line (flag, value, what is valid) and exit code 2 before anything is allocated.
#pragma once
#include <string>

#include "dtype.h"
#include "model.h"

namespace nz {

struct Args {
  // model
  std::string preset = "small";
  int layers = -1, dim = -1, heads = -1;  // -1: the preset's value
  GPTConfig cfg;                          // the preset with the overrides applied
  // batch and schedule
  int batch = 4;     // micro-batch per rank
  int seq = 64;      // sequence length
  int accum = 1;     // gradient accumulation steps
  int steps = 200;
  float lr = 3e-3f;  // peak learning rate
  int warmup = 20;   // linear warm-up steps, then cosine decay to lr/10
  float weight_decay = 0.1f;
  float clip = 1.0f; // global gradient-norm clipping; 0 turns it off
  uint64_t seed = 1337;
  std::string precision = "fp32";
  DType dtype = DType::F32;
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
  int prefetch = 1;                  // stage3: gather the next unit while this one computes
  std::string offload_to = "cpu";    // offload: cpu | disk
  std::string offload_dir;           // offload --offload-to disk: where the optimizer files go
  long offload_chunk = 1 << 20;      // offload disk: elements streamed per chunk
  bool quiet = false;                // no per-step lines (tests)
  // checkpoints and fault tolerance (README "Checkpoints")
  std::string ckpt_dir;  // where checkpoints go (DIR/step-N); none without it
  int ckpt_every = 0;    // a checkpoint every K steps (and one at the end); 0: only at the end
  int ckpt_keep = 2;     // keep the newest M checkpoints
  std::string resume;    // a checkpoint, a --ckpt-dir, or "auto" (the newest valid one in --ckpt-dir)
  int watchdog = 300;    // seconds without progress before the job is ended, naming the rank; 0: off
};

// Parses and validates argv; prints --help and exits 0; on bad input prints one line, exits 2.
Args parse_args(int argc, char** argv, const char* program);
// The default corpus path (data/corpus.txt, found next to the build tree or in the working dir).
std::string default_data_path();
// An output file (--save-model, --log-json, a tool's --out): exits 2 with one line unless it names
// a file (not a directory, nor ending in '/') in a writable directory.
void check_output_file(const char* flag, const std::string& path);
// Float formatting for messages.
std::string fmt_bytes(double bytes);

}  // namespace nz
