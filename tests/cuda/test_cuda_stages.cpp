// test_cuda_stages.cpp — every stage trained on the GPU (--device cuda), run under mpirun as a
// learner runs it, with 1 and 2 ranks on however many GPUs the machine has (one GPU: the 2 ranks
// share it through the MPI path; two or more: NCCL). What must hold:
//   - every stage equals stage0_ddp on the GPU within the stated bound (every step's loss, the
//     saved model). The bound is the one tests/stages/test_ddp.cpp grants for a change of summation
//     order, since NCCL adds in an order of its own and offload's optimizer runs on the CPU:
//       fp32: |loss diff| <= 1e-5, |param diff| <= 1e-4;
//       bf16: |loss diff| <= 2e-2, |param diff| <= 3e-2 (a few bf16 ulps of a weight near 1).
//     On the MPI path the sums are rank-ordered, so bitwise equality is expected and reported;
//   - the memory ledger's model state (every category but scratch, per location, per rank) and the
//     comm ledger (elements per step, host<->device elements) are identical to the CPU run's;
//   - --attention flash keeps only attention's log-sum-exp: the activations formula with that term,
//     exactly that much below the gemm run's, and the losses within the stage bound above; and
//     --batch auto fits the batch by that formula;
//   - the pipeline (P = 2, both schedules) equals stage0_ddp --accum 2 on one rank bit for bit on
//     either path, and its ledger and comm counts are the CPU pipeline's;
//   - ulysses (--sp 2 on 2 ranks, and --sp 4 on 4: one replica of S sequence slices, its all-to-alls
//     on the device)
//     equals stage0_ddp on one rank within the stage bound, its step-1 loss within the bound of two
//     summation orders (with --kernels reference every token's loss is the same bits: the
//     all-to-alls and the layout kernels move bits), and its ledger and comm counts are the CPU
//     run's; --sp-mode ring and --attention flash with --device cuda are one line, exit 2, and the
//     ring mode with --device auto runs on the CPU;
//   - tensor (--tensor 2 on 2 ranks) equals stage0_ddp on one rank within the tensor suite's derived
//     bound, and its CPU run (and 3D with sequence parallelism's, on 4 ranks) within the CPU-vs-GPU
//     bound below, with its ledger and comm counts; --attention flash with --device cuda is one line,
//     exit 2;
//   - the GPU trains the CPU's model: stage0_ddp's losses agree within fp32 1e-3, bf16 5e-2 over
//     the same steps (the kernels differ from the CPU's in summation order, fused multiply-adds
//     and the device math library: cuda_common.cuh).
// Each comparison prints an "NZTABLE" line that tests/cuda/gpu_check.sh collects into its table.
// Without a visible GPU every test skips (this binary runs, skipping, in `make test`).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>    // std::ldexp, std::fabs
#include <cstdlib>  // getenv
#include <map>
#include <utility>  // std::pair

#include "runtime/device.h"  // nz::cuda_rt::device_count
#include "harness.h"
#include "tensor_bound.h"  // expect_tensor_within_ddp_bound
#include "model.h"          // nz::preset_config
#include "zero_formulas.h"  // nz::expected_activation_bytes

using namespace nzt;

