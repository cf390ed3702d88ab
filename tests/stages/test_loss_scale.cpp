// test_loss_scale.cpp — fp16's dynamic loss scaling (common/loss_scale.h), run under mpirun as a
// learner runs it. What must hold:
//   - a forced overflow (an absurd initial scale) skips every step in every stage: the params, the
//     fp32 master, Adam's m and v and Adam's step count are untouched, bit for bit (checkpoint
//     shards after steps 1, 2 and 3 are the same bytes; m and v are still zero; the model is the
//     one a run with learning rate 0 writes), and the scale backs off by the rule (hysteresis
//     first, then the backoff factor, never below the minimum); such a run, whose model was never
//     updated, still writes its report and model file, then says so in one line and exits 2;
//   - after `window` clean steps in a row the scale doubles; a window of 0 keeps it static;
//   - skipped steps leave the learning-rate curve where it was (DeepSpeed's engine steps its
//     scheduler only after a real update): the lr of each step is lr_at(updates applied so far);
//   - a resumed fp16 run goes on with the scaler's state (scale, hysteresis, skipped count): bit
//     for bit the uninterrupted run.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "harness.h"

using namespace nzt;

namespace {

const std::string kTiny =
    "--preset tiny --seq 32 --batch 2 --lr 3e-3 --warmup 2 --eval-every 0 --eval-windows 4 --precision fp16 ";
const std::vector<const char*>& kStages = all_stages();  // stages.txt

std::vector<double> scales_of(const Json& report) { return step_values(report, "loss_scale"); }

// A run whose every step overflows: it writes its report (read here) and its model file, then
// fails with one line saying that no step updated the model.
RunResult run_all_skipped(const std::string& stage, int N, const std::string& flags, const std::string& tag) {
  static int counter = 0;
  const std::string report = temp_dir() + "/all_skipped_" + tag + std::to_string(counter++) + ".json";
  RunResult r = run_trainer(stage, N, flags + " --log-json " + report, tag);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("\nerror: fp16: all 3 steps of this run were skipped"), std::string::npos) << r.output;
  r.report = Json::parse(read_file(report));
  return r;
}

// The trainers' learning-rate curve (lr_schedule.h, lr_at) at position t, written out in the same fp32
// operations: linear warm-up over `warmup` steps to lr, then cosine to lr/10 at the last step.
// (What is tested is the position: the updates applied, not the step index.)
float lr_at(float lr, int warmup, int steps, int t) {
  if (t < warmup) return lr * float(t + 1) / float(warmup);
  const float min_lr = lr * 0.1f, progress = float(t - warmup) / float(steps - warmup - 1);
  return min_lr + 0.5f * (lr - min_lr) * (1.0f + std::cos(float(M_PI) * progress));
}

// One shard file, split as checkpoint.h describes it: header, params, then fp32 master, m, v of the
// owned slices (the optimizer ranges of the header, summed).
struct Shard {
  std::string bytes;
  uint64_t owned = 0;  // optimizer elements
  std::string m_and_v() const { return bytes.substr(bytes.size() - 8 * owned); }
};
Shard read_shard(const std::string& path) {
  Shard s;
  s.bytes = read_file(path);
  if (s.bytes.size() < 32) return s;
  uint32_t head[6];
  memcpy(head, s.bytes.data() + 8, sizeof head);
  const uint32_t U = head[4];
  for (uint32_t u = 0; u < U; u++) {
    uint64_t r[4];
    memcpy(r, s.bytes.data() + 32 + 32 * size_t(u), sizeof r);
    s.owned += r[3] - r[2];
  }
  return s;
}
std::string shard_path(const std::string& ckpt_dir, int step, int rank) {
  char name[64];
  snprintf(name, sizeof name, "/step-%08d/rank-%05d.shard", step, rank);
  return ckpt_dir + name;
}
std::string manifest_value(const std::string& ckpt_dir, int step, const std::string& key) {
  char name[64];
  snprintf(name, sizeof name, "/step-%08d/MANIFEST", step);
  std::istringstream in(read_file(ckpt_dir + name));
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, key.size() + 1, key + " ") == 0) return line.substr(key.size() + 1);
  return "";
}

}  // namespace

