// pipeline.h — pipeline parallelism's plan: who holds which units, and in which order they run.
// For pipeline/train.cpp: which units each segment holds, which rank is which (segment, replica),
// the order of one segment's forwards and backwards (GPipe, 1F1B), how many micro-batches'
// activations a segment keeps, and where its time goes (the bubble).
//
// A segment is what DeepSpeed and Megatron call a pipeline stage; here "stage" is kept for ZeRO's
// stages (stage0_ddp .. stage3). A segment: a contiguous run of the model's units, on D ranks.
//
// N ranks = P segments x D replicas. Rank r is segment r / D of replica r % D: the D ranks of a
// segment are neighbours in rank order, and they reduce the gradients of their units over the
// replicas (data parallelism, in replica order: the rank order of stage0_ddp on D ranks).
//
// The schedules, for K micro-batches on segment s of P (F k: forward of micro-batch k, B k: backward):
//   GPipe  F 0 .. F K-1, then B 0 .. B K-1: every micro-batch's activations are held at once (K slots)
//   1F1B   warm-up: F 0 .. F w-1 with w = min(P-s-1, K); then F w, B 0, F w+1, B 1, ... (one forward,
//          one backward); then the cool-down, the remaining backwards. At most w + 1 = min(P-s, K)
//          micro-batches are in flight: the first segment holds the most, the last one slot.
// Both run the backwards in ascending micro-batch order 0, 1, ..., K-1 on every segment. That is what
// makes the pipeline stage0_ddp --accum K to the bit: each unit's gradient is the sum over micro-batches
// added in that order (floating-point addition is not associative), and the tied embedding's gradient
// adds the head's and the lookup's parts of micro-batch k in the same order as stage0_ddp.
#pragma once
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "comm.h"  // Comm, CommRequest: the waits the segment clock counts
#include "layout.h"
#include "rung.h"  // Topology

namespace nz {

enum class PipeSchedule { GPipe, OneFOneB };
const char* schedule_name(PipeSchedule s);

struct PipeOp {
  bool forward;  // else backward
  int micro;     // the micro-batch, 0..K-1
};

// The order of forwards and backwards on segment s of P for K micro-batches (see above).
std::vector<PipeOp> segment_ops(PipeSchedule schedule, int P, int s, int K);
// The most micro-batches whose activations segment s holds at once: K for GPipe, min(P-s, K) for 1F1B.
int activation_slots(PipeSchedule schedule, int P, int s, int K);
// The idle fraction of a pipeline whose segments take equal time: (P-1) / (K+P-1).
double bubble_formula(int P, int K);

struct PipelinePlan {
  int segments = 1, replicas = 1;  // P, D
  int segment = 0, replica = 0;    // this rank's
  PipeSchedule schedule = PipeSchedule::OneFOneB;
  int zero = 0;  // --zero 1: each segment's optimizer state sharded over its D replicas (ZeRO-1, as stage1)
  std::vector<int> first_unit;   // P + 1 entries: segment s holds units [first_unit[s], first_unit[s + 1])
  int rank_of(int s, int d) const { return s * replicas + d; }
  int first() const { return first_unit[segment]; }    // this segment's units: [first(), end())
  int end() const { return first_unit[segment + 1]; }
  int segment_of_unit(int u) const;
};

// The plan for `rank` of `world` ranks, for the model `cfg`: P segments (--pipeline), the schedule's name (--schedule) and
// the partition (--partition: the first unit of segments 1..P-1, comma-separated; "" balances the
// parameters). Bad input is one line and exit 2 (check.h, user_error): P not dividing N, more
// segments than units, a partition that is not increasing, leaves a segment empty or has the wrong count,
// --zero 2 or 3 (see make_pipeline_plan in pipeline.cpp for why they do not fit a pipeline).
PipelinePlan make_pipeline_plan(const GPTConfig& cfg, int world, int rank, int P, const std::string& schedule,
                                const std::string& partition, int zero = 0);
struct Args;  // input/cli.h
// The plan from the command line (--pipeline, --schedule, --partition, --zero): make_pipeline_plan's.
PipelinePlan pipeline_plan(const Args& a, int world, int rank);
// This rank's topology (rung.h): its segment's units, its replica among D, its schedule's activation
// slots. Bad flags are one line here (the plan's, and --qat's blocks on the last segment's wte).
Topology pipeline_topology(const Args& a, int world, int rank);

// The default partition: each boundary where the running parameter count comes nearest to s/P of
// the total, every segment at least one unit (DeepSpeed's partition_method "parameters").
std::vector<int> balanced_partition(const Layout& L, int P);

// One stretch of a segment's time inside one op of its schedule: computing, or waiting.
struct SegmentEvent {
  PipeOp op;
  bool wait;
  double t0_s, t1_s;  // on the steady clock, which the ranks of one machine share
};

// Where a segment's time goes while it runs its schedule: computing, or waiting for a neighbour (a
// receive, or a send it must see through before it may reuse the buffer). The idle fraction
// wait / (compute + wait) is the measured bubble. Each stretch is also kept as an event of the op
// it belongs to (the last step's: the pipeline diagram, notebooks/05_pipeline.ipynb).
class SegmentClock {
 public:
  int start(const PipeOp& op);  // the schedule's next op begins (computing); returns its micro-batch
  void computing() { switch_to(false); }
  void waiting() { switch_to(true); }
  void stop();  // the end of the schedule: nothing is counted until the next computing() or waiting()
  double compute_s = 0, wait_s = 0;
  std::vector<SegmentEvent> events;  // the last step's

 private:
  void switch_to(bool wait);
  bool running_ = false, in_wait_ = false, new_step_ = true;
  PipeOp op_{true, -1};  // -1: between steps, nothing to record
  std::chrono::steady_clock::time_point since_;
};

// The messages between two ranks of a pipeline that may be in flight together, told apart.
enum PipeTag { kActivation = 1, kActivationGrad, kHeadGrad, kTiedWeights, kModelFile };

class Trainer;  // trainer.h
// What the Trainer asks of a pipeline rank besides training (rung.h's hooks, and unit_access):
// validation's forward through every segment (the loss on the last, 0 elsewhere), rank 0's access to
// every unit for the model file, and the memory table's formulas, each segment its own. P(u): unit
// u's parameters on my segment; head_weights: the LM head's wte (the last segment's), else null.
void set_pipeline_hooks(Trainer& run, const PipelinePlan& pipe, std::function<void*(int u)> P,
                        const void* head_weights);

// A receive, or a send seen through, counted on the segment clock as waiting: the bubble is made of
// these (pipeline/train.cpp calls them wherever a neighbour may keep it waiting).
void recv_waiting(Comm& comm, SegmentClock& clock, void* dst, size_t elems, DType dt, int from, int tag);
void wait_waiting(Comm& comm, SegmentClock& clock, CommRequest& sent);

// The bubble, measured: every rank's compute and wait times gathered; rank 0 prints them with each
// rank's idle fraction beside the formula. Returns the report's "pipeline" object (JSON), with each
// rank's events of the last step (ms from the first of them on any rank). Collective.
std::string report_bubble(Comm& comm, const PipelinePlan& plan, int K, const SegmentClock& clock);

}  // namespace nz
