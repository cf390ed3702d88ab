// test_ds_config.cpp — DeepSpeed's config file (--config, common/ds_config.h), as a learner uses it:
//   - every config in configs/ runs its binary (a few steps of the tiny model) with the values the
//     file says: read here from the file itself (json_read.h, not the trainers' parser) and compared
//     with what the run's report says it used;
//   - every key maps to its flag: a config with every supported key at an unusual value, and the
//     learning rate of every step against DeepSpeed's WarmupDecayLR formula written out here;
//   - train_batch_size = micro-batch x accumulation x ranks: the missing factor is derived, an
//     inconsistent one is one line and exit 2;
//   - command-line flags override the file;
//   - an unknown or unsupported key, a config for another binary, bad JSON: one line naming it,
//     exit 2.
#include <gtest/gtest.h>

#include <cmath>

#include "harness.h"

using namespace nzt;

namespace {

const std::string kRun = "--preset tiny --seq 32 --steps 3 --eval-every 0 --eval-windows 4 ";

std::string write_config(const std::string& name, const std::string& text) {
  const std::string path = temp_dir() + "/" + name + ".json";
  std::ofstream(path) << text;
  return path;
}

// A bad config: exit 2 and exactly one line, containing `want`.
void expect_one_line_error(const std::string& binary, const std::string& config, const std::string& flags,
                           const std::string& want) {
  std::string out;
  const int rc = run_command("timeout 60 " + bin_dir() + "/" + binary + " --config " + config + " " + flags, &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find(want), std::string::npos) << "want '" << want << "' in: " << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

}  // namespace

TEST(DsConfig, ShippedConfigsRunTheirBinaries) {
  struct Case { const char* file; const char* binary; const char* precision; };
  for (Case c : {Case{"configs/stage1.json", "stage1", "fp32"}, Case{"configs/stage2.json", "stage2", "fp32"},
                 Case{"configs/stage3.json", "stage3", "fp32"}, Case{"configs/fp16.json", "stage2", "fp16"},
                 Case{"configs/cpu_offload.json", "offload", "bf16"}}) {
    SCOPED_TRACE(c.file);
    const Json file = Json::parse(read_file(c.file));
    ASSERT_TRUE(file.has("train_batch_size")) << "not a readable config";
    const int N = 2;
    RunResult r = run_trainer(c.binary, N, kRun + "--config " + c.file, "shipped");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const Json& rep = r.report;
    EXPECT_EQ(rep["precision"].str, c.precision);
    EXPECT_EQ(rep["batch"].u(), file["train_micro_batch_size_per_gpu"].u());
    EXPECT_EQ(rep["accum"].u(), file["gradient_accumulation_steps"].u());
    EXPECT_EQ(rep["batch"].u() * rep["accum"].u() * N, file["train_batch_size"].u());
    const Json& s = rep["settings"];
    EXPECT_EQ(s["clip"].d(), file["gradient_clipping"].d());
    EXPECT_FLOAT_EQ(s["lr"].d(), file["optimizer"]["params"]["lr"].d());
    EXPECT_FLOAT_EQ(s["weight_decay"].d(), file["optimizer"]["params"]["weight_decay"].d());
    const Json& sp = file["scheduler"]["params"];
    EXPECT_EQ(s["warmup"].u(), sp["warmup_num_steps"].u());
    EXPECT_EQ(s["lr_schedule"].str, file["scheduler"]["type"].str == "WarmupLR" ? "warmup" : "warmup-decay");
    if (file.has("fp16")) {
      EXPECT_EQ(s["loss_scale"].d(), std::ldexp(1.0, int(file["fp16"]["initial_scale_power"].u())));
      EXPECT_EQ(s["loss_scale_window"].u(), file["fp16"]["loss_scale_window"].u());
      EXPECT_EQ(s["loss_scale_hysteresis"].u(), file["fp16"]["hysteresis"].u());
      EXPECT_EQ(s["loss_scale_min"].d(), file["fp16"]["min_loss_scale"].d());
    }
    if (std::string(c.binary) == "offload") {
      EXPECT_EQ(s["offload_to"].str, "cpu");
    }
  }
}

// Every supported key at a value no default has. lr of step t (0-based: DeepSpeed's scheduler
// iteration) under WarmupDecayLR with linear warm-up: min + (max - min) * gamma, gamma = t / W for
// t < W, then (total - t) / (total - W).
TEST(DsConfig, EveryKeyMapsToItsFlag) {
  const std::string dir = temp_dir() + "/nvme";
  (void)!system(("mkdir -p '" + dir + "'").c_str());
  const std::string path = write_config("every_key", R"({
    "train_batch_size": 12, "train_micro_batch_size_per_gpu": 3, "gradient_clipping": 0.75,
    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 10, "loss_scale_window": 7,
             "hysteresis": 3, "min_loss_scale": 0.5},
    "bf16": {"enabled": false},
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.05}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": 2e-3,
                  "warmup_num_steps": 3, "warmup_type": "linear", "total_num_steps": 6}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + dir + R"("}},
    "activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": false,
                                 "contiguous_memory_optimization": true, "number_checkpoints": 2}
  })");
  const int N = 2, steps = 5;
  RunResult r = run_trainer("offload", N, kRun + "--steps 5 --config " + path, "every_key");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Json& rep = r.report;
  const Json& s = rep["settings"];
  EXPECT_EQ(rep["precision"].str, "fp16");
  EXPECT_TRUE(rep["activation_checkpointing"].b);
  EXPECT_EQ(rep["batch"].u(), 3u);
  EXPECT_EQ(rep["accum"].u(), 2u);  // derived: 12 / (3 x 2 ranks)
  EXPECT_EQ(s["clip"].d(), 0.75);
  EXPECT_EQ(s["loss_scale"].d(), 1024.0);
  EXPECT_EQ(s["loss_scale_window"].u(), 7u);
  EXPECT_EQ(s["loss_scale_hysteresis"].u(), 3u);
  EXPECT_EQ(s["loss_scale_min"].d(), 0.5);
  EXPECT_FLOAT_EQ(s["weight_decay"].d(), 0.05);
  EXPECT_EQ(s["offload_to"].str, "disk");
  EXPECT_EQ(s["offload_dir"].str, dir);
  EXPECT_EQ(s["warmup_type"].str, "linear");
  EXPECT_EQ(s["lr_total_steps"].u(), 6u);
  const std::vector<double> lrs = step_values(rep, "lr");
  ASSERT_EQ(lrs.size(), size_t(steps));
  int t = 0;  // the scheduler's iteration: updates applied (fp16 skips hold it)
  for (int step = 0; step < steps; step++) {
    const double gamma = t < 3 ? t / 3.0 : std::max(0.0, (6.0 - t) / (6.0 - 3.0));
    EXPECT_NEAR(lrs[step], 1e-4 + (2e-3 - 1e-4) * gamma, 1e-9) << "step " << step + 1;
    t += !rep["steps_log"][step]["skipped"].b;
  }
  // a static scale: fp16.loss_scale > 0
  const std::string fixed = write_config("static", R"({"fp16": {"enabled": true, "loss_scale": 128},
                                                        "zero_optimization": {"stage": 1}})");
  RunResult st = run_trainer("stage1", 1, kRun + "--config " + fixed, "static");
  ASSERT_EQ(st.exit_code, 0) << st.output;
  EXPECT_EQ(st.report["settings"]["loss_scale"].d(), 128.0);
  EXPECT_EQ(st.report["settings"]["loss_scale_window"].u(), 0u);
}

