// zero_quiz.cpp — questions from the formulas, and their grader (zero_quiz.h).
#include "tools/zero_quiz.h"

#include <fcntl.h>     // open: O_NONBLOCK, so that a FIFO given as a file does not block
#include <poll.h>      // a pipe or a FIFO read while data comes, never waited on forever
#include <sys/stat.h>  // fstat: a regular file or a pipe is read, a device or a directory is not
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "runtime/check.h"          // user_error
#include "model.h"          // GPTConfig, param_count_formula
#include "runtime/rng.h"            // Rng: the same questions for the same seed
#include "zero_formulas.h"  // expected_state_bytes, expected_comm_elems, expected_link_elems
#include "tensor/formulas.h"  // tensor_param_formula, tensor_comm_elems: tensor parallelism's questions
#include "tensor/tensor.h"    // tensor_layout, padded_vocab
#include "muon_formulas.h"  // Muon's questions: muon_state_bytes, muon_gather_elems
#include "ulysses/formulas.h"  // ulysses_all_to_all_elems_per_block, ulysses_largest_sp: ulysses' questions

#ifndef __EMSCRIPTEN__
#include <sodium.h>  // Ed25519 signatures and SHA-256 (libsodium): a course's certificates
#endif
#include <ctime>     // the certificate's date

