// test_qat.cpp — quantization-aware training (--qat int8|int4, common/compression/qat.h, docs/compression.md):
//   - reference: stage0_ddp with --qat is bit for bit qat_reference (tests/compress/qat_reference.cpp:
//     the fake quantization written out in a plain trainer's loop, straight-through gradients to
//     exact parameters), in int8, int4, int4 with the embedding kept, another block size, bf16;
//     and a QAT run is not the plain run (the quantization acts);
//   - the tests of the tests: the broken copies of tests/compress/compress.mk (the master quantized
//     in place, the backward on the exact weights, one scale per unit, --qat-skip ignored) each
//     differ from the reference;
//   - the stages' equality contract with --qat int8 and int4 (the groups of tests/lib/contract.h:
//     all bit for bit stage0_ddp at accum 1; at accum 2 stage1 = stage0_ddp, stage2 = stage3 =
//     offload = infinity, the groups within the derived bound), fp32 (int8, int4), bf16 and fp16
//     (int4); with activation checkpointing; zeropp with hpZ alone = stage3 with --qat; the
//     pipeline = stage0_ddp with --qat;
//   - the ledger: the fake-quantized unit is device scratch of e * max padded unit (the embedding
//     left out with --qat-skip embedding) on every rank, = the report's formula, 0 without --qat;
//   - checkpoints: stopped and resumed with --qat, the same model and losses bit for bit; resumed
//     with other QAT settings, one line (unless --resume-changed);
//   - bad input (--qat int3, a block that is not a power of two, --qat-skip of an unknown unit, a
//     --qat-block without --qat, --device cuda, a pipeline whose wte is not whole blocks): one
//     line, exit 2;
//   - --batch auto counts the fake-quantized unit;
//   - DeepSpeed's compression_training.weight_quantization: what maps is the same run as --qat,
//     what does not is one line, exit 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "harness.h"

using namespace nzt;

