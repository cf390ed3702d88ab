// ulysses_reference.cpp — the single-process truth ulysses is held to, bit for bit: one process plays
// the N = D x S ranks of `ulysses --sp S` (--ranks N), with no communication, no all-to-all and no
// ZeRO. What it shares with ulysses/train.cpp is common/: the model's per-token pieces
// (GPT::attention_input, attention_output and their backwards, on S models of one slice each).
// What it does its own way is what ulysses is about:
//   - attention runs on the whole sequence, every head at once (the kernel's B x T x C with NH heads),
//     from q, k, v put together by token order alone: no head index mapping, the causal mask over
//     the sequence's own positions;
//   - each slice model's positions are those of its tokens, s T/S on, set here;
//   - each (replica d, slice s) "rank" r = d S + s keeps its own weight-gradient partial, and the N
//     partials of a unit are summed in rank order (as the reduce-scatter sums them) before the
//     micro-step's average is added; the norm's partials are each rank's owned slices, summed in
//     rank order; the loss likewise;
//   - AdamW updates whole units (its update is elementwise: the same bits as on slices).
// Validation is not computed (the hook returns NaN): only the steps and the model file are the truth.
// Built by tests/ulysses/ulysses.mk into $(BUILD)/mutants/bin/ulysses_reference (a test-only trainer).
//
//   mpirun -np 1 ulysses_reference --ranks N --sp S [the flags of the ulysses run]
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "trainer.h"

using namespace nz;

namespace {

int g_ranks = 1;  // N, the ranks played (--ranks)

// One process, one replica in the Trainer's eyes (its data for replica 0 is not used: the loop below
// loads every replica's), but the layout and the gradient average of N = D x S ranks.
Topology reference_topology(const Args& a, int, int) {
  if (a.sp < 1 || g_ranks % a.sp != 0 || a.cfg.heads % a.sp != 0 || a.seq % a.sp != 0)
    user_error("ulysses_reference: --ranks %d --sp %d with %d heads and --seq %d do not split", g_ranks, a.sp,
               a.cfg.heads, a.seq);
  Topology t;
  t.dp_world = g_ranks / a.sp, t.dp_rank = 0;
  t.seq.slices = a.sp;  // the Trainer's model: slice 0 (positions from 0)
  return t;
}

// The argument list without --ranks N (the Trainer does not know it).
std::vector<char*> take_ranks(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; i++) {
    if (std::string(argv[i]) == "--ranks" && i + 1 < argc) g_ranks = atoi(argv[++i]);
    else rest.push_back(argv[i]);
  }
  return rest;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = take_ranks(argc, argv);
  int n_args = int(args.size());
  char** arg_v = args.data();
  Trainer run(n_args, arg_v, Stage::Ulysses, reference_topology);
  const Layout& L = run.layout;  // padded for N, as ulysses pads it
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = L.embed_unit(), LNF = L.lnf_unit();
  const int N = g_ranks, S = run.args.sp, D = N / S, K = run.args.accum;
  const int B = run.args.batch, Tn = run.args.seq /* (T is the dispatch's type) */, Tl = Tn / S, C = run.args.cfg.dim, NH = run.args.cfg.heads;

  // the S slice models: slice s holds tokens [s T/S, (s + 1) T/S) and uses their positions
  std::vector<std::unique_ptr<GPT>> own;
  std::vector<GPT*> slice{run.model.get()};
  for (int s = 1; s < S; s++) {
    own.push_back(std::make_unique<GPT>(L, dt, B, Tn, false, 0, -1, 1, SeqSlices{S, s, s * Tl}));
    slice.push_back(own.back().get());
  }

  // whole units: parameters, the step's gradient, the optimizer
  Buffer params(Category::Params, Location::Device, L.padded_total * e, "params (whole)");
  Buffer grads(Category::Grads, Location::Device, L.padded_total * e, "grads (whole)");
  auto P = [&](int u) { return elem_ptr(params, L.units[u].offset, e); };
  auto G = [&](int u) { return elem_ptr(grads, L.units[u].offset, e); };
  AdamW adam(L, whole_units(L), dt, run.adamw);
  for (int u = 0; u < L.num_units(); u++) {
    run.init_params(u, L.full(u), P(u));
    adam.init_master(u, P(u));
  }
  run.unit_access = UnitAccess{[&](int u) -> const void* { return P(u); }};
  run.hooks.forward_loss = [] { return double(NAN); };  // validation: not the truth here

  // each rank's gradient partial of every unit (a micro-step's), and the sum over ranks of one unit
  Buffer partial(Category::Scratch, Location::Device, size_t(N) * L.padded_total * e, "each rank's partial");
  Buffer summed(Category::Scratch, Location::Device, L.max_unit_padded * e, "a unit's sum over ranks");
  auto partial_of = [&](int r, int u) { return elem_ptr(partial, size_t(r) * L.padded_total + L.units[u].offset, e); };
  // attention on the whole sequence, all heads, per block: q|k|v, the probabilities, the output
  const size_t BT = size_t(B) * Tn;
  std::vector<Buffer> qkv, att, out;
  for (int l = 0; l < run.args.cfg.layers; l++) {
    qkv.emplace_back(Category::Scratch, Location::Device, BT * 3 * C * e, "whole qkv");
    att.emplace_back(Category::Scratch, Location::Device, size_t(B) * NH * Tn * Tn * e, "whole att");
    out.emplace_back(Category::Scratch, Location::Device, BT * C * e, "whole out");
  }
  Buffer dqkv(Category::Scratch, Location::Device, BT * 3 * C * e, "whole d qkv");
  Buffer dout(Category::Scratch, Location::Device, BT * C * e, "whole d out");
  // token rows of slice s, `width` elements each, between its (B, T/S) buffer and the whole (B, T)
  auto put = [&](void* whole, const void* part, int s, int width) {
    for (int b = 0; b < B; b++)
      memcpy(static_cast<char*>(whole) + (size_t(b) * Tn + size_t(s) * Tl) * width * e,
             static_cast<const char*>(part) + size_t(b) * Tl * width * e, size_t(Tl) * width * e);
  };
  auto take = [&](void* part, const void* whole, int s, int width) {
    for (int b = 0; b < B; b++)
      memcpy(static_cast<char*>(part) + size_t(b) * Tl * width * e,
             static_cast<const char*>(whole) + (size_t(b) * Tn + size_t(s) * Tl) * width * e, size_t(Tl) * width * e);
  };

