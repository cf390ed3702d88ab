// test_ds_config.cpp — DeepSpeed's config file (--config, common/input/ds_config.h), as a learner uses it:
//   - every config in configs/ runs its binary (a few steps of the tiny model) with the values the
//     file says: read here from the file itself (json_read.h, not the trainers' parser) and compared
//     with what the run's report says it used;
//   - every key maps to its flag: a config with every supported key at an unusual value, and the
//     learning rate of every step against DeepSpeed's WarmupDecayLR formula written out here;
//   - train_batch_size = micro-batch x accumulation x ranks: the missing factor is derived, an
//     inconsistent one is one line and exit 2;
//   - command-line flags override the file;
//   - an unknown or unsupported key, a config for another binary, bad JSON: one line naming it,
//     exit 2; several unknown keys: one line naming every one of them;
//   - DeepSpeed's logging and monitoring sections, its checkpoint options and a
//     communication_data_type equal to the run's precision: one note each (another type: refused);
//   - configs as users have them (tests/tools/ds_configs: shaped like DeepSpeed's tutorial configs and
//     the Hugging Face and Lightning integrations' ZeRO-2 and ZeRO-3 configs) run: each of
//     DeepSpeed's keys that change nothing here is one note line, "auto" takes the command line's
//     value (or names every flag to give), and an absent section means what it means to DeepSpeed
//     (no scheduler: a constant learning rate; no gradient_clipping: none);
//   - a config that is not a small regular file (a directory, a FIFO, a device, megabytes), that
//     nests without end, or whose values are out of range or wrap a 64-bit integer: one line,
//     exit 2, never a crash or a hang; an error from a value the file set names its key, not a
//     flag the user never typed.
#include <gtest/gtest.h>
#include <sys/stat.h>  // mkfifo

#include <cmath>
#include <set>

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
  expect_one_line_error("stage1", write_config("unknown", R"({"sparse_attention": {}, "zero_optimization": {"stage": 1}})"),
                        kRun, "sparse_attention: unknown or unsupported key");
  expect_one_line_error("stage3", write_config("nested", R"({"zero_optimization": {"stage": 3, "mics_shard_size": 8}})"),
                        kRun, "zero_optimization.mics_shard_size: unknown or unsupported key");
  // ZeRO++'s keys (zeropp) build on stage 3
  expect_one_line_error("stage2", write_config("zeropp2", R"({"zero_optimization": {"stage": 2, "zero_hpz_partition_size": 8}})"),
                        kRun, "zero_optimization: ZeRO++'s keys with stage 2, expected stage 3");
  expect_one_line_error("stage3", write_config("zeropp3", R"({"zero_optimization": {"stage": 3, "zero_quantized_weights": true}})"),
                        kRun, "a config for ZeRO stage 3 with ZeRO++'s keys, and this is stage3, expected build/bin/zeropp");
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
  expect_one_line_error("stage0_ddp", temp_dir() + "/missing.json", kRun, "cannot read it");
}