namespace {

// NZ_TEST_QUICK=1 (tests/cuda/emu_check.sh, where kernels run on the CPU emulator, dev/emu/):
// 2 steps of 16 tokens instead of 8 of 32 (each step's two micro-batches, the optimizer's update
// between the steps, and the second step's loss on the updated model: every code path a longer run
// takes). The bounds stay as stated.
const bool kQuick = getenv("NZ_TEST_QUICK") && std::string(getenv("NZ_TEST_QUICK")) == "1";
const std::string kFlags =
    std::string("--preset tiny --batch 2 --accum 2 --lr 3e-3 --warmup 2 --clip 0.5 --eval-every 0 --eval-windows 4 ") +
    (kQuick ? "--seq 16 --steps 2 " : "--seq 32 --steps 8 ");
const char* kCategories[] = {"params", "grads", "master", "adam_m", "adam_v", "activations", "comm_buffers", "gathered"};

struct Bound {
  double loss, param;
};
Bound stage_bound(const std::string& prec) { return prec == "fp32" ? Bound{1e-5, 1e-4} : Bound{2e-2, 3e-2}; }
double cpu_gpu_loss_bound(const std::string& prec) { return prec == "fp32" ? 1e-3 : 5e-2; }

bool gpu_visible() { return nz::cuda_rt::compiled() && nz::cuda_rt::device_count() > 0; }

// The ZeRO stages built next to stage0_ddp.
std::vector<std::string> stages() {
  std::vector<std::string> s;
  struct stat st;
  for (const char* name : {"stage1", "stage2", "stage3", "offload"})
    if (stat((bin_dir() + "/" + name).c_str(), &st) == 0) s.push_back(name);
  return s;
}

// On the emulator this binary runs twice (tests/cuda/emu_check.sh): with one emulated GPU, and with
// two (NZ_EMU_GPUS=2). Only a run of several ranks on the device differs between the two (its ranks
// share the GPU through MPI, or have one each and NCCL, comm_backend.cpp); a run of one rank uses
// GPU 0 and no NCCL whatever the count, and a run on the CPU no GPU at all. Those are started with
// the count unset, the same request both times: the run cache (harness.h, NZ_RUN_CACHE) makes each
// once, and the second time checks it again from there.
const RunResult& run_cached_any_gpus(const std::string& trainer, int N, const std::string& device,
                                     const std::string& flags, const std::string& tag) {
  const char* gpus = getenv("NZ_EMU_GPUS");
  if (!gpus || (N > 1 && device == "cuda")) return run_cached(trainer, N, flags + " --device " + device, tag);
  const std::string saved = gpus;
  unsetenv("NZ_EMU_GPUS");
  const RunResult& r = run_cached(trainer, N, flags + " --device " + device, tag);
  setenv("NZ_EMU_GPUS", saved.c_str(), 1);
  return r;
}

// One run per (trainer, ranks, precision, device), shared by the tests below.
const RunResult& run(const std::string& trainer, int N, const std::string& prec, const std::string& device,
                     const std::string& extra = "") {
  return run_cached_any_gpus(trainer, N, device, kFlags + "--precision " + prec + extra, prec + "_" + device);
}

class CudaStages : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_visible()) GTEST_SKIP() << "no CUDA GPU visible: skipping the stages-on-the-GPU tests";
  }
};

}  // namespace

TEST_F(CudaStages, EveryStageEqualsStage0WithinTheStatedBound) {
  for (const char* prec : {"fp32", "bf16"}) {
    for (int N : {1, 2}) {
      SCOPED_TRACE(std::string(prec) + " N=" + std::to_string(N));
      const RunResult& ref = run("stage0_ddp", N, prec, "cuda");
      ASSERT_EQ(ref.exit_code, 0) << ref.output;
      ASSERT_EQ(ref.report["device"].str, "cuda");
      const Bound b = stage_bound(prec);
      for (const std::string& stage : stages()) {
        const RunResult& r = run(stage, N, prec, "cuda");
        ASSERT_EQ(r.exit_code, 0) << r.output;
        const Verdict v = compare_runs(ref, r);
        const double dl = v.loss_diff, dp = v.param_diff;
        const bool bitwise = v.losses_equal && v.model_equal;
        const bool ok = dl <= b.loss && dp <= b.param;
        printf("NZTABLE stage %-8s N=%d %s %-4s vs stage0_ddp: max|dloss| %-8.2g max|dparam| %-8.2g %s\n",
               stage.c_str(), N, prec, r.report["collectives"].str.c_str(), dl, dp,
               bitwise ? "bitwise" : ok ? "within bound" : "OUTSIDE BOUND");
        EXPECT_LE(dl, b.loss) << stage;
        EXPECT_LE(dp, b.param) << stage;
      }
    }
  }
}

