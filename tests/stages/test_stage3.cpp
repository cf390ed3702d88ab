// test_stage3.cpp — ZeRO stage 3 against plain data parallelism, run under mpirun as a learner
// runs it. What must hold:
//   - the contract (harness.h): every step's loss and grad norm, and the saved model, are bit for
//     bit stage0_ddp's at accum 1 and stage2's at accum 3 (both reduce every micro-step), with
//     step 1's gradient norm within the derived cross-group bound of stage0_ddp's; N = 1..4 ranks
//     (3 pads the units), clipping active, prefetch on and off; bf16 over 20 steps and fp16
//     (loss-scaled) over 12 the same way;
//   - each rank's ledger holds its shards only (formulas written out below, to the byte), the
//     gathered-parameter peak is the bound derived below, and nothing is full-model-sized;
//   - each rank sends 3K(N-1)S elements per step: 1.5K x stage0_ddp's 2(N-1)S;
//   - the ledger timeline shows the gather/release saw-tooth and no gathered unit outlives a step;
//   - deliberately broken copies of stage3 (tests/stages/stage3_mutants.mk) fail these same checks.
// Every check returns the problems it finds, so the mutants can be asked which checks see them.
#include <gtest/gtest.h>

#include <map>

#include "harness.h"

using namespace nzt;

