// hooks.cpp — what ulysses refuses at set-up: the flags not built for this rung (hooks.h).
#include "ulysses/hooks.h"

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
  if (a.device == "cuda")
    user_error("--device cuda: ulysses' all-to-alls run on the CPU backend only, expected "
               "--device cpu or auto; run stage3 on the GPU");
}

}  // namespace nz