namespace nz {

namespace {

// GPT-2's four sizes, with GPT-2's vocabulary of 50257 tokens and context 1024 (not this project's
// byte vocabulary): 124M, 355M, 774M and 1.56B parameters by param_count_formula.
struct Shape { const char* name; int layers, dim, heads; };
const Shape kShapes[] = {{"GPT-2 small", 12, 768, 12}, {"GPT-2 medium", 24, 1024, 16},
                         {"GPT-2 large", 36, 1280, 20}, {"GPT-2 XL", 48, 1600, 25}};

uint64_t params_of(const Shape& s) {
  GPTConfig c;
  c.vocab = 50257, c.ctx = 1024, c.layers = s.layers, c.dim = s.dim, c.heads = s.heads;
  return param_count_formula(c);
}

std::string shape_text(const Shape& s) {
  char t[200];
  snprintf(t, sizeof t, "%s (%d layers, width %d, %d heads, context 1024, vocabulary 50257, tied embedding)",
           s.name, s.layers, s.dim, s.heads);
  return t;
}

// What each precision keeps per parameter, said in every question: the fp32 case has no master copy
// (the params are the ones Adam updates), which a learner cannot guess from "fp32" alone.
const char* precision_text(DType dt) {
  return dt == DType::BF16 ? "bf16 mixed precision (bf16 params and grads, 2 bytes each; an fp32 master copy and "
                             "Adam m and v, 4 bytes each)"
                           : "fp32 (params, grads, Adam m and v, 4 bytes each; no separate master copy)";
}

template <class... A>
std::string fmt(const char* f, A... a) {
  char s[600];
  snprintf(s, sizeof s, f, a...);
  return s;
}

// Each category of a rank's model states, its bytes and whether it is whole or a slice: the worked
// answer of a model-state question, from the same StateBytes the answer is.
std::string explain_states(Stage s, uint64_t psi, int N, DType dt) {
  const Layout L = paper_layout(psi, N);
  const StateBytes b = expected_state_bytes(s, L, dt);
  const uint64_t P = L.padded_total, S = L.shard_total;
  // whole on every rank, or this rank's slice: what each stage shards (zero_formulas.h)
  const bool params_whole = s != Stage::Z3, grads_whole = s == Stage::DDP || s == Stage::Z1;
  const bool opt_whole = s == Stage::DDP;
  auto part = [&](const char* name, uint64_t bytes, bool whole) {
    if (!bytes) return std::string();
    return fmt("%s %llu x %s = %llu; ", name, (unsigned long long)(bytes / (whole ? P : S)), whole ? "P" : "S",
               (unsigned long long)bytes);
  };
  return fmt("Ψ = %llu parameters; on %d ranks P = Ψ padded to a multiple of N = %llu, S = P/N = %llu per rank. "
             "%s keeps, in bytes: ", (unsigned long long)psi, N, (unsigned long long)P, (unsigned long long)S,
             stage_name(s)) +
         part("params", b.params, params_whole) + part("grads", b.grads, grads_whole) +
         part("fp32 master", b.master, opt_whole) + part("Adam m", b.adam_m, opt_whole) +
         part("Adam v", b.adam_v, opt_whole) +
         fmt("total %llu bytes = %.4g GB (P: the whole model, S: this rank's slice).",
             (unsigned long long)b.total(), double(b.total()) / 1e9);
}

// ---- tensor parallelism's questions (docs/tensor.md; the answers from tensor/formulas.h) ----
// Two kinds, on GPT-2's small, medium or large blocks (with GPT-2's vocabulary) split over T tensor
// ranks, T a divisor of the heads among 2, 4 and 8: the elements one rank sends per optimizer step in
// the activations' all-reduces, and one rank's bytes of parameters. The shape is named without the
// "(L layers, width C, ...)" the model-state questions use: those the quiz's test recomputes as ZeRO's.
template <class Pick>
QuizQuestion tensor_question(Pick pick) {
  const Shape& shape = kShapes[pick(3)];
  GPTConfig c;
  c.vocab = 50257, c.ctx = 1024, c.layers = shape.layers, c.dim = shape.dim, c.heads = shape.heads;
  int Ts[3], n = 0;
  for (int T : {2, 4, 8})
    if (c.heads % T == 0) Ts[n++] = T;
  const int T = Ts[pick(n)];
  const std::string model = fmt("%s's %d blocks of width %d with %d heads (vocabulary 50257, context 1024, tied "
                                "embedding)", shape.name, c.layers, c.dim, c.heads);
  const Layout mine = tensor_layout(c, T, 1);
  if (pick(2)) {  // the activations' all-reduces: 4 per block per micro-step, 2 more per micro-step
    const int b = 1 << pick(3), s = 512 << pick(2), K = 1 + pick(4);
    const TensorComm x = tensor_comm_elems(c, T, 1, mine, b, s, K);
    const double m = double(x.all_reduce) / 1e6;
    QuizQuestion q{fmt("Tensor parallelism (Megatron-LM) over T = %d ranks, one replica: %s, micro-batches of b x s = %d "
                       "x %d tokens, %d micro-steps per optimizer step. Every block all-reduces its "
                       "(b, s, C) activations 4 times per micro-step (g twice in the forward, f twice in the "
                       "backward), and the embedding's g and the LM head's f add one each. An all-reduce of n "
                       "elements over T ranks sends 2(T-1)n/T of them per rank. How many million elements does "
                       "one tensor rank send per optimizer step in these all-reduces? (The loss's two all-reduces "
                       "of one number per token are within the tolerance: count them or not.)",
                       T, model.c_str(), b, s, K),
                   m, 0.01, "M elements"};
    q.explanation = fmt("Per micro-step (4L + 2) all-reduces of b s C = %d x %d x %d = %llu elements: (4 x %d + 2) x "
                        "%llu = %llu elements, of which a rank sends 2(T-1)/T = %.4g; times K = %d micro-steps: %.6g "
                        "M (the loss's two all-reduces add 2 x %llu elements per micro-step, within the tolerance). It grows with the tokens, not with the model's "
                        "size: ZeRO-3 sends the model instead, 3Ψ(N-1)/N per step (notebooks/09_tensor.ipynb).",
                        b, s, c.dim, (unsigned long long)(uint64_t(b) * s * c.dim), c.layers,
                        (unsigned long long)(uint64_t(b) * s * c.dim),
                        (unsigned long long)((4 * uint64_t(c.layers) + 2) * b * s * c.dim), 2.0 * (T - 1) / T, K, m,
                        (unsigned long long)((uint64_t(b) * s + T - 1) / T * T));
    return q;
  }
  // one rank's parameters: the matrices and the split biases 1/T, wte by vocabulary (padded to a
  // multiple of T), the replicated parameters whole
  const bool bf16 = pick(2);
  const uint64_t Pt = tensor_param_formula(c, T), e = bf16 ? 2 : 4;
  const double mb = double(e * Pt) / 1e6;
  QuizQuestion q{fmt("Tensor parallelism (Megatron-LM) over T = %d ranks: %s, parameters in %s (%d bytes each). "
                     "Each rank holds 1/T of every matrix (qkv and fc by columns, the two output projections by "
                     "rows, with qkv's and fc's biases), the embedding's rows of 1/T of the vocabulary rounded up "
                     "to a multiple of T, and the rest whole (wpe, the layer norms, the two output projections' "
                     "biases). How many MB (10^6 bytes) of parameters does each tensor rank hold?",
                     T, model.c_str(), bf16 ? "bf16" : "fp32", int(e)),
                 mb, 0.01, "MB"};
  const uint64_t C = c.dim, L = c.layers, V = padded_vocab(c.vocab, T);
  q.explanation = fmt("V' = 50257 rounded up to a multiple of %d = %llu. Split: V'C + L(12C² + 7C) = %llu; whole: "
                      "1024 C + 6LC + 2C = %llu. P_t = %llu / %d + %llu = %llu parameters, x %d bytes = %.6g MB: "
                      "the split part shrinks with T, the replicated part does not.",
                      T, (unsigned long long)V, (unsigned long long)(V * C + L * (12 * C * C + 7 * C)),
                      (unsigned long long)(1024 * C + 6 * L * C + 2 * C),
                      (unsigned long long)(V * C + L * (12 * C * C + 7 * C)), T,
                      (unsigned long long)(1024 * C + 6 * L * C + 2 * C), (unsigned long long)Pt, int(e), mb);
  return q;
}
// ---- end tensor parallelism's questions ----

// ---- Muon (docs/muon.md, common/muon_formulas.h): its optimizer state beside AdamW's, and the elements
// gather-all sends; a GPT-2 shape, laid out as the trainers lay it out (the blocks' four hidden matrices
// are Muon's: 12 C^2 elements a block) ----
QuizQuestion muon_question(int kind, const Shape& shape, int N, DType dt) {
  GPTConfig c;
  c.vocab = 50257, c.ctx = 1024, c.layers = shape.layers, c.dim = shape.dim, c.heads = shape.heads;
  const Layout L = make_layout(c, N);
  const uint64_t C = uint64_t(shape.dim), M = 12 * C * C * uint64_t(shape.layers);
  if (kind == 0) {  // optimizer state per rank, averaged over the ranks, stage1
    uint64_t muon = 0, adamw = 0;
    for (int r = 0; r < N; r++) {
      const StateBytes m = muon_state_bytes(Stage::Z1, L, dt, r), a = expected_state_bytes(Stage::Z1, L, dt);
      muon += m.adam_m + m.adam_v, adamw += a.adam_m + a.adam_v;
    }
    const double muon_gb = double(muon) / N / 1e9, adamw_gb = double(adamw) / N / 1e9;
    QuizQuestion q{fmt("%s, stage1 on %d ranks, --optimizer muon: Muon (one fp32 momentum) for the blocks' four hidden "
                       "matrices (qkv, attention projection, MLP up and down), AdamW (fp32 m and v) for the rest. How "
                       "many GB (10^9 bytes) of optimizer state (momentum, m, v; no master, no params) does a rank "
                       "hold, on average over the N ranks?", shape_text(shape).c_str(), N),
                   muon_gb, 0.01, "GB"};
    q.explanation = fmt("P = %llu (padded), S = P/N = %llu; the hidden matrices hold M = 12 C^2 x %d blocks = %llu "
                        "elements. Every owned element has 4 bytes of momentum or m (4S); only the AdamW elements "
                        "have v, 4 (S - M_r) on rank r, and the M_r add up to M over the ranks: on average "
                        "(8P - 4M)/N = %.6g GB, against AdamW's 8S = %.6g GB (docs/muon.md).",
                        (unsigned long long)L.padded_total, (unsigned long long)L.shard_total, shape.layers,
                        (unsigned long long)M, muon_gb, adamw_gb);
    return q;
  }
  // the elements each rank sends per step in gather-all's all-gathers of X, beyond the stage's own
  const double m = double(muon_gather_elems(Stage::Z2, L, MuonShard::GatherAll)) / 1e6;
  const uint64_t block = L.units[1].padded;
  QuizQuestion q{fmt("%s, stage2 on %d ranks, --optimizer muon --muon-shard gather-all: each rank writes its part "
                     "of X (the Muon update's input, fp32) of every hidden matrix into a block-sized buffer, and one "
                     "all-gather per block gives every rank every matrix. Beyond stage2's own collectives, how many "
                     "million elements does each rank send per optimizer step? (Each block is one unit of 12 C^2 + "
                     "13 C elements, padded to a multiple of N; count a ring's (N-1)/N.)",
                     shape_text(shape).c_str(), N), m, 0.01, "M elements"};
  q.explanation = fmt("A block is 12 C^2 + 13 C = %llu elements, padded to %llu, a slice S_u = %llu; its all-gather "
                      "sends (N - 1) S_u = %llu elements per rank, and there are %d blocks: %.6g M, whatever the "
                      "slices cut (the owners' design sends only the cut matrices' parts, point to point).",
                      (unsigned long long)L.units[1].numel, (unsigned long long)block,
                      (unsigned long long)(block / N), (unsigned long long)((N - 1) * (block / N)), shape.layers, m);
  return q;
}

// ---- ulysses' questions (ulysses/formulas.h, docs/ulysses.md, notebooks/10_ulysses.ipynb): every third
// of the rungs' questions (zero_quiz.h); two kinds, the all-to-all's elements and the largest S, each with its worked answer.
// The shape is said as blocks and heads, not in the form the ladder's questions parse (tests/tools). ----
QuizQuestion ulysses_question(Rng& rng, const Shape& shape) {
  auto pick = [&](int n) { return int(rng.next() % uint64_t(n)); };
  GPTConfig c;
  c.vocab = 50257, c.ctx = 1024, c.layers = shape.layers, c.dim = shape.dim, c.heads = shape.heads;
  const std::string model = fmt("%s's shape (%d blocks of width C = %d, %d heads)", shape.name, shape.layers,
                                shape.dim, shape.heads);
  if (pick(2) == 0) {  // the all-to-all's elements per block and rank
    std::vector<int> splits;  // S that split the heads
    for (int S = 2; S <= 8; S++)
      if (c.heads % S == 0) splits.push_back(S);
    const int S = splits[pick(int(splits.size()))], B = 1 + pick(2), T = S * 1024 * (1 + pick(8));
    const uint64_t elems = ulysses_all_to_all_elems_per_block(c, B, T, S);
    QuizQuestion q{fmt("DeepSpeed-Ulysses on %s, S = %d ranks per sequence, micro-batches of %d sequence%s of %d "
                       "tokens, each rank holding T/S of every sequence. Around attention an all-to-all sends q, k "
                       "and v to the ranks of their heads and another brings the output back; the backward does "
                       "the same for their gradients. How many million elements leave each rank per block and "
                       "micro-step, forward and backward (what stays on the rank not counted)?",
                       model.c_str(), S, B, B > 1 ? "s" : "", T),
                   double(elems) / 1e6, 0.01, "M elements"};
    q.explanation = fmt("A rank holds T/S = %d tokens of each of the B = %d sequences. To each of the S - 1 = %d "
                        "others it sends that rank's head group (C/S = %d columns) of q, k, v and the output (4 "
                        "parts), and as many for their gradients: 8 B (T/S) C (S - 1)/S = %llu elements = %.6g M. "
                        "When T grows with S this stays flat per rank; ring attention's k|v grow as S - 1.",
                        T / S, B, S - 1, shape.dim / S, (unsigned long long)elems, double(elems) / 1e6);
    return q;
  }
  const int worlds[] = {8, 16, 24, 32, 48, 64}, seqs[] = {2048, 3072, 4096, 6144, 10240};
  const int N = worlds[pick(6)], T = seqs[pick(5)];
  const int S = ulysses_largest_sp(c, N, T, false), ring = ulysses_largest_sp(c, N, T, true);
  QuizQuestion q{fmt("DeepSpeed-Ulysses on %s, sequences of %d tokens, %d ranks in all (N/S replicas of S ranks "
                     "per sequence): each of the S ranks of a sequence holds an equal slice of its tokens and "
                     "attends with whole heads. What is the largest S it can use?", model.c_str(), T, N),
                 double(S), 0.0, "ranks"};
  q.explanation = fmt("S must divide the %d heads (each rank attends with NH/S whole heads), the %d ranks (whole "
                      "groups of S) and the %d tokens (equal slices): the largest S dividing all three is %d. Ring "
                      "attention has no head limit (S divides N, 2S the sequence): up to %d here.",
                      shape.heads, N, T, S, ring);
  return q;
}

}  // namespace

std::vector<QuizQuestion> make_quiz(uint64_t seed, int count, int edition) {
  NZ_CHECK(edition >= 1 && edition <= kQuizEditions, "make_quiz: no quiz edition %d", edition);
  Rng rng(seed, 0x717a);  // its own stream
  auto pick = [&](int n) { return int(rng.next() % uint64_t(n)); };
  const int worlds[] = {4, 8, 16, 32, 64};
  const Stage zero[] = {Stage::DDP, Stage::Z1, Stage::Z2, Stage::Z3};
  std::vector<QuizQuestion> q;
  for (int i = 0; int(q.size()) < count; i++) {
    const Shape& shape = kShapes[pick(4)];
    const uint64_t psi = params_of(shape);
    const int N = worlds[pick(5)];
    const DType dt = pick(2) ? DType::BF16 : DType::F32;
    // ---- the rungs beside the ladder: every seventh question (i = 6, 13, 20, ...; a quiz of six or
    // fewer has none), in turn tensor parallelism's, Ulysses' and Muon's; edition 1 has none ----
    if (edition >= 2 && i % 7 == 6) {
      const int rung = (i / 7) % 3;
      if (rung == 0) q.push_back(tensor_question(pick));
      else if (rung == 1) q.push_back(ulysses_question(rng, shape));
      else q.push_back(muon_question(pick(2), shape, N, dt));
      continue;
    }
    // ---- the FAQ's questions (docs/faq.md, notebooks/08_faq.ipynb): every sixth question, each with
    // its worked answer; the DeepSpeed figures are its estimator's and its knobs' (zero_estimate
    // --deepspeed-estimator, --config) ----
    if (i % 6 == 5) {
      const int kind = pick(5);
      const Layout L = paper_layout(psi, N);
      const double S = double(L.shard_total);
      // the model by name and size (its shape only where the question needs it)
      const std::string model = fmt("%s (Ψ = %llu parameters)", shape.name, (unsigned long long)psi);
      if (kind == 0) {  // ZeRO-3 against ZeRO-2: where the gathered units stop outweighing the saving
        GPTConfig c;
        c.vocab = 50257, c.ctx = 1024, c.layers = shape.layers, c.dim = shape.dim, c.heads = shape.heads;
        int flip = 0;
        for (int n = 1; n <= 64 && !flip; n++) {
          const Layout Ln = make_layout(c, n);
          if (expected_state_bytes(Stage::Z3, Ln, DType::BF16).total() < expected_state_bytes(Stage::Z2, Ln, DType::BF16).total())
            flip = n;
        }
        const Layout L1 = make_layout(c, 1);
        const double G = double(expected_state_bytes(Stage::Z3, L1, DType::BF16).gathered_peak) / 2;
        q.push_back({fmt("%s's shape (%d blocks of width %d, a tied embedding of 50257 tokens, context 1024), bf16 "
                         "mixed precision. stage3 keeps a slice of the parameters but gathers two "
                         "neighbouring units whole (the one computing and the next), besides stage2's bucket. "
                         "What is the fewest ranks N for which stage3's model states per rank (buckets and gathered "
                         "units included) are smaller than stage2's?", shape.name, shape.layers, shape.dim),
                     double(flip), 0.0, "ranks"});
        q.back().explanation = fmt("stage3 saves e(P - S) = eP(1 - 1/N) of parameters and pays the gathered peak, "
                                   "the two largest neighbouring units: here the embedding and the first block, %.0f "
                                   "elements of P = %llu. It holds less once P(1 - 1/N) > %.0f: N > %.3g, so N = %d; "
                                   "on one rank it always holds more.", G, (unsigned long long)L1.padded_total, G,
                                   1 / (1 - G / double(L1.padded_total)), flip);
      } else if (kind == 1) {  // DeepSpeed's estimator against the paper, ZeRO-2
        const double gb = 4 * double(psi) / N / 1e9;
        q.push_back({fmt("%s on %d GPUs, ZeRO-2 in 16-bit mixed precision. DeepSpeed's estimator "
                         "(estimate_zero2_model_states_mem_needs) counts 2Ψ + 18Ψ/N bytes per GPU; the ZeRO paper "
                         "and this project's ledger 2Ψ + 14Ψ/N. How many GB (10^9 bytes) more does DeepSpeed count?",
                         model.c_str(), N), gb, 0.01, "GB"});
        q.back().explanation = fmt("18Ψ/N - 14Ψ/N = 4Ψ/N = 4 x %llu / %d = %.4g GB: an fp32 copy of the gradient "
                                   "slice, which DeepSpeed's optimizer steps from and the paper's K = 12 does not "
                                   "count (docs/faq.md).", (unsigned long long)psi, N, gb);
      } else if (kind == 2) {  // stage2 against stage1: every micro-step
        const int K = 2 + pick(7);
        q.push_back({fmt("%s on %d ranks with gradient accumulation over %d micro-steps: stage2 sends how many "
                         "times the elements stage1 sends per optimizer step?", stage_name(Stage::Z2), N, K),
                     (K + 1) / 2.0, 0.0, "times"});
        q.back().explanation = fmt("stage1 keeps the whole gradient, sums the micro-steps locally and reduces once: "
                                   "2(N-1)S. stage2 keeps only its slice, so it reduce-scatters every micro-step, "
                                   "then all-gathers once: (K+1)(N-1)S. (K+1)/2 = %d/2 = %.4g.", K + 1, (K + 1) / 2.0);
      } else if (kind == 3) {  // DeepSpeed's bucket against ZeRO-2's gradient saving
        const double R = pick(2) ? 5e8 : 2e8;
        const double billions = 2 * R / (2 * (1 - 1.0 / N)) / 1e9;
        q.push_back({fmt("DeepSpeed ZeRO-2 in fp16 with overlap_comm keeps a second gradient bucket of "
                         "reduce_bucket_size = %.0e elements that ZeRO-1 does not, and saves 2Ψ(1 - 1/N) bytes of "
                         "gradient. On %d GPUs, above how many billion parameters does ZeRO-2 hold less than ZeRO-1?",
                         R, N), billions, 0.01, "B parameters"});
        q.back().explanation = fmt("The bucket costs e R = 2 x %.0e = %.4g GB whatever the model; the saving "
                                   "2Ψ(1 - 1/%d) passes it at Ψ = eR / (2(1 - 1/N)) = %.4g billion (DeepSpeed issue "
                                   "1302: on a small model ZeRO-2 uses more).", R, 2 * R / 1e9, N, billions);
      } else {  // stage3_max_live_parameters
        const double live = pick(2) ? 1e9 : 1e8;
        const double gb = 2 * std::min(live, double(psi)) / 1e9;
        q.push_back({fmt("%s, DeepSpeed ZeRO-3 in bf16 with stage3_max_live_parameters = %.0e: how many GB "
                         "(10^9 bytes) of gathered parameters may each GPU hold at once, at most?",
                         model.c_str(), live), gb, 0.01, "GB"});
        q.back().explanation = fmt("2 bytes x min(%.0e, Ψ = %llu) = %.4g GB, whatever N: a knob that does not shrink "
                                   "with more GPUs (docs/faq.md, \"Memory per GPU is the same on 2 and on 4 GPUs\"; S "
                                   "= %.0f is what does).", live, (unsigned long long)psi, gb, S);
      }
      continue;
    }
    switch (i % 5) {
      case 0: {  // model-state bytes per rank
        const Stage s = zero[pick(4)];
        const double gb = double(expected_state_bytes(s, paper_layout(psi, N), dt).total()) / 1e9;
        q.push_back({fmt("%s, %s, %s on %d ranks: how many GB (10^9 bytes) of model states (params, grads, "
                         "optimizer states; no activations, no buffers) does each rank hold?",
                         shape_text(shape).c_str(), precision_text(dt), stage_name(s), N),
                     gb, 0.01, "GB"});
        q.back().explanation = explain_states(s, psi, N, dt);
        break;
      }
      case 1: {  // elements sent per optimizer step, with accumulation
        const Stage s = zero[pick(4)];
        const int K = 1 + pick(8);
        const Layout L = paper_layout(psi, N);
        const double m = double(expected_comm_elems(s, L, K)) / 1e6;
        // The paper counts a whole collective per rank: expected_comm_elems without its (N-1)/N.
        const double paper_m = double(expected_comm_elems(s, L, K)) / double(N - 1) * double(N) / 1e6;
        QuizQuestion qq{fmt("%s, %s on %d ranks with gradient accumulation over %d micro-steps (the gradient is "
                            "reduced as real systems do: stages 0 and 1 once per step, stages 2 and 3 every "
                            "micro-step): how many million elements does each rank send per optimizer step in the "
                            "model-state collectives? Count either way: as the ZeRO paper does (a reduce-scatter "
                            "or an all-gather of X elements costs X per rank), or exactly, as a ring sends them "
                            "(X(N-1)/N per rank); both are accepted, and the grader says which you used.",
                            shape_text(shape).c_str(), stage_name(s), N, K),
                        m, 0.01, "M elements"};
        qq.convention = "exact, with (N-1)/N";
        qq.paper_answer = paper_m;
        qq.paper_convention = "the ZeRO paper's count, without (N-1)/N";
        const uint64_t sent = expected_comm_elems(s, L, K), per = (uint64_t(N) - 1) * L.shard_total;
        qq.explanation = fmt("Ψ = %llu, S = Ψ/N padded = %llu, so one reduce-scatter or all-gather sends "
                             "(N-1) S = %llu elements per rank. %s with K = %d %s: %llu x %llu = %llu elements = "
                             "%.6g M (the paper's count: %llu x Ψ = %.6g M).",
                             (unsigned long long)psi, (unsigned long long)L.shard_total, (unsigned long long)per,
                             stage_name(s), K,
                             s == Stage::Z3   ? "gathers in the forward and the backward and reduce-scatters, every "
                                                "micro-step: 3K collectives"
                             : s == Stage::Z2 ? "reduce-scatters every micro-step and all-gathers once: K + 1 "
                                                "collectives"
                                              : "sums the gradient locally and reduces it once (reduce-scatter + "
                                                "all-gather): 2 collectives, whatever K",
                             (unsigned long long)(sent / per), (unsigned long long)per, (unsigned long long)sent, m,
                             (unsigned long long)(sent / per), paper_m);
        q.push_back(qq);
        break;
      }
      case 2: {  // offload: host memory and the link
        const int K = 1 + pick(4);
        if (pick(2)) {
          const double gb = double(expected_state_bytes(Stage::Offload, paper_layout(psi, N), dt).host) / 1e9;
          // The host keeps an fp32 master copy of its slice in fp32 runs too (zero_formulas.cpp): the
          // question says so, since "fp32, no separate master" holds on the device only.
          q.push_back({fmt("%s, %s, ZeRO-Offload on %d ranks: stage2 on the device, and in each rank's host "
                           "memory its slice of the gradient (in the params' precision), an fp32 master copy of "
                           "its slice of the params (kept on the host in fp32 runs too, apart from the device's "
                           "params) and Adam m and v (fp32) for that slice. How many GB (10^9 bytes) of host "
                           "memory does each rank's optimizer side take?",
                           shape_text(shape).c_str(), precision_text(dt), N),
                       gb, 0.01, "GB"});
          const Layout L = paper_layout(psi, N);
          q.back().explanation = fmt("S = Ψ/N padded = %llu; the host keeps the gradient slice (%d bytes each), an "
                                     "fp32 master slice and Adam m and v (4 bytes each): (%d + 12) S = %.6g GB.",
                                     (unsigned long long)L.shard_total, int(dtype_bytes(dt)), int(dtype_bytes(dt)), gb);
        } else {
          const double m = double(expected_link_elems(Stage::Offload, paper_layout(psi, N), K)) / 1e6;
          q.push_back({fmt("%s, ZeRO-Offload on %d ranks with %d micro-steps per optimizer step (each "
                           "micro-step's reduced gradient slice goes down to the host; the updated slice comes "
                           "up once): how many million elements cross each rank's host<->device link per "
                           "step?", shape_text(shape).c_str(), N, K),
                       m, 0.01, "M elements"});
          q.back().explanation = fmt("S = Ψ/N padded = %llu; every micro-step's reduced gradient slice goes down "
                                     "(K S) and the updated slice comes up once (S): (K + 1) S = %d x %llu = %.6g M.",
                                     (unsigned long long)paper_layout(psi, N).shard_total, K + 1,
                                     (unsigned long long)paper_layout(psi, N).shard_total, m);
        }
        break;
      }
      case 3: {  // the fewest ranks for a stage to fit a device
        const Stage s = zero[1 + pick(3)];
        const int cap = 16 << pick(3);  // 16, 32 or 64 GB
        int fewest = 0;
        for (int n = 1; n <= 1024 && !fewest; n *= 2)
          if (double(expected_state_bytes(s, paper_layout(psi, n), DType::BF16).total()) <= cap * 1e9) fewest = n;
        if (!fewest || fewest == 1) continue;  // a question with an answer worth computing
        std::string tried;
        for (int n = 1; n <= fewest; n *= 2)
          tried += fmt("%sN = %d: %.4g GB", n == 1 ? "" : ", ", n,
                       double(expected_state_bytes(s, paper_layout(psi, n), DType::BF16).total()) / 1e9);
        q.push_back({fmt("%s, bf16 mixed precision, %s: what is the fewest ranks N, a power of two, for which "
                         "each rank's model states fit in %d GB (10^9 bytes)?",
                         shape_text(shape).c_str(), stage_name(s), cap),
                     double(fewest), 0.0, "ranks"});
        q.back().explanation = fmt("Ψ = %llu; each rank's model states, doubling N: %s. The first at or under %d GB: "
                                   "N = %d.", (unsigned long long)psi, tried.c_str(), cap, fewest);
        break;
      }
      case 4: {  // the largest model a stage fits
        const Stage s = zero[pick(4)];
        const int cap = 80;
        const uint64_t probe = uint64_t(N) * 1000000000ull;  // a multiple of N: no padding
        const double per_param =
            double(expected_state_bytes(s, paper_layout(probe, N), DType::BF16).total()) / double(probe);
        const double billions = cap * 1e9 / per_param / 1e9;
        q.push_back({fmt("bf16 mixed precision (16 bytes of model states per parameter before sharding), %s on "
                         "%d ranks with %d GB (10^9 bytes) each: how many billion parameters is the largest "
                         "model whose model states fit?", stage_name(s), N, cap),
                     billions, 0.01, "B parameters"});
        q.back().explanation = fmt("%s on %d ranks keeps %.4g bytes per parameter of the model (2 + 2 + 12 = 16 bytes, "
                                   "each category divided by N where the stage shards it); %d GB / %.4g bytes = %.4g "
                                   "billion parameters.", stage_name(s), N, per_param, cap, per_param, billions);
        break;
      }
    }
  }
  return q;
}

// Whether v answers q in its unit: within its tolerance of the exact answer, or of the paper's.
static bool right_exact(const QuizQuestion& q, double v, double want) {
  return std::isfinite(v) && std::isfinite(want) &&
         (q.rel_tol == 0 ? v == want : std::fabs(v - want) <= q.rel_tol * std::fabs(want));
}

static bool right_either(const QuizQuestion& q, double v) {
  return right_exact(q, v, q.answer) || right_exact(q, v, q.paper_answer);
}

// How long a pipe or a FIFO may stay silent before it is given up: a FIFO that no program writes to
// would otherwise be waited on forever.
constexpr int kPipeQuietMs = 3000;

// The whole of a small file, read no further than `limit` bytes. A regular file, or a pipe or a FIFO
// (`--check /dev/stdin`), read while data comes: opened with O_NONBLOCK, so that a FIFO's open does
// not wait for a writer, and given up after kPipeQuietMs of silence. Anything else is refused before
// a byte is read: a device such as /dev/zero, a directory. Each refusal is one line, exit 2.
// mode: the file's permissions.
static std::string read_small_file(const char* flag, const std::string& path, size_t limit, const char* expected,
                                   unsigned* mode = nullptr) {
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) user_error("%s %s: cannot read it (%s); expected %s", flag, path.c_str(), strerror(errno), expected);
  struct stat st;
  const bool known = fstat(fd, &st) == 0;
  const bool pipe = known && S_ISFIFO(st.st_mode);
  if (!known || !(S_ISREG(st.st_mode) || pipe)) {
    close(fd);
    const char* what = !known                ? "cannot be examined"
                       : S_ISDIR(st.st_mode) ? "is a directory"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "is a device"
                                                                     : "is not a regular file";
    user_error("%s %s: %s, not a file; expected %s", flag, path.c_str(), what, expected);
  }
  if (mode) *mode = unsigned(st.st_mode & 07777);
  std::string text;
  char buf[65536];
  for (;;) {
    if (pipe) {
      struct pollfd p = {fd, POLLIN, 0};
      const int ready = poll(&p, 1, kPipeQuietMs);
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        close(fd);
        user_error("%s %s: a FIFO or pipe with nothing written to it for %d s; expected %s (write it to a file and "
                   "give the file)", flag, path.c_str(), kPipeQuietMs / 1000, expected);
      }
    }
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) {
      const int e = errno;
      close(fd);
      user_error("%s %s: cannot read it (%s); expected %s", flag, path.c_str(), strerror(e), expected);
    }
    if (n == 0) break;
    text.append(buf, size_t(n));
    if (text.size() > limit) {
      close(fd);
      user_error("%s %s: more than %zu bytes, too long for %s; give the right file", flag, path.c_str(), limit,
                 expected);
    }
  }
  close(fd);
  return text;
}