TEST_F(CudaStages, LedgerAndCommCountsEqualTheCpuRun) {
  const int N = 2;
  for (const char* prec : {"fp32", "bf16"}) {
    std::vector<std::string> all = stages();
    all.insert(all.begin(), "stage0_ddp");
    for (const std::string& stage : all) {
      SCOPED_TRACE(stage + " " + prec);
      const RunResult& gpu = run(stage, N, prec, "cuda");
      const RunResult& cpu = run(stage, N, prec, "cpu");
      ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
      ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
      ASSERT_EQ(cpu.report["device"].str, "cpu");
      int differ = 0;
      uint64_t model_state = 0;
      for (int r = 0; r < N; r++) {
        for (const char* loc : {"device", "host", "disk"}) {
          const Json& g = gpu.report["ranks"][size_t(r)]["ledger"][loc]["peak"];
          const Json& c = cpu.report["ranks"][size_t(r)]["ledger"][loc]["peak"];
          for (const char* cat : kCategories) {
            EXPECT_EQ(g[cat].u(), c[cat].u()) << "rank " << r << " " << loc << " " << cat;
            differ += g[cat].u() != c[cat].u();
            if (r == 0) model_state += g[cat].u();
          }
        }
      }
      const Json &gs = gpu.report["steps_log"], &cs = cpu.report["steps_log"];
      ASSERT_EQ(gs.size(), cs.size());
      for (size_t i = 0; i < gs.size(); i++) {
        for (const char* k : {"comm_elems", "comm_bytes", "to_host_elems", "to_device_elems"}) {
          EXPECT_EQ(gs[i][k].u(), cs[i][k].u()) << "step " << i + 1 << " " << k;
          differ += gs[i][k].u() != cs[i][k].u();
        }
      }
      printf("NZTABLE ledger %-10s N=%d %s: rank 0 tracks %llu bytes, sends %llu elements per step: %s\n",
             stage.c_str(), N, prec, (unsigned long long)model_state,
             (unsigned long long)gs[size_t(0)]["comm_elems"].u(), differ ? "DIFFERS from the CPU run" : "identical to the CPU run");
    }
  }
}

// Activation checkpointing on the GPU: the recomputed forward runs the same kernels on the same
// inputs, so the run trains the same bits as without it (the CPU matrix is tests/stages/test_activations.cpp).
// stage3: its recomputation runs on the parameters its backward gathers (the others hold theirs).
TEST_F(CudaStages, CheckpointingTrainsTheSameBits) {
  const int N = 2;
  for (const char* prec : {"bf16"}) {  // the emulator is slow: bf16 (its conversions too); fp32 on the CPU
    for (const char* stage : {"stage3"}) {
      SCOPED_TRACE(std::string(stage) + " " + prec);
      const RunResult& plain = run(stage, N, prec, "cuda");
      const RunResult& ckpt = run(stage, N, prec, "cuda", " --activation-checkpointing");
      ASSERT_EQ(plain.exit_code, 0) << plain.output;
      ASSERT_EQ(ckpt.exit_code, 0) << ckpt.output;
      const Verdict v = compare_runs(plain, ckpt);
      const uint64_t a = plain.report["ranks"][size_t(0)]["ledger"]["device"]["peak"]["activations"].u();
      const uint64_t b = ckpt.report["ranks"][size_t(0)]["ledger"]["device"]["peak"]["activations"].u();
      printf("NZTABLE checkpointing %-10s N=%d %s %-4s: activations %llu -> %llu bytes per rank, %s\n", stage, N,
             prec, ckpt.report["collectives"].str.c_str(), (unsigned long long)a, (unsigned long long)b,
             v.identical() ? "the same bits" : v.str().c_str());
      EXPECT_TRUE(v.identical()) << v.str();
      EXPECT_LT(b, a);
      EXPECT_EQ(plain.report["steps_log"][size_t(0)]["comm_elems"].u(), ckpt.report["steps_log"][size_t(0)]["comm_elems"].u());
    }
  }
}

