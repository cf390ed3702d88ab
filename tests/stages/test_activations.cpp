// test_activations.cpp — activation checkpointing and the activation formula. What must hold:
//   - the model (in process, CPU): with checkpointing every unit's gradient is the same bits as
//     without, in fp32, bf16 and fp64, and the ledger's activations peak drops to the formula's;
//   - the formula (zero_formulas.h, written out term by term) equals what the model allocates, for
//     every preset, several shapes, every precision, with and without checkpointing, with the gemm
//     attention's (B,NH,T,T) probabilities and with flash attention's (B,NH,T) fp32 log-sum-exp
//     (smaller by exactly the difference of those two terms per kept block);
//   - on the CPU --attention flash changes nothing: the softmax is kept, the gradients are the same;
//   - every stage in fp32 and in bf16, on 1 and on 3 ranks (3 pads the units), run as a learner
//     runs it (stage0_ddp and stage3 in all four combinations; stage1, stage2 and offload in fp32
//     on 3 ranks and bf16 on 1): with --activation-checkpointing every step's loss and grad norm
//     and the saved model are the bits of the run without it (stage0_ddp's: at accum 1 every stage
//     trains the same bits as stage0_ddp, docs/stages.md, "Exactly the same model", so one run without the
//     flag per precision and N serves every stage; stage3's own run without it is compared too, in
//     fp32 on 3 ranks, comm ledger and all);
//     each rank's activations peak is the formula (with and without), every other category's peak
//     is the stage's own formula (zero_formulas.h); the elements sent per step are unchanged and equal
//     expected_comm_elems (stage3: the recomputation runs on the parameters
//     its backward gathers, so nothing more is sent); the step log reports the recompute FLOPs.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "harness.h"
#include "ledger.h"
#include "mfu.h"            // recompute_flops_per_token
#include "model.h"
#include "runtime/rng.h"
#include "zero_formulas.h"  // expected_activation_bytes, expected_comm_elems

using namespace nz;
using namespace nzt;

namespace {

// One forward and backward of the whole model in storage type T; returns every unit's gradient
// bytes, and the ledger's activations peak of the model.
template <class T>
std::vector<char> gradients(const GPTConfig& c, DType dt, int B, int T_, bool ckpt, uint64_t* acts_peak) {
  Ledger::get().reset();
  Layout L = make_layout(c, 1);
  std::vector<char> grads(L.padded_total * sizeof(T));
  {
    GPT m(L, dt, B, T_, ckpt);
    std::vector<T> p(L.padded_total);
    std::vector<float> unit;
    Rng rng(5);
    for (int u = 0; u < L.num_units(); u++) {
      unit.resize(L.units[u].padded);
      init_unit(L, u, 11, unit.data());
      for (size_t i = 0; i < unit.size(); i++)  // layernorms and biases off their initial 1 and 0
        p[L.units[u].offset + i] = store<T>(double(unit[i]) + (i < L.units[u].numel ? 0.02 * rng.normal() : 0.0));
    }
    std::vector<int> tok(B * T_), tgt(B * T_);
    for (int i = 0; i < B * T_; i++) tok[i] = int(rng.next() % c.vocab), tgt[i] = int(rng.next() % c.vocab);
    m.set_batch(tok.data(), tgt.data(), B);
    for (int u = 0; u < L.num_units(); u++) m.forward(u, p.data() + L.units[u].offset);
    m.head_forward(p.data());
    m.head_backward(p.data());
    for (int u = L.num_units() - 1; u >= 0; u--)
      m.backward(u, p.data() + L.units[u].offset, grads.data() + L.units[u].offset * sizeof(T));
    *acts_peak = Ledger::get().peak(Category::Activations);
  }
  return grads;
}

}  // namespace

TEST(Checkpointing, ModelGradientsAreTheSameBitsInEveryPrecision) {
  const GPTConfig c{256, 16, 3, 24, 3};  // 3 blocks, width 24, 3 heads
  const int B = 2, T = 12;
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    uint64_t plain_peak = 0, ckpt_peak = 0;
    std::vector<char> plain, ckpt;
    if (dt == DType::F32) plain = gradients<float>(c, dt, B, T, false, &plain_peak), ckpt = gradients<float>(c, dt, B, T, true, &ckpt_peak);
    if (dt == DType::BF16) plain = gradients<bf16>(c, dt, B, T, false, &plain_peak), ckpt = gradients<bf16>(c, dt, B, T, true, &ckpt_peak);
    if (dt == DType::F64) plain = gradients<double>(c, dt, B, T, false, &plain_peak), ckpt = gradients<double>(c, dt, B, T, true, &ckpt_peak);
    ASSERT_EQ(plain.size(), ckpt.size());
    EXPECT_EQ(memcmp(plain.data(), ckpt.data(), plain.size()), 0) << "checkpointed gradients differ";
    size_t nonzero = 0;
    for (char x : plain) nonzero += x != 0;
    EXPECT_GT(nonzero, plain.size() / 2) << "the gradients compared are mostly zeros";
    EXPECT_EQ(plain_peak, expected_activation_bytes(c, B, T, dt, false));
    EXPECT_EQ(ckpt_peak, expected_activation_bytes(c, B, T, dt, true));
    EXPECT_LT(ckpt_peak, plain_peak);
  }
}