// ---- the editions' magics (zero_quiz.h): edition 1's are those of the lines made before editions were named ----
static std::string result_magic(int edition) { return fmt("nzquiz%d", edition); }
static std::string cert_magic(int edition) { return fmt("nzcert%d", edition); }
static std::string answers_magic(int edition) {
  return edition == 1 ? "nzquiz-answers" : fmt("nzquiz-answers%d", edition);
}
// The edition whose magic `word` is (1 .. kQuizEditions); 0 when it is none of them.
static int edition_of(const std::string& word, std::string (*magic)(int)) {
  for (int e = 1; e <= kQuizEditions; e++)
    if (word == magic(e)) return e;
  return 0;
}

// An answers file holds far less than this (a line per attempt); anything longer is not one.
constexpr size_t kAnswersLimit = 1 << 20;

// The answers in a file's text, every attempt of each question in the order given (one per line:
// `Q<n> <number>` or `<n> <number>`; `#` comments and blank lines ignored; a course's first line
// `nzquiz-answers ...` skipped here, read by read_header). quiz: the quiz's flags, for messages.
static std::vector<std::vector<std::string>> read_answers(const char* flag, const std::string& path,
                                                          const std::string& text, size_t questions,
                                                          const std::string& quiz) {
  std::vector<std::vector<std::string>> attempts(questions);
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    lineno++;
    if (size_t h = line.find('#'); h != std::string::npos) line.resize(h);
    std::istringstream ls(line);
    std::string label, value;
    if (!(ls >> label) || edition_of(label, answers_magic)) continue;  // blank, or the course's first line
    if (!(ls >> value)) user_error("%s %s, line %d: \"%s\" is not an answer; expected `Q<n> <number>`", flag,
                                   path.c_str(), lineno, line.c_str());
    if (label[0] == 'Q' || label[0] == 'q') label = label.substr(1);
    if (!label.empty() && (label.back() == ':' || label.back() == '.')) label.pop_back();
    char* end = nullptr;
    const long n = strtol(label.c_str(), &end, 10);
    if (label.empty() || *end || n < 1 || n > long(questions))
      user_error("%s %s, line %d: no question \"%s\" in this quiz (Q1..Q%zu, %s)", flag, path.c_str(), lineno,
                 label.c_str(), questions, quiz.c_str());
    const double v = strtod(value.c_str(), &end);
    if (*end || !std::isfinite(v) || value.size() > 40)
      user_error("%s %s, line %d: \"%.60s\" is not a number of at most 40 characters; write the answer in the "
                 "question's unit", flag, path.c_str(), lineno, value.c_str());
    attempts[n - 1].push_back(value);
  }
  return attempts;
}