// Flash attention (--attention flash) keeps only each row's log-sum-exp, B*NH*T fp32, where the gemm
// attention keeps the (B,NH,T,T) probabilities: the activations peak is the formula with that term
// (zero_formulas.h, Attention::Flash), smaller than the gemm run's by exactly the difference of the
// two terms in every block (each 64-byte aligned, written out here), and the losses stay within the
// bound of a change of summation order (the run is the same model through another kernel).
TEST_F(CudaStages, FlashAttentionKeepsOnlyTheLogSumExp) {
  nz::GPTConfig tiny;
  ASSERT_TRUE(nz::preset_config("tiny", &tiny));
  const int B = 2, T = kQuick ? 16 : 32, N = 1;
  for (const char* prec : {"fp32", "bf16"}) {
    SCOPED_TRACE(prec);
    const nz::DType dt = std::string(prec) == "fp32" ? nz::DType::F32 : nz::DType::BF16;
    const RunResult& gemm = run("stage0_ddp", N, prec, "cuda");
    const RunResult& flash = run("stage0_ddp", N, prec, "cuda", " --attention flash");
    ASSERT_EQ(gemm.exit_code, 0) << gemm.output;
    ASSERT_EQ(flash.exit_code, 0) << flash.output;
    ASSERT_EQ(flash.report["attention"].str, "flash");
    const uint64_t a_gemm = gemm.report["ranks"][size_t(0)]["ledger"]["device"]["peak"]["activations"].u();
    const uint64_t a_flash = flash.report["ranks"][size_t(0)]["ledger"]["device"]["peak"]["activations"].u();
    EXPECT_EQ(a_gemm, nz::expected_activation_bytes(tiny, B, T, dt, false, nz::Attention::Gemm));
    EXPECT_EQ(a_flash, nz::expected_activation_bytes(tiny, B, T, dt, false, nz::Attention::Flash));
    EXPECT_EQ(flash.report["formula"]["activations"].u(), a_flash);
    auto r64 = [](uint64_t n) { return (n + 63) / 64 * 64; };
    const uint64_t rows = uint64_t(B) * tiny.heads * T;
    EXPECT_EQ(a_gemm - a_flash, uint64_t(tiny.layers) * (r64(rows * T * nz::dtype_bytes(dt)) - r64(rows * 4)));
    const double dl = max_abs_diff(step_values(gemm.report, "loss"), step_values(flash.report, "loss"));
    printf("NZTABLE flash-attention stage0_ddp N=%d %s: activations %llu -> %llu bytes, max|dloss| %.2g vs gemm "
           "(bound %.0e)\n", N, prec, (unsigned long long)a_gemm, (unsigned long long)a_flash, dl, stage_bound(prec).loss);
    EXPECT_EQ(step_values(flash.report, "loss").size(), step_values(gemm.report, "loss").size());
    EXPECT_LE(dl, stage_bound(prec).loss);
  }
}

// --batch auto with flash attention fits the batch by the flash formula: a budget between the two
// formulas' peaks at the same batch takes one sequence more than gemm's, and the ledger's peak is the
// prediction (zero_formulas.h expected_device_peak, Attention::Flash) to the byte.
TEST_F(CudaStages, FlashAttentionBatchAutoFitsByTheLogSumExpFormula) {
  nz::GPTConfig tiny;
  ASSERT_TRUE(nz::preset_config("tiny", &tiny));
  const nz::Layout L = nz::make_layout(tiny, 1);
  const int T = 32;
  const uint64_t budget = 1500000;  // 1500KB: gemm fits 3 sequences, flash 4 (zero_estimate --fit)
  std::map<std::string, int> fitted;
  for (const char* a : {"gemm", "flash"}) {
    SCOPED_TRACE(a);
    const nz::Attention attn = std::string(a) == "flash" ? nz::Attention::Flash : nz::Attention::Gemm;
    const RunResult& r = run_cached_any_gpus("stage0_ddp", 1, "cuda",
                                             "--preset tiny --seq 32 --steps 1 --eval-every 0 --eval-windows 1 "
                                             "--batch auto --memory-budget 1500KB --attention " + std::string(a), a);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const int B = int(r.report["batch"].u());
    EXPECT_EQ(B, nz::largest_fitting_batch(nz::Stage::DDP, L, T, nz::DType::F32, false, budget, 1 << 16, attn));
    EXPECT_EQ(r.report["ranks"][size_t(0)]["ledger"]["device"]["peak"]["total"].u(),
              nz::expected_device_peak(nz::Stage::DDP, L, B, T, nz::DType::F32, false, attn));
    fitted[a] = B;
  }
  printf("NZTABLE flash-attention batch auto stage0_ddp 1500KB: micro-batch %d (gemm) -> %d (flash)\n", fitted["gemm"],
         fitted["flash"]);
  EXPECT_GT(fitted["flash"], fitted["gemm"]);
}