namespace {

// DeepSpeed's keys that change nothing in these trainers (docs/deepspeed_config.md): each
// must be accepted with exactly one note line naming it. A section listed here is noted whole.
const std::set<std::string> kNoEffect = {
    "steps_per_print", "wall_clock_breakdown", "memory_breakdown", "zero_allow_untested_optimizer", "aio",
    "zero_optimization.overlap_comm", "zero_optimization.contiguous_gradients", "zero_optimization.reduce_bucket_size",
    "zero_optimization.allgather_bucket_size", "zero_optimization.allgather_partitions",
    "zero_optimization.reduce_scatter", "zero_optimization.round_robin_gradients", "zero_optimization.sub_group_size",
    "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.stage3_max_live_parameters", "zero_optimization.stage3_max_reuse_distance",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save", "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_param", "activation_checkpointing.contiguous_memory_optimization",
    "activation_checkpointing.synchronize_checkpoint_boundary",
    // logging and monitoring, DeepSpeed's checkpoint options, and the reduction's type when it is the run's own
    "tensorboard", "wandb", "csv_monitor", "comms_logger", "flops_profiler", "checkpoint", "communication_data_type"};

// The keys of `j` (dotted paths) that are in kNoEffect.
void no_effect_keys(const Json& j, const std::string& where, std::vector<std::string>* out) {
  for (const auto& [k, v] : j.obj) {
    const std::string key = where.empty() ? k : where + "." + k;
    if (kNoEffect.count(key)) out->push_back(key);
    else if (v.kind == Json::Obj) no_effect_keys(v, key, out);
  }
}

int count_lines_starting(const std::string& text, const std::string& prefix) {
  int n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.compare(0, prefix.size(), prefix) == 0;
  return n;
}

bool is_auto(const Json& v) { return v.kind == Json::Str && v.str == "auto"; }

// The flags the "auto" values of the Hugging Face configs take (as its Trainer fills them in).
const std::string kAutoFlags = "--batch 2 --accum 2 --lr 2e-3 --weight-decay 0.05 --clip 0.5 --precision bf16 "
                               "--warmup 2 --warmup-min-lr 1e-4 ";

}  // namespace

// Configs shaped like the ones users copy (DeepSpeed's Megatron tutorial, Lightning's ZeRO-3,
// Hugging Face's ZeRO-2 with offload and ZeRO-3) run their binaries; what each run used is
// compared with the file itself (read here, not by the trainers' parser) and DeepSpeed's meaning
// of what the file leaves out.
TEST(DsConfig, ConfigsAsUsersHaveThemRun) {
  struct Case { const char* file; const char* binary; std::string flags; };
  const int N = 2;
  for (const Case& c : {Case{"tests/tools/ds_configs/megatron_zero2.json", "stage2", ""},
                        Case{"tests/tools/ds_configs/lightning_zero3.json", "stage3", ""},
                        Case{"tests/tools/ds_configs/hf_zero2.json", "offload", kAutoFlags},
                        Case{"tests/tools/ds_configs/hf_zero3.json", "stage3", kAutoFlags},
                        Case{"tests/tools/ds_configs/monitoring_zero2.json", "stage2", ""}}) {
    SCOPED_TRACE(c.file);
    const Json file = Json::parse(read_file(c.file));
    ASSERT_TRUE(file.has("zero_optimization")) << "not a readable config";
    RunResult r = run_trainer(c.binary, N, kRun + c.flags + "--config " + c.file, "users");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // one note line per key that changes nothing here, and no other note
    std::vector<std::string> keys;
    no_effect_keys(file, "", &keys);
    ASSERT_GT(keys.size(), 3u);
    for (const std::string& k : keys)
      EXPECT_EQ(count_lines_starting(r.output, "note: --config " + std::string(c.file) + ": " + k + ":"), 1)
          << k << " in:\n" << r.output;
    EXPECT_EQ(count_lines_starting(r.output, "note: "), int(keys.size())) << r.output;
    // the values in force: the file's, or for "auto" the command line's (kAutoFlags)
    const Json& rep = r.report;
    const Json& s = rep["settings"];
    const bool hf = !c.flags.empty();
    auto file_or = [&](const Json& v, double flag) { return is_auto(v) ? flag : v.d(); };
    if (file.has("train_micro_batch_size_per_gpu")) {
      EXPECT_EQ(rep["batch"].d(), file_or(file["train_micro_batch_size_per_gpu"], 2));
    }
    if (file.has("gradient_accumulation_steps")) {
      EXPECT_EQ(rep["accum"].d(), file_or(file["gradient_accumulation_steps"], 2));
    }
    if (file.has("train_batch_size") && !is_auto(file["train_batch_size"])) {
      EXPECT_EQ(rep["batch"].u() * rep["accum"].u() * N, file["train_batch_size"].u());
    }
    const std::string precision = hf ? "bf16" : file.has("fp16") ? "fp16" : file.has("bf16") ? "bf16" : "fp32";
    EXPECT_EQ(rep["precision"].str, precision);
    // no gradient_clipping: DeepSpeed's 0, no clipping
    EXPECT_FLOAT_EQ(s["clip"].d(), file.has("gradient_clipping") ? file_or(file["gradient_clipping"], 0.5) : 0.0);
    EXPECT_EQ(rep["activation_checkpointing"].b, file.has("activation_checkpointing"));
    if (file.has("optimizer")) {
      EXPECT_FLOAT_EQ(s["weight_decay"].d(), file_or(file["optimizer"]["params"]["weight_decay"], 0.05));
    } else {
      EXPECT_FLOAT_EQ(s["weight_decay"].d(), 0.1);  // no optimizer section: the trainers' own AdamW, its flags
    }
    const std::vector<double> lrs = step_values(rep, "lr");
    ASSERT_EQ(lrs.size(), 3u);
    if (!file.has("scheduler")) {
      // DeepSpeed without a scheduler: the optimizer's learning rate at every step, no warm-up
      const double lr = file.has("optimizer") ? file["optimizer"]["params"]["lr"].d() : 3e-3;
      EXPECT_EQ(s["lr_schedule"].str, "constant");
      for (size_t t = 0; t < lrs.size(); t++) EXPECT_EQ(lrs[t], double(float(lr))) << "step " << t + 1;
    } else {
      EXPECT_EQ(s["lr_schedule"].str, file["scheduler"]["type"].str == "WarmupLR" ? "warmup" : "warmup-decay");
      EXPECT_FLOAT_EQ(s["lr"].d(), 2e-3);
      EXPECT_FLOAT_EQ(s["warmup_min_lr"].d(), 1e-4);
      EXPECT_EQ(s["warmup"].u(), 2u);
      EXPECT_FLOAT_EQ(lrs[0], 1e-4);  // DeepSpeed's schedules: the first update at warmup_min_lr
    }
    if (std::string(c.binary) == "offload") {
      EXPECT_EQ(s["offload_to"].str, "cpu");
    }
  }
}

