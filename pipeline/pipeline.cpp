// pipeline.cpp — the partition, the schedules and the segment clock (pipeline.h).
#include "pipeline/pipeline.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "comm.h"           // gather_scalar: every rank's times
#include "runtime/check.h"  // user_error
#include "input/cli.h"    // Args
#include "runtime/json.h"   // JsonWriter: the report's "pipeline" object

namespace nz {

const char* schedule_name(PipeSchedule s) { return s == PipeSchedule::GPipe ? "gpipe" : "1f1b"; }

std::vector<PipeOp> segment_ops(PipeSchedule schedule, int P, int s, int K) {
  std::vector<PipeOp> ops;
  if (schedule == PipeSchedule::GPipe) {
    for (int k = 0; k < K; k++) ops.push_back({true, k});
    for (int k = 0; k < K; k++) ops.push_back({false, k});  // ascending: the order that keeps the bits
    return ops;
  }
  // begin exercise: pipeline_1f1b
  const int warmup = std::min(P - s - 1, K);
  for (int k = 0; k < warmup; k++) ops.push_back({true, k});
  for (int k = warmup; k < K; k++) {  // steady state: one forward, one backward
    ops.push_back({true, k});
    ops.push_back({false, k - warmup});
  }
  for (int k = K - warmup; k < K; k++) ops.push_back({false, k});  // cool-down
  // end exercise: pipeline_1f1b
  return ops;
}

int activation_slots(PipeSchedule schedule, int P, int s, int K) {
  return schedule == PipeSchedule::GPipe ? K : std::min(P - s, K);
}

double bubble_formula(int P, int K) { return double(P - 1) / double(K + P - 1); }

int PipelinePlan::segment_of_unit(int u) const {
  for (int s = 0; s < segments; s++)
    if (u < first_unit[s + 1]) return s;
  return segments - 1;
}

std::vector<int> balanced_partition(const Layout& L, int P) {
  const int U = L.num_units();
  std::vector<double> before(U + 1, 0);  // parameters in units [0, u)
  for (int u = 0; u < U; u++) before[u + 1] = before[u] + double(L.units[u].numel);
  std::vector<int> first{0};
  for (int s = 1; s < P; s++) {
    const double target = before[U] * s / P;
    int best = first.back() + 1;  // every segment at least one unit; room left for the segments after
    for (int u = best; u <= U - (P - s); u++)
      if (std::abs(before[u] - target) < std::abs(before[best] - target)) best = u;
    first.push_back(best);
  }
  first.push_back(U);
  return first;
}

PipelinePlan make_pipeline_plan(const GPTConfig& cfg, int world, int rank, int P, const std::string& schedule,
                                const std::string& partition, int zero) {
  const int U = cfg.layers + 2;
  // ZeRO-2 and -3 shard the gradient: each micro-batch's gradient of a unit must be reduce-scattered
  // away as soon as its backward ends. In a pipeline those backwards come one by one, between other
  // micro-batches' forwards, on every segment at its own time: a reduce-scatter per unit per micro-batch
  // on each segment, and the sum over micro-batches no longer local. ZeRO-1 shards only the optimizer
  // state, touched once per step after the last backward: it fits (DeepSpeed allows only it too).
  if (zero >= 2)
    user_error("--zero %d: ZeRO-%d shards the gradient, but in a pipeline a unit's gradient accumulates over K "
               "micro-batches whose backwards arrive at different times, so it cannot be sharded away after each "
               "one; expected --zero 0 or 1; use --zero 1 (the optimizer state sharded over the replicas)",
               zero, zero);
  if (world % P != 0)
    user_error("--pipeline %d: does not divide the %d ranks, expected N = P x D (D data-parallel replicas of the "
               "pipeline); run on a multiple of %d ranks, or choose P dividing %d",
               P, world, P, world);
  if (P > U)
    user_error("--pipeline %d: more segments than the model's %d units (embedding, %d blocks, final layernorm), "
               "expected at most %d; use fewer segments or more --layers",
               P, U, U - 2, U);
  PipelinePlan plan;
  plan.segments = P;
  plan.replicas = world / P;
  plan.segment = rank / plan.replicas;
  plan.replica = rank % plan.replicas;
  plan.zero = zero;
  if (schedule == "gpipe") plan.schedule = PipeSchedule::GPipe;
  else if (schedule == "1f1b") plan.schedule = PipeSchedule::OneFOneB;
  else user_error("--schedule %s: unknown pipeline schedule, expected gpipe or 1f1b", schedule.c_str());
  if (partition.empty()) {
    plan.first_unit = balanced_partition(make_layout(cfg, plan.replicas), P);
    return plan;
  }
  plan.first_unit = {0};
  const char* at = partition.c_str();
  while (*at) {
    char* end = nullptr;
    const long u = strtol(at, &end, 10);
    if (end == at || (*end != ',' && *end != '\0'))
      user_error("--partition %s: not a list of unit numbers, expected the first unit of segments 1..%d, "
                 "comma-separated (e.g. --partition %d for 2 segments)", partition.c_str(), P - 1, U / 2);
    if (u <= plan.first_unit.back() || u >= U)
      user_error("--partition %s: unit %ld %s, expected increasing unit numbers in 1..%d so that every segment holds "
                 "at least one unit (0 embed, 1..%d blocks, %d lnf)", partition.c_str(), u,
                 u >= U ? "is past the last unit" : "leaves a segment empty", U - 1, U - 2, U - 1);
    plan.first_unit.push_back(int(u));
    at = *end ? end + 1 : end;
  }
  if (int(plan.first_unit.size()) != P)
    user_error("--partition %s: %zu boundaries for --pipeline %d, expected %d (the first unit of segments 1..%d)",
               partition.c_str(), plan.first_unit.size() - 1, P, P - 1, P - 1);
  plan.first_unit.push_back(U);
  return plan;
}

int SegmentClock::start(const PipeOp& op) {
  if (new_step_) events.clear(), new_step_ = false;  // keep the last step's only
  switch_to(false);  // the previous op's last stretch ends here
  op_ = op;
  return op.micro;
}

void SegmentClock::switch_to(bool wait) {
  const auto now = std::chrono::steady_clock::now();
  if (running_) {
    (in_wait_ ? wait_s : compute_s) += std::chrono::duration<double>(now - since_).count();
    auto secs = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double>(t.time_since_epoch()).count();
    };
    if (op_.micro >= 0 && now > since_) events.push_back({op_, in_wait_, secs(since_), secs(now)});
  }
  running_ = true;
  in_wait_ = wait;
  since_ = now;
}

