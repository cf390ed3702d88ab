// hooks.h — ulysses' set-up (a RungSetUp, rung.h): the flags not built for this rung, refused.
#pragma once

namespace nz {

class Trainer;  // trainer.h

// --activation-checkpointing, --ckpt-dir/--resume, --qat, and on the GPU --sp-mode ring and
// --attention flash: each one line (exit 2), before anything is sized. --sp-mode ring with
// --device auto runs on the CPU.
void refuse_unbuilt_flags(Trainer& run);

}  // namespace nz