// "auto" takes the value of its flag on the command line; without the flag, one line names every
// flag to give. train_batch_size "auto" is whatever the others come to (--global-batch sets it).
TEST(DsConfig, AutoTakesTheCommandLinesValueOrNamesTheFlag) {
  const std::string hf = "tests/tools/ds_configs/hf_zero3.json";
  std::string out;
  int rc = run_command("timeout 60 " + bin_dir() + "/stage3 " + kRun + "--config " + hf, &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  for (const char* f : {"--batch B", "--accum K", "--lr X", "--weight-decay X", "--clip X", "--precision P",
                        "--warmup N", "--warmup-min-lr X"})
    EXPECT_NE(out.find(f), std::string::npos) << "want " << f << " named in: " << out;
  rc = run_command("timeout 60 " + bin_dir() + "/stage3 " + kRun + "--batch 2 --accum 2 --precision bf16 --lr 1e-3 "
                   "--config " + hf, &out);
  EXPECT_EQ(rc, 2) << out;
  for (const char* f : {"--batch", "--accum", "--precision", "--lr "}) EXPECT_EQ(out.find(f), std::string::npos) << f << ": " << out;
  for (const char* f : {"--clip X", "--weight-decay X", "--warmup N", "--warmup-min-lr X"})
    EXPECT_NE(out.find(f), std::string::npos) << f << ": " << out;
  // gradient_accumulation_steps "auto" from --global-batch: 8 sequences over 2 ranks x batch 2
  std::string flags = kAutoFlags;
  flags.replace(flags.find("--accum 2 "), 10, "--global-batch 8 ");
  RunResult r = run_trainer("stage3", 2, kRun + flags + "--config " + hf, "global");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report["batch"].u(), 2u);
  EXPECT_EQ(r.report["accum"].u(), 2u);
}

