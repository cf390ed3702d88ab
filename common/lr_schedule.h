// lr_schedule.h — the learning rate at each optimizer update: linear warm-up then cosine decay
// (this project's), DeepSpeed's WarmupLR / WarmupDecayLR, or a constant rate: the learning-rate
// curve (--lr-curve). "Schedule" alone is the pipeline's order of forwards and backwards.
#pragma once
#include <string>

namespace nz {

struct LrScheduleConfig {
  float lr = 3e-3f;                   // peak learning rate
  int warmup = 20;                    // warm-up updates
  int steps = 200;                    // the run's steps (cosine decays to lr/10 at the last one)
  std::string kind = "cosine";        // cosine | warmup | warmup-decay | constant
  float warmup_min_lr = 0;            // DeepSpeed's WarmupLR, WarmupDecayLR: where the warm-up starts
  std::string warmup_type = "log";    // DeepSpeed's WarmupLR, WarmupDecayLR: log or linear warm-up
  int total_steps = 0;                // warmup-decay: the step where it reaches 0 (0: steps)
};

// Linear warm-up to lr over warmup steps, then cosine decay to lr/10 at the last step; or, with
// kind warmup / warmup-decay, DeepSpeed's WarmupLR / WarmupDecayLR; or, with kind constant (a
// --config without a scheduler section), lr at every step.
float lr_at(const LrScheduleConfig& s, int step);

}  // namespace nz
