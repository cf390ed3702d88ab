// ulysses — sequence parallelism (DeepSpeed-Ulysses) with ZeRO-3: split each sequence too.
//
// Idea:  the N ranks are D replicas x S sequence slices (--sp S; rank = d S + s). Each of a
//        replica's S ranks holds T/S contiguous tokens of every sequence, with their positions
//        (wpe's rows from s T/S). Every op but attention works token by token, on my tokens.
//        Before attention an all-to-all turns (my tokens, all heads) of q, k, v into (all T
//        tokens, my NH/S heads); attention runs exactly, per head, causal in global positions;
//        a second all-to-all turns its output back into (my tokens, all heads). The backward
//        does the same in reverse. My weight gradients are my tokens' part of the batch's;
//        ZeRO-3's reduce-scatter over all N ranks sums them, in rank order, with the replicas'.
// Holds: stage3's model states, the layout padded for N; activations of T/S tokens, attention's
//        probabilities B (NH/S) T^2 per block: 1/S of stage3's (ulysses/formulas.h).
// Sends: stage3's 3K(N-1)S; per block and micro-step four all-to-alls in my replica's group
//        of S ranks, 8 B (T/S) C (S-1)/S elements per rank.
// Ring:  --sp-mode ring, the comparison: keys and values go around (ring.h); CPU only.
// GPU:   --device cuda: the all-to-alls on device memory (NCCL's grouped sends and receives,
//        comm.h), the layout changes as device kernels (kernels/swap_blocks.h); docs/gpu.md.
// Docs:  docs/ulysses.md; README.md (the ladder); docs/stages.md.
#include <cmath>      // std::sqrt
#include <cstring>    // memcpy

#include "kernels/ops.h"  // kernels on the run's backend
#include "kernels/swap_blocks.h"  // the layout changes on the GPU
#include "trainer.h"  // Trainer: args, model, data, logging, reports (all but the ZeRO idea)
#include "ulysses/formulas.h"  // ulysses_activation_bytes
#include "ulysses/hooks.h"  // refuse_unbuilt_flags
#include "ulysses/ring.h"  // RingAttention, ring_zigzag: --sp-mode ring

using namespace nz;