namespace {

// The contract's tiny runs (tests/lib/contract.h), 3 steps: clipping acts, and the third step
// computes with weights two updates have moved.
const std::string kBase =
    "--preset tiny --seq 32 --batch 2 --lr 3e-3 --warmup 2 --eval-every 0 --eval-windows 4 --clip 0.5 --steps 3 ";

std::string flags(int K, const std::string& prec, const std::string& qat) {
  // fp16: a scale that overflows in neither group at step 1 (the contract's accum > 1 choice)
  const std::string fp16 = prec == "fp16" ? " --loss-scale 1024 --loss-scale-window 4" : "";
  return kBase + "--accum " + std::to_string(K) + " --precision " + prec + fp16 + " " + qat;
}

const RunResult& run(const std::string& trainer, int N, int K, const std::string& prec, const std::string& qat) {
  return run_cached(trainer, N, flags(K, prec, qat), "qat");
}

void expect_ok(const RunResult& r) { ASSERT_EQ(r.exit_code, 0) << r.output; }

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = temp_dir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// exit 2 and exactly one line, "error: ..." containing `want`
void expect_one_line_error(const std::string& cmd, const std::string& want) {
  std::string out;
  const int rc = run_command("timeout 60 " + cmd, &out);
  EXPECT_EQ(rc, 2) << cmd << "\n" << out;
  EXPECT_EQ(out.rfind("error: ", 0), 0u) << out;
  EXPECT_NE(out.find(want), std::string::npos) << "want '" << want << "' in: " << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

}  // namespace

// The trainers' QAT (inside the model) against the reference's (in the open, through the
// quantizer's packed form): every step's loss and gradient norm, and the final exact parameters.
TEST(Qat, StageZeroIsTheFakeQuantReferenceBitForBit) {
  struct Case { const char* prec; const char* qat; };
  for (const Case c : {Case{"fp32", "--qat int8"}, Case{"fp32", "--qat int4"},
                       Case{"fp32", "--qat int4 --qat-skip embedding"}, Case{"fp32", "--qat int4 --qat-block 16"},
                       Case{"bf16", "--qat int4"}}) {
    SCOPED_TRACE(std::string(c.prec) + " " + c.qat);
    const RunResult& ref = run("qat_reference", 2, 1, c.prec, c.qat);
    const RunResult& ddp = run("stage0_ddp", 2, 1, c.prec, c.qat);
    expect_ok(ref);
    expect_ok(ddp);
    const Verdict v = compare_runs(ref, ddp);
    EXPECT_TRUE(v.identical()) << v.str();
    printf("%s %s: stage0_ddp vs qat_reference: %s\n", c.prec, c.qat, v.str().c_str());
    // the quantization acts: not the plain run (the losses of step 1 already differ)
    const RunResult& plain = run("stage0_ddp", 2, 1, c.prec, "");
    expect_ok(plain);
    EXPECT_NE(step_values(plain.report, "loss")[0], step_values(ddp.report, "loss")[0]);
  }
  // activation checkpointing recomputes each block's forward from the same q(w): the same bits
  const RunResult& ckpt = run("stage2", 2, 1, "fp32", "--qat int4 --activation-checkpointing");
  expect_ok(ckpt);
  EXPECT_TRUE(compare_runs(run("stage0_ddp", 2, 1, "fp32", "--qat int4"), ckpt).identical());
  // int4 is not int8, and the skip is not the full int4
  auto loss1 = [](const std::string& qat) {
    return step_values(run("stage0_ddp", 2, 1, "fp32", qat).report, "loss")[0];
  };
  EXPECT_NE(loss1("--qat int8"), loss1("--qat int4"));
  EXPECT_NE(loss1("--qat int4"), loss1("--qat int4 --qat-skip embedding"));
}

// Each broken copy runs, and the reference comparison sees it.
TEST(Qat, BrokenCopiesDifferFromTheReference) {
  struct Case { const char* mutant; const char* qat; };
  for (const Case c : {Case{"master_quantized", "--qat int4"}, Case{"backward_exact", "--qat int4"},
                       Case{"per_unit_scale", "--qat int4"}, Case{"skip_ignored", "--qat int4 --qat-skip embedding"}}) {
    SCOPED_TRACE(c.mutant);
    const RunResult& ref = run("qat_reference", 2, 1, "fp32", c.qat);
    const RunResult& bad = run(std::string("mutant_qat_") + c.mutant, 2, 1, "fp32", c.qat);
    expect_ok(ref);
    expect_ok(bad);
    const Verdict v = compare_runs(ref, bad);
    EXPECT_FALSE(v.identical()) << "mutant_qat_" << c.mutant << " passed: " << v.str();
    printf("mutant_qat_%s (%s): caught, %s\n", c.mutant, c.qat, v.str().c_str());
  }
}

// The contract's groups with --qat: at accum 1 every trainer is stage0_ddp bit for bit; at accum 2
// the local group (stage1) is stage0_ddp's, the sharded group (stage2, stage3, offload, infinity)
// each other's, and the two groups within the derived bound at step 1 (harness.h).
TEST(Qat, EqualityContractHoldsInEveryStage) {
  std::vector<std::string> trainers(all_stages().begin(), all_stages().end());
  trainers.push_back("infinity");  // stage3 with its slices on the host: stage3 bit for bit
  // int8 and int4 run the same code with another qmax: both in fp32, int4 alone in bf16 and fp16
  struct Case { const char* qat; const char* prec; int N, K; };
  for (const Case c : {Case{"--qat int8", "fp32", 2, 1}, Case{"--qat int8", "fp32", 3, 2},
                       Case{"--qat int4", "fp32", 2, 1}, Case{"--qat int4", "fp32", 3, 2},
                       Case{"--qat int4", "bf16", 3, 2}, Case{"--qat int4", "fp16", 2, 1}}) {
    const char* qat = c.qat;
    SCOPED_TRACE(std::string(qat) + " " + c.prec + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K));
    const RunResult& ddp = run("stage0_ddp", c.N, c.K, c.prec, qat);
    expect_ok(ddp);
    std::vector<double> micro;
    if (c.K > 1) micro = micro_batch_norms(flags(c.K, c.prec, qat), c.N, c.K, "qat_micro");
    for (const std::string& t : trainers) {
      const RunResult& r = run(t, c.N, c.K, c.prec, qat);
      expect_ok(r);
      const std::string peer = t == "stage3" ? "stage2" : "stage3";
      const bool cross = c.K > 1 && !sums_micro_steps_locally(t);
      std::string summary;
      const std::vector<std::string> problems =
          contract_problems(t, r, c.N, c.K, c.prec, ddp, peer,
                            cross ? &run(peer, c.N, c.K, c.prec, qat) : nullptr, cross ? &micro : nullptr, &summary);
      printf("%s %s %s N=%d accum=%d: %s\n", qat, c.prec, t.c_str(), c.N, c.K, summary.c_str());
      for (const std::string& p : problems) ADD_FAILURE() << t << ": " << p;
    }
  }
  // zeropp with hpZ alone moves no quantized number: stage3's run, with --qat too
  const RunResult& z = run_cached("zeropp", 2, flags(1, "fp32", "--qat int4 --hpz 2"), "qat");
  expect_ok(z);
  EXPECT_TRUE(compare_runs(run("stage3", 2, 1, "fp32", "--qat int4"), z).identical());
}

