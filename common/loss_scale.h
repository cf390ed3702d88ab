// loss_scale.h — dynamic loss scaling for fp16 training (DeepSpeed's DynamicLossScaler, NVIDIA's
// "mixed precision training" recipe).
//
// fp16 has 5 exponent bits: nothing below 2^-24 survives, and a gradient of 1e-8 is 0. So the loss
// is multiplied by a scale S before the backward (every gradient is then S times too large, and
// stays representable), and the optimizer divides by S in fp32, on the master copy. A large S risks
// overflow (65504 is fp16's largest value): an inf or NaN anywhere in the gradients. Then the step
// is skipped (params, Adam moments and the Adam step count untouched) and S is lowered; after
// `window` clean steps in a row S is doubled again. With hysteresis H, only the H-th overflow since
// the last change lowers S (DeepSpeed's delayed_shift); a clean growth window re-arms H.
//
// The decision must be the same on every rank, or the replicas (or shards) drift apart. The trainer
// decides from the global gradient norm, already summed over the ranks and so equal on every
// rank; one collective (an all-reduce MAX of a one-element flag, counted in the comm ledger as
// "overflow_flag") still confirms it, as DeepSpeed's overflow check does, so the skip stays a
// collective decision even for a caller that looks only at the gradients it holds. Only fp16 runs do any of this;
// in fp32 and bf16 the scale is 1 and nothing is exchanged.
//
// Skipped steps also leave the learning-rate curve where it was, as DeepSpeed does (its engine
// steps the LR scheduler only when the optimizer really stepped): the update count, not the step
// index, is the learning-rate curve's and Adam's clock.
#pragma once
#include "comm.h"

namespace nz {

// Everything the scaler remembers: a checkpoint stores it (checkpoint.h), so a resumed fp16 run goes on
// with the same scale, the same hysteresis and the same count of skipped steps.
struct LossScaleState {
  float scale = 1;
  long iter = 0, last_overflow_iter = -1;
  int hysteresis_left = 0, skipped = 0;
};

// The scaler's settings (the trainer fills them from --precision and the --loss-scale* flags),
// DeepSpeed's defaults.
struct LossScaleConfig {
  bool enabled = false;   // fp16 only; otherwise the scale is 1 and nothing is exchanged
  float initial = 65536;  // the initial scale, 2^16
  int window = 1000;      // clean steps in a row before the scale doubles; 0: a static scale
  int hysteresis = 2;     // overflows tolerated before the scale is lowered
  float backoff = 0.5f;   // the scale is multiplied by this on a (hysteresis-th) overflow
  float min = 1;          // it never goes below this
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& cfg);
  bool enabled() const { return enabled_; }
  float scale() const { return scale_; }  // 1 when disabled
  int skipped() const { return skipped_; }
  // Once per step, after the gradients are complete. local_overflow: this rank saw an inf or NaN
  // (the trainer passes the global norm's verdict, the same on every rank). Agrees over the ranks (one collective), updates the scale, and
  // returns true when the step must be skipped. Disabled: returns false, no communication.
  bool overflowed(Comm& comm, bool local_overflow);
  LossScaleState state() const { return {scale_, iter_, last_overflow_iter_, hysteresis_left_, skipped_}; }
  void restore(const LossScaleState& s);

 private:
  bool enabled_, dynamic_;
  float scale_, backoff_, min_;
  int window_, hysteresis_, hysteresis_left_;
  long iter_ = 0, last_overflow_iter_ = -1;  // DeepSpeed's cur_iter and last_overflow_iter
  int skipped_ = 0;
};

}  // namespace nz
