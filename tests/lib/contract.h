// contract.h — the stages' equality contract as the suites run it (docs/stages.md, "Exactly the
// same model"; harness.h, contract_problems): the flags of every contract run, one run per
// (trainer, ranks, accum, precision, extra flags) through the run cache, the check against
// stage0_ddp and the sharded group's peer, and the headline loops. test_zero12 (stage1, stage2)
// and test_stage3 (prefetch on and off) hold their trainers to the same loops, and their broken
// copies to the same check.
#pragma once
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "harness.h"

namespace nzt::contract {

// The tiny model's grad norm is 1.2 .. 2.6 over these runs: a clip of 0.5 acts on every step.
const std::string kClipText = "0.5";
const double kClip = std::stod(kClipText);
const std::string kFlags =
    "--preset tiny --seq 32 --batch 2 --lr 3e-3 --warmup 2 --eval-every 0 --eval-windows 4 --clip " + kClipText + " ";
// kSteps >= 2: stage3's ledger timeline records steps 0 and 1
const int kSteps = 6, kBf16Steps = 20, kFp16Steps = 12;

inline int steps_for(const std::string& prec) {
  return prec == "fp32" ? kSteps : prec == "fp16" ? kFp16Steps : kBf16Steps;
}

inline std::string flags_for(int K, const std::string& prec, const std::string& extra = "") {
  return kFlags + "--steps " + std::to_string(steps_for(prec)) + " --accum " + std::to_string(K) +
         " --precision " + prec + fp16_flags(prec, K) + " " + extra;
}

// One run per (trainer, ranks, accum, precision, extra flags), shared by every test (run_cached).
inline const RunResult& run(const std::string& trainer, int N, int K, const std::string& prec = "fp32",
                            const std::string& extra = "") {
  return run_cached(trainer, N, flags_for(K, prec, extra), prec);
}

// The gradient norms of the N * K micro-batches of step 1 (harness.h, micro_batch_norms).
inline const std::vector<double>& micro_norms(int N, int K, const std::string& prec) {
  static std::map<std::string, std::vector<double>> done;
  const std::string key = std::to_string(N) + " " + std::to_string(K) + " " + prec;
  auto it = done.find(key);
  if (it == done.end()) it = done.emplace(key, micro_batch_norms(flags_for(K, prec), N, K, prec)).first;
  return it->second;
}

// The sharded group's peer (another trainer that reduces every micro-step): stage2 for stage3 and
// its broken copies, stage3 for the rest (stage2 and its broken copies).
inline std::string peer_of(const std::string& trainer) {
  return trainer.find("stage3") != std::string::npos ? "stage2" : "stage3";
}

// The contract for run r of `trainer` at (N, K): bit for bit stage0_ddp at K = 1 (and at any K for
// the trainers that sum their micro-steps locally); at K > 1 bit for bit the peer, and step 1's
// gradient norm within the derived cross-group bound of stage0_ddp's. *summary: what was compared.
inline std::vector<std::string> check(const std::string& trainer, const RunResult& r, int N, int K,
                                      const std::string& prec, std::string* summary) {
  const bool cross = K > 1 && !sums_micro_steps_locally(trainer);
  const std::string peer = peer_of(trainer);
  return contract_problems(trainer, r, N, K, prec, run("stage0_ddp", N, K, prec), peer,
                           cross ? &run(peer, N, K, prec) : nullptr, cross ? &micro_norms(N, K, prec) : nullptr,
                           summary);
}

// A trainer with its own extra flags ("--prefetch 0").
struct Variant {
  std::string trainer, extra;
  std::string name() const { return extra.empty() ? trainer : trainer + " " + extra; }
};

inline void expect_holds(const Variant& v, int N, int K, const std::string& prec, const std::string& note) {
  const RunResult& r = run(v.trainer, N, K, prec, v.extra);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(step_values(r.report, "loss").size(), size_t(steps_for(prec)));
  std::string summary;
  const std::vector<std::string> problems = check(v.trainer, r, N, K, prec, &summary);
  printf("%s %s N=%d accum=%d (%s): %s\n", prec.c_str(), v.name().c_str(), N, K, note.c_str(), summary.c_str());
  for (const std::string& p : problems) ADD_FAILURE() << v.name() << ": " << p;
}

// The headline, in fp32: N = 1..4 ranks (3 pads the units), K = 1 and 3, with clipping acting on
// most of the reference's steps.
inline void expect_fp32(const std::vector<Variant>& variants) {
  for (int N : {1, 2, 3, 4}) {
    for (int K : {1, 3}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " accum=" + std::to_string(K));
      const RunResult& ref = run("stage0_ddp", N, K);
      ASSERT_EQ(ref.exit_code, 0) << ref.output;
      const std::vector<double> norms = step_values(ref.report, "grad_norm");
      ASSERT_EQ(norms.size(), size_t(kSteps));
      int clipped = 0;
      for (double g : norms) clipped += g > kClip;
      ASSERT_GE(4 * clipped, 3 * kSteps) << "--clip " << kClip << " must act on most steps";
      const std::string note = "clipped " + std::to_string(clipped) + "/" + std::to_string(kSteps) + " steps";
      for (const Variant& v : variants) expect_holds(v, N, K, "fp32", note);
    }
  }
}

// bf16 over 20 steps and fp16 (loss-scaled) over 12, at (N, K) = (2, 1) and (3, 2). In bf16 the
// reductions still add in rank order and round once per collective, the same in every trainer of a
// group, and the master weights update elementwise: the contract holds, with the cross-group bound
// at the bf16 unit roundoff. In fp16 at K = 1 the runs start at DeepSpeed's 2^16 and skip their first
// overflowing steps (asserted: at least one): every trainer must skip the same ones and keep the
// same loss scale; at K = 2 the scale grows during the run (harness.h, fp16_flags).
inline void expect_low_precision(const std::vector<Variant>& variants, const std::string& prec) {
  for (auto [N, K] : {std::pair{2, 1}, std::pair{3, 2}}) {
    SCOPED_TRACE(prec + " N=" + std::to_string(N) + " accum=" + std::to_string(K));
    const RunResult& ref = run("stage0_ddp", N, K, prec);
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    ASSERT_EQ(step_values(ref.report, "loss").size(), size_t(steps_for(prec)));
    std::string note = std::to_string(steps_for(prec)) + " steps";
    if (prec == "fp16") {
      const int skipped = skipped_steps(ref.report);
      if (K == 1) {
        EXPECT_GE(skipped, 1) << "the accum-1 case must exercise skipped steps";
      }
      note += ", " + std::to_string(skipped) + " skipped in stage0_ddp";
    }
    for (const Variant& v : variants) {
      expect_holds(v, N, K, prec, note);
      const RunResult& r = run(v.trainer, N, K, prec, v.extra);
      if (prec == "fp16" && (K == 1 || sums_micro_steps_locally(v.trainer))) {
        EXPECT_EQ(step_values(r.report, "loss_scale"), step_values(ref.report, "loss_scale")) << v.name();
      }
    }
  }
}

}  // namespace nzt::contract