// One question's verdict line, and under a wrong answer with `explain` its worked answer; `note`
// follows the verdict. Returns whether v is right.
static bool print_verdict(size_t i, const QuizQuestion& qi, double v, bool explain, const std::string& note = "") {
  const bool exact = right_exact(qi, v, qi.answer), paper = !exact && right_exact(qi, v, qi.paper_answer);
  const std::string tol = qi.rel_tol == 0 ? " exactly" : fmt(" within %g%%", qi.rel_tol * 100);
  if (!std::isfinite(v)) printf("Q%zu  no answer\n", i + 1);
  else if (exact && qi.convention.empty()) printf("Q%zu  right (%g %s)%s\n", i + 1, v, qi.unit.c_str(), note.c_str());
  else if (exact || paper)
    printf("Q%zu  right (%g %s; %s)%s\n", i + 1, v, qi.unit.c_str(),
           (exact ? qi.convention : qi.paper_convention).c_str(), note.c_str());
  else if (std::isnan(qi.paper_answer))
    printf("Q%zu  wrong: %g %s, expected %.4g%s%s\n", i + 1, v, qi.unit.c_str(), qi.answer, tol.c_str(), note.c_str());
  else
    printf("Q%zu  wrong: %g %s, expected %.4g (%s) or %.4g (%s)%s%s\n", i + 1, v, qi.unit.c_str(), qi.answer,
           qi.convention.c_str(), qi.paper_answer, qi.paper_convention.c_str(), tol.c_str(), note.c_str());
  if (explain && std::isfinite(v) && !(exact || paper)) printf("    %s\n", qi.explanation.c_str());
  return exact || paper;
}

