// muon_formulas.cpp — which matrices Muon updates, which ranks own them, and what Muon holds and sends
// (muon_formulas.h). No kernels, no MPI: zero_estimate and the explorer use it too.
#include "muon_formulas.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <tuple>

#include "runtime/check.h"
#include "runtime/json.h"  // JsonWriter: muon_estimate_json

namespace nz {

// ---- which tensors, their shapes ----

bool is_muon_matrix(const TensorSpec& ts) {
  return ts.name == "qkv_w" || ts.name == "attproj_w" || ts.name == "fc_w" || ts.name == "fcproj_w";
}

std::pair<int, int> muon_matrix_shape(const TensorSpec& ts, int C) {
  if (ts.name == "qkv_w") return {3 * C, C};
  if (ts.name == "attproj_w") return {C, C};
  if (ts.name == "fc_w") return {4 * C, C};
  NZ_CHECK(ts.name == "fcproj_w", "%s is not a Muon matrix", ts.name.c_str());
  return {C, 4 * C};
}

uint64_t ns_work_elems(int rows, int cols) {
  const uint64_t s = std::min(rows, cols);
  return 2 * uint64_t(rows) * cols + 3 * s * s;
}

uint64_t ns_flops(int rows, int cols, int steps) {
  const uint64_t s = std::min(rows, cols), l = std::max(rows, cols);
  return uint64_t(steps) * 2 * (s * s * l + s * s * s + s * s * l);  // Gram, its square, B times X
}

// ---- which ranks own which matrix ----

std::vector<MuonMatrix> muon_matrices(const Layout& L) {
  std::vector<MuonMatrix> out;
  for (int u = 0; u < L.num_units(); u++) {
    const uint64_t s = L.units[u].padded / L.world;
    for (const TensorSpec& ts : L.units[u].tensors) {
      if (!is_muon_matrix(ts)) continue;
      MuonMatrix m;
      m.unit = u;
      m.name = L.units[u].name + "." + ts.name;
      std::tie(m.rows, m.cols) = muon_matrix_shape(ts, L.cfg.dim);
      m.begin = ts.offset, m.end = ts.offset + ts.numel;
      m.first_rank = int(m.begin / s), m.last_rank = int((m.end - 1) / s);
      out.push_back(m);
    }
  }
  return out;
}

// Elements [begin, end) of a unit that slice `r` (of size s) holds.
static uint64_t overlap(uint64_t begin, uint64_t end, uint64_t s, int r) {
  const uint64_t lo = std::max(begin, r * s), hi = std::min(end, (r + 1) * s);
  return hi > lo ? hi - lo : 0;
}

uint64_t muon_owned_elems(Stage stage, const Layout& L, int rank) {
  uint64_t n = 0;
  for (const MuonMatrix& m : muon_matrices(L))
    n += stage == Stage::DDP ? m.end - m.begin : overlap(m.begin, m.end, L.units[m.unit].padded / L.world, rank);
  return n;
}

StateBytes muon_state_bytes(Stage stage, const Layout& L, DType dt, int rank) {
  StateBytes f = expected_state_bytes(stage, L, dt);
  f.adam_v -= 4 * muon_owned_elems(stage, L, rank);  // no second moment for the Muon elements
  return f;
}

bool parse_muon_shard(const std::string& s, MuonShard* out) {
  if (s == "owners") *out = MuonShard::Owners;
  else if (s == "gather-all") *out = MuonShard::GatherAll;
  else if (s == "whole-matrices") *out = MuonShard::WholeMatrices;
  else return false;
  return true;
}

const char* muon_shard_name(MuonShard d) {
  return d == MuonShard::Owners ? "owners" : d == MuonShard::GatherAll ? "gather-all" : "whole-matrices";
}

uint64_t muon_gathered_unit_elems(const Layout& L) {
  uint64_t most = 0;
  for (const MuonMatrix& m : muon_matrices(L)) most = std::max(most, L.units[m.unit].padded);
  return most;
}

uint64_t muon_work_bytes(const Layout& L, MuonShard d) {
  uint64_t most = 0;
  for (const MuonMatrix& m : muon_matrices(L)) most = std::max(most, ns_work_elems(m.rows, m.cols));
  return 4 * (most + (d == MuonShard::GatherAll ? muon_gathered_unit_elems(L) : 0));
}

uint64_t muon_p2p_elems(Stage stage, const Layout& L, int rank, MuonShard d) {
  if (stage == Stage::DDP || d == MuonShard::GatherAll) return 0;
  const std::vector<MuonMatrix> mats = muon_matrices(L);
  uint64_t n = 0;
  for (size_t k = 0; k < mats.size(); k++) {
    const MuonMatrix& m = mats[k];
    const uint64_t s = L.units[m.unit].padded / L.world, mine = overlap(m.begin, m.end, s, rank);
    if (d == MuonShard::Owners) {  // my part to each other owner
      if (m.crosses() && mine > 0) n += mine * (m.last_rank - m.first_rank);
    } else if (muon_assignee(L, int(k)) != rank) {  // my part of X to the assignee
      n += mine;
    } else {  // the assignee: each other owner's part of O back to it
      n += (m.end - m.begin) - mine;
    }
  }
  return n;
}

uint64_t muon_gather_elems(Stage stage, const Layout& L, MuonShard d) {
  if (stage == Stage::DDP || d != MuonShard::GatherAll) return 0;
  uint64_t n = 0;
  int last_unit = -1;
  for (const MuonMatrix& m : muon_matrices(L))
    if (m.unit != last_unit) n += (L.world - 1) * (L.units[m.unit].padded / L.world), last_unit = m.unit;
  return n;
}

uint64_t muon_ns_flops(Stage stage, const Layout& L, int rank, MuonShard d) {
  const std::vector<MuonMatrix> mats = muon_matrices(L);
  uint64_t f = 0;
  for (size_t k = 0; k < mats.size(); k++) {
    const MuonMatrix& m = mats[k];
    const bool mine = stage == Stage::DDP ? true
                      : d == MuonShard::WholeMatrices ? muon_assignee(L, int(k)) == rank
                                                      : rank >= m.first_rank && rank <= m.last_rank;
    if (mine) f += ns_flops(m.rows, m.cols);
  }
  return f;
}

// ---- zero_estimate --optimizer muon ----

static std::string range(uint64_t lo, uint64_t hi, double scale = 1) {
  char s[64];
  if (scale != 1) snprintf(s, sizeof s, lo == hi ? "%.3f" : "%.3f..%.3f", lo * scale, hi * scale);
  else if (lo == hi) snprintf(s, sizeof s, "%llu", (unsigned long long)lo);
  else snprintf(s, sizeof s, "%llu..%llu", (unsigned long long)lo, (unsigned long long)hi);
  return s;
}

std::string muon_estimate_text(const Layout& L, DType dt) {
  std::ostringstream o;
  char line[256];
  const std::vector<MuonMatrix> mats = muon_matrices(L);
  uint64_t muon_elems = 0;
  int cut = 0;
  for (const MuonMatrix& m : mats) muon_elems += m.end - m.begin, cut += m.crosses();
  snprintf(line, sizeof line, "muon: %zu hidden matrices, %llu of the %llu parameters; at N = %d the slices cut %d "
           "of them:\n", mats.size(), (unsigned long long)muon_elems, (unsigned long long)L.num_params, L.world, cut);
  o << line;
  for (const MuonMatrix& m : mats) {
    if (!m.crosses()) continue;
    const uint64_t s = L.units[m.unit].padded / L.world;
    snprintf(line, sizeof line, "  %-18s %5d x %-5d ranks %d..%d (boundary at element", m.name.c_str(), m.rows,
             m.cols, m.first_rank, m.last_rank);
    o << line;
    for (int r = m.first_rank + 1; r <= m.last_rank; r++) o << (r > m.first_rank + 1 ? ", " : " ") << r * s - m.begin;
    o << " of " << (m.end - m.begin) << ")\n";
  }
  snprintf(line, sizeof line, "  %-10s %14s %14s %16s\n", "bytes", "adam_m", "adam_v AdamW", "adam_v Muon");
  o << line;
  for (Stage stage : {Stage::DDP, Stage::Z1, Stage::Z2, Stage::Z3}) {
    const StateBytes a = expected_state_bytes(stage, L, dt);
    uint64_t v_lo = UINT64_MAX, v_hi = 0;
    for (int r = 0; r < L.world; r++) {
      const uint64_t v = muon_state_bytes(stage, L, dt, r).adam_v;
      v_lo = std::min(v_lo, v), v_hi = std::max(v_hi, v);
    }
    snprintf(line, sizeof line, "  %-10s %14llu %14llu %16s\n", stage_name(stage), (unsigned long long)a.adam_m,
             (unsigned long long)a.adam_v, range(v_lo, v_hi).c_str());
    o << line;
  }
  snprintf(line, sizeof line, "  %-22s %16s %16s %16s %14s\n", "stages 1-3, per step", "p2p elems", "all-gather elems",
           "NS GFLOP", "work bytes");
  o << line;
  for (MuonShard d : {MuonShard::Owners, MuonShard::GatherAll, MuonShard::WholeMatrices}) {
    uint64_t p_lo = UINT64_MAX, p_hi = 0, f_lo = UINT64_MAX, f_hi = 0;
    for (int r = 0; r < L.world; r++) {
      const uint64_t p = muon_p2p_elems(Stage::Z1, L, r, d), f = muon_ns_flops(Stage::Z1, L, r, d);
      p_lo = std::min(p_lo, p), p_hi = std::max(p_hi, p), f_lo = std::min(f_lo, f), f_hi = std::max(f_hi, f);
    }
    snprintf(line, sizeof line, "  --muon-shard %-9s %16s %16llu %16s %14llu\n", muon_shard_name(d),
             range(p_lo, p_hi).c_str(), (unsigned long long)muon_gather_elems(Stage::Z1, L, d),
             range(f_lo, f_hi, 1e-9).c_str(), (unsigned long long)muon_work_bytes(L, d));
    o << line;
  }
  snprintf(line, sizeof line, "  (lo..hi over the ranks; adam_m holds Muon's momentum and AdamW's m, 4 bytes per "
           "owned element; stage0_ddp: no messages, NS %.3f GFLOP on every rank)\n",
           muon_ns_flops(Stage::DDP, L, 0, MuonShard::Owners) * 1e-9);
  o << line;
  return o.str();
}

std::string muon_estimate_json(const Layout& L, DType dt) {
  const std::vector<MuonMatrix> mats = muon_matrices(L);
  uint64_t muon_elems = 0;
  for (const MuonMatrix& m : mats) muon_elems += m.end - m.begin;
  JsonWriter j;
  j.begin_object();
  j.kv("world", L.world);
  j.kv("matrices", uint64_t(mats.size()));
  j.kv("muon_params", muon_elems);
  j.key("cut");  // the matrices whose elements more than one rank's slice holds
  j.begin_array();
  for (const MuonMatrix& m : mats) {
    if (!m.crosses()) continue;
    j.begin_object();
    j.kv("name", m.name), j.kv("rows", m.rows), j.kv("cols", m.cols);
    j.kv("first_rank", m.first_rank), j.kv("last_rank", m.last_rank);
    j.end_object();
  }
  j.end_array();
  j.key("stages");
  j.begin_array();
  for (Stage stage : {Stage::DDP, Stage::Z1, Stage::Z2, Stage::Z3}) {
    const StateBytes a = expected_state_bytes(stage, L, dt);
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int r = 0; r < L.world; r++) {
      const uint64_t v = muon_state_bytes(stage, L, dt, r).adam_v;
      lo = std::min(lo, v), hi = std::max(hi, v);
    }
    j.begin_object();
    j.kv("stage", stage_name(stage));
    j.kv("adam_m", a.adam_m);  // the same with either: Muon's momentum or AdamW's m, 4 bytes per owned element
    j.kv("adam_v_adamw", a.adam_v);
    j.kv("adam_v_muon_min", lo), j.kv("adam_v_muon_max", hi);
    j.end_object();
  }
  j.end_array();
  j.kv("ddp_ns_flops", muon_ns_flops(Stage::DDP, L, 0, MuonShard::Owners));
  j.key("designs");  // stages 1-3
  j.begin_array();
  for (MuonShard d : {MuonShard::Owners, MuonShard::GatherAll, MuonShard::WholeMatrices}) {
    uint64_t p_lo = UINT64_MAX, p_hi = 0, f_lo = UINT64_MAX, f_hi = 0;
    for (int r = 0; r < L.world; r++) {
      const uint64_t p = muon_p2p_elems(Stage::Z1, L, r, d), f = muon_ns_flops(Stage::Z1, L, r, d);
      p_lo = std::min(p_lo, p), p_hi = std::max(p_hi, p), f_lo = std::min(f_lo, f), f_hi = std::max(f_hi, f);
    }
    j.begin_object();
    j.kv("design", muon_shard_name(d));
    j.kv("p2p_elems_min", p_lo), j.kv("p2p_elems_max", p_hi);
    j.kv("gather_elems", muon_gather_elems(Stage::Z1, L, d));
    j.kv("ns_flops_min", f_lo), j.kv("ns_flops_max", f_hi);
    j.kv("work_bytes", muon_work_bytes(L, d));
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return j.str();
}

}  // namespace nz
