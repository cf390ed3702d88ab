// loss_scale.cpp — the loss scaler's update rule (DeepSpeed's, step for step).
#include "loss_scale.h"

#include <algorithm>

#include "runtime/check.h"  // user_error

namespace nz {

LossScaler::LossScaler(const LossScaleConfig& c)
    : enabled_(c.enabled),
      dynamic_(c.window > 0),
      scale_(enabled_ ? c.initial : 1.0f),
      backoff_(c.backoff),
      min_(c.min),
      window_(c.window),
      hysteresis_(c.hysteresis),
      hysteresis_left_(c.hysteresis) {}

void LossScaler::restore(const LossScaleState& s) {
  scale_ = s.scale;
  iter_ = s.iter;
  last_overflow_iter_ = s.last_overflow_iter;
  hysteresis_left_ = s.hysteresis_left;
  skipped_ = s.skipped;
}

bool LossScaler::overflowed(Comm& comm, bool local_overflow) {
  if (!enabled_) return false;
  const bool overflow = comm.any_flag(local_overflow);  // one collective: every rank decides alike
  if (overflow) {
    skipped_++;
    if (dynamic_) {
      if (hysteresis_left_ <= 1) {  // the H-th overflow since the scale last changed: back off
        if (scale_ <= min_)
          user_error("fp16 loss scale: the gradients overflow even at the minimum scale %g (--loss-scale-min); "
                     "the run has diverged: lower --lr, or train in bf16", double(min_));
        scale_ = std::max(scale_ * backoff_, min_);
      } else {
        hysteresis_left_--;
      }
    }
    last_overflow_iter_ = iter_;
  } else if (dynamic_ && (iter_ - last_overflow_iter_) % window_ == 0) {
    hysteresis_left_ = hysteresis_;  // a whole window without overflow: grow, and re-arm the hysteresis
    scale_ *= 2;
  }
  iter_++;
  return overflow;
}

}  // namespace nz
