// lr_schedule.cpp — the learning-rate curves (lr_schedule.h).
#include "lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace nz {

float lr_at(const LrScheduleConfig& a, int step) {
  if (a.kind == "constant") return a.lr;  // DeepSpeed without a scheduler: the optimizer's rate
  if (a.kind != "cosine") {
    // DeepSpeed's WarmupLR and WarmupDecayLR at scheduler iteration `step`: min + (max - min) * gamma,
    // gamma rising over the warm-up (log(t + 1) / log(W), or t / W; W at least 2), then 1
    // (warmup) or falling linearly to 0 at the total step (warmup-decay).
    const int W = std::max(2, a.warmup), total = a.total_steps > 0 ? a.total_steps : a.steps;
    double gamma = 1.0;
    if (step < W) gamma = a.warmup_type == "log" ? std::log(double(step + 1)) / std::log(double(W)) : double(step) / W;
    else if (a.kind == "warmup-decay") gamma = std::max(0.0, double(total - step) / std::max(1.0, double(total - W)));
    return float(a.warmup_min_lr + (double(a.lr) - a.warmup_min_lr) * gamma);
  }
  if (step < a.warmup) return a.lr * float(step + 1) / float(a.warmup);
  const float min_lr = a.lr * 0.1f;
  const int decay_steps = a.steps - a.warmup;
  if (decay_steps <= 1) return a.lr;
  const float progress = float(step - a.warmup) / float(decay_steps - 1);  // 0 .. 1
  return min_lr + 0.5f * (a.lr - min_lr) * (1.0f + std::cos(float(M_PI) * progress));
}

}  // namespace nz