// The pipeline on the GPU: P = 2 segments on 2 ranks (D = 1), K = --accum 2 micro-batches, whose
// activations, their gradients and the tied embedding (d wte forward, the fresh wte back) cross by
// the device path: NCCL send/recv in groups with one GPU per rank, pinned host copies over MPI when the
// ranks share one. No sum crosses ranks (D = 1), and point to point only moves bits, so either path
// must be stage0_ddp on 1 rank with --accum 2 on the GPU bit for bit: every step's loss and norm, and
// the model file (both schedules, fp32 and bf16: one run each). Its memory ledger's model state and
// its comm counts per step (the p2p op) are the CPU pipeline's.
TEST_F(CudaStages, PipelineEqualsStage0BitForBitAndCountsAsOnTheCpu) {
  for (const auto& [prec, schedule] : {std::pair<std::string, std::string>{"fp32", "gpipe"}, {"bf16", "1f1b"}}) {
    SCOPED_TRACE(prec + " " + schedule);
    const std::string pipe = " --pipeline 2 --schedule " + schedule;
    const RunResult& ref = run("stage0_ddp", 1, prec, "cuda");
    const RunResult& gpu = run("pipeline", 2, prec, "cuda", pipe);
    const RunResult& cpu = run("pipeline", 2, prec, "cpu", pipe);
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
    ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
    ASSERT_EQ(gpu.report["device"].str, "cuda");
    const Verdict v = compare_runs(ref, gpu);
    printf("NZTABLE pipeline P=2 %s %s %-4s vs stage0_ddp --accum 2 on 1 rank: %s\n", schedule.c_str(), prec.c_str(),
           gpu.report["collectives"].str.c_str(), v.identical() ? "bitwise" : v.str().c_str());
    EXPECT_TRUE(v.identical()) << v.str();
    for (int r = 0; r < 2; r++)
      for (const char* loc : {"device", "host"})
        for (const char* cat : kCategories)
          EXPECT_EQ(gpu.report["ranks"][size_t(r)]["ledger"][loc]["peak"][cat].u(),
                    cpu.report["ranks"][size_t(r)]["ledger"][loc]["peak"][cat].u())
              << "rank " << r << " " << loc << " " << cat;
    for (int r = 0; r < 2; r++) {  // every rank's sends and receives over the whole run, the p2p op
      const Json &g = gpu.report["ranks"][size_t(r)]["comm"]["p2p"], &c = cpu.report["ranks"][size_t(r)]["comm"]["p2p"];
      EXPECT_GT(g["calls"].u(), 0u) << "rank " << r;
      for (const char* k : {"calls", "elems_sent", "bytes_sent", "bytes_recv"})
        EXPECT_EQ(g[k].u(), c[k].u()) << "rank " << r << " " << k;
    }
    const Json &gs = gpu.report["steps_log"], &cs = cpu.report["steps_log"];
    ASSERT_EQ(gs.size(), cs.size());
    for (size_t i = 0; i < gs.size(); i++)
      for (const char* k : {"comm_elems", "comm_bytes"}) EXPECT_EQ(gs[i][k].u(), cs[i][k].u()) << "step " << i + 1 << " " << k;
    EXPECT_GT(gs[size_t(0)]["comm_elems"].u(), 0u);  // the activations were counted at all
  }
}

// Rank r's peak bytes per category, on the device and the host, in the GPU run's ledger equal the
// CPU run's; returns how many differ.
static int ledger_differences(const RunResult& gpu, const RunResult& cpu, int r) {
  int differ = 0;
  for (const char* loc : {"device", "host"})
    for (const char* cat : kCategories) {
      const uint64_t gb = gpu.report["ranks"][size_t(r)]["ledger"][loc]["peak"][cat].u();
      const uint64_t cb = cpu.report["ranks"][size_t(r)]["ledger"][loc]["peak"][cat].u();
      EXPECT_EQ(gb, cb) << "rank " << r << " " << loc << " " << cat;
      differ += gb != cb;
    }
  return differ;
}

// Every step's comm_elems and comm_bytes in the GPU run's log equal the CPU run's (the same
// collectives, whatever moves them); returns how many differ.
static int step_comm_differences(const RunResult& gpu, const RunResult& cpu) {
  const Json &gs = gpu.report["steps_log"], &cs = cpu.report["steps_log"];
  EXPECT_EQ(gs.size(), cs.size());
  int differ = 0;
  for (size_t i = 0; i < std::min(gs.size(), cs.size()); i++)
    for (const char* k : {"comm_elems", "comm_bytes"}) {
      EXPECT_EQ(gs[i][k].u(), cs[i][k].u()) << "step " << i + 1 << " " << k;
      differ += gs[i][k].u() != cs[i][k].u();
    }
  return differ;
}