namespace {

// The tiny model's grad norm is 1.2 .. 2.6 over these runs: a clip of 0.5 acts on every step.
const std::string kClipText = "0.5";
const double kClip = std::stod(kClipText);
const std::string kFlags =
    "--preset tiny --seq 32 --batch 2 --lr 3e-3 --warmup 2 --eval-every 0 --eval-windows 4 --clip " + kClipText + " ";
// kSteps >= 2: the ledger timeline records steps 0 and 1
const int kSteps = 6, kBf16Steps = 20, kFp16Steps = 12;

// One run per (trainer, ranks, accum, precision, extra flags), shared by the tests below.
const RunResult& run(const std::string& trainer, int N, int accum, const std::string& prec = "fp32",
                     const std::string& extra = "") {
  const int steps = prec == "fp32" ? kSteps : prec == "fp16" ? kFp16Steps : kBf16Steps;
  std::string flags = kFlags + "--steps " + std::to_string(steps) + " --accum " + std::to_string(accum) +
                      " --precision " + prec + fp16_flags(prec, accum) + " " + extra;
  return run_cached(trainer, N, flags, prec);
}

using Problems = std::vector<std::string>;
std::string join(const Problems& p) {
  std::string s;
  for (const std::string& x : p) s += "\n  " + x;
  return s;
}
template <class... A>
std::string fmt(const char* f, A... a) {
  char s[400];
  snprintf(s, sizeof s, f, a...);
  return s;
}

// The most gathered-parameter bytes alive at once. Every unit is gathered into a buffer of its own
// padded size. Per micro-step the gathers come in the order
//     embed, block 1, ..., block L, lnf, embed (LM head), lnf, block L, ..., block 1
// (the embedding's backward needs no parameters). With prefetch, the next unit of that order is
// gathered while the current one computes, and the current one is released after: two neighbours
// of the order are alive at once, never more, and nothing is prefetched across micro-steps. The
// neighbours are the pairs (u, u+1) and (lnf, embed): the units adjacent on the cycle embed ->
// block 1 -> ... -> lnf -> embed. So the peak is e * max over that cycle of (unit + next unit),
// which is 2eU when two equal blocks are the largest units, less otherwise (one layer).
// Without prefetch one unit is alive at a time: eU.
uint64_t gathered_peak_bound(const Sizes& z, uint64_t e, bool prefetch) {
  if (!prefetch) return e * z.U;
  uint64_t m = 0;
  for (int u = 0; u < z.units(); u++) m = std::max(m, z.padded[u] + z.padded[(u + 1) % z.units()]);
  return e * m;
}

// ---- the checks ----

// The contract (harness.h): bit for bit stage0_ddp at accum 1 (every step's loss and grad norm, ==
// on doubles: the report keeps %.17g, and the model file's bytes); at accum K > 1 bit for bit
// stage2 (the same sums in the same order) and step 1's gradient norm within the derived bound of
// stage0_ddp's. *summary: what was compared, with the differences.
Problems check_contract(const std::string& trainer, const RunResult& r, int N, int K, const std::string& prec,
                        std::string* summary) {
  static std::map<std::string, std::vector<double>> micro;  // micro-batch norms per (N, K, precision)
  const std::string key = std::to_string(N) + " " + std::to_string(K) + " " + prec;
  const int steps = prec == "fp32" ? kSteps : prec == "fp16" ? kFp16Steps : kBf16Steps;
  const std::string flags = kFlags + "--steps " + std::to_string(steps) + " --precision " + prec + fp16_flags(prec, K);
  if (K > 1 && !micro.count(key)) micro[key] = micro_batch_norms(flags, N, K, "stage3_" + prec);
  return contract_problems(trainer, r, N, K, prec, run("stage0_ddp", N, K, prec), "stage2",
                           K > 1 ? &run("stage2", N, K, prec) : nullptr, K > 1 ? &micro[key] : nullptr, summary);
}

// Per rank, to the byte. e = bytes per stored element, S = padded shard (P / N), U = largest unit:
//   params eS, grads eS, master 4S (bf16 only), adam_m 4S, adam_v 4S: 16S in all either way
//   (fp32: 4S + 4S + 8S; bf16: 2S + 2S + 4S + 8S); one gradient bucket eU; gathered: the bound
//   above. For N >= 2 no model-state category reaches a full model's worth of itself (eP for
//   params, grads, gathered units, buckets, scratch; 4P for master and moments): in fp32, < eP.
//   (Activations are not model state: they are the same in every stage.)
Problems check_ledger(const RunResult& r, int N, const std::string& prec, bool prefetch) {
  Problems p;
  const Sizes z = sizes_from_units(r.report, N);
  const uint64_t e = prec == "fp32" ? 4 : 2, P = z.P, S = z.S;
  const std::map<std::string, uint64_t> want = {
      {"params", e * S},  {"grads", e * S},        {"master", e == 2 ? 4 * S : 0},
      {"adam_m", 4 * S},  {"adam_v", 4 * S},       {"comm_buffers", e * z.U},
      {"gathered", gathered_peak_bound(z, e, prefetch)}};
  if (want.at("params") + want.at("grads") + want.at("master") + want.at("adam_m") + want.at("adam_v") != 16 * S)
    p.push_back("the written-out formulas do not add up to 16S");
  const std::map<std::string, uint64_t> full = {{"params", e * P}, {"grads", e * P},       {"master", 4 * P},
                                                {"adam_m", 4 * P}, {"adam_v", 4 * P},      {"comm_buffers", e * P},
                                                {"gathered", e * P}, {"scratch", e * P}};
  if (r.report["ranks"].size() != size_t(N)) p.push_back("report has the wrong number of ranks");
  for (const Json& rank : r.report["ranks"].arr) {
    const Json& led = rank["ledger"];
    const unsigned long long rk = rank["rank"].u();
    for (auto& [cat, bytes] : want) {
      const uint64_t peak = led["device"]["peak"][cat].u() + led["host"]["peak"][cat].u();
      if (peak != bytes) p.push_back(fmt("rank %llu: %s peak %llu bytes, formula %llu", rk, cat.c_str(),
                                         (unsigned long long)peak, (unsigned long long)bytes));
    }
    for (auto& [cat, bytes] : full) {
      const uint64_t peak = led["device"]["peak"][cat].u() + led["host"]["peak"][cat].u();
      if (N >= 2 && peak >= bytes)
        p.push_back(fmt("rank %llu: %s peak %llu bytes is a full model's worth (%llu)", rk, cat.c_str(),
                        (unsigned long long)peak, (unsigned long long)bytes));
    }
  }
  // With prefetch the trainer's own formula (zero_formulas.cpp) must be the bound derived here.
  for (auto& [cat, bytes] : want)
    if ((prefetch || cat != "gathered") && r.report["formula"][cat].u() != bytes)
      p.push_back(fmt("zero_formulas.cpp says %s = %llu, the test derives %llu", cat.c_str(),
                      (unsigned long long)r.report["formula"][cat].u(), (unsigned long long)bytes));
  return p;
}

// Elements each rank sends per step with K micro-steps: all-gathers of 2P per micro-step (forward
// P + embed, backward P - embed) and reduce-scatters of P, each sending (N-1)/N of it: 3K(N-1)S.
// The reduce-scatters alone are K(N-1)S per step in M calls per micro-step (the run's totals hold
// nothing else: validation and the model file only gather).
Problems check_comm(const RunResult& r, int N, int K) {
  Problems p;
  const Sizes z = sizes_from_units(r.report, N);
  const uint64_t n1 = N - 1, S = z.S, per_step = 3 * K * n1 * S;
  if (r.report["formula"]["comm_elems_per_step"].u() != per_step)
    p.push_back(fmt("zero_formulas.cpp says %llu elements per step, the test %llu",
                    (unsigned long long)r.report["formula"]["comm_elems_per_step"].u(), (unsigned long long)per_step));
  for (const Json& s : r.report["steps_log"].arr)
    if (s["comm_elems"].u() != per_step)
      p.push_back(fmt("step %llu sent %llu elements, formula 3K(N-1)S = %llu", s["step"].u(), s["comm_elems"].u(),
                      (unsigned long long)per_step));
  for (const Json& rank : r.report["ranks"].arr) {
    const Json& c = rank["comm"];
    const unsigned long long rk = rank["rank"].u();
    if (c["reduce_scatter"]["elems_sent"].u() != kSteps * K * n1 * S ||
        c["reduce_scatter"]["calls"].u() != uint64_t(kSteps * K * z.units()))
      p.push_back(fmt("rank %llu: reduce-scatters sent %llu elements in %llu calls, formula %llu in %d", rk,
                      c["reduce_scatter"]["elems_sent"].u(), c["reduce_scatter"]["calls"].u(),
                      (unsigned long long)(kSteps * K * n1 * S), kSteps * K * z.units()));
    if (c["all_reduce"]["elems_sent"].u() != 0) p.push_back(fmt("rank %llu: all-reduce used", rk));
  }
  return p;
}

// The gather/release saw-tooth, from each rank's ledger timeline (recorded for steps 0 and 1):
//   - at most two gathered units alive at any moment (one without prefetch), and with prefetch
//     two really are alive at some moment;
//   - the gathered bytes are back to 0 at the end of each recorded step, and at the end of the run;
//   - step 1 allocates M + 1 (forward, the embedding twice) + M - 1 (backward) = 2M gather buffers
//     per micro-step, M units;
//   - the bytes go up and down: local maxima (an allocation followed by a release) number 2M per
//     micro-step without prefetch; with prefetch 2M - 1, since the forward's first gather is
//     followed by the prefetch of block 1 before any release.
Problems check_timeline(const RunResult& r, int N, int K, bool prefetch) {
  Problems p;
  const int M = sizes_from_units(r.report, N).units();
  for (const Json& rank : r.report["ranks"].arr) {
    const unsigned long long rk = rank["rank"].u();
    const Json& led = rank["ledger"];
    const uint64_t left = led["device"]["current"]["gathered"].u() + led["host"]["current"]["gathered"].u();
    if (left != 0) p.push_back(fmt("rank %llu: %llu gathered bytes still alive at the end of the run", rk,
                                   (unsigned long long)left));
    std::vector<const Json*> ev;  // the gathered-parameter events, in order
    for (const Json& e : led["timeline"].arr)
      if (e["category"].str == "gathered") ev.push_back(&e);
    int64_t bytes = 0;
    int alive = 0, max_alive = 0;
    std::map<int, int64_t> at_end;  // step -> gathered bytes after its last event
    for (const Json* e : ev) {
      bytes += int64_t(std::llround((*e)["delta"].d()));
      alive += (*e)["delta"].d() > 0 ? 1 : -1;
      max_alive = std::max(max_alive, alive);
      at_end[int(std::llround((*e)["step"].d()))] = bytes;
    }
    const int max_allowed = prefetch ? 2 : 1;
    if (max_alive > max_allowed || (prefetch && max_alive < 2))
      p.push_back(fmt("rank %llu: %d gathered units alive at once, expected %d", rk, max_alive, max_allowed));
    for (int s : {0, 1}) {
      if (!at_end.count(s)) p.push_back(fmt("rank %llu: no gathers recorded in step %d", rk, s));
      else if (at_end[s] != 0)
        p.push_back(fmt("rank %llu: %lld gathered bytes alive at the end of step %d", rk, (long long)at_end[s], s));
    }
    std::vector<double> d;  // step 1's deltas
    for (const Json* e : ev)
      if (std::llround((*e)["step"].d()) == 1) d.push_back((*e)["delta"].d());
    int allocs = 0, maxima = 0;
    for (size_t i = 0; i < d.size(); i++) {
      allocs += d[i] > 0;
      maxima += d[i] > 0 && i + 1 < d.size() && d[i + 1] < 0;
    }
    if (allocs != K * 2 * M)
      p.push_back(fmt("rank %llu: step 1 allocated %d gather buffers, expected K * 2M = %d", rk, allocs, K * 2 * M));
    const int want_maxima = K * (prefetch ? 2 * M - 1 : 2 * M);
    if (maxima != want_maxima)
      p.push_back(fmt("rank %llu: step 1's gathered bytes have %d local maxima, expected %d", rk, maxima, want_maxima));
  }
  return p;
}

}  // namespace

