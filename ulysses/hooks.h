// hooks.h — ulysses' set-up (a RungSetUp, rung.h): the flags not built for this rung, refused.
#pragma once

namespace nz {

class Trainer;  // trainer.h

// --activation-checkpointing, --ckpt-dir/--resume, --qat and --device cuda: each one line
// (exit 2), before anything is sized
void refuse_unbuilt_flags(Trainer& run);

}  // namespace nz
