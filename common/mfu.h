// mfu.h — model FLOPs utilisation (MFU) on GPUs: the model FLOP/s a run achieves over the peak
// FLOP/s of the GPUs it runs on. What the step line, the summary and the JSON report print.
#pragma once
#include <cstddef>

#include "kernels/dtype.h"  // DType
#include "layout.h"  // GPTConfig

namespace nz {

// FLOPs of one training step (forward + backward) per token, for a model of num_params
// parameters trained on sequences of length seq (PaLM's count; mfu.cpp says what it includes).
double flops_per_token(const GPTConfig& cfg, int seq, size_t num_params);
// FLOPs per token that activation checkpointing adds: one more forward of every block (the
// embedding, the final layernorm and the LM head are not recomputed). MFU leaves them out (they
// do not train the model: PaLM's definition); the step line reports them, and HFU counts them.
double recompute_flops_per_token(const GPTConfig& cfg, int seq);
// Dense peak FLOP/s of this process's GPU at precision dt, or 0 when unknown. NZ_PEAK_TFLOPS
// overrides the table; a value that is not a positive number exits with one line.
double peak_flops(DType dt);
// MFU at tokens_per_s (over all ranks) on `gpus` GPUs: 0 on the CPU or when the peak is unknown.
double mfu(double flops_per_token, double tokens_per_s, DType dt, int gpus);

}  // namespace nz