// The headline: sharding the parameters changes where they live, not what they are.
TEST(Stage3, Fp32ContractForOneToFourRanksPrefetchOnAndOff) {
  for (int N : {1, 2, 3, 4}) {
    for (int K : {1, 3}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " accum=" + std::to_string(K));
      const RunResult& ref = run("stage0_ddp", N, K);
      ASSERT_EQ(ref.exit_code, 0) << ref.output;
      std::vector<double> norms = step_values(ref.report, "grad_norm");
      ASSERT_EQ(norms.size(), size_t(kSteps));
      int clipped = 0;
      for (double g : norms) clipped += g > kClip;
      ASSERT_GE(4 * clipped, 3 * kSteps) << "--clip " << kClip << " must act on most steps";
      for (int prefetch : {1, 0}) {
        const RunResult& r = run("stage3", N, K, "fp32", "--prefetch " + std::to_string(prefetch));
        ASSERT_EQ(r.exit_code, 0) << r.output;
        std::string summary;
        Problems pr = check_contract("stage3", r, N, K, "fp32", &summary);
        printf("fp32 stage3 N=%d accum=%d prefetch=%d (clipped %d/%d steps): %s\n", N, K, prefetch, clipped, kSteps,
               summary.c_str());
        EXPECT_TRUE(pr.empty()) << join(pr);
      }
      // prefetch only moves the gathers earlier: the same bits
      EXPECT_TRUE(same_model_bits(run("stage3", N, K, "fp32", "--prefetch 1").model_path,
                                  run("stage3", N, K, "fp32", "--prefetch 0").model_path));
    }
  }
}

