// test_tensor.cpp — tensor/train.cpp as a whole, under mpirun: T tensor ranks x D replicas equal the
// single-process reference (tp_reference.h) bit for bit — every step's loss and grad norm and the
// model file — with clipping active; stage0_ddp within a bound derived below; every rank's ledger
// holds tensor/formulas.h to the byte and every step's comm ledger its elements; bad input is one
// line and exit 2; the deliberately broken copies (tests/tensor/mutants.mk) are caught.
//
// make test runs a small matrix (fp32: T = 1, 2, 4 with D = 1, and T = 2 x D = 2 with --accum 2;
// bf16: T = 2, 4; fp16: T = 2; T = 3 on a 3-head model, whose vocabulary of 256 is padded to 258;
// ZeRO-1 over the replicas, T = 2 x D = 2, fp32 with --accum 2 and bf16).
// NZ_TENSOR_FULL=1 (make tensor-check) runs every T, D, K with T x D <= 4, T = 3, and --zero 1, in every
// precision.
// 3D (--tensor T --pipeline P, tensor/pipe3d.cpp): T x P x D runs equal the same reference (Tensor3D),
// every rank's ledger and elements sent per step equal its segment's formulas.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>  // strstr

#include "harness.h"
#include "tensor_bound.h"  // tensor_ddp_bound, expect_tensor_within_ddp_bound
#include "tensor/formulas.h"  // tensor_state_bytes, tensor_activation_bytes, tensor_comm_elems
#include "tensor/tensor.h"    // tensor_layout, padded_vocab
#include "tp_reference.h"

using namespace nzt;