// The pipeline's segments run the same model code: 2 segments x 1 replica, accum 2 = stage0_ddp on one
// rank with accum 2, with --qat (one thread per rank in both, as tests/pipeline does).
TEST(Qat, PipelineIsStageZeroWithQat) {
  const char* before = getenv("OMP_NUM_THREADS");
  const std::string saved = before ? before : "";
  setenv("OMP_NUM_THREADS", "1", 1);
  const RunResult& ddp = run("stage0_ddp", 1, 2, "fp32", "--qat int8");
  const RunResult& pp = run_cached("pipeline", 2, flags(2, "fp32", "--qat int8 --pipeline 2"), "qat");
  if (before) setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else unsetenv("OMP_NUM_THREADS");
  expect_ok(ddp);
  expect_ok(pp);
  const Verdict v = compare_runs(ddp, pp);
  EXPECT_TRUE(v.identical()) << v.str();
}

// The fake-quantized unit in the ledger: device scratch, the same on every rank and in every stage,
// e times the largest unit it quantizes (padded for N, as the report's unit list gives), written
// out here from the unit list; the report's formula says the same; 0 without --qat.
TEST(Qat, LedgerCountsTheFakeQuantizedUnitByTheFormula) {
  const int N = 3, K = 2;
  for (const char* prec : {"fp32", "bf16"}) {
    const uint64_t e = std::string(prec) == "fp32" ? 4 : 2;
    struct Case { const char* trainer; const char* qat; };
    const bool fp32 = std::string(prec) == "fp32";
    for (const Case c : {Case{"stage0_ddp", fp32 ? "--qat int8" : "--qat int4"}, Case{"stage3", "--qat int4"},
                         Case{"offload", fp32 ? "--qat int8" : "--qat int4"}, Case{"stage2", ""}}) {
      SCOPED_TRACE(std::string(prec) + " " + c.trainer + " " + c.qat);
      const RunResult& r = run(c.trainer, N, K, prec, c.qat);
      expect_ok(r);
      uint64_t largest = 0;
      const auto& units = r.report["units"].arr;
      for (size_t u = 0; u < units.size(); u++) {
        const uint64_t numel = units[u]["numel"].u(), padded = (numel + N - 1) / N * N;
        EXPECT_EQ(units[u]["padded"].u(), padded);
        largest = std::max<uint64_t>(largest, padded);
      }
      const uint64_t want = std::string(c.qat).empty() ? 0 : e * largest;
      EXPECT_EQ(r.report["formula"]["qat"].u(), want);
      for (const Json& rank : r.report["ranks"].arr)
        EXPECT_EQ(rank["ledger"]["device"]["peak"]["scratch"].u(), want) << "rank " << rank["rank"].u();
    }
  }
  // --qat-skip embedding: the copy is the largest of the other units. On tiny a block is larger than
  // the embedding, so at width 16 (the embedding the largest unit) the copy shrinks to a block's.
  for (const char* qat : {"--qat int4", "--qat int4 --qat-skip embedding"}) {
    SCOPED_TRACE(qat);
    const RunResult& r = run_cached("stage1", 2, flags(1, "fp32", std::string("--dim 16 ") + qat), "qat");
    expect_ok(r);
    const auto& units = r.report["units"].arr;
    const bool skip = std::string(qat).find("skip") != std::string::npos;
    uint64_t largest_block = 0;
    for (size_t u = 1; u < units.size(); u++) largest_block = std::max<uint64_t>(largest_block, units[u]["padded"].u());
    ASSERT_LT(largest_block, units[0]["padded"].u());
    const uint64_t want = 4 * (skip ? largest_block : units[0]["padded"].u());
    EXPECT_EQ(r.report["formula"]["qat"].u(), want);
    for (const Json& rank : r.report["ranks"].arr) EXPECT_EQ(rank["ledger"]["device"]["peak"]["scratch"].u(), want);
  }
}