TEST(Checkpointing, FormulaEqualsWhatTheModelAllocates) {
  for (const char* name : {"tiny", "small", "gpt2"}) {
    GPTConfig c;
    ASSERT_TRUE(preset_config(name, &c));
    for (int B : {1, 3, 8})
      for (int T : {1, 7, 64, c.ctx})
        for (DType dt : {DType::F32, DType::BF16, DType::F64})
          for (bool ckpt : {false, true}) {
            if (T > c.ctx) continue;
            EXPECT_EQ(expected_activation_bytes(c, B, T, dt, ckpt), activation_bytes(c, B, T, dt, ckpt))
                << name << " B=" << B << " T=" << T << " " << dtype_name(dt) << " ckpt=" << ckpt;
            // flash attention: each kept block holds B*NH*T fp32 instead of B*NH*T*T elements
            const uint64_t flash = expected_activation_bytes(c, B, T, dt, ckpt, Attention::Flash);
            EXPECT_EQ(flash, activation_bytes(c, B, T, dt, ckpt, Attention::Flash))
                << name << " B=" << B << " T=" << T << " " << dtype_name(dt) << " ckpt=" << ckpt << " flash";
            auto r64 = [](uint64_t n) { return (n + 63) / 64 * 64; };
            const uint64_t blocks_kept = ckpt ? 1 : uint64_t(c.layers), rows = uint64_t(B) * c.heads * T;
            EXPECT_EQ(expected_activation_bytes(c, B, T, dt, ckpt) - flash,
                      blocks_kept * (r64(rows * T * dtype_bytes(dt)) - r64(rows * 4)))
                << name << " B=" << B << " T=" << T << " " << dtype_name(dt) << " ckpt=" << ckpt;
          }
    // checkpointing keeps one block's internals instead of L: the saving is (L-1) of them
    const int B = 4, T = std::min(64, c.ctx);
    const uint64_t one_block = expected_activation_bytes(GPTConfig{c.vocab, c.ctx, 1, c.dim, c.heads}, B, T,
                                                         DType::F32, false) -
                               expected_activation_bytes(GPTConfig{c.vocab, c.ctx, 1, c.dim, c.heads}, B, T,
                                                         DType::F32, true);
    EXPECT_EQ(one_block, 0u) << "one layer: nothing to save";
  }
}

// The CPU has no flash attention: with --attention flash chosen (the trainers call set_attention)
// the model still keeps the (B,NH,T,T) probabilities, and the ledger shows the gemm formula.
TEST(FlashAttention, TheCpuModelKeepsTheSoftmax) {
  const GPTConfig c{256, 16, 2, 24, 3};
  const int B = 2, T = 12;
  set_attention(Attention::Flash);
  uint64_t peak = 0;
  const std::vector<char> flash = gradients<float>(c, DType::F32, B, T, false, &peak);
  set_attention(Attention::Gemm);
  uint64_t gemm_peak = 0;
  const std::vector<char> gemm = gradients<float>(c, DType::F32, B, T, false, &gemm_peak);
  EXPECT_EQ(peak, expected_activation_bytes(c, B, T, DType::F32, false, Attention::Gemm));
  EXPECT_EQ(peak, gemm_peak);
  EXPECT_EQ(memcmp(flash.data(), gemm.data(), gemm.size()), 0) << "the CPU ran another attention";
}

// ---- every stage, run under mpirun ----

namespace {

const std::string kFlags = "--preset tiny --seq 32 --batch 2 --steps 2 --warmup 1 --eval-every 0 --eval-windows 1 ";

const RunResult& run(const std::string& trainer, int N, const std::string& prec, bool ckpt) {
  const std::string flags = kFlags + "--precision " + prec + (ckpt ? " --activation-checkpointing" : "");
  return run_cached(trainer, N, flags, prec + (ckpt ? "_ckpt" : ""));
}

// Every number under j, with its path: two comm ledgers compared whole.
std::string flatten(const Json& j, const std::string& path = "") {
  std::string s;
  if (j.kind == Json::Obj)
    for (auto& [k, v] : j.obj) s += flatten(v, path + "." + k);
  else if (j.kind == Json::Arr)
    for (size_t i = 0; i < j.arr.size(); i++) s += flatten(j.arr[i], path + "[" + std::to_string(i) + "]");
  else if (j.kind == Json::Num)
    s += path + "=" + std::to_string(j.num) + "\n";
  return s;
}

uint64_t peak_of(const Json& rank, const std::string& cat) {
  return rank["ledger"]["device"]["peak"][cat].u() + rank["ledger"]["host"]["peak"][cat].u();
}

}  // namespace