std::string quiz_flags(uint64_t seed, int count, int edition) {
  return fmt("--seed %llu --count %d", (unsigned long long)seed, count) +
         (edition == kQuizEdition ? "" : fmt(" --quiz-edition %d", edition));
}

static double answer_value(const std::string& text) { return text == "-" ? NAN : strtod(text.c_str(), nullptr); }

int check_quiz(uint64_t seed, int count, const std::string& path, bool explain, bool result, int edition) {
  const std::string text = read_small_file("--check", path, kAnswersLimit, "a file of answers, one `Q<n> <number>` a line");
  if (text.find("nzquiz-answers") != std::string::npos)
    user_error("--check %s: a course's answers file (its line nzquiz-answers); grade it with --student ID "
               "--course-pub FILE, not --seed", path.c_str());
  const std::vector<QuizQuestion> q = make_quiz(seed, count, edition);
  const auto attempts = read_answers("--check", path, text, q.size(), fmt("--seed %llu --count %d", (unsigned long long)seed, count));
  std::vector<std::string> given_text(q.size(), "-");  // self-study: the latest answer to each question counts
  for (size_t i = 0; i < q.size(); i++)
    if (!attempts[i].empty()) given_text[i] = attempts[i].back();
  int wrong = 0;
  for (size_t i = 0; i < q.size(); i++) wrong += !print_verdict(i, q[i], answer_value(given_text[i]), explain);
  printf("score: %zu of %zu right\n", q.size() - wrong, q.size());
  if (result) {
    printf("result: %s\n", quiz_result_line(seed, count, given_text, int(q.size()) - wrong, edition).c_str());
    printf("(self-study: the result line's code is a checksum, not a signature; anyone can make one. A course's "
           "certificate is signed by its instructor: docs/certificates.md)\n");
  }
  return wrong;
}

static uint32_t fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

std::string quiz_result_line(uint64_t seed, int count, const std::vector<std::string>& answers, int right,
                             int edition) {
  std::string line = result_magic(edition) + fmt(" seed=%llu count=%d answers=", (unsigned long long)seed, count);
  for (size_t i = 0; i < answers.size(); i++) line += (i ? "," : "") + answers[i];
  line += fmt(" score=%d/%d", right, count);
  return line + fmt(" code=%08x", fnv1a(line));
}

// A line's space-separated fields `name=value`, checked against the names expected in order; false
// when the line has other fields, fewer, more, or in another order.
static bool split_fields(const std::string& line, const std::string& magic, const std::vector<std::string>& names,
                         std::vector<std::string>* values) {
  std::istringstream ss(line);
  std::string tok;
  if (!(ss >> tok) || tok != magic) return false;
  values->clear();
  for (const std::string& name : names) {
    if (!(ss >> tok) || tok.compare(0, name.size() + 1, name + "=") != 0) return false;
    values->push_back(tok.substr(name.size() + 1));
  }
  if (ss >> tok) return false;
  // one space between fields, nothing else: the signed text is exactly what is shown
  std::string rebuilt = magic;
  for (size_t i = 0; i < names.size(); i++) rebuilt += " " + names[i] + "=" + (*values)[i];
  return rebuilt == line;
}

// A whole number of decimal digits only (no sign, no spaces), at most `hi`: strtoull alone reads
// "-1" as 2^64 - 1 and a number past 2^64 as 2^64 - 1.
static bool parse_whole(const std::string& s, uint64_t hi, uint64_t* out) {
  if (s.empty() || s.size() > 20 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  errno = 0;
  const unsigned long long v = strtoull(s.c_str(), nullptr, 10);
  if (errno == ERANGE || v > hi) return false;
  *out = v;
  return true;
}

static std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    const size_t c = s.find(',', at);
    out.push_back(s.substr(at, c == std::string::npos ? std::string::npos : c - at));
    if (c == std::string::npos) return out;
    at = c + 1;
  }
}

// An answer as a result line or a certificate carries it: a finite number, or `-` for none.
static bool answer_field_ok(const std::string& a) {
  if (a == "-") return true;
  char* end = nullptr;
  const double v = strtod(a.c_str(), &end);
  return !a.empty() && a.size() <= 40 && !*end && std::isfinite(v);
}

int verify_quiz_result(const std::string& text, const std::string& course_pub) {
  std::string line = text;
  if (line.rfind("result: ", 0) == 0) line = line.substr(8);  // as --check --result prints it
  if (line.rfind("certificate: ", 0) == 0) line = line.substr(13);  // as --sign prints it
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) line.pop_back();
  const std::string word = line.substr(0, line.find(' '));
  if (edition_of(word, cert_magic)) return verify_certificate(line, course_pub);
  if (line.rfind("nzgrade1 ", 0) == 0) return verify_grade_record(line, course_pub);
  std::vector<std::string> f;
  uint64_t seed = 0, count = 0, right = 0, of = 0;
  const int edition = edition_of(word, result_magic);
  const bool parsed = line.size() < 20000 && edition &&
                      split_fields(line, word, {"seed", "count", "answers", "score", "code"}, &f) &&
                      f[3].find('/') != std::string::npos &&
                      parse_whole(f[1], 1000, &count) && count >= 1 &&
                      parse_whole(f[3].substr(0, f[3].find('/')), count, &right) &&
                      parse_whole(f[3].substr(f[3].find('/') + 1), 1000, &of) && of == count &&
                      f[4].size() == 8 && f[4].find_first_not_of("0123456789abcdef") == std::string::npos;
  if (!parsed)
    user_error("--verify \"%.80s\": not a quiz result line, expected `nzquiz2 seed=S count=C answers=A1,A2,... "
               "score=R/C code=XXXXXXXX` (nzquiz1 for edition 1); paste the whole line the quiz printed", line.c_str());
  if (!parse_whole(f[0], 1u << 30, &seed) || seed < 1)
    user_error("--verify: seed=%.40s is not a quiz's seed, expected a whole number from 1 to %u as --seed takes it; "
               "paste the whole line the quiz printed", f[0].c_str(), 1u << 30);
  const std::vector<std::string> given = split_commas(f[2]);
  if (given.size() != count)
    user_error("--verify: %zu answers for a quiz of %d questions, expected one per question (`-` for none); paste "
               "the whole line the quiz printed", given.size(), int(count));
  const std::string body = line.substr(0, line.rfind(" code="));
  if (fmt("%08x", fnv1a(body)) != f[4]) {
    printf("not verified: the check code does not match the line (edited, or garbled when copied); ask for the line "
           "again\n");
    return 1;
  }
  const std::vector<QuizQuestion> q = make_quiz(seed, int(count), edition);
  int regraded = 0;
  for (size_t i = 0; i < count; i++) {
    if (!answer_field_ok(given[i]))
      user_error("--verify: answer %zu \"%s\" is not a number or `-`; paste the whole line the quiz printed", i + 1,
                 given[i].c_str());
    regraded += right_either(q[i], answer_value(given[i]));
  }
  if (regraded != int(right)) {
    printf("not verified: the line says %d of %d right, its answers grade %d of %d (%s)\n", int(right), int(count),
           regraded, int(count), quiz_flags(seed, int(count), edition).c_str());
    return 1;
  }
  printf("verified: %s, %d of %d right (a self-study line: its code is a checksum, not a signature)\n",
         quiz_flags(seed, int(count), edition).c_str(), int(right), int(count));
  return 0;
}

void print_quiz_key(uint64_t seed, int count, int edition) {
  const std::vector<QuizQuestion> q = make_quiz(seed, count, edition);
  printf("ZeRO quiz answer key (--seed %llu --count %d), for the instructor: a file of these lines scores 100%%\n",
         (unsigned long long)seed, count);
  for (size_t i = 0; i < q.size(); i++) {
    const QuizQuestion& qi = q[i];
    const std::string tol = qi.rel_tol == 0 ? "exactly" : fmt("within %d%%", int(qi.rel_tol * 100));
    if (std::isnan(qi.paper_answer))
      printf("Q%zu %.6g   # %s, %s\n", i + 1, qi.answer, qi.unit.c_str(), tol.c_str());
    else
      printf("Q%zu %.6g   # %s, %s (%s); also right: %.6g (%s)\n", i + 1, qi.answer, qi.unit.c_str(), tol.c_str(),
             qi.convention.c_str(), qi.paper_answer, qi.paper_convention.c_str());
  }
}

// ---- a course's quiz and its certificate ----

bool valid_student_id(const std::string& id) {
  if (id.empty() || id.size() > 64 || !isalnum((unsigned char)id[0])) return false;
  for (unsigned char c : id)
    if (!isalnum(c) && c != '.' && c != '_' && c != '@' && c != '-') return false;
  return true;
}

#ifndef __EMSCRIPTEN__

