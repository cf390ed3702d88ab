// zero_formulas.h — what the ZeRO paper says each rank holds and sends, for this project's exact
// layout (padding included). The trainers print these beside the ledger, the tests assert
// ledger == formula to the byte, and zero_estimate prints them without allocating anything.
//
// Notation (docs/memory.md, "The memory ledger"): P = padded parameter count (Ψ plus the zeros that pad each unit to a
// multiple of N), S = P / N (the elements each rank owns), U = the largest unit (padded),
// e = bytes per element of the storage type (4 for fp32, 2 for bf16 and fp16).
#pragma once
#include <cstdint>
#include <string>

#include "kernels/dtype.h"
#include "ledger.h"
#include "kernels/kernels.h"  // Attention
#include "layout.h"
#include "compression/qat.h"  // QatConfig

namespace nz {

// Pipeline: pipeline/train.cpp; its per-segment bytes are in pipeline/formulas.h, the whole-model
// functions count it as stage0_ddp (every rank all units: an upper bound).
// ZeroPP: zeropp/train.cpp, stage3 with ZeRO++'s quantized and node-local collectives; the
// whole-model functions count it as stage3, and zeropp/formulas.h adds what ZeRO++ adds.
enum class Stage { DDP, Z1, Z2, Z3, Offload, Pipeline, Infinity, ZeroPP, Tensor, Ulysses };
const char* stage_name(Stage s);
bool parse_stage(const std::string& s, Stage* out);

struct StateBytes {
  // by category, summed over locations
  uint64_t params = 0, grads = 0, master = 0, adam_m = 0, adam_v = 0, comm_buffers = 0;
  uint64_t gathered_peak = 0;  // stage3: the most gathered-parameter bytes alive at once
  // offload, infinity: what lives off the device; the rest is on the device. expected_state_bytes:
  // host = all of it, disk = 0; offload_state_bytes with the disk tier: host memory and disk apart.
  uint64_t host = 0, disk = 0;
  uint64_t total() const { return params + grads + master + adam_m + adam_v + comm_buffers + gathered_peak; }
  uint64_t of(Category c) const;
};

// Offload and infinity with their state on `tier` (Location::Host, or Location::Disk: offload
// --offload-to disk, infinity --offload-param disk): expected_state_bytes with `disk` split off
// `host`, what the ledger shows at each location (chunk and slot buffers, scratch, apart).
StateBytes offload_state_bytes(Stage stage, const Layout& L, DType dt, Location tier);

// A raw parameter count seen the paper's way: Ψ padded to a multiple of N and held in no unit, so
// the largest unit is U = 0 and the formulas count no bucket, no gathered unit and no incoming
// unit gradient: exactly the model states (2 + 2 + K)Ψ of the ZeRO paper (zero_estimate --params,
// the quiz).
Layout paper_layout(uint64_t psi, int world);

// Per-rank model-state bytes of `stage` for layout L (its world size is N) in storage type dt.
StateBytes expected_state_bytes(Stage stage, const Layout& L, DType dt);

// Activation bytes per rank for a micro-batch of B sequences of length T: what the forward saves
// for the backward, the backward's activation gradients of one block, and the tokens and targets;
// the same in every stage (ZeRO shards model states, not activations). Written out term by term in
// zero_formulas.cpp (docs/memory.md, "Activations"); the model's allocation (model.h) and the ledger's
// activations peak equal it to the byte. With checkpointing, only the L block inputs and one
// block's internals are kept (model.h). With attn = Flash (flash attention in force on the CUDA
// device, GPT::attention()) each block keeps B*NH*T fp32 log-sums-exp instead of the B*NH*T*T
// probabilities.
uint64_t expected_activation_bytes(const GPTConfig& cfg, int B, int T, DType dt, bool checkpointing,
                                   Attention attn = Attention::Gemm);

// The most bytes a rank holds on the device at once, for micro-batch B of length T: its model
// states on the device (offload's host part left out) plus its activations. Every category's peak
// is added as if they all peaked together, so the ledger's device peak is at most this; in these
// trainers they do (the model states are allocated before the first forward and the activations
// once), so it is equal (tests/test_batch_fit). What --batch auto fits into --memory-budget.
// state: a rung's own model-state bytes where they differ from its stage's (zeropp: what ZeRO++
// adds to stage3, zeropp/formulas.h); null: expected_state_bytes(stage).
uint64_t expected_device_peak(Stage stage, const Layout& L, int B, int T, DType dt, bool checkpointing,
                              Attention attn = Attention::Gemm, const StateBytes* state = nullptr);
// The largest micro-batch B in 1..max_batch whose expected_device_peak fits in budget bytes, or 0
// when even B = 1 does not (activations grow with B, nothing else does).
int largest_fitting_batch(Stage stage, const Layout& L, int T, DType dt, bool checkpointing, uint64_t budget,
                          int max_batch = 1 << 16, Attention attn = Attention::Gemm,
                          const StateBytes* state = nullptr);

// Elements this rank sends per optimizer step in the model-state collectives, with K = accum
// micro-steps. Stages 0 and 1 keep the full gradient, so they accumulate it locally and reduce
// once per step, whatever K is (PyTorch DDP's no_sync, DeepSpeed stage 1); from stage 2 on a rank
// keeps only its slice of the gradient, so it must reduce-scatter every micro-step:
//   stage0:        2 (N-1) S                  (all-reduce = reduce-scatter + all-gather, once)
//   stage1:        2 (N-1) S                  (reduce-scatter once, all-gather once)
//   stage2:        K (N-1) S + (N-1) S        (reduce-scatter per micro-step, one all-gather)
//   stage3:        3 K (N-1) S                (gather in forward and backward, reduce-scatter)
//   offload:       as stage2, plus host<->device: K S down (grad slices) + S up (params)
//   infinity:      as stage3, plus host<->device: K S down (grad slices) + 2 K S up (my slice
//                  before each gather: S + s_E in the forward, S - s_E in the backward)
// With K = 1 these are the paper's 2Ψ(N-1)/N and 3Ψ(N-1)/N per rank.
// Activation checkpointing changes nothing here, so it is no parameter: the recomputation of each
// block's forward in its backward needs the block's full parameters, which stages 0-2 always
// hold; stage3 gathers them for the backward anyway, and the recomputation runs on that same
// gathered buffer (zero_formulas.cpp writes stage3's gathers out unit by unit).
uint64_t expected_comm_elems(Stage stage, const Layout& L, int accum);
uint64_t expected_link_elems(Stage stage, const Layout& L, int accum);  // offload, infinity; else 0
// fp16 only (loss_scale.h): every stage agrees once per step on whether the gradients overflowed,
// a one-element all-reduce MAX: N - 1 elements per rank per step (4 bytes each). 0 in fp32, bf16.
uint64_t expected_overflow_flag_elems(const Layout& L, DType dt);

// ---- --qat (qat.h): quantization-aware training, in any stage ----
// The model's fake-quantized copy of the unit computing now, one buffer reused unit after unit
// (ledger: scratch, on the device), the same in every stage:
//   e max p_u   over the units it quantizes (every unit, or all but the embedding with --qat-skip
//               embedding), p_u padded as the model checks a unit's parameters; 0 without --qat.
// It is where the fake-quantized weights live in every stage: stage0-2 (and offload) quantize
// their full parameter buffer's unit into it (in place would be wrong: in fp32 the parameters are
// the master itself), stage3 (infinity, zeropp) the unit it gathered. stage3 could quantize its
// gathered copy in place and save these bytes, but only with lines in its file; one copy in the
// model keeps every stage file unchanged. For a pipeline segment: units [first, end), and on a last
// segment without the embedding the LM head's wte copy, V C elements.
uint64_t qat_bytes(const Layout& L, DType dt, const QatConfig& q, int first = 0, int end = -1);

}  // namespace nz