// Stopped after step 2 and resumed: the run that never stopped, bit for bit (the checkpoint holds
// the exact parameters and moments; the fake-quantized copy is remade from them).
TEST(Qat, ResumeIsBitForBit) {
  for (const char* stage : {"stage3", "offload"}) {
    SCOPED_TRACE(stage);
    const std::string f = kBase + "--accum 2 --precision fp32 --qat int4 --steps 4";
    const std::string dir = fresh_dir(std::string("ckpt_qat_") + stage);
    RunResult full = run_trainer(stage, 2, f + " --ckpt-dir " + dir + " --ckpt-every 2", "qat_full");
    expect_ok(full);
    RunResult resumed = run_trainer(stage, 2, f + " --resume " + dir + "/step-00000002", "qat_resumed");
    expect_ok(resumed);
    EXPECT_TRUE(same_model_bits(full.model_path, resumed.model_path));
    const std::vector<double> a = step_values(full.report, "loss"), b = step_values(resumed.report, "loss");
    ASSERT_EQ(a.size(), 4u);
    ASSERT_EQ(b.size(), 2u);  // steps 3 and 4 only: it did not start over
    EXPECT_EQ(std::vector<double>(a.begin() + 2, a.end()), b);
  }
  // the checkpoint remembers its QAT settings: resumed with others, one line (or --resume-changed)
  const std::string f = kBase + "--accum 2 --precision fp32 --steps 4 --resume " + temp_dir() +
                        "/ckpt_qat_stage3/step-00000002 ";
  const std::string bin = "mpirun -np 2 " + bin_dir() + "/stage3 " + f;
  expect_one_line_error(bin + "--qat int8", "--qat int8/64 (was int4/64)");
  expect_one_line_error(bin, "--qat none (was int4/64)");
  const RunResult changed =
      run_trainer("stage3", 2, f + "--qat int4 --qat-skip embedding --resume-changed", "qat_changed");
  expect_ok(changed);
}