static void check_student_id(const char* flag, const std::string& id) {
  if (!valid_student_id(id))
    user_error("%s '%.80s': not a student id, expected 1 to 64 letters, digits and . _ @ - starting with a letter "
               "or digit (no spaces, no / or \\); e.g. %s alice.smith", flag, id.c_str(), flag);
}

// The first line of a student's answers file, `nzquiz-answers2 student=ID seed=S count=C` (edition 2;
// `nzquiz-answers ...` an edition-1 quiz's).
struct AnswersHeader {
  std::string student;
  uint64_t seed = 0, count = 0;
  int edition = 0;
};

static AnswersHeader read_header(const char* flag, const std::string& path, const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (size_t h = line.find('#'); h != std::string::npos) line.resize(h);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r' || line.back() == '\t')) line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::vector<std::string> f;
    AnswersHeader h;
    h.edition = edition_of(line.substr(0, line.find(' ')), answers_magic);
    if (h.edition && split_fields(line, answers_magic(h.edition), {"student", "seed", "count"}, &f) &&
        valid_student_id(f[0]) &&
        parse_whole(f[1], 1u << 30, &h.seed) && h.seed >= 1 && parse_whole(f[2], 1000, &h.count) && h.count >= 1) {
      h.student = f[0];
      return h;
    }
    break;  // the first line that is not blank or a comment is not the header
  }
  user_error("%s %s: no first line `nzquiz-answers2 student=ID seed=S count=C` (nzquiz-answers for edition 1); "
             "a course's answers file begins "
             "with the line its quiz printed (zero_estimate --quiz --student ID --course-pub FILE)", flag, path.c_str());
}

constexpr size_t kKeyLimit = 4096;  // a key file is one line

static void sodium_ready() { NZ_CHECK(sodium_init() >= 0, "libsodium could not start (sodium_init)"); }

static std::string hex(const unsigned char* b, size_t n) {
  std::string h(2 * n + 1, '\0');
  sodium_bin2hex(&h[0], h.size(), b, n);
  h.pop_back();
  return h;
}

static bool unhex(const std::string& h, unsigned char* out, size_t n) {
  size_t got = 0;
  return h.size() == 2 * n && h.find_first_not_of("0123456789abcdef") == std::string::npos &&
         sodium_hex2bin(out, n, h.c_str(), h.size(), nullptr, &got, nullptr) == 0 && got == n;
}

struct CourseKey {
  unsigned char pk[crypto_sign_PUBLICKEYBYTES];
  unsigned char sk[crypto_sign_SECRETKEYBYTES];  // only from --signing-key
  std::string id() const { return hex(pk, 8); }   // the key's name in a certificate: its first 8 bytes
};

// A key file: one line, `magic <hex>` (course.pub: the 32-byte public key; course.key: libsodium's
// 64-byte secret key, its seed followed by the public key).
static void read_key_line(const char* flag, const std::string& path, const char* magic, unsigned char* out,
                          size_t n, unsigned* mode, const char* expected) {
  const std::string text = read_small_file(flag, path, kKeyLimit, expected, mode);
  std::istringstream ss(text);
  std::string m, h, extra;
  if (!(ss >> m >> h) || (ss >> extra) || m != magic || !unhex(h, out, n))
    user_error("%s %s: not %s (a line `%s <%zu hex digits>`); give the file make course-keys wrote", flag,
               path.c_str(), expected, magic, 2 * n);
}

static CourseKey read_public_key(const std::string& path) {
  CourseKey k;
  read_key_line("--course-pub", path, "nzcourse-pub1", k.pk, sizeof k.pk, nullptr, "a course's public key");
  sodium_memzero(k.sk, sizeof k.sk);
  return k;
}

static CourseKey read_signing_key(const std::string& path) {
  CourseKey k;
  unsigned mode = 0;
  read_key_line("--signing-key", path, "nzcourse-key1", k.sk, sizeof k.sk, &mode,
                "a course's private key (course.key)");
  // as ssh does: a private key others can read is no longer private
  if (mode & 077)
    user_error("--signing-key %s: readable by others (mode %04o), expected 0600; chmod 600 it (and make a new key "
               "pair if others may have read it)", path.c_str(), mode);
  unsigned char seed[crypto_sign_SEEDBYTES], pk[crypto_sign_PUBLICKEYBYTES], sk[crypto_sign_SECRETKEYBYTES];
  crypto_sign_ed25519_sk_to_seed(seed, k.sk);
  crypto_sign_seed_keypair(pk, sk, seed);  // the public half the file holds must be the seed's own
  const bool whole = sodium_memcmp(sk, k.sk, sizeof sk) == 0;
  sodium_memzero(seed, sizeof seed);
  sodium_memzero(sk, sizeof sk);
  if (!whole) user_error("--signing-key %s: damaged (its public half is not its own); restore it from a copy", path.c_str());
  memcpy(k.pk, pk, sizeof pk);
  return k;
}

// 1 + (the first 8 bytes of SHA-256(tag with its terminating 0, public key, id), big-endian) mod 2^30
static uint64_t seed_of(const char* tag, const unsigned char public_key[32], const std::string& student) {
  sodium_ready();
  std::string msg(tag, strlen(tag) + 1);  // with its terminating 0: the tag ends before the key
  msg.append(reinterpret_cast<const char*>(public_key), 32);
  msg += student;
  unsigned char h[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(h, reinterpret_cast<const unsigned char*>(msg.data()), msg.size());
  uint64_t x = 0;
  for (int i = 0; i < 8; i++) x = x << 8 | h[i];
  return 1 + x % (uint64_t(1) << 30);
}

uint64_t student_seed(const unsigned char public_key[32], const std::string& student) {
  return seed_of("nzquiz-seed1", public_key, student);
}

uint64_t grade_seed(const unsigned char public_key[32], const std::string& student) {
  return seed_of("nzgrade-seed1", public_key, student);
}

static bool exists_path(const std::string& p) {
  struct stat st;
  return lstat(p.c_str(), &st) == 0;
}

// Writes `text` to a new file of `mode`; never replaces one (O_EXCL, and no link followed).
static bool write_new_file(const std::string& path, const std::string& text, unsigned mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return false;
  const bool ok = fchmod(fd, mode) == 0 && write(fd, text.data(), text.size()) == ssize_t(text.size()) &&
                  fsync(fd) == 0;
  return close(fd) == 0 && ok;
}

void make_course_keys(const std::string& dir) {
  sodium_ready();
  if (dir.empty()) user_error("--course-keys needs a folder; e.g. --course-keys ~/.nanozero-course");
  struct stat st;
  if (stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    user_error("--course-keys %s: not a folder; give a folder for course.key and course.pub", dir.c_str());
  const std::string key = dir + "/course.key", pub = dir + "/course.pub";
  for (const std::string& p : {key, pub})
    if (exists_path(p))
      user_error("--course-keys %s: %s exists; a course makes its key pair once, and a new one would leave every "
                 "certificate signed with the old one unverifiable: keep it, or move it away first", dir.c_str(),
                 p.c_str());
  if (stat(dir.c_str(), &st) != 0 && mkdir(dir.c_str(), 0700) != 0)
    user_error("--course-keys %s: cannot make the folder (%s); give a folder whose parent exists", dir.c_str(),
               strerror(errno));
  CourseKey k;
  crypto_sign_keypair(k.pk, k.sk);
  std::string secret = "nzcourse-key1 " + hex(k.sk, sizeof k.sk) + "\n";
  const bool key_ok = write_new_file(key, secret, 0600);
  sodium_memzero(&secret[0], secret.size());
  sodium_memzero(k.sk, sizeof k.sk);
  if (!key_ok) {
    const int e = errno;
    user_error("--course-keys %s: cannot write %s (%s); nothing was made", dir.c_str(), key.c_str(), strerror(e));
  }
  if (!write_new_file(pub, "nzcourse-pub1 " + hex(k.pk, sizeof k.pk) + "\n", 0644)) {
    const int e = errno;
    unlink(key.c_str());  // ours, made a moment ago: a private key without its public half is no pair
    user_error("--course-keys %s: cannot write %s (%s); nothing was made", dir.c_str(), pub.c_str(), strerror(e));
  }
  printf("made the course's key pair (Ed25519), key id %s:\n"
         "  %s  private, mode 0600: it signs the certificates; keep it to yourself, and a copy somewhere safe\n"
         "  %s  public: give it to the students and to whoever checks a certificate\n",
         k.id().c_str(), key.c_str(), pub.c_str());
}

// The grade of a student's answers file: the first attempt at each question, and how many.
struct CourseGrade {
  AnswersHeader h;
  std::vector<QuizQuestion> q;
  std::vector<std::string> first;  // `-`: never answered
  std::vector<int> attempts;
};

// Reads and grades a student's answers file against the quiz of their seed; the file's first line
// must name `student` (when given) and that student's seed. Prints the verdicts when `print`.
static CourseGrade grade_course_answers(const char* flag, const std::string& path, const CourseKey& k,
                                        const std::string& student, bool print, bool explain, int edition) {
  const std::string text = read_small_file(flag, path, kAnswersLimit, "a student's answers file");
  CourseGrade g;
  g.h = read_header(flag, path, text);
  if (!student.empty() && g.h.student != student)
    user_error("%s %s: the answers of student %s, not of --student %s; sign each student's own file", flag,
               path.c_str(), g.h.student.c_str(), student.c_str());
  const uint64_t own = student_seed(k.pk, g.h.student);
  if (g.h.seed != own)
    user_error("%s %s: answers to the quiz of seed %llu, but student %s's quiz is seed %llu with this course's key "
               "%s (another student's quiz, or another course's); answer your own quiz", flag, path.c_str(),
               (unsigned long long)g.h.seed, g.h.student.c_str(), (unsigned long long)own, k.id().c_str());
  // the file's first line names its quiz's edition; --quiz-edition, when given, must agree
  if (edition != 0 && edition != g.h.edition)
    user_error("%s %s: answers to an edition-%d quiz (its first line %s), not to --quiz-edition %d; drop "
               "--quiz-edition: the file's first line says which quiz it answers", flag, path.c_str(), g.h.edition,
               answers_magic(g.h.edition).c_str(), edition);
  g.q = make_quiz(g.h.seed, int(g.h.count), g.h.edition);
  const auto attempts = read_answers(flag, path, text, g.q.size(),
                                     fmt("student %s, --count %d", g.h.student.c_str(), int(g.h.count)));
  for (size_t i = 0; i < g.q.size(); i++) {
    g.first.push_back(attempts[i].empty() ? "-" : attempts[i][0]);
    g.attempts.push_back(int(attempts[i].size()));
    if (!print) continue;
    const double first = answer_value(g.first[i]);
    std::string note;
    if (attempts[i].size() > 1) {
      const bool latest = right_either(g.q[i], answer_value(attempts[i].back()));
      note = fmt(" [first of %zu attempts, the one graded; the latest, %s, is %s]", attempts[i].size(),
                 attempts[i].back().c_str(), latest ? "right" : "wrong");
    }
    print_verdict(i, g.q[i], first, explain, note);
  }
  return g;
}

static int first_right(const CourseGrade& g) {
  int right = 0;
  for (size_t i = 0; i < g.q.size(); i++) right += right_either(g.q[i], answer_value(g.first[i]));
  return right;
}

static std::string utc_now() {
  const time_t t = time(nullptr);
  struct tm u;
  gmtime_r(&t, &u);
  char s[32];
  strftime(s, sizeof s, "%Y-%m-%dT%H:%M:%SZ", &u);
  return s;
}

static std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); i++) s += (i ? "," : "") + v[i];
  return s;
}

