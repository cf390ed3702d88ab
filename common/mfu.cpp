// mfu.cpp — FLOPs per token, the GPUs' peak FLOP/s, and their ratio.
#include "mfu.h"

#include <cstdlib>
#include <cstring>

#include "runtime/check.h"   // user_error
#include "runtime/device.h"  // current_device, cuda_rt::device_name

namespace nz {

// FLOPs per token of one training step (forward + backward), as counted in the PaLM paper:
//  - each weight multiplies each token once in the forward (2 FLOPs: multiply, add) and twice in
//    the backward (input gradient, weight gradient): 6 FLOPs per parameter, 6Ψ. The LM head
//    reuses wte, so 6Ψ covers it; biases, norms and wpe are counted too (under 2% of Ψ).
//  - attention has no weights but two products per layer and token: scores q·K^T (C channels
//    against T keys: 2TC) and att·V (2TC); 4TC forward, twice that backward: 12TC per layer,
//    12LTC in all, counting the whole T x T (the causal half that is skipped too, by convention).
double flops_per_token(const GPTConfig& cfg, int seq, size_t num_params) {
  return 6.0 * double(num_params) + 12.0 * cfg.layers * double(seq) * cfg.dim;
}

// A block's forward is a third of its training FLOPs: 2 per weight and token (the block's
// 12C^2 + 13C parameters, biases and layernorms counted as flops_per_token counts them), and
// attention's two products, 4TC. L blocks: 2L(12C^2 + 13C) + 4LTC.
double recompute_flops_per_token(const GPTConfig& cfg, int seq) {
  const double C = cfg.dim;
  return cfg.layers * (2.0 * (12 * C * C + 13 * C) + 4.0 * seq * C);
}

// bf16 and fp16 run their matmuls on tensor cores (bf16 in, fp32 accumulate); fp32 runs on the fp32 units
// (cuBLAS with CUBLAS_COMPUTE_32F, no TF32). NZ_PEAK_TFLOPS=<number> is for another GPU, other
// clocks, or sparsity.
double peak_flops(DType dt) {
  if (const char* env = getenv("NZ_PEAK_TFLOPS")) {
    char* end = nullptr;
    double t = strtod(env, &end);
    if (end == env || *end != '\0' || !(t > 0))
      user_error("NZ_PEAK_TFLOPS=%s: not a positive number; set it to the GPU's peak in TFLOP/s "
                 "(e.g. 989 for an H100 in bf16) or unset it", env);
    return t * 1e12;
  }
  // The more specific names first: "H100" is also a substring of "H100 PCIe".
  struct Peak { const char* name; double bf16, fp32; };  // TFLOP/s, dense, from the data sheets
  static const Peak peaks[] = {{"H100 PCIe", 756, 51}, {"H100 NVL", 835, 60}, {"H200 NVL", 835, 60},
                               {"H100", 989, 67},       {"H200", 989, 67},     {"A100", 312, 19.5}};
  const char* name = cuda_rt::device_name();
  for (const Peak& p : peaks)
    if (strstr(name, p.name)) return (dt == DType::F32 ? p.fp32 : p.bf16) * 1e12;  // fp16: bf16's tensor-core rate
  return 0;
}

double mfu(double flops_per_token, double tokens_per_s, DType dt, int gpus) {
  if (current_device() != Device::CUDA) return 0;
  const double peak = peak_flops(dt) * gpus;  // ranks sharing a GPU share its peak
  return peak > 0 ? flops_per_token * tokens_per_s / peak : 0;
}

}  // namespace nz