// The command line wins over the file; train_batch_size is checked against what is in force.
TEST(DsConfig, FlagsOverrideTheFileAndTheBatchMustAgree) {
  RunResult r = run_trainer("stage2", 2, kRun + "--config configs/fp16.json --precision bf16 --lr 1e-3 --batch 2 --accum 4",
                            "override");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report["precision"].str, "bf16");
  EXPECT_FLOAT_EQ(r.report["settings"]["lr"].d(), 1e-3);
  EXPECT_EQ(r.report["batch"].u(), 2u);
  EXPECT_EQ(r.report["accum"].u(), 4u);  // 2 x 4 x 2 ranks = the file's 16
  std::string out;
  const int rc = run_command("timeout 60 mpirun -np 2 " + bin_dir() + "/stage2 " + kRun +
                                 "--config configs/fp16.json --batch 2",
                             &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("train_batch_size 16, but micro-batch 2 x accumulation 2 x 2 ranks = 8"), std::string::npos)
      << out;
  // only train_batch_size: the micro-batch takes it all, accumulation 1
  const std::string only = write_config("only_tbs", R"({"train_batch_size": 6, "zero_optimization": {"stage": 1}})");
  RunResult o = run_trainer("stage1", 2, kRun + "--config " + only, "only_tbs");
  ASSERT_EQ(o.exit_code, 0) << o.output;
  EXPECT_EQ(o.report["batch"].u(), 3u);
  EXPECT_EQ(o.report["accum"].u(), 1u);
}