// Files that are no config, and values that would wrap or overflow: one line, exit 2, at once
// (each run is bounded by `timeout 60`: a hang fails as exit 124).
// Every unknown key of a config, at any depth, is named in one line: one run tells the user all
// of them (a group of compression_training counts whatever its name).
TEST(DsConfig, EveryUnknownKeyInOneLine) {
  const std::vector<std::string> unknown = {
      "compression_training.weight_quantization.different_groups.g1.params.zz", "fp16.auto_cast", "sparse_attention",
      "zero_optimization.mics_shard_size", "zero_optimization.offload_param.bogus"};
  const std::string config = write_config("several_unknown", R"({"sparse_attention": {"mode": "fixed"},
      "zero_optimization": {"stage": 2, "mics_shard_size": 8, "overlap_comm": true, "offload_param": {"bogus": 1}},
      "fp16": {"enabled": false, "auto_cast": false}, "tensorboard": {"enabled": true},
      "compression_training": {"weight_quantization": {"different_groups": {"g1": {"params": {"zz": 1}}}}}})");
  std::string out;
  const int rc = run_command("timeout 60 " + bin_dir() + "/stage2 --config " + config + " " + kRun, &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find("5 unknown or unsupported keys: "), std::string::npos) << out;
  for (const std::string& key : unknown) EXPECT_NE(out.find(key), std::string::npos) << key << " not in: " << out;
  // the keys that are known here, or DeepSpeed's that change nothing, are not among them
  for (const char* known : {"overlap_comm", "tensorboard", "fp16.enabled", "g1.params,", "offload_param,"})
    EXPECT_EQ(out.find(known), std::string::npos) << known << " named in: " << out;
}

// communication_data_type may only restate the run's own precision (the gradients are reduced in
// it here); total_num_steps is WarmupDecayLR's alone.
TEST(DsConfig, CommunicationTypeIsTheRunsPrecision) {
  expect_one_line_error("stage2", write_config("comm_fp32_in_bf16", R"({"zero_optimization": {"stage": 2},
                          "bf16": {"enabled": true}, "communication_data_type": "fp32"})"), kRun,
                        "communication_data_type: \"fp32\": here the gradients are reduced in the run's own precision, "
                        "bf16, expected \"bf16\"");
  expect_one_line_error("stage2", write_config("comm_bf16_cli", R"({"zero_optimization": {"stage": 2},
                          "communication_data_type": "bf16"})"), kRun + "--precision fp16 ",
                        "reduced in the run's own precision, fp16");
  expect_one_line_error("stage2", write_config("comm_bogus", R"({"zero_optimization": {"stage": 2},
                          "communication_data_type": "int8"})"), kRun, "expected fp32, fp16 or bf16");
  expect_one_line_error("stage0_ddp", write_config("warmuplr_total", R"({"scheduler": {"type": "WarmupLR",
                          "params": {"total_num_steps": 10}}})"), kRun,
                        "scheduler.params.total_num_steps: WarmupDecayLR's key beside WarmupLR");
  // DeepSpeed's older spelling of bf16, in its upper case, restating a bf16 run from the command line: accepted
  RunResult r = run_trainer("stage2", 2, kRun + "--precision bf16 --config " +
                            write_config("comm_bfp16", R"({"zero_optimization": {"stage": 2}, "communication_data_type": "BFP16"})"),
                            "comm_bfp16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.report["precision"].str, "bf16");
  EXPECT_NE(r.output.find("note: --config "), std::string::npos) << r.output;
}