namespace {

// The split: S sequence slices x D = N/S replicas, a replica's slices on consecutive ranks.
// What cannot be split is one line here, before anything is sized.
Topology ulysses_topology(const Args& a, int world, int rank) {
  const int S = a.sp, H = a.cfg.heads, T = a.seq;
  const bool ring = a.sp_mode == "ring";
  if (world % S != 0)
    user_error("--sp %d on %d ranks: the ranks do not make whole sequence groups of %d, "
               "expected an S that divides %d (N = S x replicas); e.g. --sp %d",
               S, world, S, world, world % 2 == 0 ? 2 : 1);
  if (!ring && H % S != 0)
    user_error("--sp %d: the %d heads do not split over %d ranks, expected an S that divides "
               "%d (each rank attends with NH/S whole heads); e.g. --sp %d",
               S, H, S, H, H % 2 == 0 ? 2 : 1);
  if (!ring && T % S != 0)  // (ring mode: ring_zigzag asks for 2S equal chunks)
    user_error("--sp %d: a sequence of %d tokens does not split into %d equal slices, "
               "expected an S that divides --seq %d; e.g. --seq %d",
               S, T, S, T, T / S * S > 0 ? T / S * S : S);
  Topology t;
  t.dp_world = world / S, t.dp_rank = rank / S;  // my replica: it splits the data with the others
  const int s = rank % S;                        // my slice of every sequence
  t.seq.slices = S;
  t.seq.slice = s;
  t.seq.first_position = s * (T / S);  // learned absolute positions: my tokens' rows of wpe
  if (ring) ring_zigzag(a, s, t);  // ring mode: chunks s and 2S-1-s of 2S, their positions
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  Trainer run(argc, argv, Stage::Ulysses, ulysses_topology, refuse_unbuilt_flags);
  const Layout& L = run.layout;  // padded for all N ranks: ZeRO-3 over replicas and slices
  const DType dt = run.dtype;
  const size_t e = run.elem_bytes;
  const int EMBED = L.embed_unit();
  const int LNF = L.lnf_unit();
  const int rank = run.rank();
  GPT& model = *run.model;  // my slice of every sequence (model.h, SeqSlices)
  Comm& comm = run.comm;

  // ---- the split: my replica's S ranks, who hold the other slices of my sequences ----
  const int S = run.args.sp, T = run.args.seq, Tl = T / S, C = run.args.cfg.dim;
  Comm group(comm, /*color: my replica*/ rank / S, /*key: my slice*/ rank % S);
  // the all-to-alls' send and receive buffer, in place: B T/S tokens of 3C (q | k | v) at most
  const bool ring = run.args.sp_mode == "ring";
  Buffer exchange;  // (ring mode passes keys and values around instead: the ring's buffers below)
  if (!ring)
    exchange = Buffer(Category::Activations, Location::Device,
                      size_t(run.args.batch) * Tl * 3 * C * e, "all-to-all exchange");

  // ---- the two all-to-alls (DeepSpeed-Ulysses) ----
  // tokens (B, T/S, parts x C): my tokens, every head  ->  heads (B, T, parts x C/S): every
  // token, my NH/S heads. parts = 3 for q | k | v, 1 for attention's output (or the gradients).
  // Head group j's columns of part p are [p C + j C/S, p C + (j + 1) C/S): slot j of the
  // exchange is what goes to rank j; after the all-to-all, slot j holds rank j's tokens
  // (positions j T/S on) of my heads.
  // begin exercise: ulysses_all_to_all
  auto tokens_to_heads = [&](const void* tokens, void* heads, int parts) {
    const int B = model.rows(), Ch = C / S;
    // bytes: a token's row in the heads' layout, and a slot (what one rank gets)
    const size_t row = size_t(parts) * Ch * e, slot = size_t(B) * Tl * row;
    const char* tok = static_cast<const char*>(tokens);
    char* x = static_cast<char*>(exchange.data());
    for (int j = 0; j < S; j++)
      for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl; t++)
          for (int p = 0; p < parts; p++)
            memcpy(x + j * slot + (size_t(b) * Tl + t) * row + p * Ch * e,
                   tok + ((size_t(b) * Tl + t) * parts * C + p * C + j * Ch) * e, Ch * e);
    group.all_to_all(exchange.data(), slot / e, dt);  // all-to-all: my heads' share to each rank
    char* out = static_cast<char*>(heads);
    for (int j = 0; j < S; j++)  // rank j's tokens are positions j T/S .. (j + 1) T/S - 1
      for (int b = 0; b < B; b++)
        memcpy(out + (size_t(b) * T + size_t(j) * Tl) * row, x + j * slot + size_t(b) * Tl * row,
               Tl * row);
  };
  // heads (B, T, parts x C/S)  ->  tokens (B, T/S, parts x C): the inverse, back to my tokens
  auto heads_to_tokens = [&](const void* heads, void* tokens, int parts) {
    const int B = model.rows(), Ch = C / S;
    const size_t row = size_t(parts) * Ch * e, slot = size_t(B) * Tl * row;
    const char* in = static_cast<const char*>(heads);
    char* x = static_cast<char*>(exchange.data());
    for (int j = 0; j < S; j++)  // to rank j: its tokens, of my heads
      for (int b = 0; b < B; b++)
        memcpy(x + j * slot + size_t(b) * Tl * row, in + (size_t(b) * T + size_t(j) * Tl) * row,
               Tl * row);
    group.all_to_all(exchange.data(), slot / e, dt);  // all-to-all: slot j: heads j, my tokens
    char* tok = static_cast<char*>(tokens);
    for (int j = 0; j < S; j++)
      for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl; t++)
          for (int p = 0; p < parts; p++)
            memcpy(tok + ((size_t(b) * Tl + t) * parts * C + p * C + j * Ch) * e,
                   x + j * slot + (size_t(b) * Tl + t) * row + p * Ch * e, Ch * e);
  };
  // end exercise: ulysses_all_to_all
  // On the GPU the same moves, as device kernels: two block swaps around each all-to-all
  // (kernels/swap_blocks.h). The loops above are the CPU's, and the lesson.
  const bool gpu = current_device() == Device::CUDA;
  auto to_heads = [&](const void* tokens, void* heads, int parts) {
    if (!gpu) return tokens_to_heads(tokens, heads, parts);
    const int B = model.rows(), Ch = C / S;
    const size_t row = size_t(parts) * Ch * e, slot = size_t(B) * Tl * row;
    // (B T/S parts, S, C/S) -> (S, B T/S parts, C/S): head group j of every row to slot j
    ops::swap_blocks(exchange.data(), tokens, size_t(B) * Tl * parts, S, Ch * e);
    group.all_to_all(exchange.data(), slot / e, dt);
    ops::swap_blocks(heads, exchange.data(), S, B, Tl * row);  // (S, B, T/S) -> (B, S, T/S) rows
  };
  auto to_tokens = [&](const void* heads, void* tokens, int parts) {  // the same, undone
    if (!gpu) return heads_to_tokens(heads, tokens, parts);
    const int B = model.rows(), Ch = C / S;
    const size_t row = size_t(parts) * Ch * e, slot = size_t(B) * Tl * row;
    ops::swap_blocks(exchange.data(), heads, B, S, Tl * row);  // (B, S, T/S) -> (S, B, T/S) rows
    group.all_to_all(exchange.data(), slot / e, dt);
    ops::swap_blocks(tokens, exchange.data(), S, size_t(B) * Tl * parts, Ch * e);
  };

  // ring mode (--sp-mode ring): keys and values around the ring instead (ulysses/ring.h)
  std::unique_ptr<RingAttention> ring_attention;
  if (ring) ring_attention = std::make_unique<RingAttention>(group, run.args, rank % S, dt);

  // ---- a block, forward and backward: per token, but attention between two all-to-alls ----
  auto block_forward = [&](int u, const void* p) {
    const GPT::AttentionBuffers a = model.attention_buffers(u);
    model.attention_input(u, p);              // ln1, q k v: my T/S tokens, all heads
    if (ring) {  // ring: my queries against every rank's keys, passed around (no all-to-all)
      ring_attention->forward(u, a.qkv, a.out);
      model.attention_output(u, p);
      return;
    }
    to_heads(a.qkv, a.qkv_heads, 3);          // all-to-all: all T tokens, my NH/S heads
    model.attention(u, T);  // exact, per head, sequences of T tokens: causal in global positions
    to_tokens(a.out_heads, a.out, 1);         // all-to-all: back to my tokens, all heads
    model.attention_output(u, p);             // the projection and the MLP: per token
  };
  auto block_backward = [&](int u, const void* p, void* g) {
    const GPT::AttentionBuffers a = model.attention_buffers(u);
    model.attention_output_backward(u, p, g);          // the MLP, the projection: d out, my tokens
    if (ring) {  // ring: keys and values around again, their gradients with them
      ring_attention->backward(u, a.qkv, a.out, a.grad_out, a.grad_qkv);
      model.attention_input_backward(u, p, g);
      return;
    }
    to_heads(a.grad_out, a.grad_out_heads, 1);         // all-to-all: d out of all T, my heads
    model.attention_backward(u, T);  // the same sequences of T tokens: causal in global positions
    to_tokens(a.grad_qkv_heads, a.grad_qkv, 3);        // all-to-all: d q k v back to my tokens
    model.attention_input_backward(u, p, g);           // qkv, ln1: my tokens' part of the gradient
  };
  auto is_block = [&](int u) { return u != EMBED && u != LNF; };

  // ---- model state: params (P_p), gradients and optimizer state only for my slices ----
  Buffer params(Category::Params, Location::Device, L.shard_total * e, "params (my slices)");
  Buffer grads(Category::Grads, Location::Device, L.shard_total * e, "grads (my slices)");  // P_g
  Buffer bucket(Category::CommBuffers, Location::Device, L.max_unit_padded * e, "grad bucket");
  auto owned = [&](int u) { return L.units[u].padded / L.world; };          // elements in my slice
  // my slice of unit u, packed in the sharded parameter and gradient buffers
  auto my_P = [&](int u) { return elem_ptr(params, L.units[u].shard_offset, e); };
  auto my_G = [&](int u) { return elem_ptr(grads, L.units[u].shard_offset, e); };
  AdamW adam(L, owned_shards(L, rank), dt, run.adamw);  // P_os: m, v for my slices only
  for (int u = 0; u < L.num_units(); u++) {
    run.init_params(u, L.shard(u, rank), my_P(u));  // P_p: only my slice is ever initialised
    adam.init_master(u, my_P(u));
  }

  // ---- gather and release: a unit's full parameters exist only while it is in use ----
  std::vector<Buffer> gathered(L.num_units());        // unit u's full params (ledger: gathered)
  std::vector<CommRequest> in_flight(L.num_units());  // unit u's all-gather, until waited for
  // all-gather, started: every rank's slice of unit u, into a fresh buffer of the unit's size
  auto gather_start = [&](int u) {
    const Unit& unit = L.units[u];
    gathered[u] = Buffer(Category::Gathered, Location::Device, unit.padded * e,
                         "gathered " + unit.name);
    in_flight[u] = comm.all_gather_start(my_P(u), gathered[u].data(), owned(u), dt);
  };
  // unit u's full parameters: gathered now, or the prefetch already started is waited for
  auto gather_unit = [&](int u) -> const void* {
    if (gathered[u].empty()) gather_start(u);
    comm.wait(in_flight[u]);
    return gathered[u].data();
  };
  // prefetch: start the next unit's all-gather before this unit computes, so the two overlap
  auto prefetch = [&](int u) { if (run.args.prefetch) gather_start(u); };
  auto release_unit = [&](int u) { gathered[u].release(); };  // release: only my slice stays
  // The prefetch order: the unit a micro-step needs after unit u (FSDP2 records it in its first
  // forward; here it is written down). Forward: embed, blocks, lnf, then the embedding again for
  // the LM head. Backward: lnf down to block 0; the embedding's backward needs no parameters.
  auto prefetch_after_forward = [&](int u) { prefetch(u < LNF ? u + 1 : EMBED); };
  auto prefetch_after_backward = [&](int u) { if (u - 1 > EMBED) prefetch(u - 1); };
  run.unit_access = UnitAccess{gather_unit, release_unit};  // the model file: unit by unit
  // validation: the forward of my slice, the blocks between their all-to-alls
  run.hooks.forward_loss = [&] {
    for (int u = 0; u < L.num_units(); u++) {
      const void* p = gather_unit(u);
      if (is_block(u)) block_forward(u, p);
      else model.forward(u, p);
      release_unit(u);
    }
    model.head_forward(gather_unit(EMBED));
    release_unit(EMBED);
    return model.take_loss_sum();  // my tokens' losses: the Trainer sums the ranks'
  };
  // the memory table: stage3's model states (the layout padded for N), my slice's activations
  run.hooks.state_formula = [&](int) { return expected_state_bytes(Stage::Ulysses, L, dt); };
  run.hooks.activation_formula = [&](int) {
    return ring ? ring_activation_bytes(run.args.cfg, run.args.batch, T, S, dt)
                : ulysses_activation_bytes(run.args.cfg, run.args.batch, T, S, dt);
  };

  for (int step = run.first_step(); step < run.args.steps; step++) {
    run.begin_step(step);
    for (int k = 0; k < run.args.accum; k++) {
      run.load_micro_batch(step, k);  // my replica's sequences; the model keeps my slice of each
      run.phase("forward");
      for (int u = 0; u < L.num_units(); u++) {
        const void* p = gather_unit(u);       // all-gather: unit u, just before it runs
        prefetch_after_forward(u);            // prefetch: the next unit (after lnf, the LM head's)
        if (is_block(u)) block_forward(u, p); // a block: attention between two all-to-alls
        else model.forward(u, p);
        release_unit(u);                      // release: unit u, until it is needed again
      }
      const void* wte = gather_unit(EMBED);   // all-gather: the embedding again, for the LM head
      prefetch(LNF);                          // prefetch: the first unit of the backward
      model.head_forward(wte);  // adds my tokens' summed loss to the step total, on the device
      run.phase("backward");
      model.head_backward(wte);  // d loss / d logits: my tokens' part of the batch's mean
      release_unit(EMBED);                    // release: the LM head is done with the embedding
      for (int u = L.num_units() - 1; u >= 0; u--) {
        // all-gather: unit u again for its backward; the embedding's backward needs no parameters
        const void* p = u == EMBED ? nullptr : gather_unit(u);
        prefetch_after_backward(u);           // prefetch: the next unit of the backward
        if (is_block(u)) block_backward(u, p, bucket.data());  // my tokens' part of the gradient
        else model.backward(u, p, bucket.data());
        release_unit(u);                      // release: unit u, until the next forward
        // reduce-scatter over all N ranks, every micro-step: the S slices' parts and the D
        // replicas' gradients summed in rank order; each rank receives the slice it owns
        void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);
        comm.reduce_scatter(bucket.data(), mine, owned(u), dt);
        accumulate_grads(dt, my_G(u), mine, owned(u), run.grad_average_scale(), k == 0);
      }
    }
    run.phase("optimizer");
    // global gradient norm: each rank sums its slices, then one rank-ordered sum of the partials
    double sq = sq_sum_of_shard(L, dt, grads.data());
    comm.sum_scalars(&sq, 1);
    const double norm = std::sqrt(sq) / run.loss_scale();  // fp16: the gradients are stored scaled
    const double loss_sum = model.take_loss_sum();  // my tokens' summed losses, all micro-steps
    if (run.skip_step(step, loss_sum, norm)) continue;  // fp16: an overflow on any rank, no update
    // clip, and undo the loss scale
    const float scale = clip_scale(norm, run.args.clip) / run.loss_scale();
    for (int u = 0; u < L.num_units(); u++) {
      adam.step(u, my_P(u), my_G(u), run.lr(), scale, run.adam_step());  // P_os: my slice only
      // no all-gather here: the next forward gathers each unit just before it needs it (P_p)
    }
    run.end_step(step, loss_sum, norm);
  }
  run.finish();
  return 0;
}
