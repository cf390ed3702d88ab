// ds_config.cpp — DeepSpeed's JSON config, translated key by key into this project's flags.
#include "ds_config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>  // nlohmann::json (Debian: nlohmann-json3-dev; scripts/install_deps.sh)
#include <set>
#include <sstream>

#include "check.h"  // user_error
#include "cli.h"    // Args

namespace nz {

using json = nlohmann::json;

namespace {

// One config being read: its path (for the messages) and the flags it stands for.
struct Reader {
  std::string path;
  DsConfig out;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    user_error("--config %s: %s: %s", path.c_str(), key.c_str(), what.c_str());
  }
  // Every key of `obj` must be one of `known`; a nested object's keys are named with its path.
  void only(const json& obj, const std::string& where, const std::set<std::string>& known) const {
    if (!obj.is_object()) fail(where, "expected an object { ... }");
    for (auto it = obj.begin(); it != obj.end(); ++it)
      if (!known.count(it.key())) {
        std::string list;
        for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
        fail((where.empty() ? "" : where + ".") + it.key(),
             "unknown or unsupported key; this project reads " + (where.empty() ? std::string("the top-level keys ")
                                                                              : where + "'s keys ") +
                 list + " (README 'DeepSpeed config files'): remove it");
      }
  }
  double number(const json& v, const std::string& key) const {
    if (v.is_string() && v.get<std::string>() == "auto")
      fail(key, "\"auto\" is filled in by the Hugging Face integration, not here; give a number");
    if (!v.is_number()) fail(key, "expected a number, got " + v.dump());
    return v.get<double>();
  }
  long whole(const json& v, const std::string& key) const {
    const double x = number(v, key);
    if (x != std::floor(x) || x < 0 || x > 1e15) fail(key, "expected a whole number >= 0, got " + v.dump());
    return long(x);
  }
  bool boolean(const json& v, const std::string& key) const {
    if (!v.is_boolean()) fail(key, "expected true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::string text(const json& v, const std::string& key) const {
    if (!v.is_string()) fail(key, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  void flag(const std::string& f, const std::string& value) { out.flags.push_back({f, value}); }
  static std::string num(double x) {
    std::ostringstream s;
    s.precision(17);
    s << x;
    return s.str();
  }
};

// The binary that runs a config's ZeRO stage (with or without offload_optimizer).
std::string binary_for(long stage, bool offload) {
  if (offload) return "offload";
  return stage == 0 ? "stage0_ddp" : "stage" + std::to_string(stage);
}

}  // namespace

DsConfig read_ds_config(const std::string& path, const std::string& program) {
  Reader r{path, {}};
  std::ifstream f(path);
  if (!f) user_error("--config %s: cannot open it; give a DeepSpeed JSON config (examples in configs/)", path.c_str());
  json c;
  try {
    c = json::parse(f, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    user_error("--config %s: not valid JSON (%s); fix the file", path.c_str(), e.what());
  }
  r.only(c, "", {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                 "gradient_clipping", "fp16", "bf16", "zero_optimization", "optimizer", "scheduler",
                 "activation_checkpointing"});

  // ---- batch: micro-batch per rank, accumulation, and their product over the ranks ----
  if (c.contains("train_micro_batch_size_per_gpu"))
    r.flag("--batch", std::to_string(r.whole(c["train_micro_batch_size_per_gpu"], "train_micro_batch_size_per_gpu")));
  if (c.contains("gradient_accumulation_steps"))
    r.flag("--accum", std::to_string(r.whole(c["gradient_accumulation_steps"], "gradient_accumulation_steps")));
  if (c.contains("train_batch_size")) {
    r.out.train_batch_size = r.whole(c["train_batch_size"], "train_batch_size");
    if (r.out.train_batch_size < 1) r.fail("train_batch_size", "expected a positive whole number");
  }
  if (c.contains("gradient_clipping")) r.flag("--clip", Reader::num(r.number(c["gradient_clipping"], "gradient_clipping")));

  // ---- precision: fp16 (with its loss scaler) or bf16; fp32 when neither is enabled ----
  bool fp16 = false, bf16 = false;
  if (c.contains("fp16")) {
    const json& h = c["fp16"];
    r.only(h, "fp16", {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                       "min_loss_scale"});
    fp16 = h.contains("enabled") && r.boolean(h["enabled"], "fp16.enabled");
    if (fp16) {
      r.flag("--precision", "fp16");
      if (h.contains("initial_scale_power"))
        r.flag("--loss-scale", Reader::num(std::ldexp(1.0, int(r.whole(h["initial_scale_power"], "fp16.initial_scale_power")))));
      if (h.contains("loss_scale_window"))
        r.flag("--loss-scale-window", std::to_string(r.whole(h["loss_scale_window"], "fp16.loss_scale_window")));
      if (h.contains("hysteresis")) r.flag("--loss-scale-hysteresis", std::to_string(r.whole(h["hysteresis"], "fp16.hysteresis")));
      if (h.contains("min_loss_scale"))
        r.flag("--loss-scale-min", Reader::num(r.number(h["min_loss_scale"], "fp16.min_loss_scale")));
      // loss_scale 0 (DeepSpeed's default) means dynamic; any other value is a static scale
      if (h.contains("loss_scale") && r.number(h["loss_scale"], "fp16.loss_scale") != 0) {
        r.flag("--loss-scale", Reader::num(r.number(h["loss_scale"], "fp16.loss_scale")));
        r.flag("--loss-scale-window", "0");
      }
    }
  }
  if (c.contains("bf16")) {
    r.only(c["bf16"], "bf16", {"enabled"});
    bf16 = c["bf16"].contains("enabled") && r.boolean(c["bf16"]["enabled"], "bf16.enabled");
    if (bf16) r.flag("--precision", "bf16");
  }
  if (fp16 && bf16) r.fail("fp16.enabled and bf16.enabled", "both true; enable one of them");

  // ---- ZeRO stage and offload: which binary runs this config ----
  long stage = 0;
  bool offload = false;
  if (c.contains("zero_optimization")) {
    const json& z = c["zero_optimization"];
    r.only(z, "zero_optimization", {"stage", "offload_optimizer"});
    if (z.contains("stage")) stage = r.whole(z["stage"], "zero_optimization.stage");
    if (stage > 3) r.fail("zero_optimization.stage", "expected 0, 1, 2 or 3");
    if (z.contains("offload_optimizer")) {
      const json& o = z["offload_optimizer"];
      r.only(o, "zero_optimization.offload_optimizer", {"device", "nvme_path"});
      const std::string device = o.contains("device") ? r.text(o["device"], "zero_optimization.offload_optimizer.device") : "none";
      if (device == "cpu" || device == "nvme") {
        offload = true;
        r.flag("--offload-to", device == "cpu" ? "cpu" : "disk");
      } else if (device != "none") {
        r.fail("zero_optimization.offload_optimizer.device", "\"" + device + "\": expected cpu, nvme or none");
      }
      if (o.contains("nvme_path")) {
        if (device != "nvme") r.fail("zero_optimization.offload_optimizer.nvme_path", "applies to device nvme only");
        r.flag("--offload-dir", r.text(o["nvme_path"], "zero_optimization.offload_optimizer.nvme_path"));
      }
    }
    if (offload && stage != 2)
      r.fail("zero_optimization.offload_optimizer",
             "not supported with stage " + std::to_string(stage) + " yet: ZeRO-Offload here is stage 2's (run "
             "build/bin/offload with zero_optimization.stage 2)");
  }
  const std::string want = binary_for(stage, offload);
  if (want != program)
    user_error("--config %s: a config for ZeRO stage %ld%s, and this is %s: run build/bin/%s with it", path.c_str(),
               stage, offload ? " with offload_optimizer" : "", program.c_str(), want.c_str());

  // ---- the optimizer: AdamW (DeepSpeed's "Adam" is AdamW too, its adam_w_mode on by default) ----
  if (c.contains("optimizer")) {
    const json& o = c["optimizer"];
    r.only(o, "optimizer", {"type", "params"});
    const std::string type = o.contains("type") ? r.text(o["type"], "optimizer.type") : "AdamW";
    if (type != "AdamW" && type != "Adam")
      r.fail("optimizer.type", "\"" + type + "\": this project has AdamW only; write \"AdamW\"");
    if (o.contains("params")) {
      const json& p = o["params"];
      r.only(p, "optimizer.params", {"lr", "betas", "eps", "weight_decay"});
      if (p.contains("lr")) r.flag("--lr", Reader::num(r.number(p["lr"], "optimizer.params.lr")));
      if (p.contains("weight_decay"))
        r.flag("--weight-decay", Reader::num(r.number(p["weight_decay"], "optimizer.params.weight_decay")));
      // betas and eps are the constants of optim.cpp: a config may restate them, not change them
      if (p.contains("betas")) {
        const json& b = p["betas"];
        if (!b.is_array() || b.size() != 2 || r.number(b[0], "optimizer.params.betas") != 0.9 ||
            r.number(b[1], "optimizer.params.betas") != 0.95)
          r.fail("optimizer.params.betas", b.dump() + ": fixed at [0.9, 0.95] here (common/optim.cpp); remove it");
      }
      if (p.contains("eps") && r.number(p["eps"], "optimizer.params.eps") != 1e-8)
        r.fail("optimizer.params.eps", p["eps"].dump() + ": fixed at 1e-8 here (common/optim.cpp); remove it");
    }
  }

  // ---- the schedule: DeepSpeed's WarmupLR (then constant) and WarmupDecayLR (then linear to 0) ----
  if (c.contains("scheduler")) {
    const json& s = c["scheduler"];
    r.only(s, "scheduler", {"type", "params"});
    const std::string type = s.contains("type") ? r.text(s["type"], "scheduler.type") : "";
    if (type == "WarmupLR") r.flag("--lr-schedule", "warmup");
    else if (type == "WarmupDecayLR") r.flag("--lr-schedule", "warmup-decay");
    else r.fail("scheduler.type", "\"" + type + "\": expected WarmupLR or WarmupDecayLR");
    const json p = s.contains("params") ? s["params"] : json::object();
    std::set<std::string> keys = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"};
    if (type == "WarmupDecayLR") keys.insert("total_num_steps");
    r.only(p, "scheduler.params", keys);
    if (p.contains("warmup_min_lr")) r.flag("--warmup-min-lr", Reader::num(r.number(p["warmup_min_lr"], "scheduler.params.warmup_min_lr")));
    if (p.contains("warmup_max_lr")) r.flag("--lr", Reader::num(r.number(p["warmup_max_lr"], "scheduler.params.warmup_max_lr")));
    if (p.contains("warmup_num_steps"))
      r.flag("--warmup", std::to_string(r.whole(p["warmup_num_steps"], "scheduler.params.warmup_num_steps")));
    if (p.contains("warmup_type")) r.flag("--warmup-type", r.text(p["warmup_type"], "scheduler.params.warmup_type"));
    if (p.contains("total_num_steps"))
      r.flag("--lr-total-steps", std::to_string(r.whole(p["total_num_steps"], "scheduler.params.total_num_steps")));
  }

  // ---- activation checkpointing ----
  // The section turns on --activation-checkpointing (every block recomputed in its backward). Of
  // its keys, the two that would change where checkpoints live are refused when true:
  // partition_activations splits them over model-parallel ranks (there are none here) and
  // cpu_checkpointing moves them to the host (not built). contiguous_memory_optimization and
  // number_checkpoints describe what the trainers do anyway: every block input in one arena.
  if (c.contains("activation_checkpointing")) {
    const json& a = c["activation_checkpointing"];
    if (!a.is_object()) r.fail("activation_checkpointing", "expected an object, got " + a.dump());
    r.only(a, "activation_checkpointing",
           {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization", "number_checkpoints"});
    if (a.contains("partition_activations") && r.boolean(a["partition_activations"], "activation_checkpointing.partition_activations"))
      r.fail("activation_checkpointing.partition_activations",
             "true splits checkpoints over model-parallel ranks, and these trainers have none; set it to false");
    if (a.contains("cpu_checkpointing") && r.boolean(a["cpu_checkpointing"], "activation_checkpointing.cpu_checkpointing"))
      r.fail("activation_checkpointing.cpu_checkpointing",
             "true (checkpoints on the host) is not supported; set it to false");
    if (a.contains("contiguous_memory_optimization"))
      r.boolean(a["contiguous_memory_optimization"], "activation_checkpointing.contiguous_memory_optimization");
    if (a.contains("number_checkpoints")) r.whole(a["number_checkpoints"], "activation_checkpointing.number_checkpoints");
    r.flag("--activation-checkpointing", "");
  }
  return r.out;
}

void resolve_batch(Args& a, int world) {
  const long tbs = a.train_batch_size;
  if (tbs == 0) return;
  const std::string& p = a.config;
  if (a.batch_given && a.accum_given) {
    if (long(a.batch) * a.accum * world != tbs)
      user_error("--config %s: train_batch_size %ld, but micro-batch %d x accumulation %d x %d ranks = %ld; make them "
                 "agree (train_micro_batch_size_per_gpu, gradient_accumulation_steps, --batch, --accum, or -np)",
                 p.c_str(), tbs, a.batch, a.accum, world, long(a.batch) * a.accum * world);
    return;
  }
  if (a.batch_given) {  // accumulation = train_batch_size / (micro-batch x ranks)
    if (tbs % (long(a.batch) * world) != 0)
      user_error("--config %s: train_batch_size %ld is not a multiple of micro-batch %d x %d ranks; change one of them",
                 p.c_str(), tbs, a.batch, world);
    a.accum = int(tbs / (long(a.batch) * world));
    return;
  }
  if (!a.accum_given) a.accum = 1;  // neither: no accumulation, the micro-batch takes it all
  if (tbs % (long(a.accum) * world) != 0)
    user_error("--config %s: train_batch_size %ld is not a multiple of accumulation %d x %d ranks; change one of them",
               p.c_str(), tbs, a.accum, world);
  a.batch = int(tbs / (long(a.accum) * world));
}

}  // namespace nz