TEST(DsConfig, BadFilesAndOutOfRangeValuesAreOneLineExit2) {
  const std::string dir = temp_dir() + "/a_dir";
  (void)!system(("mkdir -p '" + dir + "'").c_str());
  expect_one_line_error("stage0_ddp", dir, kRun, "not a regular file (a directory)");
  const std::string fifo = temp_dir() + "/fifo.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  expect_one_line_error("stage0_ddp", fifo, kRun, "not a regular file (a pipe)");
  expect_one_line_error("stage0_ddp", "/dev/zero", kRun, "not a regular file");
  expect_one_line_error("stage0_ddp", write_config("huge", "{\"train_batch_size\": 8" + std::string(2 << 20, ' ') + "}"),
                        kRun, "more than the limit of 1048576");
  const int deep = 100000;  // dumping or destroying it recursively would overflow the stack
  expect_one_line_error("stage0_ddp", write_config("deep_array", "{\"train_batch_size\": " + std::string(deep, '[') +
                                                                     std::string(deep, ']') + "}"),
                        kRun, "nested more than 32 levels deep");
  std::string objects;
  for (int i = 0; i < deep; i++) objects += "{\"a\": ";
  expect_one_line_error("stage0_ddp", write_config("deep_object", objects + "1" + std::string(deep, '}')), kRun,
                        "nested more than 32 levels deep");
  expect_one_line_error("stage0_ddp", write_config("newline_key", R"({"bad\nkey": 1})"), kRun,
                        "bad\\x0akey: unknown or unsupported key");
  // 6442450944 = 1.5 * 2^32 and 2^33 wrapped to a negative and a zero micro-batch
  expect_one_line_error("stage0_ddp", write_config("tbs_wraps", R"({"train_batch_size": 6442450944})"), kRun,
                        "train_batch_size 6442450944 needs a micro-batch of 6442450944 per rank");
  expect_one_line_error("stage0_ddp", write_config("tbs_2_33", R"({"train_batch_size": 8589934592})"), kRun,
                        "expected at most 65536");
  expect_one_line_error("stage0_ddp", write_config("tbs_accum", R"({"train_batch_size": 8589934592,
                          "train_micro_batch_size_per_gpu": 1})"), kRun, "needs an accumulation of 8589934592");
  expect_one_line_error("stage0_ddp", write_config("tbs_huge", R"({"train_batch_size": 1e300})"), kRun,
                        "train_batch_size: 1e+300: out of range");
  expect_one_line_error("stage0_ddp", write_config("tbs_uint64", R"({"train_batch_size": 18446744073709551615})"),
                        kRun, "train_batch_size: 18446744073709551615: out of range");
  expect_one_line_error("stage0_ddp", write_config("mb_wraps", R"({"train_micro_batch_size_per_gpu": 6442450944})"),
                        kRun, "train_micro_batch_size_per_gpu 6442450944: out of range");
  expect_one_line_error("stage0_ddp", write_config("accum_negative", R"({"gradient_accumulation_steps": -1})"), kRun,
                        "gradient_accumulation_steps: -1: out of range");
  expect_one_line_error("stage0_ddp", write_config("accum_fraction", R"({"gradient_accumulation_steps": 2.5})"), kRun,
                        "gradient_accumulation_steps: 2.5: not whole");
  expect_one_line_error("stage0_ddp", write_config("scale_power", R"({"fp16": {"enabled": true,
                          "initial_scale_power": 1000}})"), kRun, "fp16.initial_scale_power: 1000: out of range");
  expect_one_line_error("stage0_ddp", write_config("number_overflow", R"({"gradient_clipping": 1e999})"), kRun,
                        "not valid JSON");
  expect_one_line_error("stage2", write_config("bool_knob", R"({"zero_optimization": {"stage": 2,
                          "overlap_comm": "yes"}})"), kRun, "zero_optimization.overlap_comm: expected true or false");
  expect_one_line_error("stage3", write_config("param_offload", R"({"zero_optimization": {"stage": 3,
                          "offload_param": {"device": "cpu"}}})"), kRun, "run build/bin/infinity with it");
}

