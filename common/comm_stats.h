// comm_stats.h — the comm ledger: how many elements and bytes each kind of collective moved on
// this rank, and what crossed the host<->device link. Plain counters with no MPI in them, in a
// header of their own because their readers are the reports and the tests, not the collectives:
// comm.h counts into them, trainer.h differences them per step, the JSON report prints them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace nz {

// Broadcast has no caller: the stages never broadcast model state. It stays so that every report
// keeps the same "comm" keys (scripts/exercise_grader.py reads "broadcast"), and it counts in
// model_elems_sent, which tests/stages/test_zero12.cpp holds to the formulas: a broadcast would show there.
// OverflowFlag: fp16's once-per-step agreement on a gradient overflow (loss_scale.h).
// PointToPoint: the pipeline's activations and their gradients between neighbouring segments (and
// the tied embedding's gradient and weights between the first and the last segment).
// AllToAll: ZeRO++'s quantized gradient reduce-scatter (qgZ) moves int4 blocks with one; ulysses turns
// attention's tokens into heads and back with four per block and micro-step.
enum class CommOp { AllReduce, ReduceScatter, AllGather, Broadcast, Scalars, OverflowFlag, PointToPoint, AllToAll,
                    kCount };
constexpr int kNumCommOps = int(CommOp::kCount);

struct CommCounts {
  uint64_t calls = 0;
  uint64_t elems_sent = 0;  // elements this rank sent (what the ZeRO formulas count)
  uint64_t bytes_sent = 0;
  uint64_t bytes_recv = 0;
  // Of bytes_sent, those sent to ranks on another node (Comm::set_node_size: simulated nodes of G
  // ranks; one node unless set). bytes_sent - bytes_across_sent stayed inside the node.
  uint64_t bytes_across_sent = 0;
};

// What crossed the host<->device link (offload), counted by whoever copies.
struct LinkCounts {
  uint64_t to_host_bytes = 0, to_device_bytes = 0;
  uint64_t to_host_elems = 0, to_device_elems = 0;
};

// One call's traffic on this rank, each count by its name: what it sent (elements and bytes), what
// it received, and how many of the bytes sent went to ranks on another node. Built by the way the
// call moves data, e.g. CallTraffic::both_ways(e, b).across_nodes(x).
struct CallTraffic {
  uint64_t elems_sent = 0, bytes_sent = 0, bytes_recv = 0, bytes_across = 0;
  // sent elems (bytes), and received as many bytes: every collective
  static CallTraffic both_ways(uint64_t elems, uint64_t bytes) { return {elems, bytes, bytes, 0}; }
  static CallTraffic sent(uint64_t elems, uint64_t bytes) { return {elems, bytes, 0, 0}; }
  static CallTraffic received(uint64_t bytes) { return {0, 0, bytes, 0}; }
  CallTraffic across_nodes(uint64_t bytes) const {
    CallTraffic t = *this;
    t.bytes_across = bytes;
    return t;
  }
};

struct CommStats {
  CommCounts op[kNumCommOps];
  LinkCounts link;
  // One call of `op` that moved this much.
  void add(CommOp op, const CallTraffic& t);
  void add_link(bool to_host, size_t elems, size_t bytes);
  // Model-state traffic: everything except the small scalar all-reduces (loss, norm, timings)
  // and the overflow flag.
  uint64_t model_elems_sent() const;
  uint64_t model_bytes_sent() const;
  uint64_t model_bytes_across_nodes() const;  // of model_bytes_sent, to ranks on other nodes
  CommStats operator-(const CommStats& o) const;
  std::string to_json() const;
};

}  // namespace nz
