// hooks.cpp — what the Trainer asks of a tensor rank besides training (tensor.h).
#include <cstring>  // memcpy
#include <memory>   // std::make_shared
#include <vector>

#include "tensor/formulas.h"  // tensor_state_bytes, tensor_activation_bytes, tensor_report_json
#include "tensor/tensor.h"
#include "tensor/tp_model.h"  // TensorGPT
#include "trainer.h"          // Trainer: its hooks, unit_access

namespace nz {

Slice owned_part(const Layout& L, const TensorPlan& p, int u) { return p.zero == 1 ? L.shard(u, p.d) : L.full(u); }

std::vector<Slice> owned_parts(const Layout& L, const TensorPlan& p, int u0, int u1) {
  std::vector<Slice> mine(L.num_units(), Slice{0, 0});  // units outside [u0, u1): none (3D)
  for (int u = u0; u < u1; u++) mine[u] = owned_part(L, p, u);
  return mine;
}

void init_my_pieces(Trainer& run, const Layout& L, const TensorPlan& plan, int u0, int u1,
                    const std::function<void*(int u)>& param, AdamW& adam) {
  const Layout& full = run.layout;  // the whole model's units
  const size_t e = run.elem_bytes;
  for (int u = u0; u < u1; u++) {
    // the whole unit's initial values (as every rung draws them), my pieces copied out
    std::vector<char> unit(full.units[u].padded * e);
    run.init_params(u, full.full(u), unit.data(), Location::Host);
    char* mine = static_cast<char*>(param(u));
    fill_zero(mine, L.units[u].padded * e, Location::Device);
    for_each_run(full, L, u, plan.tensor, plan.t, [&](size_t at, size_t local, size_t n) {
      copy_bytes(mine + local * e, Location::Device, unit.data() + at * e, Location::Host, n * e);
    });
    adam.init_master(u, mine + owned_part(L, plan, u).begin * e);
  }
}

void set_tensor_hooks(Trainer& run, const TensorPlan& plan, const Layout& L, TensorGPT& model, Comm& tp,
                      std::function<void*(int u)> P) {
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int T = plan.tensor, t = plan.t;
  // validation: the forward of my pieces on the batch evaluation loaded into the Trainer's model
  run.hooks.forward_loss = [&run, &model, &L, P, t]() -> double {
    model.set_batch(run.batch_tokens(), run.batch_targets(), run.model->rows());
    for (int u = 0; u < L.num_units(); u++) model.forward(u, P(u));
    model.head_forward(P(L.embed_unit()));
    const double s = model.take_loss_sum();
    return t == 0 ? s : 0.0;  // every tensor rank has the replica's loss: counted once
  };
  // the model file: each unit's pieces all-gathered over my tensor ranks, put back in place
  const Layout& full = run.layout;
  auto gathered = std::make_shared<std::vector<char>>(L.max_unit_padded * T * e);
  auto whole = std::make_shared<std::vector<char>>(full.max_unit_padded * e);
  run.unit_access = UnitAccess{[&tp, &L, &full, P, dt, e, T, gathered, whole](int u) -> const void* {
    const size_t n = L.units[u].padded;
    tp.all_gather(P(u), gathered->data(), n, dt);
    for (int r = 0; r < T; r++)
      for_each_run(full, L, u, T, r, [&](size_t at, size_t local, size_t count) {
        memcpy(whole->data() + at * e, gathered->data() + (r * n + local) * e, count * e);
      });
    return whole->data();
  }};
  // the memory table's formulas (formulas.h), the same on every rank; the report's "tensor" object
  run.hooks.state_formula = [&L, dt, plan](int) { return tensor_state_bytes(L, dt, plan.zero); };
  run.hooks.activation_formula = [&run, dt, plan](int) {
    return tensor_activation_bytes(run.args.cfg, plan.tensor, dt, run.args.batch, run.args.seq, plan.sp);
  };
  run.hooks.report_key = "tensor";
  run.hooks.report_json = tensor_report_json(run.args.cfg, T, plan.replicas, L, dt, run.args.batch, run.args.seq,
                                             run.args.accum, plan.zero, plan.sp);
}

}  // namespace nz
