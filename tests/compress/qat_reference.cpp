// qat_reference.cpp — the reference --qat is held to, bit for bit: stage0_ddp with the fake
// quantization written out in its loop instead of inside the model (qat.h). The model's own QAT is
// switched off; after the initialisation and after every optimizer step each unit's exact
// parameters are quantized and dequantized by kernels/quantize.h directly (its packed form, through
// fp32) into a second full buffer, `seen`, in blocks counted from the unit's first element over its
// Ψ_u values (the last block shorter), the embedding left exact with --qat-skip embedding. The
// forward, the LM head and the backward compute with `seen`; the gradient they produce goes to the
// exact parameters (straight through); validation runs on `seen` too, the model file holds the
// exact parameters. Shares nothing with the trainers' QAT but the quantizer and common/'s model.
// Built by tests/compress/compress.mk into $(BUILD)/mutants/bin/qat_reference (a test-only trainer).
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/ops.h"
#include "kernels/quantize.h"
#include "trainer.h"

using namespace nz;

int main(int argc, char** argv) {
  Trainer run(argc, argv, Stage::DDP);
  const Layout& L = run.layout;
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = L.embed_unit();
  GPT& model = *run.model;
  Comm& comm = run.comm;
  const BlockQuant q{run.args.qat_bits, size_t(run.args.qat_block)};
  model.set_qat(QatConfig{});  // off: the fake quantization is done below, in the open

  Buffer params(Category::Params, Location::Device, L.padded_total * e, "params");
  Buffer seen(Category::Params, Location::Host, L.padded_total * e, "params as the model sees them");
  Buffer grads(Category::Grads, Location::Device, L.padded_total * e, "grads");
  Buffer unit_grad(Category::Grads, Location::Device, L.max_unit_padded * e, "one unit's gradient");
  auto P = [&](int u) { return elem_ptr(params, L.units[u].offset, e); };
  auto V = [&](int u) { return elem_ptr(seen, L.units[u].offset, e); };
  auto G = [&](int u) { return elem_ptr(grads, L.units[u].offset, e); };
  std::vector<uint8_t> packed(q.bits ? q.packed_bytes(L.max_unit_padded) : 0);
  std::vector<float> f32(L.max_unit_padded);
  auto refresh_seen = [&] {  // seen = fake-quant(params), unit by unit
    for (int u = 0; u < L.num_units(); u++) {
      const size_t n = L.units[u].numel;
      if (q.bits == 0 || (run.args.qat_skip_embed && u == EMBED)) {
        memcpy(V(u), P(u), L.units[u].padded * e);
        continue;
      }
      quantize_packed(q, dt, P(u), n, packed.data());
      dequantize_packed(q, packed.data(), n, DType::F32, f32.data());
      from_f32(dt, f32.data(), n, V(u));
    }
  };
  AdamW adam(L, whole_units(L), dt, run.adamw);
  for (int u = 0; u < L.num_units(); u++) {
    run.init_params(u, L.full(u), P(u));
    adam.init_master(u, P(u));
  }
  run.unit_access = UnitAccess{[&](int u) -> const void* { return P(u); }};  // the model file: exact
  run.hooks.forward_loss = [&] {  // validation: on what the model sees
    for (int u = 0; u < L.num_units(); u++) model.forward(u, V(u));
    model.head_forward(V(EMBED));
    return model.take_loss_sum();
  };
  run.checkpoint_state(params, ParamsHeld::AllUnits, adam);
  refresh_seen();

  for (int step = run.first_step(); step < run.args.steps; step++) {
    run.begin_step(step);
    for (int k = 0; k < run.args.accum; k++) {
      run.load_micro_batch(step, k);
      for (int u = 0; u < L.num_units(); u++) model.forward(u, V(u));
      model.head_forward(V(EMBED));
      model.head_backward(V(EMBED));
      for (int u = L.num_units() - 1; u >= 0; u--) {
        model.backward(u, V(u), unit_grad.data());
        accumulate_grads(dt, G(u), unit_grad.data(), L.units[u].padded, 1.0f, k == 0);
        if (k == run.args.accum - 1) {
          comm.all_reduce(G(u), L.units[u].padded, dt);
          average_grads(dt, G(u), L.units[u].padded, run.grad_average_scale());
        }
      }
    }
    const double norm = std::sqrt(sq_sum_in_rank_order(L, dt, grads.data())) / run.loss_scale();
    const double loss_sum = model.take_loss_sum();
    if (run.skip_step(step, loss_sum, norm)) continue;
    const float scale = clip_scale(norm, run.args.clip) / run.loss_scale();
    // straight through: the gradient at the fake-quantized weights updates the exact ones
    for (int u = 0; u < L.num_units(); u++) adam.step(u, P(u), G(u), run.lr(), scale, run.adam_step());
    refresh_seen();
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