// An error caused by a value the file set names the file's key, not a flag the user never typed.
TEST(DsConfig, ErrorsNameTheKeyNotAFlagTheUserNeverTyped) {
  struct Case { const char* binary; const char* name; std::string json; std::string flags; const char* want; const char* not_flag; };
  const std::string nvme = temp_dir() + "/not_a_dir";
  std::ofstream(nvme) << "x";
  for (const Case& c : {
           Case{"stage0_ddp", "accum_range", R"({"gradient_accumulation_steps": 100000})", "",
                "gradient_accumulation_steps 100000: out of range", "--accum"},
           Case{"stage0_ddp", "lr_range", R"({"optimizer": {"type": "AdamW", "params": {"lr": 50}}})", "",
                "optimizer.params.lr 50: expected a learning rate", "--lr"},
           Case{"stage0_ddp", "scale_below_min", R"({"fp16": {"enabled": true, "initial_scale_power": 1,
                "min_loss_scale": 4}})", "", "fp16.initial_scale_power 1: below --config", "--loss-scale"},
           Case{"stage0_ddp", "accum_and_global", R"({"gradient_accumulation_steps": 2})", "--global-batch 8 ",
                "--global-batch 8 and --config", "--accum"},
           Case{"stage0_ddp", "batch_and_global", R"({"train_micro_batch_size_per_gpu": 3})", "--global-batch 8 ",
                "not a multiple of --config", "--batch"},
           Case{"offload", "nvme_no_path", R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})",
                "", "\"nvme\" without nvme_path", "--offload"},
           Case{"offload", "nvme_not_dir", R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme",
                "nvme_path": ")" + nvme + R"("}}})", "", "offload_optimizer.nvme_path", "--offload"},
           Case{"stage0_ddp", "warmup_type", R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})",
                "", "scheduler.params.warmup_type: \"cosine\", expected log or linear", "--warmup-type"},
           Case{"stage0_ddp", "tbs_batch", R"({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 4})", "",
                "train_micro_batch_size_per_gpu 4", "--batch"},
       }) {
    SCOPED_TRACE(c.name);
    std::string out;
    const int rc = run_command("timeout 60 " + bin_dir() + "/" + c.binary + " " + kRun + c.flags + "--config " +
                                   write_config(c.name, c.json), &out);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    EXPECT_NE(out.find(c.want), std::string::npos) << "want '" << c.want << "' in: " << out;
    EXPECT_EQ(out.find(std::string(c.not_flag) + " "), std::string::npos) << "names " << c.not_flag << ": " << out;
    EXPECT_EQ(out.find(std::string(c.not_flag) + "-"), std::string::npos) << "names " << c.not_flag << ": " << out;
  }
  // the command line's own flag is named: --warmup with a config whose learning rate is constant
  expect_one_line_error("stage0_ddp", write_config("no_scheduler", R"({"train_micro_batch_size_per_gpu": 2})"),
                        kRun + "--warmup 5 ", "--warmup 5: the learning rate is constant");
}