namespace {

// tiny: 2 blocks, width 32, 4 heads, vocabulary 256. --clip 0.5 clips every step (the norms are
// above 2). Three steps: the later ones train on what the first updates produced.
const std::string kTiny =
    "--preset tiny --seq 32 --batch 2 --steps 3 --lr 3e-3 --warmup 1 --clip 0.5 --eval-every 0 --eval-windows 4 ";

// The fast CPU kernels' bits depend on the thread count: one thread in every process.
struct OneThread {
  OneThread() { setenv("OMP_NUM_THREADS", "1", 1); }
} one_thread;

std::string tensor_flags(int T, int K) {
  return "--tensor " + std::to_string(T) + " --accum " + std::to_string(K) + " ";
}

struct Case {
  int T, D, K;
  const char* precision;
  const char* model = "";  // more flags (T = 3: 3 heads of a 48-wide tiny, vocabulary padded; --zero 1)
};
const char* kThreeHeads = "--dim 48 --heads 3 ";
const char* kSequenceParallel = "--sequence-parallel ";

// Every step's loss and norm and every parameter of the model file, bit for bit, against the reference.
void expect_equals_reference(const RunResult& r, const tpref::Result& ref, const std::string& what) {
  const std::vector<double> losses = step_values(r.report, "loss"), norms = step_values(r.report, "grad_norm");
  const std::vector<float> params = model_params(r.model_path);
  EXPECT_EQ(losses, ref.losses) << what << ": losses (max |diff| " << max_abs_diff(losses, ref.losses) << ")";
  EXPECT_EQ(norms, ref.norms) << what << ": grad norms (max |diff| " << max_abs_diff(norms, ref.norms) << ")";
  ASSERT_EQ(params.size(), ref.params.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < params.size(); i++) differ += memcmp(&params[i], &ref.params[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << what << ": parameters of the model file that differ from the reference's";
}

// The run equals the reference: every step's loss and norm, every parameter, to the bit.
void expect_equal_to_reference(const Case& c) {
  // fp16: a scale of 1024 that no step of these runs overflows at (65536 does with --accum 2 and 3:
  // the K scaled gradients are summed in fp16), and that stays for the 3 steps (window 1000)
  const std::string fp16 = std::string(c.precision) == "fp16" ? "--loss-scale 1024 " : "";
  const std::string flags = kTiny + c.model + "--precision " + c.precision + " " + fp16 + tensor_flags(c.T, c.K);
  const RunResult& r = run_cached("tensor", c.T * c.D, flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  if (std::string(c.precision) == "fp16")  // the reference keeps the initial loss scale: so must the run
    for (const Json& s : r.report["steps_log"].arr) {
      ASSERT_FALSE(s["skipped"].b) << "fp16 run skipped a step: the reference does not model that";
      ASSERT_EQ(s["loss_scale"].d(), r.report["steps_log"][0]["loss_scale"].d());
    }
  const std::string what = "T=" + std::to_string(c.T) + " D=" + std::to_string(c.D) + " K=" +
                           std::to_string(c.K) + " " + c.precision;
  expect_equals_reference(r, tpref::run(flags, c.T, c.D), what);
}

std::vector<Case> matrix() {
  std::vector<Case> m;
  if (getenv("NZ_TENSOR_FULL")) {
    for (const char* p : {"fp32", "bf16", "fp16"})
      for (int T : {1, 2, 4})
        for (int D : {1, 2, 4})
          for (int K : {1, 2, 3})
            if (T * D <= 4) m.push_back({T, D, K, p});
    for (const char* p : {"fp32", "bf16", "fp16"})
      for (int K : {1, 2}) {
        m.push_back({3, 1, K, p, kThreeHeads});
        for (auto [T, D] : {std::pair{1, 2}, std::pair{1, 4}, std::pair{2, 2}}) m.push_back({T, D, K, p, "--zero 1 "});
        for (auto [T, D] : {std::pair{2, 1}, std::pair{4, 1}, std::pair{2, 2}, std::pair{3, 1}})
          m.push_back({T, D, K, p, T == 3 ? "--dim 48 --heads 3 --seq 30 --sequence-parallel " : kSequenceParallel});
      }
    return m;
  }
  return {{1, 1, 1, "fp32"}, {2, 1, 1, "fp32"}, {4, 1, 1, "fp32"},       {2, 2, 2, "fp32"},
          {2, 1, 1, "bf16"}, {4, 1, 1, "bf16"}, {2, 1, 1, "fp16"}, {3, 1, 1, "fp32", kThreeHeads},
          {2, 2, 2, "fp32", "--zero 1 "}, {2, 2, 1, "bf16", "--zero 1 "}, {4, 1, 1, "fp32", kSequenceParallel},
          {2, 2, 2, "bf16", kSequenceParallel}};
}

}  // namespace

// ---- 3D: --tensor T --pipeline P on N = P x D x T ranks (tensor/pipe3d.cpp) ----
// The same truth: every step's loss and norm and the model file equal the reference bit for bit
// (its norm added segment by segment, as the ranks add it). tiny has 4 units (embed, 2 blocks, lnf):
// --partition 2 gives segment 0 the embedding and block 1, segment 1 block 2 and lnf; P = 3 (--partition
// 1,3) the embedding alone, both blocks, lnf alone; with P = 4 each unit is a segment of its own.
struct Case3D {
  int T, P, D, K;
  const char* precision;
  const char* more = "";  // --zero 1, --sequence-parallel, --schedule gpipe
};
std::string flags_3d(const Case3D& c) {
  const std::string fp16 = std::string(c.precision) == "fp16" ? "--loss-scale 1024 " : "";
  const std::string partition = c.P == 2 ? "2" : c.P == 3 ? "1,3" : "1,2,3";
  return kTiny + "--precision " + c.precision + " " + fp16 + tensor_flags(c.T, c.K) + "--pipeline " +
         std::to_string(c.P) + " --partition " + partition + " " + c.more;
}
std::string name_3d(const Case3D& c) {
  return std::to_string(c.T) + "x" + std::to_string(c.P) + "x" + std::to_string(c.D) + "/K" + std::to_string(c.K) +
         "/" + c.precision + (strstr(c.more, "--zero") ? "/zero1" : "") + (strstr(c.more, "--sequence") ? "/sp" : "") +
         (strstr(c.more, "gpipe") ? "/gpipe" : "");
}

void expect_3d_equal_to_reference(const Case3D& c) {
  const std::string flags = flags_3d(c), what = name_3d(c);
  const RunResult& r = run_cached("tensor", c.T * c.P * c.D, flags);
  ASSERT_EQ(r.exit_code, 0) << what << ": " << r.output;
  if (std::string(c.precision) == "fp16") {
    for (const Json& s : r.report["steps_log"].arr) ASSERT_FALSE(s["skipped"].b) << what << ": a skipped step";
  }
  expect_equals_reference(r, tpref::run(flags, c.T, c.D), what);
}

std::vector<Case3D> matrix_3d() {
  if (getenv("NZ_TENSOR_FULL")) {
    std::vector<Case3D> m;
    for (const char* p : {"fp32", "bf16", "fp16"})
      for (int K : {1, 3}) {
        for (auto [T, P, D] : {std::tuple{2, 2, 1}, std::tuple{1, 2, 2}, std::tuple{2, 2, 2}, std::tuple{2, 3, 1},
                               std::tuple{1, 4, 1}, std::tuple{2, 4, 1}})
          m.push_back({T, P, D, K, p});
        m.push_back({2, 2, 1, K, p, "--schedule gpipe "});
        m.push_back({2, 2, 2, K, p, "--zero 1 "});
        m.push_back({2, 2, 1, K, p, kSequenceParallel});
        m.push_back({2, 2, 2, K, p, "--sequence-parallel --zero 1 "});
      }
    return m;
  }
  return {{2, 2, 1, 1, "fp32"}, {2, 2, 1, 3, "fp32"}, {2, 2, 1, 3, "bf16"}, {1, 2, 2, 3, "fp32", "--zero 1 "},
          {2, 2, 1, 3, "fp32", "--sequence-parallel --schedule gpipe "}, {2, 2, 1, 1, "fp16"},
          {2, 2, 2, 3, "bf16", "--zero 1 "}};
}

TEST(Tensor3D, EqualsTheSingleProcessReferenceBitForBit) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Case3D> cases = matrix_3d();
  std::string list;
  for (const Case3D& c : cases) expect_3d_equal_to_reference(c), list += " " + name_3d(c);
  // validation runs through the segments (the loss on the last): the final model's validation loss
  // is the one the same model gives without a pipeline (T = 2, the same bits; the reference has none)
  const RunResult& flat = run_cached("tensor", 2, kTiny + "--precision fp32 " + tensor_flags(2, 1));
  const RunResult& piped = run_cached("tensor", 4, flags_3d({2, 2, 1, 1, "fp32"}));
  ASSERT_EQ(flat.exit_code, 0) << flat.output;
  EXPECT_EQ(piped.report["final_val_loss"].d(), flat.report["final_val_loss"].d()) << "3D validation";
  printf("%zu 3D runs (T x P x D / K / precision):%s — each bit for bit the reference, %.1f s\n", cases.size(),
         list.c_str(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// 3D: every rank's ledger = its segment's formula (tensor/formulas.h) to the byte, by category, and
// zero_estimate --tensor T --pipeline P prints the same per segment. The runs are the equality
// test's (cached): 1F1B keeps min(P - p, K) micro-batches on segment p, GPipe K. The elements sent
// per step: rank 0's every step (the report's steps), and every rank's as the difference between
// its run totals after 3 steps and after 2 (a second run, one step shorter: the same validation,
// model file and first exchange of the tied rows).
TEST(Tensor3D, LedgerEqualsTheFormulas) {
  for (const Case3D& c : {Case3D{2, 2, 1, 3, "fp32"}, Case3D{1, 2, 2, 3, "fp32", "--zero 1 "},
                          Case3D{2, 2, 1, 3, "fp32", "--sequence-parallel --schedule gpipe "}}) {
    const RunResult& r = run_cached("tensor", c.T * c.P * c.D, flags_3d(c));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nz::GPTConfig cfg{256, 32, 2, 32, 4};  // tiny
    const nz::Layout mine = nz::tensor_layout(cfg, c.T, c.D);
    const bool zero = strstr(c.more, "--zero"), sp = strstr(c.more, "--sequence"), gpipe = strstr(c.more, "gpipe");
    const int first_unit[] = {0, 2, 4};  // --partition 2
    std::string est;
    ASSERT_EQ(run_command(program_path("zero_estimate") + " --tensor " + std::to_string(c.T) +
                              " --pipeline 2 --world " + std::to_string(c.T * c.P * c.D) +
                              " --partition 2 --preset tiny --batch 2 --seq 32 --accum " + std::to_string(c.K) + (zero ? " --zero 1" : "") + (sp ? " --sequence-parallel" : "") +
                              (gpipe ? " --schedule gpipe" : "") + " --json", &est), 0) << est;
    const Json e = Json::parse(est)["estimates"];
    for (const Json& rank : r.report["ranks"].arr) {
      const int seg = int(rank["rank"].u()) / (c.T * c.D), slots = gpipe ? c.K : std::min(c.P - seg, c.K);
      const nz::StateBytes s = nz::tensor3d_state_bytes(mine, nz::DType::F32, zero, first_unit[seg],
                                                        first_unit[seg + 1], seg == c.P - 1);
      const uint64_t acts = nz::tensor_activation_bytes(cfg, c.T, nz::DType::F32, 2, 32, sp, first_unit[seg],
                                                        first_unit[seg + 1], slots);
      const Json& peak = rank["ledger"]["device"]["peak"];
      const std::string what = name_3d(c) + " rank " + std::to_string(rank["rank"].u());
      EXPECT_EQ(peak["params"].u(), s.params) << what;
      EXPECT_EQ(peak["grads"].u(), s.grads) << what;
      EXPECT_EQ(peak["adam_m"].u(), s.adam_m) << what;
      EXPECT_EQ(peak["adam_v"].u(), s.adam_v) << what;
      EXPECT_EQ(peak["activations"].u(), acts) << what;
      for (const char* k : {"params", "grads", "master", "adam_m", "adam_v", "activations"})
        EXPECT_EQ(e[seg]["bytes"][k].u(), peak[k].u()) << what << ": zero_estimate --tensor --pipeline: " << k;
    }
    auto comm_of = [&](int seg) {
      return nz::tensor3d_comm_elems(cfg, c.T, c.D, mine, 2, 32, c.K, sp, first_unit[seg], first_unit[seg + 1],
                                     seg == 0, seg == c.P - 1);
    };
    for (const Json& step : r.report["steps_log"].arr)
      EXPECT_EQ(step["comm_elems"].u(), comm_of(0).total()) << name_3d(c) << ": rank 0's elements sent per step";
    const RunResult& shorter = run_cached("tensor", c.T * c.P * c.D, flags_3d(c) + " --steps 2");
    ASSERT_EQ(shorter.exit_code, 0) << shorter.output;
    for (size_t i = 0; i < r.report["ranks"].arr.size(); i++) {
      const int rank = int(r.report["ranks"][i]["rank"].u()), seg = rank / (c.T * c.D);
      const uint64_t step = r.report["ranks"][i]["comm"]["model_elems_sent"].u() -
                            shorter.report["ranks"][i]["comm"]["model_elems_sent"].u();
      EXPECT_EQ(step, comm_of(seg).total()) << name_3d(c) << " rank " << rank << ": elements sent in a step";
      EXPECT_EQ(e[seg]["comm_elems_per_step"].u(), comm_of(seg).total()) << "zero_estimate: segment " << seg;
    }
    // by hand, the first case (T = 2, K = 3, b s C = 2048, R = 64, V'C/T = 4096): segment 0 all-reduces
    // the embedding's g and block 1's four (2 x 1/2 of 2048 each), sends 3 activations and wte's rows;
    // segment 1 block 2's four, the head's f, the loss's 2 of R, gathers R, sends 3 activation
    // gradients and 3 head gradients
    if (name_3d(c) == "2x2x1/K3/fp32") {
      EXPECT_EQ(comm_of(0).total(), uint64_t(3 * 5 * 2048 + 3 * 2048 + 4096));
      EXPECT_EQ(comm_of(1).total(), uint64_t(3 * (5 * 2048 + 128) + 3 * 64 + 3 * 2048 + 3 * 4096));
    }
  }
}

TEST(Tensor, EqualsTheSingleProcessReferenceBitForBit) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Case> cases = matrix();
  for (const Case& c : cases) expect_equal_to_reference(c);
  std::string list;
  for (const Case& c : cases)
    list += " " + std::to_string(c.T) + "x" + std::to_string(c.D) + "/K" + std::to_string(c.K) + "/" + c.precision +
            (strstr(c.model, "--heads 3") ? "/3heads" : "") + (strstr(c.model, "--sequence") ? "/sp" : "") +
            (strstr(c.model, "--zero") ? "/zero1" : "");
  printf("%zu runs (T x D / K / precision):%s — each bit for bit the reference, %.1f s\n", cases.size(), list.c_str(),
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// The reference itself, against something it was not built from: with T = 1 it is a plain model
// (one piece: the whole matrices, sums of one term), which must be stage0_ddp on D ranks bit for bit
// — the same kernels on the same numbers, except the cross-entropy, written here as
// log S + M - z_target where stage0_ddp's kernel writes -log(p_target): those may differ in the last
// bits, so the loss is held to the bound below and the rest (norms, model) compared as for T > 1.
//
// The bound against stage0_ddp, for every T. Tensor parallelism changes no formula, only the order
// of additions: a row-parallel product adds T partial sums of n/T terms instead of one sum of n
// terms (n = C for attproj, 4C for fcproj, V for the head's d lnf), the cross-entropy sums T partial
// Σ exp and forms the loss from log S + M - z. Each reordered sum of n terms of one sign is off by
// at most γ_n = n u / (1 - n u) of the sum of their magnitudes (u = 2^-24 in fp32; Higham, Accuracy
// and Stability, 3.1); with mixed signs the error is relative to Σ|terms|, which the layer norms keep
// of order one per unit of output. Per step the loss and the gradient pass through 2 reordered sums
// per block in the forward and 2 in the backward, 1 each at the head: (4L + 2) γ_n with n = V the
// largest, a relative first-order bound per step. The update then carries the difference into the
// next step's parameters, scaled by at most lr / (sqrt(v) + eps) per unit of gradient difference,
// which Adam keeps at most about lr per element: a parameter difference δ ≤ steps · lr, whose effect
// on the loss is bounded by its gradient norm (≤ the clip, 0.5) times √Ψ δ. So with u = 2^-24:
//   |Δ loss_s| / loss_s ≤ (4L + 2) γ_V  +  s · lr · 0.5 · √Ψ · (4L + 2) γ_V
// (the second term: the drift of s updates computed from gradients that differ by the first).
// This is a first-order estimate, not a proof: it is the one the check holds runs to, and a run
// outside it is a bug (the mutants are orders of magnitude outside).
TEST(Tensor, Stage0DdpWithinTheDerivedBound) {
  const nz::GPTConfig c{256, 32, 2, 32, 4};  // tiny
  const RunResult& ref = run_cached("stage0_ddp", 1, kTiny);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  for (int T : {1, 2, 4}) {
    const RunResult& r = run_cached("tensor", T, kTiny + tensor_flags(T, 1));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    double worst = expect_tensor_within_ddp_bound(c, ref.report, r.report, "T=" + std::to_string(T));
    // validation (the rung's own forward over its pieces, the loss counted once per replica): the
    // final model's, within the bound of the step after the last
    const double v0 = ref.report["final_val_loss"].d(), v = r.report["final_val_loss"].d();
    const double vbound = tensor_ddp_bound(c, step_values(r.report, "loss").size());
    EXPECT_LE(std::fabs(v - v0) / v0, vbound) << "T=" << T << ": validation loss " << v << " vs stage0_ddp " << v0;
    worst = std::max(worst, std::fabs(v - v0) / v0 / vbound);
    printf("T=%d vs stage0_ddp: largest relative difference %.3g of the bound (loss, norm, 3 steps; validation)\n", T,
           worst);
  }
}

// Every rank's ledger = tensor/formulas.h to the byte (peak, by category), and every step's comm
// ledger = the elements the formula counts: 4 all-reduces of b s C per block and micro-step (g twice,
// f twice), 2 more (the embedding's g, the head's f), the loss's 2 of R and 1 all-gather of R over the
// T ranks, and one all-reduce of the pieces over the D replicas.
TEST(Tensor, LedgerAndCommEqualTheFormulas) {
  for (auto [T, D, K, zero, sp] : {std::tuple{2, 2, 2, 0, false}, std::tuple{4, 1, 1, 0, false},
                                   std::tuple{2, 2, 1, 1, false}, std::tuple{4, 1, 1, 0, true},
                                   std::tuple{2, 2, 2, 1, true}}) {
    const RunResult& r = run_cached("tensor", T * D, kTiny + tensor_flags(T, K) + (zero ? "--zero 1 " : "") +
                                                         (sp ? kSequenceParallel : ""));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nz::GPTConfig c{256, 32, 2, 32, 4};
    const nz::Layout mine = nz::tensor_layout(c, T, D);
    EXPECT_EQ(mine.num_params, nz::tensor_param_formula(c, T));
    const nz::StateBytes s = nz::tensor_state_bytes(mine, nz::DType::F32, zero);
    // --zero 1: the optimizer's three arrays over D (fp32: m and v; the parameters are their own master)
    EXPECT_EQ(s.adam_m, (zero ? mine.padded_total / D : mine.padded_total) * 4);
    const uint64_t acts = nz::tensor_activation_bytes(c, T, nz::DType::F32, 2, 32, sp);
    for (const Json& rank : r.report["ranks"].arr) {
      const Json& peak = rank["ledger"]["device"]["peak"];
      EXPECT_EQ(peak["params"].u(), s.params);
      EXPECT_EQ(peak["grads"].u(), s.grads);
      EXPECT_EQ(peak["adam_m"].u(), s.adam_m);
      EXPECT_EQ(peak["adam_v"].u(), s.adam_v);
      EXPECT_EQ(peak["activations"].u(), acts) << "rank " << rank["rank"].u();
    }
    // zero_estimate --tensor prints the same, running nothing
    std::string est;
    ASSERT_EQ(run_command(program_path("zero_estimate") + " --tensor " + std::to_string(T) + " --world " +
                              std::to_string(T * D) + " --preset tiny --batch 2 --seq 32 --accum " + std::to_string(K) +
                              (zero ? " --zero 1" : "") + (sp ? " --sequence-parallel" : "") + " --json", &est), 0)
        << est;
    const Json e = Json::parse(est)["estimates"][0];
    const Json& peak0 = r.report["ranks"][0]["ledger"]["device"]["peak"];
    for (const char* k : {"params", "grads", "master", "adam_m", "adam_v", "activations"})
      EXPECT_EQ(e["bytes"][k].u(), peak0[k].u()) << "zero_estimate --tensor: " << k;
    EXPECT_EQ(e["comm_elems_per_step"].u(), r.report["steps_log"][0]["comm_elems"].u()) << "zero_estimate --tensor";
    const nz::TensorComm x = nz::tensor_comm_elems(c, T, D, mine, 2, 32, K, sp);
    for (const Json& step : r.report["steps_log"].arr)
      EXPECT_EQ(step["comm_elems"].u(), x.total()) << "T=" << T << " D=" << D << " sp=" << sp;
    // 4 all-reduces of b s C per block and micro-step, written out once more by hand for tiny, T = 4:
    // (4 x 2 + 2) x 64 x 32 elements, 2 x 3/4 of each sent, 2 x 64 of the loss, 3 x 64 gathered
    if (T == 4 && !sp) {
      EXPECT_EQ(x.total(), uint64_t(2 * 3 * ((4 * 2 + 2) * 64 * 32 + 2 * 64) / 4 + 3 * 64));
    }
    // sequence parallelism, by hand for T = 4: (4 x 2 + 2) reduce-scatters and (6 x 2 + 2) all-gathers of
    // 3/4 of 64 x 32, the loss's as before, and the layer norms' gradients: 5 all-reduces of 2 x 32
    if (T == 4 && sp) {
      EXPECT_EQ(x.total(), uint64_t((10 + 14) * 3 * 64 * 32 / 4 + 2 * 3 * (2 * 64 + 5 * 64) / 4 + 3 * 64));
    }
  }
}

TEST(Tensor, BadInputIsOneLineAndExitCode2) {
  struct Bad {
    int np;
    std::string program, flags, says;
  } bad[] = {
      {3, "tensor", "--tensor 3", "the 4 heads do not split over 3 ranks"},
      {3, "tensor", "--tensor 2", "T does not divide the ranks"},
      {1, "stage0_ddp", "--tensor 2", "stage0_ddp does not use it"},
      {2, "tensor", "--tensor 2 --ckpt-dir /tmp/nz_tensor_ckpt_never", "does not write or read checkpoints"},
      {2, "tensor", "--tensor 2 --zero 2", "ZeRO-2 over the replicas is not built yet"},
      {1, "tensor", "--sequence-parallel", "expected T > 1"},
      {2, "tensor", "--tensor 2 --batch auto --memory-budget 1MiB", "--batch auto with tensor"},
      {4, "tensor", "--tensor 4 --sequence-parallel --seq 30", "the positions do not split over 4 tensor ranks"},
      {6, "tensor", "--tensor 2 --pipeline 2", "T x P = 4 does not divide the ranks"},
      {5, "tensor", "--pipeline 5", "more segments than the model's 4 units"},
      {4, "tensor", "--tensor 2 --pipeline 2 --partition 9", "unit 9 is past the last unit"},
      {2, "tensor", "--tensor 2 --partition 2", "1 boundaries for --pipeline 1"},
      // what the GPU does not run (the rest does: tests/cuda/test_cuda_stages.cpp)
      {2, "tensor", "--tensor 2 --attention flash --device cuda", "--attention flash with tensor on the GPU: not built"},
  };
  for (const Bad& b : bad) {
    std::string out;
    const int code = run_command("timeout -k 5 60 mpirun -np " + std::to_string(b.np) + " " + program_path(b.program) +
                                     " " + kTiny + b.flags, &out);
    EXPECT_EQ(code, 2) << b.flags << ": " << out;
    EXPECT_NE(out.find(b.says), std::string::npos) << b.flags << ": " << out;
    size_t lines = 0;
    for (char ch : out) lines += ch == '\n';
    EXPECT_EQ(lines, 1u) << b.flags << ": " << out;
  }
}

// Each broken copy runs (or fails) and is told apart from the reference by the check above.
void expect_mutants_caught(const std::string& flags, const tpref::Result& ref, const std::vector<const char*>& names) {
  for (const char* m : names) {
    RunResult r = run_trainer(std::string("mutant_tensor_") + m, 4, flags, m);
    if (r.exit_code != 0) {
      printf("mutant_tensor_%s: failed to run (exit %d): caught\n", m, r.exit_code);
      continue;
    }
    const std::vector<double> l = step_values(r.report, "loss"), n = step_values(r.report, "grad_norm");
    const std::vector<float> p = model_params(r.model_path);
    const bool same = l == ref.losses && n == ref.norms && p == ref.params;
    printf("mutant_tensor_%s: losses max |diff| %.3g, norms %.3g: %s\n", m, max_abs_diff(l, ref.losses),
           max_abs_diff(n, ref.norms), same ? "NOT CAUGHT" : "caught");
    EXPECT_FALSE(same) << "mutant_tensor_" << m << " was not caught";
  }
}

TEST(Tensor, MutantsAreCaught) {
  for (const bool sp : {false, true}) {  // 2 tensor ranks x 2 replicas; sequence parallel for its own mutant
    const std::string flags = kTiny + "--precision fp32 " + tensor_flags(2, 1) + (sp ? kSequenceParallel : "");
    const tpref::Result ref = tpref::run(flags, 2, 2);
    const RunResult& good = run_cached("tensor", 4, flags);
    ASSERT_EQ(good.exit_code, 0) << good.output;
    EXPECT_EQ(step_values(good.report, "loss"), ref.losses) << "the real rung must pass the check its mutants fail";
    EXPECT_EQ(step_values(good.report, "grad_norm"), ref.norms) << "the real rung must pass the check";
    expect_mutants_caught(flags, ref, sp ? std::vector<const char*>{"sp_ln_not_summed"}
                                         : std::vector<const char*>{"f_no_all_reduce", "bias_summed_t_times",
                                                                    "local_max", "wrong_placement"});
  }
  // 3D, 2 tensor ranks x 2 segments, sequence parallel: each tensor rank's activation rows go to
  // the equal tensor rank of the next segment (the mutant sends them to the other one)
  const std::string flags = flags_3d({2, 2, 1, 1, "fp32", kSequenceParallel});
  const tpref::Result ref = tpref::run(flags, 2, 1);
  const RunResult& good = run_cached("tensor", 4, flags);
  ASSERT_EQ(good.exit_code, 0) << good.output;
  EXPECT_EQ(step_values(good.report, "loss"), ref.losses) << "the real rung must pass the check its mutants fail";
  expect_mutants_caught(flags, ref, {"wrong_peer_3d"});
  // 3D with 2 replicas, 1 tensor rank x 2 segments: a placement the pipeline's plan disagrees with
  const std::string flags_d2 = flags_3d({1, 2, 2, 1, "fp32"});
  expect_mutants_caught(flags_d2, tpref::run(flags_d2, 1, 2), {"placement_3d_p_fastest"});
}
