// profile.cpp — NZ_PROFILE=1's per-phase breakdown of a step (profile.h).
#include "profile.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/device.h"  // current_device, cuda_rt::timer_record / timer_elapsed_ms
#include "runtime/json.h"    // JsonWriter

namespace nz {

StepProfile& StepProfile::get() {
  static StepProfile p;
  return p;
}

StepProfile::StepProfile() {
  const char* env = getenv("NZ_PROFILE");
  on_ = env && strcmp(env, "1") == 0;
}

StepProfile::Part StepProfile::current() const {
  if (collective_depth_ > 0) return Collectives;
  if (attention_depth_ > 0) return phase_ == Backward ? BackwardAttention : phase_ == Forward ? ForwardAttention : phase_;
  return phase_;
}

void StepProfile::cut() {
  const Part p = current();
  if (!cuts_.empty() && cuts_.back().part == p) return;  // the same part goes on: no new span
  const double now = std::chrono::duration<double, std::milli>(
                         std::chrono::steady_clock::now().time_since_epoch()).count();
  if (events_) cuda_rt::timer_record(int(cuts_.size()));
  cuts_.push_back({p, now});
}

void StepProfile::begin_step() {
  if (!on_) return;
  events_ = current_device() == Device::CUDA;
  in_step_ = true;
  cuts_.clear();
  phase_ = Other;
  cut();
}

void StepProfile::phase(Part p) {
  if (!on_) return;
  phase_ = p;
  if (in_step_) cut();
}

void StepProfile::enter(Part p) {
  if (!on_) return;
  (p == Collectives ? collective_depth_ : attention_depth_)++;
  if (in_step_) cut();
}

void StepProfile::leave(Part p) {
  if (!on_) return;
  (p == Collectives ? collective_depth_ : attention_depth_)--;
  if (in_step_) cut();
}

void StepProfile::end_step() {
  if (!on_ || !in_step_) return;
  in_step_ = false;
  const double now = std::chrono::duration<double, std::milli>(
                         std::chrono::steady_clock::now().time_since_epoch()).count();
  if (events_) cuda_rt::timer_record(int(cuts_.size()));
  cuts_.push_back({Other, now});  // the end of the last span
}

void StepProfile::add_step(int step, bool timed) {
  if (!on_ || !timed || cuts_.size() < 2) return;
  for (size_t i = 0; i + 1 < cuts_.size(); i++) {
    const double ms = events_ ? cuda_rt::timer_elapsed_ms(int(i), int(i + 1)) : cuts_[i + 1].host_ms - cuts_[i].host_ms;
    total_[cuts_[i].part] += ms > 0 ? ms : 0;  // an event pair can read a hair below zero
  }
  timed_++;
  if (first_timed_ < 0) first_timed_ = step;
  last_timed_ = step;
}

double StepProfile::step_ms() const {
  double s = 0;
  for (int p = 0; p < kParts; p++) s += ms(Part(p));
  return s;
}

std::string StepProfile::line(int total_steps) const {
  char buf[400];
  snprintf(buf, sizeof buf,
           "profile: step %.1f ms = forward %.1f (attention %.1f) + backward %.1f (attention %.1f) + optimizer %.1f + "
           "collectives %.1f + other %.1f | steps %d-%d of %d, rank 0, %s",
           step_ms(), ms(Forward) + ms(ForwardAttention), ms(ForwardAttention), ms(Backward) + ms(BackwardAttention),
           ms(BackwardAttention), ms(Optimizer), ms(Collectives), ms(Other), first_timed_ + 1, last_timed_ + 1,
           total_steps, events_ ? "CUDA events" : "host clock");
  return buf;
}

std::string StepProfile::json() const {
  JsonWriter j;
  j.begin_object();
  j.kv("steps_timed", timed_);
  j.kv("step_ms", step_ms());
  j.kv("forward_ms", ms(Forward) + ms(ForwardAttention));
  j.kv("forward_attention_ms", ms(ForwardAttention));
  j.kv("backward_ms", ms(Backward) + ms(BackwardAttention));
  j.kv("backward_attention_ms", ms(BackwardAttention));
  j.kv("optimizer_ms", ms(Optimizer));
  j.kv("collectives_ms", ms(Collectives));
  j.kv("other_ms", ms(Other));
  j.kv("clock", events_ ? "cuda_events" : "host");
  j.end_object();
  return j.str();
}

}  // namespace nz