// Ulysses on the GPU: S = 2 (and 4) slices of every sequence on S ranks (D = 1 replica), so the run
// is stage0_ddp on one rank with every sequence cut in S: each rank runs its T/S tokens, the two
// all-to-alls around attention exchange q, k, v and the output (and their gradients) on the device,
// NCCL's grouped sends and receives with one GPU per rank, pinned host copies over MPI when the
// ranks share one. With --kernels reference every kernel computes a token's outputs from its own
// row (attention: from its own head over all T tokens) in a fixed order, so every token's loss is
// the same bits as stage0_ddp's, and the step-1 loss is the same n = B T K token losses added in
// double in two orders: within 2 gamma_{n-1} + 2u of each other, relative (tests/ulysses/
// test_ulysses.cpp derives it). The weight gradients sum each slice's rows first: the later steps
// and the model within the stage bound of a change of summation order. The memory ledger's model
// state and activations, and the comm counts per step (the all-to-alls'), are the CPU run's.
TEST_F(CudaStages, UlyssesEqualsStage0WithinTheBoundsAndCountsAsOnTheCpu) {
  const std::string prec = "fp32", ref_kernels = " --kernels reference";
  const RunResult& ddp = run("stage0_ddp", 1, prec, "cuda", ref_kernels);
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  // S = 4 (one head a rank) once: on the emulator's second pass (NZ_EMU_GPUS=2) its 4 ranks would
  // share the 2 GPUs, the MPI path again
  for (int S : {2, 4}) {
    if (S == 4 && getenv("NZ_EMU_GPUS")) continue;
    SCOPED_TRACE("S=" + std::to_string(S));
    const std::string sp = " --sp " + std::to_string(S);
    const RunResult& gpu = run("ulysses", S, prec, "cuda", ref_kernels + sp);
    const RunResult& cpu = run("ulysses", S, prec, "cpu", ref_kernels + sp);
    ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
    ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
    ASSERT_EQ(gpu.report["device"].str, "cuda");
    const Verdict v = compare_runs(ddp, gpu);
    const Bound b = stage_bound(prec);
    const double l0 = step_values(ddp.report, "loss")[0], l1 = step_values(gpu.report, "loss")[0];
    const double n = 2.0 * (kQuick ? 16 : 32) * 2, u = std::ldexp(1.0, -53), g = (n - 1) * u / (1 - (n - 1) * u);
    const double step1_bound = (2 * g + 2 * u) * std::max(l0, l1) * (1 + 4 * u);
    printf("NZTABLE ulysses S=%d N=%d %s %-4s vs stage0_ddp on 1 rank (--kernels reference): step-1 |dloss| %.2g "
           "(bound %.2g), max|dloss| %.2g max|dparam| %.2g (bound %.0e, %.0e)\n", S, S, prec.c_str(),
           gpu.report["collectives"].str.c_str(), std::fabs(l0 - l1), step1_bound, v.loss_diff, v.param_diff, b.loss,
           b.param);
    EXPECT_LE(std::fabs(l0 - l1), step1_bound);
    EXPECT_LE(v.loss_diff, b.loss);
    EXPECT_LE(v.param_diff, b.param);
    EXPECT_EQ(step_values(gpu.report, "loss").size(), step_values(ddp.report, "loss").size());
    // the ledger and the comm counts: the CPU run's
    int differ = 0;
    for (int r = 0; r < S; r++) {
      differ += ledger_differences(gpu, cpu, r);
      const Json &ga = gpu.report["ranks"][size_t(r)]["comm"]["all_to_all"];
      const Json &ca = cpu.report["ranks"][size_t(r)]["comm"]["all_to_all"];
      EXPECT_GT(ga["calls"].u(), 0u) << "rank " << r;
      for (const char* k : {"calls", "elems_sent", "bytes_sent", "bytes_recv"}) {
        EXPECT_EQ(ga[k].u(), ca[k].u()) << "rank " << r << " all_to_all " << k;
        differ += ga[k].u() != ca[k].u();
      }
    }
    differ += step_comm_differences(gpu, cpu);
    const double dl = max_abs_diff(step_values(gpu.report, "loss"), step_values(cpu.report, "loss"));
    printf("NZTABLE ulysses S=%d N=%d %s: ledger and comm counts %s; max|dloss| %.2g vs the CPU run (bound %.0e)\n",
           S, S, prec.c_str(), differ ? "DIFFER from the CPU run's" : "identical to the CPU run's", dl,
           cpu_gpu_loss_bound(prec));
    EXPECT_LE(dl, cpu_gpu_loss_bound(prec));
  }
}

