// muon.cpp — Muon's Newton–Schulz and the hybrid optimizer over owned slices (muon.h; the formulas are
// muon_formulas.cpp).
#include "muon.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kernels/ops.h"
#include "lr_schedule.h"
#include "runtime/check.h"
#include "runtime/heartbeat.h"
#include "trainer.h"

namespace nz {

// ---- Newton–Schulz ----

void newton_schulz(float* X, int rows, int cols, float* work, int steps) {
  const size_t n = size_t(rows) * cols, s = std::min(rows, cols);
  float *Y = work, *A = Y + n, *A2 = A + s * s, *B = A2 + s * s;
  // X / (||X||_F + eps): every singular value at most 1
  const double norm = std::sqrt(ops::sum_squares<float>(X, n));
  ops::accumulate<float>(X, X, n, float(1.0 / (norm + kNsEps)), true);
  for (int k = 0; k < steps; k++) {
    // A = X X^T (s = rows), or X^T X (s = cols): the Gram matrix on the short side
    if (rows <= cols) {
      ops::matmul_forward<float>(A, X, X, nullptr, rows, cols, rows);
    } else {
      fill_zero(A, s * s * sizeof(float), Location::Device);  // matmul_backward's dw adds to it
      ops::matmul_backward<float>(nullptr, A, nullptr, X, X, X, rows, cols, cols);
    }
    ops::matmul_forward<float>(A2, A, A, nullptr, int(s), int(s), int(s));  // A A^T = A^2 (A is symmetric)
    ops::accumulate<float>(B, A, s * s, kNsB, true);                       // B = b A + c A^2
    ops::accumulate<float>(B, A2, s * s, kNsC, false);
    // Y = B X, or X B^T (B is symmetric): the same polynomial of X on either side
    if (rows <= cols) ops::matmul_backward<float>(Y, nullptr, nullptr, B, X, X, rows, cols, rows);
    else ops::matmul_forward<float>(Y, X, B, nullptr, rows, cols, cols);
    ops::accumulate<float>(X, X, n, kNsA, true);  // X = a X + Y
    ops::accumulate<float>(X, Y, n, 1.0f, false);
  }
}

// ---- the hybrid optimizer ----

// Calls fn(i, len, ts) for each tensor piece of unit u's owned slice `own` (i: from the slice's first
// element; ts null for the padding after the last tensor).
template <class Fn>
static void for_each_tensor_piece(const Unit& unit, Slice own, Fn fn) {
  for (const TensorSpec& ts : unit.tensors) {
    const uint64_t lo = std::max(ts.offset, own.begin), hi = std::min(ts.offset + ts.numel, own.end);
    if (hi > lo) fn(lo - own.begin, hi - lo, &ts);
  }
  const uint64_t lo = std::max(unit.numel, own.begin);
  if (own.end > lo) fn(lo - own.begin, own.end - lo, (const TensorSpec*)nullptr);
}

Muon::Muon(const Layout& L, std::vector<Slice> owned, DType dt, const AdamWConfig& adam, const MuonConfig& mc,
           Comm* comm)
    : OptimizerState(L, std::move(owned), dt, adam), mc_(mc), comm_(comm) {
  NZ_CHECK(!adam.prune, "Muon: --prune-mask is refused on the command line");
  size_t adam_elems = 0;
  for (int u = 0; u < L.num_units(); u++) {
    v_offset_.push_back(adam_elems);
    for_each_tensor_piece(L.units[u], owned_[u], [&](size_t, size_t len, const TensorSpec* ts) {
      if (!ts || !is_muon_matrix(*ts)) adam_elems += len;
    });
  }
  m_ = Buffer(Category::AdamM, Location::Device, total_ * sizeof(float), "momentum (muon) and adam m");
  v_ = Buffer(Category::AdamV, Location::Device, adam_elems * sizeof(float), "adam v (adamw elements only)");
  m_.zero();
  v_.zero();
  if (dt_ != DType::F32) master_ = Buffer(Category::Master, Location::Device, total_ * sizeof(float), "fp32 master");
  const MuonShard d = comm_ ? mc_.shard : MuonShard::Owners;  // stage0_ddp: every matrix whole already
  work_ = Buffer(Category::Scratch, Location::Device, muon_work_bytes(L, d), "newton-schulz work (muon)");
  work_.zero();
}

void Muon::init_master(int u, const void* params_slice) {
  if (master_.empty()) return;
  NZ_DISPATCH_TRAIN_DTYPE(dt_, ops::cast<float, T>(master_.as<float>() + state_offset_[u], (const T*)params_slice,
                                                   owned_[u].size()));
}

// Elements [i, i + len) of my slice: B = mu B + G, x = G + mu B (Nesterov), per element. B, the
// momentum, exists only for my slice.
void Muon::nesterov(float* x, float* b, const void* g, size_t i, size_t len, float grad_scale) {
  const float mu = mc_.momentum;
  NZ_DISPATCH_TRAIN_DTYPE(dt_, ops::cast<float, T>(x, (const T*)g + i, len));
  ops::accumulate<float>(x, x, len, grad_scale, true);  // G: the loss scale undone, clipped
  ops::accumulate<float>(b, b, len, mu, true);          // B = mu B + G
  ops::accumulate<float>(b, x, len, 1.0f, false);
  ops::accumulate<float>(x, b, len, mu, false);         // x = G + mu B
}

void Muon::step(int u, void* params_slice, const void* grads_slice, float muon_lr, float adam_lr, float grad_scale,
                int t) {
  const size_t n = owned_[u].size(), base = state_offset_[u];
  check_span_at(params_slice, n * dtype_bytes(dt_), Location::Device, "Muon step: the parameter slice");
  check_span_at(grads_slice, n * dtype_bytes(dt_), Location::Device, "Muon step: the gradient slice");
  float* p32 = master_.empty() ? (float*)params_slice : master_.as<float>() + base;
  float* m = m_.as<float>() + base;
  float* v = v_.as<float>() + v_offset_[u];
  size_t vi = 0;  // the AdamW elements seen so far in this slice
  for_each_tensor_piece(L_.units[u], owned_[u], [&](size_t i, size_t len, const TensorSpec* ts) {
    if (ts && is_muon_matrix(*ts)) return;  // below
    const float wd = ts && ts->decay ? cfg_.weight_decay : 0.0f;  // the padding: gradient 0, stays 0
    NZ_DISPATCH_TRAIN_DTYPE(dt_, ops::adamw_update<T>(p32 + i, m + i, v + vi, (const T*)grads_slice + i, len, adam_lr,
                                                      cfg_.beta1, cfg_.beta2, cfg_.eps, wd, grad_scale, t));
    vi += len;
  });
  // begin muon gather-all: my part of X of every matrix of the unit, then one all-gather of the unit
  const bool gather_all = comm_ && mc_.shard == MuonShard::GatherAll;
  bool has_matrix = false;
  for (const TensorSpec& ts : L_.units[u].tensors) has_matrix |= is_muon_matrix(ts);
  if (gather_all && has_matrix) {
    float* Xu = work_.as<float>() + work_.bytes() / sizeof(float) - muon_gathered_unit_elems(L_);
    for_each_tensor_piece(L_.units[u], owned_[u], [&](size_t i, size_t len, const TensorSpec* ts) {
      if (ts && is_muon_matrix(*ts)) nesterov(Xu + owned_[u].begin + i, m + i, grads_slice, i, len, grad_scale);
    });
    comm_->all_gather(Xu + owned_[u].begin, Xu, n, DType::F32);
  }
  // end muon gather-all
  int k = 0;  // the matrix's index in muon_matrices (whole-matrices: who orthogonalises it)
  for (int w = 0; w < u; w++)
    for (const TensorSpec& ts : L_.units[w].tensors) k += is_muon_matrix(ts);
  for (const TensorSpec& ts : L_.units[u].tensors)
    if (is_muon_matrix(ts)) matrix_step(u, k++, ts, p32, m, grads_slice, muon_lr, grad_scale);
  if (dt_ == DType::BF16) ops::cast<bf16, float>((bf16*)params_slice, p32, n);  // rounded from the master
  if (dt_ == DType::F16) ops::cast<f16, float>((f16*)params_slice, p32, n);
  heartbeat();
}

// Matrix ts (index k in muon_matrices) of unit u: X made whole where Newton–Schulz runs, and my part
// of it (if any) updated.
void Muon::matrix_step(int u, int k, const TensorSpec& ts, float* p32, float* m, const void* g, float lr,
                       float grad_scale) {
  const auto [rows, cols] = muon_matrix_shape(ts, L_.cfg.dim);
  const Slice own = owned_[u];
  const uint64_t lo = std::max(ts.offset, own.begin), hi = std::min(ts.offset + ts.numel, own.end);
  const size_t len = hi > lo ? hi - lo : 0;  // my part: elements [i, i + len) of my slice
  const size_t i = len ? lo - own.begin : 0, at = len ? lo - ts.offset : 0;  // at: where it starts in the matrix
  const MuonShard d = comm_ ? mc_.shard : MuonShard::Owners;  // stage0_ddp: every matrix whole here
  const int me = comm_ ? comm_->rank() : 0;
  const bool assigned = d == MuonShard::WholeMatrices && muon_assignee(L_, k) == me;
  if (len == 0 && !assigned) return;  // none of it is mine, and I do not orthogonalise it
  float* X = work_.as<float>();  // the whole matrix, row-major
  float* work = X + size_t(rows) * cols;
  if (d == MuonShard::GatherAll) {  // X gathered already (step), Newton–Schulz's work space before it
    X = work_.as<float>() + work_.bytes() / sizeof(float) - muon_gathered_unit_elems(L_) + ts.offset;
    work = work_.as<float>();
  } else if (len) {
    nesterov(X + at, m + i, g, i, len, grad_scale);  // my part of X
  }
  // begin muon exchange: the parts of X (and O) between the ranks that need them (stages 1-3)
  const uint64_t s = L_.units[u].padded / L_.world;
  const int first = int(ts.offset / s), last = int((ts.offset + ts.numel - 1) / s);
  const int tag = 7000 + u * 16 + int(&ts - L_.units[u].tensors.data());  // this matrix's messages
  auto part = [&](int q) {  // rank q's part of the matrix: [offset, offset + count)
    const uint64_t a = std::max(ts.offset, q * s), b = std::min(ts.offset + ts.numel, (q + 1) * s);
    return std::pair<uint64_t, uint64_t>{a - ts.offset, b - a};
  };
  std::vector<CommRequest> sends;
  if (d == MuonShard::Owners && len < ts.numel) {  // owners: each sends its part to each other owner
    // begin exercise: muon_boundary_gather
    for (int q = first; q <= last; q++)
      if (q != me) sends.push_back(comm_->send_start(X + at, len, DType::F32, q, tag));
    for (int q = first; q <= last; q++)
      if (q != me) comm_->recv(X + part(q).first, part(q).second, DType::F32, q, tag);
    for (CommRequest& r : sends) comm_->wait(r);  // before Newton–Schulz overwrites what they send
    sends.clear();
    // end exercise: muon_boundary_gather
  }
  const int assignee = muon_assignee(L_, k);
  if (d == MuonShard::WholeMatrices) {  // whole matrices: the owners' parts of X to the assignee
    if (!assigned) {
      CommRequest r = comm_->send_start(X + at, len, DType::F32, assignee, tag);
      comm_->wait(r);  // before my part of O lands in the same place
    } else {
      for (int q = first; q <= last; q++)
        if (q != me) comm_->recv(X + part(q).first, part(q).second, DType::F32, q, tag);
    }
  }
  // end muon exchange
  // Newton–Schulz on the whole matrix: on every owner (owners, gather-all), on the assignee (whole-matrices)
  if (d != MuonShard::WholeMatrices || assigned)
    newton_schulz(X, rows, cols, work, mc_.ns_steps);
  // begin muon whole-matrices return: each owner's part of O back from the assignee
  if (d == MuonShard::WholeMatrices) {
    if (assigned) {
      for (int q = first; q <= last; q++)
        if (q != me) sends.push_back(comm_->send_start(X + part(q).first, part(q).second, DType::F32, q, tag));
    } else {
      comm_->recv(X + at, len, DType::F32, assignee, tag);
    }
  }
  for (CommRequest& r : sends) comm_->wait(r);
  // end muon whole-matrices return
  if (len == 0) return;
  // my part of W = W (1 - lr wd) - lr 0.2 sqrt(max(rows, cols)) O   (Moonlight's RMS match)
  // begin exercise: muon_boundary_gather
  if (ts.decay) ops::accumulate<float>(p32 + i, p32 + i, len, 1.0f - lr * cfg_.weight_decay, true);
  const float rms_match = 0.2f * std::sqrt(float(std::max(rows, cols)));
  ops::accumulate<float>(p32 + i, X + at, len, -lr * rms_match, false);
  // end exercise: muon_boundary_gather
}

// ---- the stage's optimizer ----

StageOptimizer::StageOptimizer(Trainer& run, std::vector<Slice> owned) : run_(run) {
  if (run.args.optimizer != "muon") {
    adamw_ = std::make_unique<AdamW>(run.layout, std::move(owned), run.dtype, run.adamw);
    return;
  }
  MuonConfig mc;
  mc.lr = run.args.muon_lr, mc.adam_lr = run.args.adam_lr;
  NZ_CHECK(parse_muon_shard(run.args.muon_shard, &mc.shard), "--muon-shard %s", run.args.muon_shard.c_str());
  Comm* exchange = run.stage == Stage::DDP ? nullptr : &run.comm;  // stage0_ddp: every matrix whole everywhere
  muon_ = std::make_unique<Muon>(run.layout, std::move(owned), run.dtype, run.adamw, mc, exchange);
  // the memory table's formulas, per rank (their Muon elements differ), and the report's "muon" object
  const Layout& L = run.layout;
  const Stage stage = run.stage;
  const DType dt = run.dtype;
  run.hooks.state_formula = [&L, stage, dt](int r) { return muon_state_bytes(stage, L, dt, r); };
  const MuonShard d = stage == Stage::DDP ? MuonShard::Owners : mc.shard;
  // the report's formula per rank: Muon's messages beyond the stage's, and its work space
  run.hooks.optimizer_comm_elems = [&L, stage, d](int r) {
    return muon_p2p_elems(stage, L, r, d) + muon_gather_elems(stage, L, d);
  };
  run.hooks.optimizer_work_bytes = [&L, d](int) { return muon_work_bytes(L, d); };
  std::ostringstream j;
  j << "{\"muon_lr\": " << mc.lr << ", \"adam_lr\": " << mc.adam_lr << ", \"momentum\": " << mc.momentum
    << ", \"ns_steps\": " << mc.ns_steps << ", \"shard\": \"" << muon_shard_name(d)
    << "\", \"work_bytes\": " << muon_work_bytes(L, d) << ", \"gather_elems_per_step\": "
    << muon_gather_elems(stage, L, d) << ", \"ranks\": [";
  for (int r = 0; r < L.world; r++)
    j << (r ? ", " : "") << "{\"muon_elems\": " << muon_owned_elems(stage, L, r)
      << ", \"adam_v\": " << muon_state_bytes(stage, L, dt, r).adam_v
      << ", \"p2p_elems_per_step\": " << muon_p2p_elems(stage, L, r, d)
      << ", \"ns_flops_per_step\": " << muon_ns_flops(stage, L, r, d) << "}";
  j << "]}";
  run.hooks.report_key = "muon";
  run.hooks.report_json = j.str();
}

void StageOptimizer::init_master(int u, const void* params_slice) {
  if (adamw_) adamw_->init_master(u, params_slice);
  else muon_->init_master(u, params_slice);
}

void StageOptimizer::step(int u, void* params_slice, const void* grads_slice, float lr, float grad_scale, int t) {
  if (adamw_) {
    adamw_->step(u, params_slice, grads_slice, lr, grad_scale, t);
    return;
  }
  // the curve of --lr, at --muon-lr's and --adam-lr's peaks; update t is the curve's t - 1
  LrScheduleConfig s = run_.lr_schedule;
  s.lr = run_.args.muon_lr;
  const float muon_lr = lr_at(s, t - 1);
  s.lr = run_.args.adam_lr;
  muon_->step(u, params_slice, grads_slice, muon_lr, lr_at(s, t - 1), grad_scale, t);
}

StageOptimizer::operator OptimizerState&() {
  if (adamw_) return *adamw_;
  return *muon_;
}

}  // namespace nz
