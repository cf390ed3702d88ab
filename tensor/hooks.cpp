// hooks.cpp — what the Trainer asks of a tensor rank besides training (tensor.h).
#include <cstring>  // memcpy
#include <memory>   // std::make_shared
#include <vector>

#include "tensor/formulas.h"  // tensor_state_bytes, tensor_activation_bytes, tensor_report_json
#include "tensor/tensor.h"
#include "tensor/tp_model.h"  // TensorGPT
#include "trainer.h"          // Trainer: its hooks, unit_access

namespace nz {

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