// What ulysses does not run on the GPU: ring attention (its tiles are host loops, ulysses/ring.cpp)
// and flash attention (sequence slices keep the probabilities). Each is one line and exit 2 with
// --device cuda; with --device auto the ring mode runs on the CPU, a GPU visible or not.
TEST_F(CudaStages, UlyssesRingAndFlashStayOffTheGpu) {
  const std::pair<std::string, std::string> refused[] = {
      {"--sp-mode ring --device cuda", "--sp-mode ring --device cuda: ring attention runs on the CPU backend only"},
      {"--attention flash --device cuda", "--attention flash with ulysses on the GPU: not built"}};
  for (const auto& [flags, says] : refused) {
    const RunResult r = run_trainer("ulysses", 2, kFlags + "--sp 2 " + flags, "refused");
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << flags << ": " << r.output;
    size_t lines = 0;
    for (char ch : r.output) lines += ch == '\n';
    EXPECT_EQ(lines, 1u) << flags << ": " << r.output;
  }
  const RunResult ring = run_trainer("ulysses", 2, kFlags + "--sp 2 --sp-mode ring --device auto --steps 1", "ring_auto");
  ASSERT_EQ(ring.exit_code, 0) << ring.output;
  EXPECT_EQ(ring.report["device"].str, "cpu");
}

// The tensor rung on the GPU: its pieces' products, the vocabulary's lookup and the cross-entropy's
// per-row numbers as device kernels, the all-reduces of its groups on device memory (a group's
// collectives take the world's path, comm.h: with a GPU a rank, NCCL on a communicator of the
// group's own; ranks sharing a GPU, MPI through pinned host copies, in rank order). What must hold:
//   - T = 2 on 2 ranks (D = 1) against stage0_ddp on one rank on the GPU (fp32): every step's loss and
//     norm within the tensor suite's derived relative bound (tests/tensor/test_tensor.cpp,
//     Stage0DdpWithinTheDerivedBound): (4L + 2) γ_V (1 + s lr 0.5 √Ψ) at step s, u = 2^-24, the
//     row-parallel sums' change of order;
//   - against its own CPU run, that one in fp32, and 3D with sequence parallelism in bf16 (T = 2,
//     P = 2 on 4 ranks: the segments' sends, the rows' reduce-scatters and all-gathers, on one GPU
//     and, on the emulator's second pass, with a GPU each; and P = 2 on 2 ranks with a GPU each: the
//     sends and the model file on NCCL): the losses
//     within the CPU-vs-GPU bound above (the kernels differ in summation order, fused multiply-adds
//     and the device math library), and the memory ledger's model state and activations and the comm
//     counts (every collective and the sends, every step) the CPU run's exactly;
//   - on NCCL, nothing goes through host memory: no rank's ledger holds host scratch (the MPI path's
//     pinned staging buffer), so the tensor and data-parallel groups ran on NCCL too.
static void expect_nothing_through_host_memory_on_nccl(const RunResult& gpu) {
  if (gpu.report["collectives"].str != "nccl") return;
  for (size_t r = 0; r < gpu.report["ranks"].size(); r++)
    EXPECT_EQ(gpu.report["ranks"][r]["ledger"]["host"]["peak"]["scratch"].u(), 0u)
        << "rank " << r << ": a collective went through host memory on the NCCL path";
}