// The certificate: `nzcert2 student=ID seed=S count=C date=D first=A1,... attempts=N1,... score=R/C
// key=K sig=SIG` (nzcert1 for an edition-1 quiz), SIG the Ed25519 signature of everything before
// " sig=", the magic and so the edition included.
static std::string sign_certificate(const CourseGrade& g, const CourseKey& k) {
  std::vector<std::string> n;
  for (int a : g.attempts) n.push_back(std::to_string(a));
  const std::string body = cert_magic(g.h.edition) +
                           fmt(" student=%s seed=%llu count=%d date=%s first=", g.h.student.c_str(),
                               (unsigned long long)g.h.seed, int(g.h.count), utc_now().c_str()) +
                           join(g.first) + " attempts=" + join(n) +
                           fmt(" score=%d/%d key=%s", first_right(g), int(g.h.count), k.id().c_str());
  unsigned char sig[crypto_sign_BYTES];
  crypto_sign_detached(sig, nullptr, reinterpret_cast<const unsigned char*>(body.data()), body.size(), k.sk);
  return body + " sig=" + hex(sig, sizeof sig);
}

int verify_certificate(const std::string& line, const std::string& course_pub) {
  sodium_ready();
  std::vector<std::string> f;
  const char* shape = "`nzcert2 student=ID seed=S count=C date=D first=A1,... attempts=N1,... score=R/C key=K "
                      "sig=SIG` (nzcert1 for edition 1)";
  const std::string word = line.substr(0, line.find(' '));
  const int edition = edition_of(word, cert_magic);
  if (line.size() > 100000 || !edition ||
      !split_fields(line, word, {"student", "seed", "count", "date", "first", "attempts", "score", "key", "sig"},
                    &f))
    user_error("--verify \"%.60s...\": not a certificate, expected %s; paste the whole line", line.c_str(), shape);
  if (course_pub.empty())
    user_error("--verify: a course's certificate is checked with the course's public key; add --course-pub FILE "
               "(the instructor's course.pub)");
  const CourseKey k = read_public_key(course_pub);
  uint64_t seed = 0, count = 0, right = 0, of = 0;
  unsigned char sig[crypto_sign_BYTES], key8[8];
  const std::vector<std::string> first = split_commas(f[4]), attempts = split_commas(f[5]);
  const size_t slash = f[6].find('/');
  auto need = [&](bool ok, const char* name, const std::string& v, const char* expected) {
    if (!ok)
      user_error("--verify: %s=%.40s in the certificate, expected %s; paste the whole line the instructor sent", name,
                 v.c_str(), expected);
  };
  need(valid_student_id(f[0]), "student", f[0], "a student id");
  need(parse_whole(f[1], 1u << 30, &seed) && seed >= 1, "seed", f[1], "a whole number from 1 to 2^30");
  need(parse_whole(f[2], 1000, &count) && count >= 1, "count", f[2], "a whole number from 1 to 1000");
  need(f[3].size() == 20 && f[3][10] == 'T' && f[3][19] == 'Z', "date", f[3], "a UTC time, 2026-01-31T12:00:00Z");
  need(first.size() == count, "first", f[4], "one answer (or -) per question");
  need(attempts.size() == count, "attempts", f[5], "one count per question");
  for (size_t i = 0; i < count; i++) {
    uint64_t a = 0;
    need(answer_field_ok(first[i]), "first", first[i], "a number or -");
    need(parse_whole(attempts[i], 1000000, &a) && (a == 0) == (first[i] == "-"), "attempts", attempts[i],
         "a whole number, 0 where the answer is -");
  }
  need(slash != std::string::npos && parse_whole(f[6].substr(0, slash), count, &right) &&
       parse_whole(f[6].substr(slash + 1), 1000, &of) && of == count, "score", f[6], "R/C, R at most C");
  need(unhex(f[7], key8, 8), "key", f[7], "16 hex digits");
  need(unhex(f[8], sig, sizeof sig), "sig", f[8], "128 hex digits");
  if (f[7] != k.id()) {
    printf("not verified: signed with key %s, not with this course's key %s\n", f[7].c_str(), k.id().c_str());
    return 1;
  }
  const std::string body = line.substr(0, line.rfind(" sig="));
  if (crypto_sign_verify_detached(sig, reinterpret_cast<const unsigned char*>(body.data()), body.size(), k.pk) != 0) {
    printf("not verified: the signature does not match the line (edited after it was signed, or signed with another "
           "key); ask the instructor for the certificate\n");
    return 1;
  }
  // A valid signature over a seed that is not the student's own would certify another student's quiz.
  const uint64_t own = student_seed(k.pk, f[0]);
  if (seed != own) {
    printf("not verified: seed %llu is not student %s's (theirs is %llu): another student's quiz under this id\n",
           (unsigned long long)seed, f[0].c_str(), (unsigned long long)own);
    return 1;
  }
  const std::vector<QuizQuestion> q = make_quiz(seed, int(count), edition);
  int regraded = 0, tries = 0;
  for (size_t i = 0; i < count; i++) {
    regraded += right_either(q[i], answer_value(first[i]));
    tries += atoi(attempts[i].c_str());
  }
  if (regraded != int(right)) {
    printf("not verified: the certificate says %d of %d right, its first answers grade %d of %d\n", int(right),
           int(count), regraded, int(count));
    return 1;
  }
  printf("verified: student %s, %d of %d right at the first attempt (%d attempts in all), signed %s with course "
         "key %s (seed %llu%s)\n", f[0].c_str(), int(right), int(count), tries, f[3].c_str(), k.id().c_str(),
         (unsigned long long)seed, edition == kQuizEdition ? "" : fmt(", quiz edition %d", edition).c_str());
  return 0;
}

int run_course_quiz(const CourseQuiz& c) {
  if (c.seed_given)
    user_error("--seed with a course's quiz: its seed is the student's own (from --student and the course's key); "
               "drop --seed");
  if (c.result)
    user_error("--result makes a self-study line; a course's certificate is signed by the instructor (--sign), so "
               "drop --result and send your answers file");
  if (!c.sign_file.empty()) {
    if (!c.check_file.empty() || c.key)
      user_error("--sign with --%s; expected one: --sign certifies a student's file", c.key ? "key" : "check");
    if (c.signing_key.empty()) user_error("--sign needs the course's private key: add --signing-key course.key");
    if (c.student.empty())
      user_error("--sign needs the id of the student who sent the file: add --student ID");
    check_student_id("--student", c.student);
    sodium_ready();
    CourseKey k = read_signing_key(c.signing_key);
    const CourseGrade g = grade_course_answers("--sign", c.sign_file, k, c.student, false, false, c.edition);
    printf("certificate: %s\n", sign_certificate(g, k).c_str());
    sodium_memzero(k.sk, sizeof k.sk);
    return 0;
  }
  if (!c.signing_key.empty()) user_error("--signing-key goes with --sign FILE; students use --course-pub course.pub");
  if (c.course_pub.empty())
    user_error("a course's quiz needs the course's public key: add --course-pub FILE (the instructor's course.pub)");
  const CourseKey k = read_public_key(c.course_pub);
  if (!c.check_file.empty()) {
    if (!c.student.empty()) check_student_id("--student", c.student);
    const CourseGrade g = grade_course_answers("--check", c.check_file, k, c.student, true, c.explain, c.edition);
    int tries = 0;
    for (int a : g.attempts) tries += a;
    printf("score: %d of %d right at the first attempt (%d attempts in all; the first answer to each question is "
           "the one graded)\n", first_right(g), int(g.h.count), tries);
    printf("for a certificate, send this file as it is to your instructor, who signs it (zero_estimate --quiz --sign "
           "FILE --student %s --signing-key course.key)\n", g.h.student.c_str());
    return first_right(g) == int(g.h.count) ? 0 : 1;
  }
  if (c.student.empty()) user_error("a course's quiz is a student's own: add --student ID");
  check_student_id("--student", c.student);
  const uint64_t seed = student_seed(k.pk, c.student);
  const int edition = c.edition ? c.edition : kQuizEdition;
  if (c.key) {
    print_quiz_key(seed, c.count, edition);
    return 0;
  }
  const std::vector<QuizQuestion> q = make_quiz(seed, c.count, edition);
  // the first line names the edition, so the file is graded against these questions after an update
  printf("ZeRO quiz of student %s (course key %s: seed %llu, --count %d). Answer in a file whose first line is\n"
         "  %s student=%s seed=%llu count=%d\n"
         "then one line per answer in each question's unit, e.g. `Q1 12.5`. Every line is an attempt and the first "
         "answer to each question is the one graded: to try again, add a line, never change one. Check with\n"
         "  zero_estimate --quiz --student %s --course-pub %s --check answers.txt\n\n",
         c.student.c_str(), k.id().c_str(), (unsigned long long)seed, c.count, answers_magic(edition).c_str(),
         c.student.c_str(), (unsigned long long)seed, c.count, c.student.c_str(), c.course_pub.c_str());
  for (size_t i = 0; i < q.size(); i++) printf("Q%zu. %s\n\n", i + 1, q[i].text.c_str());
  return 0;
}