// begin tensor parallelism's config (docs/deepspeed_config.md): DeepSpeed's AutoTP training names the tensor
// degree tensor_parallel.autotp_size; > 1 runs build/bin/tensor as --tensor T, with ZeRO-1 over the replicas
// for stage 1 and train_batch_size counted over the data-parallel replicas (N / T), as DeepSpeed counts it.
TEST(DsConfig, TensorParallelAutotpSizeIsTheTensorDegree) {
  const std::string cfg = write_config("ds_autotp", R"({
    "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "bf16": {"enabled": true}, "zero_optimization": {"stage": 1},
    "tensor_parallel": {"autotp_size": 2, "tp_overlap_comm": true}})");
  RunResult r = run_trainer("tensor", 4, kRun + "--config " + cfg, "ds_autotp");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Json& t = r.report["tensor"];
  EXPECT_EQ(t["tensor"].u(), 2u);    // autotp_size
  EXPECT_EQ(t["replicas"].u(), 2u);  // 4 ranks / T: 2 x 2 x 2 = train_batch_size 8
  EXPECT_EQ(t["zero"].u(), 1u);      // zero_optimization.stage 1
  EXPECT_EQ(r.report["precision"].str, "bf16");
  EXPECT_EQ(r.report["batch"].u(), 2u);
  EXPECT_EQ(r.report["accum"].u(), 2u);
  EXPECT_NE(r.output.find("note: --config " + cfg + ": tensor_parallel.tp_overlap_comm:"), std::string::npos) << r.output;
  // autotp_size 1 (or 0, DeepSpeed's "off") is no tensor parallelism: stage0_ddp runs it
  const std::string one = write_config("ds_autotp_one", R"({"train_micro_batch_size_per_gpu": 2,
    "tensor_parallel": {"autotp_size": 1}})");
  RunResult plain = run_trainer("stage0_ddp", 2, kRun + "--config " + one, "ds_autotp_one");
  EXPECT_EQ(plain.exit_code, 0) << plain.output;
  // what does not mean the same here: one line each, exit 2
  expect_one_line_error("stage2", cfg, kRun, "expected build/bin/tensor; run build/bin/tensor with it");
  const std::string two = write_config("ds_autotp_stage2", R"({"zero_optimization": {"stage": 2},
    "tensor_parallel": {"autotp_size": 2}})");
  expect_one_line_error("tensor", two, kRun + "--tensor 2", "zero_optimization.stage: 2 with tensor parallelism");
  const std::string rules = write_config("ds_autotp_rules", R"({"tensor_parallel": {"autotp_size": 2,
    "preset_model": "llama"}})");
  expect_one_line_error("tensor", rules, kRun, "tensor_parallel.preset_model: AutoTP's rules");
  const std::string parts = write_config("ds_autotp_parts", R"({"tensor_parallel": {"autotp_size": 2,
    "partition_config": {"use_default_specs": false}}})");
  expect_one_line_error("tensor", parts, kRun, "tensor_parallel.partition_config: AutoTP's rules");
  const std::string text = write_config("ds_autotp_text", R"({"tensor_parallel": {"autotp_size": "two"}})");
  expect_one_line_error("tensor", text, kRun, "tensor_parallel.autotp_size: got \"two\", expected a whole number");
  const std::string off = write_config("ds_autotp_offload", R"({"zero_optimization": {"stage": 2,
    "offload_optimizer": {"device": "cpu"}}, "tensor_parallel": {"autotp_size": 2}})");
  expect_one_line_error("tensor", off, kRun, "offload with tensor parallelism");
  const std::string inference = write_config("ds_autotp_tp", R"({"tensor_parallel": {"tp": {"tp_size": 2}}})");
  expect_one_line_error("tensor", inference, kRun, "tensor_parallel.tp: unknown or unsupported key");
  std::string out;
  EXPECT_EQ(run_command(bin_dir() + "/zero_estimate --config " + cfg + " --preset tiny", &out), 2) << out;
  EXPECT_NE(out.find("use zero_estimate --tensor for its table"), std::string::npos) << out;
}
// end tensor parallelism's config