// bf16: on the MPI path every reduction still adds in rank order and rounds to bf16 once per
// collective, and gathering a bf16 slice copies it bit for bit, so stage3 is bit for bit stage0_ddp
// at accum 1 and stage2 at accum 2, with the cross-group bound at the bf16 unit roundoff.
TEST(Stage3, Bf16ContractOverTwentySteps) {
  for (auto [N, K] : {std::pair{2, 1}, std::pair{3, 2}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " accum=" + std::to_string(K));
    const RunResult& r = run("stage3", N, K, "bf16");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_EQ(step_values(r.report, "loss").size(), size_t(kBf16Steps));
    std::string summary;
    Problems pr = check_contract("stage3", r, N, K, "bf16", &summary);
    printf("bf16 stage3 N=%d accum=%d, %d steps: %s\n", N, K, kBf16Steps, summary.c_str());
    EXPECT_TRUE(pr.empty()) << join(pr);
  }
}

// fp16: the same, with the loss scale (harness.h, fp16_flags): at accum 1 the skipped steps too.
TEST(Stage3, Fp16ContractOverTwelveSteps) {
  for (auto [N, K] : {std::pair{2, 1}, std::pair{3, 2}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " accum=" + std::to_string(K));
    const RunResult& r = run("stage3", N, K, "fp16");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_EQ(step_values(r.report, "loss").size(), size_t(kFp16Steps));
    std::string summary;
    Problems pr = check_contract("stage3", r, N, K, "fp16", &summary);
    printf("fp16 stage3 N=%d accum=%d, %d steps (%d skipped): %s\n", N, K, kFp16Steps, skipped_steps(r.report),
           summary.c_str());
    EXPECT_TRUE(pr.empty()) << join(pr);
  }
}

