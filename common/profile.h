// profile.h — NZ_PROFILE=1: where a training step's time goes, measured. Each step is cut at the
// moments its phase changes (trainer.cpp: forward, backward, optimizer; model.cpp: attention in and
// out; comm.cpp: a collective in and out) into consecutive spans, each given to one part:
//
//   step = forward (of which attention) + backward (of which attention) + optimizer + collectives + other
//
// The spans tile the step, so the parts add up to it exactly and none is negative; "other" is
// what falls in no phase (loading the micro-batch, the start of the step). A collective inside the
// backward is the collective's, not the backward's; a recomputed forward (activation checkpointing)
// runs inside the backward and is the backward's.
//
// The clock: on the CUDA backend, events recorded on the compute stream at each cut, read once per
// step after the step's own device_sync (no synchronisation is added); a span is then GPU time
// on that stream, idle time included (the host preparing work, a staged collective). On NCCL the
// collectives run on their own stream and may overlap compute: "collectives" is the time the
// compute stream spends waiting for them (from the cut before its wait on the comm stream to the
// cut after), so a fully overlapped collective costs nothing here. On the CPU backend the cuts read
// the host's steady clock. Rank 0's figures are reported, averaged over the timed steps: all of
// them, or all but the first two (warm-up) when a run has more than 4.
//
// Without NZ_PROFILE=1 every call returns at once: nothing is recorded, nothing printed, the same bits.
#pragma once
#include <string>
#include <vector>

namespace nz {

class StepProfile {
 public:
  enum Part { Other, Forward, ForwardAttention, Backward, BackwardAttention, Optimizer, Collectives, kParts };
  static StepProfile& get();  // one per process
  bool on() const { return on_; }

  // trainer.cpp: the step's boundaries and its phases (Other, Forward, Backward or Optimizer)
  void begin_step();
  void phase(Part p);
  void end_step();                   // the last cut; before the step's device_sync
  void add_step(int step, bool timed);  // after it: the spans read and, when timed, added up

  // model.cpp and comm.cpp, nested freely (Scope below)
  void enter(Part p);  // ForwardAttention (the phase decides which attention) or Collectives
  void leave(Part p);

  int steps_timed() const { return timed_; }
  double ms(Part p) const { return timed_ ? total_[p] / timed_ : 0; }  // per timed step
  double step_ms() const;
  // "profile: step ... | steps A-B of N, rank 0, CUDA events" (the format docs/gpu.md shows; gpu_check.sh parses it), and the JSON object
  std::string line(int total_steps) const;
  std::string json() const;

  struct Scope {  // enter(p) now, leave(p) at the end of the scope
    Part p;
    explicit Scope(Part part) : p(part) { get().enter(p); }
    ~Scope() { get().leave(p); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
  };

 private:
  StepProfile();
  Part current() const;
  void cut();  // a new span starts now, given to current()
  bool on_ = false, in_step_ = false, events_ = false;
  Part phase_ = Other;
  int attention_depth_ = 0, collective_depth_ = 0;
  struct Cut {
    Part part;       // of the span that starts here
    double host_ms;  // the CPU backend's clock
  };
  std::vector<Cut> cuts_;  // this step's; on CUDA cut i is timing event i (cuda_rt::timer_record)
  double total_[kParts] = {};
  int timed_ = 0, first_timed_ = -1, last_timed_ = -1;
};

}  // namespace nz