// sequence_parallel_size (DeepSpeed's Ulysses, as ALST sets it) is ulysses' --sp S: a stage-3 config with
// it trains what `--sp S` trains, bit for bit (every step's loss and norm, the saved model, the all-to-all
// elements of the comm ledger; --sp 4 sends others); 1 on another rung, and "auto" there, are a note;
// where it does not mean the same (another ZeRO stage, offload, ZeRO++, a pipeline, another binary, a
// size out of range, "auto" with no --sp) one line, exit 2.
TEST(DsConfig, SequenceParallelSizeIsUlyssesSp) {
  const std::string flags = kRun + "--batch 2 ";
  const std::string sp2 = write_config("sp2", R"({"zero_optimization": {"stage": 3}, "sequence_parallel_size": 2})");
  // the same config without the key (a stage-3 config runs ulysses too), --sp on the command line
  const std::string z3 = write_config("z3_plain", R"({"zero_optimization": {"stage": 3}})");
  RunResult cfg = run_trainer("ulysses", 4, flags + "--config " + sp2, "sp_config");
  RunResult cli = run_trainer("ulysses", 4, flags + "--config " + z3 + " --sp 2", "sp_flag");
  RunResult four = run_trainer("ulysses", 4, flags + "--config " + z3 + " --sp 4", "sp_flag4");
  ASSERT_EQ(cfg.exit_code, 0) << cfg.output;
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  ASSERT_EQ(four.exit_code, 0) << four.output;
  EXPECT_EQ(step_values(cfg.report, "loss"), step_values(cli.report, "loss"));
  EXPECT_EQ(step_values(cfg.report, "grad_norm"), step_values(cli.report, "grad_norm"));
  EXPECT_TRUE(read_file(cfg.model_path) == read_file(cli.model_path)) << "the saved models differ";
  auto a2a = [](const RunResult& r) { return r.report["ranks"][0]["comm"]["all_to_all"]["elems_sent"].u(); };
  EXPECT_GT(a2a(cli), 0u);
  EXPECT_EQ(a2a(cfg), a2a(cli));
  EXPECT_NE(a2a(cfg), a2a(four));  // the key chose S = 2, not another split
  EXPECT_NE(step_values(cfg.report, "grad_norm"), step_values(four.report, "grad_norm"));
  // the command line wins: --sp 4 over the file's 2
  RunResult over = run_trainer("ulysses", 4, flags + "--config " + sp2 + " --sp 4", "sp_override");
  ASSERT_EQ(over.exit_code, 0) << over.output;
  EXPECT_EQ(a2a(over), a2a(four));
  EXPECT_EQ(step_values(over.report, "grad_norm"), step_values(four.report, "grad_norm"));
  // 1 and "auto" on another rung: a note, the run as without the key
  for (const char* v : {"1", "\"auto\""}) {
    RunResult one = run_trainer("stage3", 2, kRun + "--config " +
                                write_config("sp_one", std::string(R"({"zero_optimization": {"stage": 3}, )") +
                                             R"("sequence_parallel_size": )" + v + "}"), "sp_one");
    ASSERT_EQ(one.exit_code, 0) << v << ": " << one.output;
    EXPECT_NE(one.output.find("note: --config "), std::string::npos) << one.output;
    EXPECT_NE(one.output.find("sequence_parallel_size"), std::string::npos) << one.output;
  }
  // where it does not mean the same: one line, exit 2, naming the key
  expect_one_line_error("ulysses", write_config("sp_z2", R"({"zero_optimization": {"stage": 2},
                          "sequence_parallel_size": 2})"), kRun, "sequence_parallel_size: 2 with zero_optimization.stage 2");
  expect_one_line_error("ulysses", write_config("sp_offload", R"({"zero_optimization": {"stage": 3, "offload_param":
                          {"device": "cpu"}}, "sequence_parallel_size": 2})"), kRun,
                        "sequence_parallel_size: 2 beside offload_param");
  expect_one_line_error("ulysses", write_config("sp_zeropp", R"({"zero_optimization": {"stage": 3,
                          "zero_quantized_weights": true}, "sequence_parallel_size": 2})"), kRun,
                        "sequence_parallel_size: 2 beside ZeRO++'s keys");
  expect_one_line_error("stage3", sp2, kRun, "with sequence_parallel_size, and this is stage3, expected build/bin/ulysses");
  expect_one_line_error("ulysses", write_config("sp_zero", R"({"zero_optimization": {"stage": 3},
                          "sequence_parallel_size": 0})"), kRun, "sequence_parallel_size: 0: out of range");
  expect_one_line_error("ulysses", write_config("sp_auto", R"({"zero_optimization": {"stage": 3},
                          "sequence_parallel_size": "auto"})"), kRun, "add --sp S");
  std::string out;
  EXPECT_EQ(run_command(bin_dir() + "/zero_estimate --config " + sp2, &out), 2) << out;
  EXPECT_NE(out.find("a config for build/bin/ulysses, expected one for the ZeRO stages"), std::string::npos) << out;
  EXPECT_NE(out.find("zero_estimate --sp S"), std::string::npos) << out;
}