TEST(Stage3, LedgerHoldsOnlyShardsAndTheDerivedGatheredPeak) {
  struct Case { int N, K; const char* prec; int prefetch; };
  for (Case c : {Case{1, 1, "fp32", 1}, Case{2, 1, "fp32", 1}, Case{3, 1, "fp32", 1}, Case{4, 1, "fp32", 1},
                 Case{4, 3, "fp32", 0}, Case{2, 1, "bf16", 1}, Case{3, 2, "bf16", 1}}) {
    SCOPED_TRACE(std::string(c.prec) + " N=" + std::to_string(c.N) + " prefetch=" + std::to_string(c.prefetch));
    const RunResult& r =
        c.prec == std::string("fp32") ? run("stage3", c.N, c.K, "fp32", "--prefetch " + std::to_string(c.prefetch))
                                      : run("stage3", c.N, c.K, c.prec);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    Problems pr = check_ledger(r, c.N, c.prec, c.prefetch);
    EXPECT_TRUE(pr.empty()) << join(pr);
    const Sizes z = sizes_from_units(r.report, c.N);
    const uint64_t e = c.prec == std::string("fp32") ? 4 : 2;
    printf("%s N=%d prefetch=%d: model state %llu bytes per rank = 16S (stage0_ddp: 16P = %llu); gathered peak "
           "%llu = %s\n", c.prec, c.N, c.prefetch, (unsigned long long)(16 * z.S), (unsigned long long)(16 * z.P),
           (unsigned long long)gathered_peak_bound(z, e, c.prefetch), c.prefetch ? "2eU (two blocks)" : "eU");
  }
  // One layer: the largest neighbours are the embedding and the block, so the peak is below 2eU.
  const RunResult& one = run("stage3", 3, 1, "fp32", "--layers 1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const Sizes z = sizes_from_units(one.report, 3);
  ASSERT_EQ(z.units(), 3);
  EXPECT_EQ(gathered_peak_bound(z, 4, true), 4 * (z.padded[0] + z.padded[1]));
  EXPECT_LT(gathered_peak_bound(z, 4, true), 2 * 4 * z.U);
  Problems pr = check_ledger(one, 3, "fp32", true);
  EXPECT_TRUE(pr.empty()) << join(pr);
}

TEST(Stage3, SendsThreeKTimesNMinusOneTimesSPerStep) {
  for (int N : {1, 2, 3, 4}) {
    for (int K : {1, 2, 3}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " accum=" + std::to_string(K));
      const RunResult& ref = run("stage0_ddp", N, K);
      ASSERT_EQ(ref.exit_code, 0) << ref.output;
      for (int prefetch : {1, 0}) {
        if (K == 2 && prefetch == 0) continue;  // K = 2 for the formula; prefetch is covered at K = 1, 3
        const RunResult& r = run("stage3", N, K, "fp32", "--prefetch " + std::to_string(prefetch));
        ASSERT_EQ(r.exit_code, 0) << r.output;
        Problems pr = check_comm(r, N, K);
        EXPECT_TRUE(pr.empty()) << join(pr);
      }
      // 1.5K x stage0_ddp's 2(N-1)S, step by step (stage0_ddp sums micro-steps locally)
      const RunResult& r = run("stage3", N, K, "fp32", "--prefetch 1");
      const uint64_t S = sizes_from_units(r.report, N).S;
      ASSERT_EQ(r.report["steps_log"].size(), ref.report["steps_log"].size());
      for (size_t s = 0; s < r.report["steps_log"].size(); s++) {
        const uint64_t ddp = ref.report["steps_log"][s]["comm_elems"].u(), z3 = r.report["steps_log"][s]["comm_elems"].u();
        EXPECT_EQ(ddp, 2 * (N - 1) * S);
        EXPECT_EQ(2 * z3, 3 * K * ddp) << "stage3 sends 1.5K x stage0_ddp";
      }
      if (N == 4)
        printf("4 ranks, accum %d: stage0_ddp sends %llu elements per rank per step, stage3 %llu\n", K,
               ref.report["steps_log"][0]["comm_elems"].u(), r.report["steps_log"][0]["comm_elems"].u());
    }
  }
}