// 1e30 times the loss overflows fp16 at once: every step is skipped. Scales, with hysteresis 2 and
// backoff 0.5: 1e30 (overflow: hysteresis 2 -> 1), 1e30 (overflow: halve), 5e29 (halve). With
// hysteresis 1 and backoff 0.25 every overflow divides by 4.
TEST(LossScale, ForcedOverflowSkipsEveryStepAndLeavesTheStateUntouched) {
  const int N = 2, steps = 3;
  const std::string flags = kTiny + "--steps 3 --loss-scale 1e30 --ckpt-every 1 --ckpt-keep 3";
  RunResult frozen = run_trainer("stage0_ddp", N, kTiny + "--steps 3 --lr 0 --loss-scale 1024", "lr0");  // no move
  ASSERT_EQ(frozen.exit_code, 0) << frozen.output;
  ASSERT_EQ(skipped_steps(frozen.report), 0);
  for (const char* stage : kStages) {
    SCOPED_TRACE(stage);
    const std::string dir = fresh_dir(std::string("forced_") + stage);
    RunResult r = run_all_skipped(stage, N, flags + " --ckpt-dir " + dir, "forced");
    EXPECT_EQ(skipped_steps(r.report), steps);
    const float s0 = 1e30f;
    EXPECT_EQ(scales_of(r.report), (std::vector<double>{s0, s0, double(s0 * 0.5f)}));
    for (int rank = 0; rank < N; rank++) {
      const Shard first = read_shard(shard_path(dir, 1, rank));
      ASSERT_GT(first.owned, 0u);
      for (int step : {2, 3}) EXPECT_EQ(read_shard(shard_path(dir, step, rank)).bytes, first.bytes) << "step " << step;
      EXPECT_EQ(first.m_and_v(), std::string(8 * first.owned, '\0')) << "Adam m and v must still be zero";
    }
    // Adam's step count and the learning-rate curve have not moved: the next update is still update 1
    EXPECT_EQ(manifest_value(dir, steps, "next_adam_t"), "1");
    EXPECT_EQ(float(std::stod(manifest_value(dir, steps, "next_lr"))), lr_at(3e-3f, 2, steps, 0));
    // the params are the initial ones: the model a learning rate of 0 leaves
    EXPECT_TRUE(same_model_bits(r.model_path, frozen.model_path));
  }
  RunResult quarter = run_all_skipped("stage2", N, kTiny + "--steps 3 --loss-scale 1e30 --loss-scale-hysteresis 1 "
                                                    "--loss-scale-backoff 0.25", "quarter");
  const float q0 = 1e30f, q1 = q0 * 0.25f, q2 = q1 * 0.25f;
  EXPECT_EQ(scales_of(quarter.report), (std::vector<double>{q0, q1, q2}));
  // the minimum stops the backoff; an overflow at the minimum ends the run (as DeepSpeed does)
  RunResult floor = run_trainer("stage1", N, kTiny + "--steps 3 --loss-scale 1e30 --loss-scale-hysteresis 1 "
                                              "--loss-scale-min 1e30", "floor");
  EXPECT_EQ(floor.exit_code, 2);
  EXPECT_NE(floor.output.find("even at the minimum scale"), std::string::npos) << floor.output;
}

// No overflow at a scale of 256: the scale doubles after every `window` = 3 clean steps.
TEST(LossScale, ScaleGrowsAfterTheWindowAndStaysStaticWithoutOne) {
  RunResult grow = run_trainer("stage1", 2, kTiny + "--steps 8 --loss-scale 256 --loss-scale-window 3", "grow");
  ASSERT_EQ(grow.exit_code, 0) << grow.output;
  ASSERT_EQ(skipped_steps(grow.report), 0);
  EXPECT_EQ(scales_of(grow.report), (std::vector<double>{256, 256, 256, 512, 512, 512, 1024, 1024}));
  RunResult fixed = run_trainer("stage1", 2, kTiny + "--steps 8 --loss-scale 256 --loss-scale-window 0", "static");
  ASSERT_EQ(fixed.exit_code, 0) << fixed.output;
  EXPECT_EQ(scales_of(fixed.report), std::vector<double>(8, 256));
}

// 2^18 overflows the tiny model's first 3 steps (harness.h, fp16_flags): the learning rate of
// step t is the curve's value for the updates applied before it, so steps 1..4 all use
// lr_at(0), step 5 lr_at(1), and so on. Then: checkpoint after step 1 (hysteresis already spent,
// scale not yet lowered) and resume: the same run, bit for bit, the same scales and skips.
TEST(LossScale, SkippedStepsHoldTheScheduleAndResumeKeepsTheScaler) {
  const int N = 2, steps = 7;
  const std::string flags = kTiny + "--steps 7 --loss-scale 262144";
  RunResult straight = run_trainer("stage2", N, flags, "straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  std::vector<double> lrs = step_values(straight.report, "lr");
  ASSERT_EQ(lrs.size(), size_t(steps));
  int updates = 0;
  for (int t = 0; t < steps; t++) {
    const bool skipped = straight.report["steps_log"][t]["skipped"].b;
    EXPECT_EQ(lrs[t], double(lr_at(3e-3f, 2, steps, updates))) << "step " << t + 1;
    updates += !skipped;
  }
  EXPECT_EQ(steps - updates, 3) << "the first 3 steps overflow at 2^18";
  const std::string dir = fresh_dir("resume");
  RunResult first = run_trainer("stage2", N, flags + " --ckpt-dir " + dir + " --ckpt-every 1 --ckpt-keep 9", "part1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(manifest_value(dir, 1, "loss_scale"), "262144 1 0 1 1");  // scale iter last_overflow hysteresis skipped
  RunResult resumed = run_trainer("stage2", N, flags + " --resume " + dir + "/step-00000001", "resumed");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(same_model_bits(straight.model_path, resumed.model_path));
  const std::vector<double> all = scales_of(straight.report), want(all.begin() + 1, all.end());
  EXPECT_EQ(scales_of(resumed.report), want);
}
