// tensor.cpp — tensor parallelism's plan: the checks, the pieces each rank holds (tensor.h).
#include "tensor/tensor.h"

#include <cstdio>
#include <cstring>

#include "input/cli.h"
#include "pipeline/pipeline.h"  // make_pipeline_plan: 3D's partition
#include "runtime/check.h"  // user_error
#include "runtime/device.h"  // cuda_rt: is there a GPU for --device auto

namespace nz {

TensorPlan tensor_plan(const Args& a, int world, int rank) {
  const GPTConfig& c = a.cfg;
  const int T = a.tensor, P = a.pipeline;
  if (P > c.layers + 2)
    user_error("--pipeline %d: more segments than the model's %d units (embedding, %d blocks, final layernorm), "
               "expected at most %d; use fewer segments or more --layers", P, c.layers + 2, c.layers, c.layers + 2);
  if (P > 1 && world % (T * P) != 0)  // 3D: N = P x D x T
    user_error("--tensor %d --pipeline %d on %d ranks: T x P = %d does not divide the ranks, expected N = P x D x T; "
               "run a multiple of %d ranks, or a T and a P whose product divides %d", T, P, world, T * P, T * P, world);
  // 3D: the pipeline rung's checks of --partition and --schedule, over the N/T tensor groups (pipe3d.cpp);
  // a --partition without --pipeline is refused there too (boundaries for one segment)
  if (P > 1 || !a.partition.empty()) make_pipeline_plan(c, world / T, rank / T, P, a.schedule, a.partition, a.zero);
  if (world % T != 0)
    user_error("--tensor %d on %d ranks: T does not divide the ranks, expected N = D x T; run %d ranks, or a T "
               "that divides %d", T, world, (world / T + 1) * T, world);
  if (c.heads % T != 0)
    user_error("--tensor %d: the %d heads do not split over %d ranks, expected a T that divides the heads; use "
               "--tensor 1, 2 or a divisor of %d", T, c.heads, T, c.heads);
  // (the MLP's 4C columns then split too: C = heads x head size is a multiple of T, so is 4C)
  // what this rung does not build (yet): refused, not ignored
  if (a.sequence_parallel && T == 1)
    user_error("--sequence-parallel with --tensor 1: it splits the rows over the tensor ranks, expected T > 1; "
               "add --tensor 2 (or more), or drop --sequence-parallel");
  if (a.sequence_parallel && a.seq % T != 0)
    user_error("--sequence-parallel with --seq %d: the positions do not split over %d tensor ranks, expected a "
               "--seq that T divides, e.g. --seq %d", a.seq, T, a.seq / T * T > 0 ? a.seq / T * T : T);
  if (a.zero >= 2)
    user_error("--zero %d with tensor: ZeRO-%d over the replicas is not built yet, expected --zero 0 or 1 (the "
               "optimizer state sharded over the D replicas)", a.zero, a.zero);
  if (!a.ckpt_dir.empty() || !a.resume.empty())
    user_error("%s: tensor does not write or read checkpoints yet, expected no --ckpt-dir and no --resume; drop "
               "them (docs/tensor.md)", a.ckpt_dir.empty() ? "--resume" : "--ckpt-dir");
  if (!a.prune_mask.empty())
    user_error("--prune-mask with tensor: not built for this rung, expected stage0_ddp, stage1, stage2, stage3 or "
               "offload; fine-tune the pruned model with one of those");
  if (a.qat_bits)
    user_error("--qat with tensor: not built for this rung, expected no --qat; train with --qat on stage0_ddp..stage3");
  if (a.activation_checkpointing)
    user_error("--activation-checkpointing with tensor: not built for this rung yet, expected it off; drop the flag");
  if (a.batch_auto)
    user_error("--batch auto with tensor: the fit is sized by the whole model's formulas, not a tensor rank's, "
               "expected a --batch; zero_estimate --tensor T --batch B prints a rank's bytes");
  // The GPU runs every layout (T x D, 3D, sequence parallel) but flash attention's kernels
  const bool gpu = a.device == "cuda" || (a.device == "auto" && cuda_rt::compiled() && cuda_rt::device_count() > 0);
  if (gpu && a.attention == "flash")
    user_error("--attention flash with tensor on the GPU: not built (each rank keeps its heads' attention "
               "probabilities, tensor/formulas.h), expected --attention gemm; drop the flag");
  TensorPlan p;
  p.tensor = T;
  p.segments = P;
  p.replicas = world / (T * P);
  p.t = rank % T;  // T fastest, then D, then P
  p.d = rank / T % p.replicas, p.p = rank / T / p.replicas;
  p.zero = a.zero;
  p.sp = a.sequence_parallel;
  return p;
}

Topology tensor_topology(const Args& a, int world, int rank) {
  const TensorPlan p = tensor_plan(a, world, rank);
  Topology t;
  t.dp_world = p.replicas, t.dp_rank = p.d;  // the data: my replica's micro-batches, as stage0_ddp on D ranks
  t.first_unit = 0, t.end_unit = 1;          // the Trainer's model holds the batch only (tensor/model.h computes)
  t.own_model = true;
  return t;
}

std::string tensor_summary(const TensorPlan& p, const GPTConfig& c) {
  const int V = c.vocab, Vp = padded_vocab(V, p.tensor);
  char pad[160] = "";
  if (Vp != V)  // said once: the rows past V are zeros no token looks up, left out of the loss
    snprintf(pad, sizeof pad, " padded to %d (a multiple of T; the %d rows past %d are zeros: no token looks them "
             "up, the loss leaves them out)", Vp, Vp - V, V);
  char line[640], place[200];
  if (p.segments > 1)
    snprintf(place, sizeof place, " x P = %d pipeline segments, T fastest, then D, then P (rank r: tensor rank r %% T "
             "of replica r / T %% D in segment r / (T D))", p.segments);
  else
    snprintf(place, sizeof place, ", T fastest (rank r: tensor rank r %% T of replica r / T)");
  snprintf(line, sizeof line, "tensor: T = %d tensor ranks x D = %d replicas%s%s%s | %d heads, %d MLP columns, %d "
           "vocabulary rows per tensor rank (vocabulary %d%s)",
           p.tensor, p.replicas, place, p.zero ? ", ZeRO-1 over the replicas" : "",
           p.sp ? ", sequence parallel (each rank 1/T of the rows outside attention and the MLP)" : "",
           c.heads / p.tensor, 4 * c.dim / p.tensor, Vp / p.tensor, V, pad);
  return line;
}

int padded_vocab(int vocab, int T) { return (vocab + T - 1) / T * T; }

bool replicated_tensor(const char* name) {
  for (const char* split : {"wte", "qkv_w", "qkv_b", "attproj_w", "fc_w", "fc_b", "fcproj_w"})
    if (strcmp(name, split) == 0) return false;
  return true;
}

Layout tensor_layout(const GPTConfig& cfg, int T, int D) {
  // make_layout's units and tensors, with every split tensor cut to one rank's piece: a config whose
  // sizes are the pieces' would give other shapes (4C/T is not 4 x (C/T) of a smaller model), so the
  // tensors are resized here, then the units laid out again
  Layout L = make_layout(cfg, D);
  const uint64_t C = cfg.dim, Vl = padded_vocab(cfg.vocab, T) / T;
  uint64_t offset = 0, shard_offset = 0;
  L.num_params = L.padded_total = L.shard_total = L.max_unit_padded = 0;
  for (Unit& u : L.units) {
    uint64_t at = 0;
    for (TensorSpec& ts : u.tensors) {
      if (ts.name == "wte") ts.numel = Vl * C;
      else if (!replicated_tensor(ts.name.c_str())) ts.numel /= T;  // qkv, attproj_w, fc, fcproj_w: 1/T each
      ts.offset = at;
      at += ts.numel;
    }
    u.numel = at;
    u.padded = (at + D - 1) / D * D;
    u.offset = offset;
    u.shard_offset = shard_offset;
    offset += u.padded;
    shard_offset += u.padded / D;
    L.num_params += u.numel;
    L.max_unit_padded = std::max(L.max_unit_padded, u.padded);
  }
  L.padded_total = offset;
  L.shard_total = shard_offset;
  return L;
}

void for_each_run(const Layout& full, const Layout& local, int u, int T, int t,
                  const std::function<void(size_t, size_t, size_t)>& fn) {
  const GPTConfig& c = full.cfg;
  const size_t C = c.dim, Cq = C / T, F = 4 * C / T;
  const std::vector<TensorSpec>& ft = full.units[u].tensors;
  const std::vector<TensorSpec>& lt = local.units[u].tensors;
  for (size_t i = 0; i < ft.size(); i++) {
    const std::string& name = ft[i].name;
    const size_t f0 = ft[i].offset, l0 = lt[i].offset;
    if (replicated_tensor(name.c_str())) {
      fn(f0, l0, ft[i].numel);
    } else if (name == "wte") {  // rows [t V', (t+1) V') that exist: the padding rows stay zeros
      const size_t Vl = lt[i].numel / C, lo = t * Vl, hi = std::min(lo + Vl, size_t(c.vocab));
      if (hi > lo) fn(f0 + lo * C, l0, (hi - lo) * C);
    } else if (name == "qkv_w" || name == "qkv_b") {  // my heads' rows of q, of k and of v
      const size_t row = name == "qkv_w" ? C : 1;
      for (size_t s = 0; s < 3; s++) fn(f0 + (s * C + t * Cq) * row, l0 + s * Cq * row, Cq * row);
    } else if (name == "fc_w" || name == "fc_b") {  // my rows of the MLP's first matrix
      const size_t row = name == "fc_w" ? C : 1;
      fn(f0 + t * F * row, l0, F * row);
    } else {  // attproj_w (C, C), fcproj_w (C, 4C): my columns of every row
      const size_t cols = name == "attproj_w" ? C : 4 * C, mine = cols / T;
      for (size_t r = 0; r < C; r++) fn(f0 + r * cols + t * mine, l0 + r * mine, mine);
    }
  }
}

}  // namespace nz