TEST(Stage3, TimelineShowsTheGatherReleaseSawTooth) {
  for (int N : {1, 2, 3, 4}) {
    for (int K : {1, 3}) {
      for (int prefetch : {1, 0}) {
        SCOPED_TRACE("N=" + std::to_string(N) + " accum=" + std::to_string(K) + " prefetch=" + std::to_string(prefetch));
        const RunResult& r = run("stage3", N, K, "fp32", "--prefetch " + std::to_string(prefetch));
        ASSERT_EQ(r.exit_code, 0) << r.output;
        Problems pr = check_timeline(r, N, K, prefetch);
        EXPECT_TRUE(pr.empty()) << join(pr);
      }
    }
  }
}

// The tests of the tests: each mutant (tests/stages/stage3_mutants.mk) still trains, and the checks
// above must see its bug. N = 3 (padding) and accum 3.
TEST(Stage3, BrokenStage3VariantsAreCaught) {
  const int N = 3, K = 3;
  struct Mutant {
    const char* name;
    bool equal, ledger, comm, timeline;  // which checks must report it (the others must not)
  };
  // keep_gathered and reuse_embedding train the right model: only the memory checks can see them.
  for (Mutant m : {Mutant{"keep_gathered", false, true, false, true},
                   Mutant{"reuse_embedding", false, true, true, true},
                   Mutant{"prefetch_across_steps", true, false, true, true}}) {
    const std::string mutant = std::string("mutant_stage3_") + m.name;
    SCOPED_TRACE(mutant);
    const RunResult& r = run(mutant, N, K);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::string summary;
    const Problems eq = check_contract(mutant, r, N, K, "fp32", &summary), led = check_ledger(r, N, "fp32", true),
                   comm = check_comm(r, N, K), tl = check_timeline(r, N, K, true);
    printf("%s:\n", mutant.c_str());
    for (auto [what, pr] : {std::pair{"contract", &eq}, {"ledger", &led}, {"comm", &comm}, {"timeline", &tl}})
      printf("  %-8s %s%s\n", what, pr->empty() ? "passes" : "FAILS: ", pr->empty() ? "" : (*pr)[0].c_str());
    EXPECT_EQ(eq.empty(), !m.equal) << "contract check:" << join(eq);
    EXPECT_EQ(led.empty(), !m.ledger) << "ledger check:" << join(led);
    EXPECT_EQ(comm.empty(), !m.comm) << "comm check:" << join(comm);
    EXPECT_EQ(tl.empty(), !m.timeline) << "timeline check:" << join(tl);
  }
}