// ---- a course's graded exercises: the seed of a student's hidden runs, and the signed grade record ----

// `NAME:PASS,NAME:FAIL,...`: 1 to 64 exercises, each named once by lower-case letters, digits and _.
static bool exercises_field_ok(const std::string& field, int* passed, int* count) {
  const std::vector<std::string> items = split_commas(field);
  std::vector<std::string> names;
  *passed = *count = 0;
  if (items.empty() || items.size() > 64) return false;
  for (const std::string& it : items) {
    const size_t colon = it.find(':');
    if (colon == std::string::npos || colon == 0 || colon > 64) return false;
    const std::string name = it.substr(0, colon), verdict = it.substr(colon + 1);
    if (name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos) return false;
    if (verdict != "PASS" && verdict != "FAIL") return false;
    for (const std::string& n : names)
      if (n == name) return false;
    names.push_back(name);
    *passed += verdict == "PASS";
    ++*count;
  }
  return true;
}

static const char* kGradeShape = "`nzgrade1 student=ID seed=S exercises=NAME:PASS,NAME:FAIL,...`";

// The record: the verdicts make grade gives, then the count of passes, the date, the key's id and the
// Ed25519 signature of everything before " sig=". The seed must be the student's own with this key.
static std::string sign_grade_record(const std::string& line, const CourseKey& k) {
  std::vector<std::string> f;
  uint64_t seed = 0;
  int passed = 0, count = 0;
  if (line.size() > 10000 || !split_fields(line, "nzgrade1", {"student", "seed", "exercises"}, &f) ||
      !valid_student_id(f[0]) || !parse_whole(f[1], 1u << 30, &seed) || seed < 1 ||
      !exercises_field_ok(f[2], &passed, &count))
    user_error("--sign-grade \"%.60s\": not a grade to sign, expected %s (make grade writes it)", line.c_str(),
               kGradeShape);
  const uint64_t own = grade_seed(k.pk, f[0]);
  if (seed != own)
    user_error("--sign-grade: seed %llu is not student %s's grading seed with this course's key %s (theirs is %llu): "
               "grade their files with their own seed (make grade SIGNING_KEY=...)", (unsigned long long)seed,
               f[0].c_str(), k.id().c_str(), (unsigned long long)own);
  const std::string body = line + fmt(" passed=%d/%d date=%s key=%s", passed, count, utc_now().c_str(), k.id().c_str());
  unsigned char sig[crypto_sign_BYTES];
  crypto_sign_detached(sig, nullptr, reinterpret_cast<const unsigned char*>(body.data()), body.size(), k.sk);
  return body + " sig=" + hex(sig, sizeof sig);
}

int run_course_grade(const CourseQuiz& c) {
  if (!c.grade_seed_of.empty() && !c.grade_line.empty())
    user_error("--grade-seed with --sign-grade; expected one: the seed first, then the record it grades");
  if (!c.grade_seed_of.empty()) {
    check_student_id("--grade-seed", c.grade_seed_of);
    if (c.signing_key.empty() == c.course_pub.empty())
      user_error("--grade-seed needs the course's key: add --signing-key course.key or --course-pub course.pub (one)");
    CourseKey k = c.signing_key.empty() ? read_public_key(c.course_pub) : read_signing_key(c.signing_key);
    sodium_memzero(k.sk, sizeof k.sk);
    printf("%llu\n", (unsigned long long)grade_seed(k.pk, c.grade_seed_of));
    return 0;
  }
  if (c.signing_key.empty()) user_error("--sign-grade needs the course's private key: add --signing-key course.key");
  sodium_ready();
  CourseKey k = read_signing_key(c.signing_key);
  const std::string record = sign_grade_record(c.grade_line, k);
  sodium_memzero(k.sk, sizeof k.sk);
  printf("%s\n", record.c_str());
  return 0;
}

int verify_grade_record(const std::string& line, const std::string& course_pub) {
  sodium_ready();
  std::vector<std::string> f;
  if (line.size() > 20000 ||
      !split_fields(line, "nzgrade1", {"student", "seed", "exercises", "passed", "date", "key", "sig"}, &f))
    user_error("--verify \"%.60s...\": not a grade record, expected `nzgrade1 student=ID seed=S exercises=... "
               "passed=R/C date=D key=K sig=SIG`; paste the whole line", line.c_str());
  if (course_pub.empty())
    user_error("--verify: a grade record is checked with the course's public key; add --course-pub FILE "
               "(the instructor's course.pub)");
  const CourseKey k = read_public_key(course_pub);
  uint64_t seed = 0, right = 0, of = 0;
  int passed = 0, count = 0;
  unsigned char sig[crypto_sign_BYTES], key8[8];
  const size_t slash = f[3].find('/');
  auto need = [&](bool ok, const char* name, const std::string& v, const char* expected) {
    if (!ok)
      user_error("--verify: %s=%.40s in the grade record, expected %s; paste the whole line the instructor sent",
                 name, v.c_str(), expected);
  };
  need(valid_student_id(f[0]), "student", f[0], "a student id");
  need(parse_whole(f[1], 1u << 30, &seed) && seed >= 1, "seed", f[1], "a whole number from 1 to 2^30");
  need(exercises_field_ok(f[2], &passed, &count), "exercises", f[2], "NAME:PASS or NAME:FAIL, comma-separated");
  need(slash != std::string::npos && parse_whole(f[3].substr(0, slash), 64, &right) &&
       parse_whole(f[3].substr(slash + 1), 64, &of) && right <= of, "passed", f[3], "R/C, R at most C");
  need(f[4].size() == 20 && f[4][10] == 'T' && f[4][19] == 'Z', "date", f[4], "a UTC time, 2026-01-31T12:00:00Z");
  need(unhex(f[5], key8, 8), "key", f[5], "16 hex digits");
  need(unhex(f[6], sig, sizeof sig), "sig", f[6], "128 hex digits");
  if (f[5] != k.id()) {
    printf("not verified: signed with key %s, not with this course's key %s\n", f[5].c_str(), k.id().c_str());
    return 1;
  }
  const std::string body = line.substr(0, line.rfind(" sig="));
  if (crypto_sign_verify_detached(sig, reinterpret_cast<const unsigned char*>(body.data()), body.size(), k.pk) != 0) {
    printf("not verified: the signature does not match the line (edited after it was signed, or signed with another "
           "key); ask the instructor for the record\n");
    return 1;
  }
  // A valid signature over a seed that is not the student's own: another student's hidden runs under this id.
  const uint64_t own = grade_seed(k.pk, f[0]);
  if (seed != own) {
    printf("not verified: seed %llu is not student %s's grading seed (theirs is %llu): another student's hidden runs "
           "under this id\n", (unsigned long long)seed, f[0].c_str(), (unsigned long long)own);
    return 1;
  }
  if (int(right) != passed || int(of) != count) {
    printf("not verified: the record says %d of %d passed, its verdicts count %d of %d\n", int(right), int(of),
           passed, count);
    return 1;
  }
  printf("verified: student %s, %d of %d exercises passed (%s), graded %s with course key %s (seed %llu)\n",
         f[0].c_str(), passed, count, f[2].c_str(), f[4].c_str(), k.id().c_str(), (unsigned long long)seed);
  return 0;
}

#else  // the WebAssembly page: no libsodium

[[noreturn]] static void no_signatures() {
  user_error("a course's keys and certificates need libsodium, which the page does not carry; use the command "
             "line's zero_estimate");
}
uint64_t student_seed(const unsigned char*, const std::string&) { no_signatures(); }
void make_course_keys(const std::string&) { no_signatures(); }
int verify_certificate(const std::string&, const std::string&) { no_signatures(); }
int run_course_quiz(const CourseQuiz&) { no_signatures(); }
uint64_t grade_seed(const unsigned char*, const std::string&) { no_signatures(); }
int run_course_grade(const CourseQuiz&) { no_signatures(); }
int verify_grade_record(const std::string&, const std::string&) { no_signatures(); }

#endif

}  // namespace nz
