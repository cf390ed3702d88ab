// hooks.cpp — what the Trainer asks of a pipeline rank besides training (pipeline.h).
#include <memory>  // std::make_shared
#include <vector>

#include "pipeline/formulas.h"  // pipeline_segment_bytes, pipeline_activation_bytes
#include "pipeline/pipeline.h"
#include "trainer.h"  // Trainer: its hooks, unit_access

namespace nz {

void set_pipeline_hooks(Trainer& run, const PipelinePlan& pipe, std::function<void*(int u)> P,
                        const void* head_weights) {
  Comm& comm = run.comm;
  GPT& model = *run.model;
  const Layout& L = run.layout;
  const DType dt = run.dtype;
  const int s = pipe.segment, d = pipe.replica;
  const bool first = s == 0, last = s == pipe.segments - 1;
  const int prev = pipe.rank_of(s - 1, d), next = pipe.rank_of(s + 1, d);
  // validation: a forward through every segment, as in training
  run.hooks.forward_loss = [&run, &comm, &model, &L, dt, first, last, prev, next, pipe, P,
                            head_weights]() -> double {
    const size_t elems = size_t(model.rows()) * run.args.seq * L.cfg.dim;
    if (!first) comm.recv(model.segment_input(), elems, dt, prev, kActivation);
    for (int u = pipe.first(); u < pipe.end(); u++) model.forward(u, P(u));
    if (last) {
      model.head_forward(head_weights);
      return model.take_loss_sum();
    }
    CommRequest sent = comm.send_start(model.segment_output(), elems, dt, next, kActivation);
    comm.wait(sent);
    return 0.0;  // the loss is the last segment's
  };
  // the model file: rank 0 writes every unit, each sent by replica 0 of the segment that holds it
  auto on_rank0 = std::make_shared<std::vector<char>>();
  run.unit_access = UnitAccess{[&comm, &L, dt, pipe, P, on_rank0](int u) -> const void* {
    const int owner = pipe.rank_of(pipe.segment_of_unit(u), 0);
    const size_t numel = L.units[u].padded;
    if (comm.rank() == owner) {
      if (owner != 0) {
        CommRequest sent = comm.send_start(P(u), numel, dt, 0, kModelFile);
        comm.wait(sent);
      }
      return P(u);
    }
    if (comm.rank() != 0) return nullptr;  // only rank 0 writes
    on_rank0->resize(numel * dtype_bytes(dt));
    comm.recv(on_rank0->data(), numel, dt, owner, kModelFile);
    return on_rank0->data();
  }};
  // the memory table's formulas: each segment its own (formulas.h)
  run.hooks.state_formula = [&L, dt, pipe](int r) {
    return pipeline_segment_bytes(L, dt, pipe, r / pipe.replicas);
  };
  run.hooks.activation_formula = [&run, &model, &L, dt, pipe](int r) {
    return pipeline_activation_bytes(L.cfg, run.args.batch, run.args.seq, dt, run.args.activation_checkpointing,
                                     model.attention(), pipe, r / pipe.replicas, run.args.accum);
  };
}

}  // namespace nz