void SegmentClock::stop() {
  switch_to(false);
  running_ = false;
  new_step_ = true;
  op_.micro = -1;
}

PipelinePlan pipeline_plan(const Args& a, int world, int rank) {
  return make_pipeline_plan(a.cfg, world, rank, a.pipeline, a.schedule, a.partition, a.zero);
}

Topology pipeline_topology(const Args& a, int world, int rank) {
  const PipelinePlan plan = pipeline_plan(a, world, rank);
  // the last segment quantizes its own copy of wte for the LM head: its blocks are the embedding's
  // (counted from the unit's start) only if wte is whole blocks
  const size_t wte_elems = size_t(a.cfg.vocab) * a.cfg.dim;
  if (a.qat_bits && !a.qat_skip_embed && wte_elems % a.qat_block != 0)
    user_error("--qat with --pipeline: wte's %zu values are not whole blocks of %ld, expected a --qat-block that "
               "divides them (at most %zu); use a smaller --qat-block or --qat-skip embedding", wte_elems,
               a.qat_block, wte_elems & (~wte_elems + 1));
  Topology t;
  t.dp_world = plan.replicas, t.dp_rank = plan.replica;
  t.first_unit = plan.first(), t.end_unit = plan.end();
  t.activation_slots = [plan](int K) { return activation_slots(plan.schedule, plan.segments, plan.segment, K); };
  return t;
}