TEST(Checkpointing, EveryStageTrainsTheSameBitsWithLessActivationMemory) {
  GPTConfig tiny;
  preset_config("tiny", &tiny);
  const int B = 2, T = 32;
  for (const char* stage : all_stages()) {
    Stage st;
    ASSERT_TRUE(parse_stage(stage, &st));
    for (const char* prec : {"fp32", "bf16"}) {
      for (int N : {1, 3}) {
        const bool all_four = std::string(stage) == "stage0_ddp" || std::string(stage) == "stage3";
        if (!all_four && (std::string(prec) == "fp32") != (N == 3)) continue;  // fp32 on 3, bf16 on 1
        SCOPED_TRACE(std::string(stage) + " " + prec + " N=" + std::to_string(N));
        // stage3's own run without the flag too (its recomputation and its gathers share the parameters)
        const bool own_plain = std::string(stage) == "stage0_ddp" ||
                               (std::string(stage) == "stage3" && N == 3 && std::string(prec) == "fp32");
        const RunResult& plain = run(own_plain ? stage : "stage0_ddp", N, prec, false);
        const RunResult& ckpt = run(stage, N, prec, true);
        ASSERT_EQ(plain.exit_code, 0) << plain.output;
        ASSERT_EQ(ckpt.exit_code, 0) << ckpt.output;
        // the same training, bit for bit
        const Verdict v = compare_runs(plain, ckpt);
        EXPECT_TRUE(v.identical()) << v.str();
        // activations: the formula, with and without; everything else the stage's formula
        const DType dt = std::string(prec) == "fp32" ? DType::F32 : DType::BF16;
        const uint64_t want_plain = expected_activation_bytes(tiny, B, T, dt, false);
        const uint64_t want_ckpt = expected_activation_bytes(tiny, B, T, dt, true);
        const Layout L = make_layout(tiny, N);
        const StateBytes f = expected_state_bytes(st, L, dt);
        ASSERT_EQ(plain.report["ranks"].size(), size_t(N));
        ASSERT_EQ(ckpt.report["ranks"].size(), size_t(N));
        for (int r = 0; r < N; r++) {
          EXPECT_EQ(peak_of(plain.report["ranks"][r], "activations"), want_plain) << "rank " << r;
          EXPECT_EQ(peak_of(ckpt.report["ranks"][r], "activations"), want_ckpt) << "rank " << r;
          for (Category c : {Category::Params, Category::Grads, Category::Master, Category::AdamM, Category::AdamV,
                             Category::CommBuffers})
            EXPECT_EQ(peak_of(ckpt.report["ranks"][r], category_name(c)), f.of(c)) << "rank " << r << ": "
                                                                                     << category_name(c);
          EXPECT_LE(peak_of(ckpt.report["ranks"][r], "gathered"), f.gathered_peak) << "rank " << r;
          if (own_plain) {
            EXPECT_EQ(flatten(plain.report["ranks"][r]["comm"]), flatten(ckpt.report["ranks"][r]["comm"]))
                << "rank " << r << ": the comm ledger changed";
          }
        }
        // communication: per step, the formula without checkpointing (stage3's gathers serve the recompute)
        const uint64_t per_step = expected_comm_elems(st, L, 1);
        for (const Json& s : ckpt.report["steps_log"].arr) {
          EXPECT_EQ(s["comm_elems"].u(), per_step);
          // the step log: one more forward of every block for every token of the step, all ranks
          EXPECT_DOUBLE_EQ(s["recompute_flops"].d(), double(N) * B * T * recompute_flops_per_token(tiny, T));
        }
        for (const Json& s : plain.report["steps_log"].arr) EXPECT_EQ(s["recompute_flops"].d(), 0.0);
        EXPECT_TRUE(ckpt.report["activation_checkpointing"].b);
        if (N == 3 && std::string(stage) == "stage3")
          printf("stage3 %s, 3 ranks: activations %llu -> %llu bytes per rank, %llu elements sent per step either "
                 "way\n", prec, (unsigned long long)want_plain, (unsigned long long)want_ckpt,
                 (unsigned long long)per_step);
      }
    }
  }
}