TEST(Qat, BadInputIsOneLineAndExitTwo) {
  const std::string bin = bin_dir() + "/stage1 " + kBase;
  expect_one_line_error(bin + "--qat int3", "--qat int3: unknown format, expected int8 or int4");
  expect_one_line_error(bin + "--qat int4 --qat-block 48",
                        "--qat-block 48: 48 values per scale, expected a power of two");
  expect_one_line_error(bin + "--qat int4 --qat-block 4", "expected a power of two from 8 to 65536");
  expect_one_line_error(bin + "--qat int8 --qat-skip lnf", "--qat-skip lnf: unknown unit, expected embedding");
  expect_one_line_error(bin + "--qat-block 64", "--qat-block: it sets up --qat");
  expect_one_line_error(bin + "--qat int8 --device cuda", "--qat with --device cuda");
  // the pipeline's last segment quantizes its own wte copy: only whole blocks keep the embedding's blocks
  expect_one_line_error("mpirun -np 2 " + bin_dir() + "/pipeline " + kBase + "--pipeline 2 --qat int4 "
                        "--qat-block 65536", "--qat with --pipeline: wte's 8192 values are not whole blocks of 65536");
}

// DeepSpeed's weight quantization: one group of every module at fixed bits, quantized in the
// forward, is --qat; the rest is refused with one line.
TEST(Qat, DeepSpeedWeightQuantization) {
  auto config = [](const std::string& name, const std::string& shared, const std::string& group) {
    return write_file(name + ".json",
                      R"({"compression_training": {"weight_quantization": {"shared_parameters": {"enabled": true, )" +
                          shared + R"(}, "different_groups": {"wq1": )" + group + "}}}}");
  };
  const std::string shared = R"("quantize_weight_in_forward": true, "quantization_type": "symmetric", )"
                             R"("rounding": "nearest", "schedule_offset": 0, "quantizer_kernel": false)";
  const std::string int4 =
      R"({"params": {"start_bits": 4, "target_bits": 4, "quantization_period": 50}, "modules": ["*"]})";
  const std::string good = "--lr-schedule cosine --config " + config("good", shared, int4);
  const RunResult& mapped = run_cached("stage0_ddp", 2, flags(1, "fp32", good), "qat");
  expect_ok(mapped);
  const Verdict v = compare_runs(run("stage0_ddp", 2, 1, "fp32", "--qat int4"), mapped);
  EXPECT_TRUE(v.identical()) << v.str();
  const std::string bin = bin_dir() + "/stage0_ddp " + kBase + "--lr-schedule cosine --config ";
  expect_one_line_error(bin + config("groups", shared + R"(, "quantize_groups": 8)", int4), "quantize_groups");
  expect_one_line_error(bin + config("forward", R"("quantize_weight_in_forward": false)", int4),
                        "quantizes the stored weights in the optimizer step");
  expect_one_line_error(bin + config("progressive", shared,
                                     R"({"params": {"start_bits": 8, "target_bits": 4}, "modules": ["*"]})"),
                        "progressive bits are not built");
  expect_one_line_error(bin + config("modules", shared,
                                     R"({"params": {"start_bits": 8, "target_bits": 8}, "modules": ["attention"]})"),
                        "modules");
  expect_one_line_error(bin + write_file("prune.json", R"({"compression_training": {"sparse_pruning": {}}})"),
                        "compression_training.sparse_pruning");
}

// --batch auto counts the fake-quantized unit: with the budget a plain run of micro-batch 3 peaks
// at, the plain run fits 3, the QAT run (its copy on top) only 2, and stays within the budget.
TEST(Qat, BatchAutoCountsTheCopy) {
  const std::string f = kBase + "--precision fp32 ";
  const RunResult& three = run_cached("stage2", 2, f + "--batch 3", "qat");
  expect_ok(three);
  const uint64_t budget = three.report["ranks"][0]["ledger"]["device"]["peak"]["total"].u();
  const std::string fit = f + "--batch auto --memory-budget " + std::to_string(budget);
  const RunResult& plain = run_cached("stage2", 2, fit, "qat");
  const RunResult& qat = run_cached("stage2", 2, fit + " --qat int8", "qat");
  expect_ok(plain);
  expect_ok(qat);
  EXPECT_EQ(plain.report["batch"].u(), 3u);
  EXPECT_EQ(qat.report["batch"].u(), 2u);
  for (const Json& rank : qat.report["ranks"].arr) EXPECT_LE(rank["ledger"]["device"]["peak"]["total"].u(), budget);
}