TEST(DsConfig, BadConfigsAreOneLineExit2) {
  expect_one_line_error("stage1", write_config("unknown", R"({"steps_per_print": 10, "zero_optimization": {"stage": 1}})"),
                        kRun, "steps_per_print: unknown or unsupported key");
  expect_one_line_error("stage2", write_config("nested", R"({"zero_optimization": {"stage": 2, "overlap_comm": true}})"),
                        kRun, "zero_optimization.overlap_comm: unknown or unsupported key");
  expect_one_line_error("stage2", "configs/stage1.json", kRun, "run build/bin/stage1 with it");
  expect_one_line_error("stage2", "configs/cpu_offload.json", kRun, "run build/bin/offload with it");
  expect_one_line_error("offload", "configs/stage2.json", kRun, "run build/bin/stage2 with it");
  expect_one_line_error("stage0_ddp", "configs/stage3.json", kRun, "run build/bin/stage3 with it");
  expect_one_line_error("stage3", write_config("z3_offload", R"({"zero_optimization": {"stage": 3,
                          "offload_optimizer": {"device": "cpu"}}})"), kRun, "not supported with stage 3 yet");
  expect_one_line_error("stage1", write_config("ac", R"({"zero_optimization": {"stage": 1},
                          "activation_checkpointing": {"partition_activations": true}})"), kRun,
                        "activation_checkpointing.partition_activations: true splits checkpoints");
  expect_one_line_error("stage1", write_config("ac_cpu", R"({"zero_optimization": {"stage": 1},
                          "activation_checkpointing": {"cpu_checkpointing": true}})"), kRun,
                        "activation_checkpointing.cpu_checkpointing: true (checkpoints on the host) is not supported");
  expect_one_line_error("stage1", write_config("ac_key", R"({"zero_optimization": {"stage": 1},
                          "activation_checkpointing": {"profile": true}})"), kRun,
                        "activation_checkpointing.profile: unknown or unsupported key");
  expect_one_line_error("stage0_ddp", write_config("both", R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"),
                        kRun, "both true");
  expect_one_line_error("stage0_ddp", write_config("betas", R"({"optimizer": {"type": "AdamW",
                          "params": {"betas": [0.9, 0.999]}}})"), kRun, "optimizer.params.betas");
  expect_one_line_error("stage0_ddp", write_config("auto", R"({"train_micro_batch_size_per_gpu": "auto"})"), kRun,
                        "\"auto\"");
  expect_one_line_error("stage0_ddp", write_config("broken", R"({"train_batch_size": 8,)"), kRun, "not valid JSON");
  expect_one_line_error("stage0_ddp", temp_dir() + "/missing.json", kRun, "cannot open it");
}