void recv_waiting(Comm& comm, SegmentClock& clock, void* dst, size_t elems, DType dt, int from, int tag) {
  clock.waiting();
  comm.recv(dst, elems, dt, from, tag);
  clock.computing();
}

void wait_waiting(Comm& comm, SegmentClock& clock, CommRequest& sent) {
  clock.waiting();
  comm.wait(sent);
  clock.computing();
}

std::string report_bubble(Comm& comm, const PipelinePlan& plan, int K, const SegmentClock& clock) {
  const std::vector<double> compute_s = comm.gather_scalar(clock.compute_s);
  const std::vector<double> wait_s = comm.gather_scalar(clock.wait_s);
  // the events, in ms from the first one on any rank: [op, micro-batch, "compute" or "wait", from, to]
  const std::vector<double> firsts = comm.gather_scalar(clock.events.empty() ? 1e300 : clock.events[0].t0_s);
  double origin = comm.rank() == 0 ? *std::min_element(firsts.begin(), firsts.end()) : 0;
  comm.control_broadcast(&origin, sizeof origin);
  std::string mine = "[";
  for (const SegmentEvent& ev : clock.events) {
    char one[96];
    snprintf(one, sizeof one, "%s[\"%c\", %d, \"%s\", %.4f, %.4f]", mine.size() > 1 ? ", " : "",
             ev.op.forward ? 'F' : 'B', ev.op.micro, ev.wait ? "wait" : "compute", 1e3 * (ev.t0_s - origin),
             1e3 * (ev.t1_s - origin));
    mine += one;
  }
  const std::string all_events = comm.gather_strings(mine + "]", "\n");  // rank 0: one line per rank
  size_t line_at = 0;
  JsonWriter j;
  j.begin_object();
  j.kv("segments", plan.segments);
  j.kv("replicas", plan.replicas);
  j.kv("zero", plan.zero);
  j.kv("schedule", schedule_name(plan.schedule));
  j.kv("bubble_formula", bubble_formula(plan.segments, K));
  j.key("first_unit");
  j.begin_array();
  for (int u : plan.first_unit) j.value(u);
  j.end_array();
  j.key("ranks");
  j.begin_array();
  if (comm.rank() == 0)
    printf("pipeline: %d segments x %d replicas, %s, %d micro-batches | bubble (P-1)/(K+P-1) = %.3f\n",
           plan.segments, plan.replicas, schedule_name(plan.schedule), K, bubble_formula(plan.segments, K));
  for (int r = 0; r < comm.size(); r++) {
    const double busy = compute_s[r] + wait_s[r];
    const double idle = busy > 0 ? wait_s[r] / busy : 0;
    const int rs = r / plan.replicas;
    if (comm.rank() == 0)
      printf("  rank %d (segment %d, units %d..%d, %d activation slots): compute %.1f ms, waiting %.1f ms: idle %.3f\n",
             r, rs, plan.first_unit[rs], plan.first_unit[rs + 1] - 1,
             activation_slots(plan.schedule, plan.segments, rs, K), 1e3 * compute_s[r], 1e3 * wait_s[r], idle);
    j.begin_object();
    j.kv("segment", rs);
    j.kv("compute_s", compute_s[r]);
    j.kv("wait_s", wait_s[r]);
    j.kv("idle", idle);
    const size_t line_end = std::min(all_events.find('\n', line_at), all_events.size());
    j.key("events");  // rank 0 gathered them: one line per rank
    j.raw(comm.rank() == 0 ? all_events.substr(line_at, line_end - line_at) : "[]");
    j.end_object();
    line_at = line_end + 1;
  }
  j.end_array();
  j.end_object();
  fflush(stdout);
  return j.str();
}

}  // namespace nz