  std::vector<int> tokens(BT), targets(BT);
  std::vector<double> rank_loss(N);
  std::vector<char> shard(L.shard_total * e);
  for (int step = run.first_step(); step < run.args.steps; step++) {
    run.begin_step(step);
    for (GPT* m : slice) m->set_loss_scale(run.loss_scale());
    for (int k = 0; k < K; k++) {
      run.phase("forward");
      for (int d = 0; d < D; d++) {  // replica d's micro-batch, its S slices side by side
        run.data->train_batch(step, k, K, D, d, tokens.data(), targets.data());
        for (GPT* m : slice) m->set_batch(tokens.data(), targets.data(), B);
        for (int u = 0; u < L.num_units(); u++) {
          if (u == EMBED || u == LNF) {
            for (GPT* m : slice) m->forward(u, P(u));
            continue;
          }
          const int l = u - 1;
          for (int s = 0; s < S; s++) {
            slice[s]->attention_input(u, P(u));
            put(qkv[l].data(), slice[s]->attention_buffers(u).qkv, s, 3 * C);
          }
          NZ_DISPATCH_DTYPE(dt, ops::attention_forward<T>((T*)out[l].data(), (T*)att[l].data(),
                                                          (const T*)qkv[l].data(), B, Tn, C, NH));
          for (int s = 0; s < S; s++) {
            take(slice[s]->attention_buffers(u).out, out[l].data(), s, C);
            slice[s]->attention_output(u, P(u));
          }
        }
        for (int s = 0; s < S; s++) {
          slice[s]->head_forward(P(EMBED));
          const double batch = slice[s]->take_loss_sum();  // this rank's micro-batch, summed in token order
          const int r = d * S + s;
          rank_loss[r] = k == 0 ? batch : rank_loss[r] + batch;  // as its loss total adds them up
        }
        run.phase("backward");
        for (GPT* m : slice) m->head_backward(P(EMBED));
        for (int u = L.num_units() - 1; u >= 0; u--) {
          const void* p = u == EMBED ? nullptr : P(u);
          if (u == EMBED || u == LNF) {
            for (int s = 0; s < S; s++) slice[s]->backward(u, p, partial_of(d * S + s, u));
            continue;
          }
          const int l = u - 1;
          for (int s = 0; s < S; s++) {
            slice[s]->attention_output_backward(u, p, partial_of(d * S + s, u));
            put(dout.data(), slice[s]->attention_buffers(u).grad_out, s, C);
          }
          NZ_DISPATCH_DTYPE(dt, ops::attention_backward<T>((T*)dqkv.data(), (const T*)dout.data(),
                                                           (const T*)qkv[l].data(), (const T*)att[l].data(),
                                                           (const T*)out[l].data(), B, Tn, C, NH));
          for (int s = 0; s < S; s++) {
            take(slice[s]->attention_buffers(u).grad_qkv, dqkv.data(), s, 3 * C);
            slice[s]->attention_input_backward(u, p, partial_of(d * S + s, u));
          }
        }
      }
      // each unit: the N partials summed in rank order, then the average added (ZeRO-3's way)
      for (int u = 0; u < L.num_units(); u++) {
        const size_t n = L.units[u].padded;
        NZ_DISPATCH_TRAIN_DTYPE(dt, {
          T* sum = (T*)summed.data();
          for (size_t i = 0; i < n; i++) {
            acc_t<T> acc = load(((const T*)partial_of(0, u))[i]);
            for (int r = 1; r < N; r++) acc += load(((const T*)partial_of(r, u))[i]);
            sum[i] = store<T>(acc);
          }
        });
        accumulate_grads(dt, G(u), summed.data(), n, run.grad_average_scale(), k == 0);
      }
    }
    run.phase("optimizer");
    // the norm: rank r's owned slices summed as it sums them, the N partials in rank order
    double sq = 0;
    for (int r = 0; r < N; r++) {
      for (int u = 0; u < L.num_units(); u++) {
        const Slice own_slice = L.shard(u, r);
        memcpy(shard.data() + L.units[u].shard_offset * e, static_cast<char*>(G(u)) + own_slice.begin * e,
               own_slice.size() * e);
      }
      const double mine = sq_sum_of_shard(L, dt, shard.data(), Location::Host);
      sq = r == 0 ? mine : sq + mine;
    }
    const double norm = std::sqrt(sq) / run.loss_scale();
    double loss_sum = rank_loss[0];
    for (int r = 1; r < N; r++) loss_sum += rank_loss[r];
    if (run.skip_step(step, loss_sum, norm)) continue;
    const float scale = clip_scale(norm, run.args.clip) / run.loss_scale();
    for (int u = 0; u < L.num_units(); u++) adam.step(u, P(u), G(u), run.lr(), scale, run.adam_step());
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
