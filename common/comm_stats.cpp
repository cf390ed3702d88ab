// comm_stats.cpp — counting into the comm ledger, differencing it per step, and its JSON form.
#include "comm_stats.h"

#include "runtime/json.h"

namespace nz {

// The keys of the report's "comm" object (tests/stages/test_zero12.cpp reads them by name).
static const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::AllReduce: return "all_reduce";
    case CommOp::ReduceScatter: return "reduce_scatter";
    case CommOp::AllGather: return "all_gather";
    case CommOp::Broadcast: return "broadcast";
    case CommOp::Scalars: return "scalars";
    case CommOp::OverflowFlag: return "overflow_flag";
    case CommOp::PointToPoint: return "p2p";
    case CommOp::AllToAll: return "all_to_all";
    default: return "?";
  }
}

void CommStats::add(CommOp o, const CallTraffic& t) {
  CommCounts& c = op[int(o)];
  c.calls++;
  c.elems_sent += t.elems_sent;
  c.bytes_sent += t.bytes_sent;
  c.bytes_recv += t.bytes_recv;
  c.bytes_across_sent += t.bytes_across;
}

void CommStats::add_link(bool to_host, size_t elems, size_t bytes) {
  if (to_host) {
    link.to_host_elems += elems;
    link.to_host_bytes += bytes;
  } else {
    link.to_device_elems += elems;
    link.to_device_bytes += bytes;
  }
}

uint64_t CommStats::model_elems_sent() const {
  uint64_t s = 0;
  for (int i = 0; i < kNumCommOps; i++)
    if (CommOp(i) != CommOp::Scalars && CommOp(i) != CommOp::OverflowFlag) s += op[i].elems_sent;
  return s;
}

uint64_t CommStats::model_bytes_sent() const {
  uint64_t s = 0;
  for (int i = 0; i < kNumCommOps; i++)
    if (CommOp(i) != CommOp::Scalars && CommOp(i) != CommOp::OverflowFlag) s += op[i].bytes_sent;
  return s;
}

uint64_t CommStats::model_bytes_across_nodes() const {
  uint64_t s = 0;
  for (int i = 0; i < kNumCommOps; i++)
    if (CommOp(i) != CommOp::Scalars && CommOp(i) != CommOp::OverflowFlag) s += op[i].bytes_across_sent;
  return s;
}

CommStats CommStats::operator-(const CommStats& o) const {
  CommStats d;
  for (int i = 0; i < kNumCommOps; i++) {
    d.op[i].calls = op[i].calls - o.op[i].calls;
    d.op[i].elems_sent = op[i].elems_sent - o.op[i].elems_sent;
    d.op[i].bytes_sent = op[i].bytes_sent - o.op[i].bytes_sent;
    d.op[i].bytes_recv = op[i].bytes_recv - o.op[i].bytes_recv;
    d.op[i].bytes_across_sent = op[i].bytes_across_sent - o.op[i].bytes_across_sent;
  }
  d.link.to_host_bytes = link.to_host_bytes - o.link.to_host_bytes;
  d.link.to_device_bytes = link.to_device_bytes - o.link.to_device_bytes;
  d.link.to_host_elems = link.to_host_elems - o.link.to_host_elems;
  d.link.to_device_elems = link.to_device_elems - o.link.to_device_elems;
  return d;
}

std::string CommStats::to_json() const {
  JsonWriter j;
  j.begin_object();
  for (int i = 0; i < kNumCommOps; i++) {
    j.key(comm_op_name(CommOp(i)));
    j.begin_object();
    j.kv("calls", op[i].calls);
    j.kv("elems_sent", op[i].elems_sent);
    j.kv("bytes_sent", op[i].bytes_sent);
    j.kv("bytes_recv", op[i].bytes_recv);
    j.kv("bytes_across_nodes", op[i].bytes_across_sent);
    j.end_object();
  }
  j.kv("model_elems_sent", model_elems_sent());
  j.kv("model_bytes_sent", model_bytes_sent());
  j.kv("model_bytes_across_nodes", model_bytes_across_nodes());
  j.kv("to_host_bytes", link.to_host_bytes);
  j.kv("to_device_bytes", link.to_device_bytes);
  j.kv("to_host_elems", link.to_host_elems);
  j.kv("to_device_elems", link.to_device_elems);
  j.end_object();
  return j.str();
}

}  // namespace nz