TEST_F(CudaStages, TensorEqualsStage0WithinTheBoundAndCountsAsOnTheCpu) {
  {
    const RunResult& ddp = run("stage0_ddp", 1, "fp32", "cuda");
    const RunResult& gpu = run("tensor", 2, "fp32", "cuda", " --tensor 2");
    ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
    ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
    ASSERT_EQ(gpu.report["device"].str, "cuda");
    expect_nothing_through_host_memory_on_nccl(gpu);
    nz::GPTConfig c;
    ASSERT_TRUE(nz::preset_config("tiny", &c));
    const double worst = expect_tensor_within_ddp_bound(c, ddp.report, gpu.report, "tensor T=2 (GPU)");
    printf("NZTABLE tensor T=2 N=2 fp32 %-4s vs stage0_ddp on 1 rank: largest relative |dloss|, |dnorm| %.3g of "
           "the derived bound\n", gpu.report["collectives"].str.c_str(), worst);
  }
  struct Case {
    std::string prec, flags;
    int N;
  };
  const bool gpu_each = getenv("NZ_EMU_GPUS") || nz::cuda_rt::device_count() >= 2;  // 2 ranks: NCCL
  for (const Case& k : {Case{"fp32", " --tensor 2", 2}, Case{"bf16", " --tensor 2 --pipeline 2 --sequence-parallel", 4},
                        Case{"bf16", " --pipeline 2", 2}}) {
    // 3D with sequence parallelism: on the emulator's first pass its 4 ranks share one GPU (the MPI
    // path), on the second (NZ_EMU_GPUS set) each has one of 4 (NCCL: the tensor and data-parallel
    // groups on communicators of their own); 3D's sends and its model file on NCCL where 2 ranks
    // have a GPU each
    if (k.flags == " --pipeline 2" && !gpu_each) continue;
    SCOPED_TRACE(k.prec + k.flags);
    const char* emu_gpus = getenv("NZ_EMU_GPUS");
    const std::string saved = emu_gpus ? emu_gpus : "";
    if (k.N == 4 && emu_gpus) setenv("NZ_EMU_GPUS", "4", 1);
    const RunResult& gpu = run("tensor", k.N, k.prec, "cuda", k.flags);
    if (k.N == 4 && emu_gpus) setenv("NZ_EMU_GPUS", saved.c_str(), 1);
    const RunResult& cpu = run("tensor", k.N, k.prec, "cpu", k.flags);
    ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
    ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
    ASSERT_EQ(gpu.report["device"].str, "cuda");
    ASSERT_EQ(cpu.report["device"].str, "cpu");
    expect_nothing_through_host_memory_on_nccl(gpu);
    int differ = 0;
    for (int r = 0; r < k.N; r++) {
      differ += ledger_differences(gpu, cpu, r);
      for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "p2p"}) {
        const Json &g = gpu.report["ranks"][size_t(r)]["comm"][op], &c = cpu.report["ranks"][size_t(r)]["comm"][op];
        for (const char* key : {"calls", "elems_sent", "bytes_sent", "bytes_recv"}) {
          EXPECT_EQ(g[key].u(), c[key].u()) << "rank " << r << " " << op << " " << key;
          differ += g[key].u() != c[key].u();
        }
      }
      EXPECT_GT(gpu.report["ranks"][size_t(r)]["comm"]["all_reduce"]["calls"].u(), 0u) << "rank " << r;
    }
    differ += step_comm_differences(gpu, cpu);
    const double dl = max_abs_diff(step_values(gpu.report, "loss"), step_values(cpu.report, "loss"));
    printf("NZTABLE tensor%s N=%d %s %-4s: ledger and comm counts %s; max|dloss| %.2g vs the CPU run (bound %.0e)\n",
           k.flags.c_str(), k.N, k.prec.c_str(), gpu.report["collectives"].str.c_str(), differ ? "DIFFER from the CPU run's" : "identical to the CPU run's",
           dl, cpu_gpu_loss_bound(k.prec));
    EXPECT_LE(dl, cpu_gpu_loss_bound(k.prec));
  }
}

// What tensor does not run on the GPU: --attention flash (each rank keeps its heads' attention
// probabilities): one line and exit 2 with --device cuda.
TEST_F(CudaStages, TensorFlashAttentionStaysOffTheGpu) {
  const RunResult r = run_trainer("tensor", 2, kFlags + "--tensor 2 --attention flash --device cuda", "refused");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--attention flash with tensor on the GPU: not built"), std::string::npos) << r.output;
  size_t lines = 0;
  for (char ch : r.output) lines += ch == '\n';
  EXPECT_EQ(lines, 1u) << r.output;
}

TEST_F(CudaStages, GpuTrainsTheCpuModel) {
  for (const char* prec : {"fp32", "bf16"}) {
    for (int N : {1, 2}) {
      const RunResult& gpu = run("stage0_ddp", N, prec, "cuda");
      const RunResult& cpu = run("stage0_ddp", N, prec, "cpu");
      ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
      ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
      const double dl = max_abs_diff(step_values(gpu.report, "loss"), step_values(cpu.report, "loss"));
      printf("NZTABLE cpu-vs-gpu stage0_ddp N=%d %s: max|dloss| %.2g over %zu steps (bound %.0e)\n", N, prec, dl,
             step_values(gpu.report, "loss").size(), cpu_gpu_loss_bound(prec));
      EXPECT_LE(dl, cpu_gpu_loss_bound(prec)) << prec << " N=" << N;
    }
  }
}
