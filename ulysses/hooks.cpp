// hooks.cpp — what ulysses refuses at set-up: the flags not built for this rung (hooks.h).
#include "ulysses/hooks.h"

#include "runtime/device.h"  // cuda_rt: is there a GPU for --device auto
#include "trainer.h"

namespace nz {

void refuse_unbuilt_flags(Trainer& run) {
  const Args& a = run.args;
  if (a.activation_checkpointing)
    user_error("--activation-checkpointing with ulysses: not built yet (the recompute would "
               "repeat the all-to-alls), expected it off; drop the flag");
  if (!a.ckpt_dir.empty() || !a.resume.empty())
    user_error("--ckpt-dir/--resume with ulysses: checkpoints are not built for this rung "
               "yet, expected neither; drop them, or train with stage3");
  if (a.qat_bits)
    user_error("--qat with ulysses: not built for this rung, expected no --qat; drop it");
  // The GPU runs the Ulysses mode (its all-to-alls on NCCL or through pinned host memory, the
  // layout changes as device kernels); ring attention's tiles are host loops (ring.cpp).
  const bool gpu = a.device == "cuda" || (a.device == "auto" && cuda_rt::compiled() && cuda_rt::device_count() > 0);
  if (a.sp_mode == "ring" && a.device == "cuda")
    user_error("--sp-mode ring --device cuda: ring attention runs on the CPU backend only (its tiles are "
               "host loops, ulysses/ring.cpp), expected --device cpu or auto; or --sp-mode ulysses on the GPU");
  if (a.sp_mode == "ring") run.args.device = "cpu";  // auto: the CPU, even where a GPU is visible
  else if (gpu && a.attention == "flash")
    user_error("--attention flash with ulysses on the GPU: not built (sequence slices keep attention's "
               "probabilities, ulysses/formulas.h), expected --attention gemm; drop the flag");
}

}  // namespace nz
