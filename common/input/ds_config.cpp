// ds_config.cpp — DeepSpeed's JSON config, translated key by key into this project's flags.
#include "input/ds_config.h"

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>  // nlohmann::json (Debian: nlohmann-json3-dev; scripts/install_deps.sh)
#include <set>

#include "runtime/check.h"  // user_error
#include "input/data.h"   // read_input_file: a regular file of bounded size, never a FIFO

namespace nz {

using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxConfigBytes = 1 << 20;  // DeepSpeed's configs are a few kB
constexpr int kMaxConfigDepth = 32;            // theirs nest 4 levels deep

// Text from the file made fit for a one-line message: control characters escaped, at most 80
// characters (a key or a string may be anything, newlines and megabytes included).
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() >= 80) return out + "...";
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out;
}

// A value as a message shows it: a scalar as written, an array or an object by its kind. Never
// dumped whole: dumping recurses as deep as the value nests.
std::string shown(const json& v) {
  if (v.is_object()) return "an object {...}";
  if (v.is_array()) return "an array [...]";
  return printable(v.dump());
}

bool is_auto(const json& v) { return v.is_string() && v.get_ref<const std::string&>() == "auto"; }

// The keys of DeepSpeed's that change nothing here: what each does there, and why nothing changes
// here. Each is accepted with one note line; its value must still have the type DeepSpeed wants.
enum class Kind { Bool, Size, Section };  // Size: a number >= 0, or "auto"
struct NoEffect {
  Kind kind;
  const char* why;
};
const std::map<std::string, NoEffect> kNoEffect = {
    {"steps_per_print", {Kind::Size, "DeepSpeed logs its progress every N steps; here every step prints its line (--quiet: none)"}},
    {"wall_clock_breakdown", {Kind::Bool, "DeepSpeed times the forward, backward and optimizer step apart; here each step's "
                                          "time is in its line and in --log-json"}},
    {"memory_breakdown", {Kind::Bool, "DeepSpeed prints its memory use as it trains; here the memory ledger reports every "
                                      "byte at the end"}},
    {"zero_allow_untested_optimizer", {Kind::Bool, "lets DeepSpeed run ZeRO with an optimizer of the user's own; here the "
                                                   "optimizer is always this project's AdamW"}},
    {"aio", {Kind::Section, "DeepSpeed's asynchronous I/O for NVMe offload; the disk tier here reads and writes its files "
                            "a chunk at a time (--offload-chunk)"}},
    // logging and monitoring: what DeepSpeed would record, this project records its own way
    {"tensorboard", {Kind::Section, "DeepSpeed writes its training metrics (loss, learning rate, loss scale) as "
                                    "TensorBoard events; here every step's numbers are in its line and in --log-json"}},
    {"wandb", {Kind::Section, "DeepSpeed sends its training metrics to Weights & Biases; here every step's numbers "
                              "are in its line and in --log-json"}},
    {"csv_monitor", {Kind::Section, "DeepSpeed writes its training metrics to CSV files; here every step's numbers are "
                                    "in its line and in --log-json"}},
    {"comms_logger", {Kind::Section, "DeepSpeed logs each collective's size and time; here the comm ledger counts every "
                                     "collective's bytes, printed at the end and in --log-json"}},
    {"flops_profiler", {Kind::Section, "DeepSpeed profiles each module's FLOPs and time at one step; here every step's "
                                       "line has its throughput, and the report its MFU from the model's FLOPs"}},
    {"checkpoint", {Kind::Section, "DeepSpeed's checkpoint options (tag validation across ranks, universal loading, "
                                   "node-local storage, parallel writes); here --ckpt-dir's checkpoints carry a MANIFEST "
                                   "and checksums every reader checks, and load at any stage and world size"}},
    {"zero_optimization.overlap_comm", {Kind::Bool, "DeepSpeed overlaps the gradient reduction with the backward on a "
                                                    "second CUDA stream; here each unit's collective runs in turn, with "
                                                    "the same result"}},
    {"zero_optimization.contiguous_gradients", {Kind::Bool, "DeepSpeed copies gradients into one contiguous buffer as "
                                                            "they are made; here they live in one flat buffer from the start"}},
    {"zero_optimization.reduce_bucket_size", {Kind::Size, "elements DeepSpeed reduces at a time; here the bucket is one "
                                                          "unit (the embeddings, a block, the final norm)"}},
    {"zero_optimization.allgather_bucket_size", {Kind::Size, "elements DeepSpeed all-gathers at a time; here one unit at "
                                                             "a time"}},
    {"zero_optimization.allgather_partitions", {Kind::Bool, "all-gather (true) or one broadcast per rank (false) to "
                                                            "rebuild the parameters: the same values; here the stage "
                                                            "decides its collective"}},
    {"zero_optimization.reduce_scatter", {Kind::Bool, "reduce-scatter (true) or all-reduce (false) for the gradients: "
                                                      "the same values; here the stage decides its collective"}},
    {"zero_optimization.round_robin_gradients", {Kind::Bool, "spreads the copies of gradients to the host over the "
                                                             "ranks (offload); here each rank copies its own slices"}},
    {"zero_optimization.sub_group_size", {Kind::Size, "parameters DeepSpeed's stage-3 optimizer updates at a time; here "
                                                      "the optimizer updates one unit's slice at a time"}},
    {"zero_optimization.stage3_prefetch_bucket_size", {Kind::Size, "parameters DeepSpeed gathers ahead of their use; "
                                                                   "here the next unit is gathered ahead (--prefetch)"}},
    {"zero_optimization.stage3_param_persistence_threshold", {Kind::Size, "DeepSpeed leaves parameters smaller than "
                                                                          "this unsharded; here every unit is sharded"}},
    {"zero_optimization.stage3_max_live_parameters", {Kind::Size, "DeepSpeed's limit on parameters gathered at once; "
                                                                  "here at most two units are"}},
    {"zero_optimization.stage3_max_reuse_distance", {Kind::Size, "DeepSpeed keeps a gathered parameter that is used "
                                                                 "again this soon; here each unit is released after use"}},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save",
     {Kind::Bool, "DeepSpeed gathers the 16-bit weights into one file when it saves; here --save-model always writes "
                  "the whole model (fp32)"}},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save",
     {Kind::Bool, "DeepSpeed gathers the 16-bit weights into one file when it saves; here --save-model always writes "
                  "the whole model (fp32)"}},
    {"zero_optimization.offload_optimizer.pin_memory", {Kind::Bool, "DeepSpeed page-locks its host buffers for faster "
                                                                    "copies; here host memory is pinned whenever a GPU "
                                                                    "is used"}},
    {"zero_optimization.offload_optimizer.buffer_count", {Kind::Size, "DeepSpeed's buffers for swapping optimizer state "
                                                                      "to NVMe; the disk tier here streams through one "
                                                                      "chunk (--offload-chunk)"}},
    {"activation_checkpointing.contiguous_memory_optimization",
     {Kind::Bool, "DeepSpeed copies the checkpoints into one buffer; here every block input already lives in one arena"}},
    {"activation_checkpointing.number_checkpoints", {Kind::Size, "sizes DeepSpeed's contiguous checkpoint buffer; here "
                                                                 "the arena holds one input per block"}},
    {"pipeline.pipe_partitioned", {Kind::Bool, "DeepSpeed splits the activations sent between segments over the "
                                               "tensor-parallel ranks; there are none here"}},
    {"pipeline.grad_partitioned", {Kind::Bool, "DeepSpeed splits the gradients sent between segments over the "
                                               "tensor-parallel ranks; there are none here"}},
    {"tensor_parallel.tp_overlap_comm", {Kind::Bool, "DeepSpeed overlaps the tensor ranks' all-reduces with the "
                                                     "computation; here each runs where the layer needs it, in rank "
                                                     "order"}},
    {"activation_checkpointing.synchronize_checkpoint_boundary",
     {Kind::Bool, "DeepSpeed waits for the device at each checkpoint (for profiling); nothing to time apart here"}},
};

// The keys each section of a config may hold (besides kNoEffect's), by the section's dotted path;
// "*" stands for a key of any name (a compression group's). One table for the whole file: every
// key is checked against it before any value is read, so a config with several unknown keys is
// told about all of them at once, and a section's reader below never sees one.
const std::map<std::string, std::set<std::string>> kKnownKeys = {
    {"", {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
          "fp16", "bf16", "zero_optimization", "optimizer", "scheduler", "activation_checkpointing", "pipeline",
          "compression_training", "communication_data_type", "tensor_parallel",
          "sequence_parallel_size"}},
    {"fp16", {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale"}},
    {"bf16", {"enabled"}},
    {"zero_optimization", {"stage", "offload_optimizer", "offload_param", "cpu_offload", "zero_quantized_weights",
                           "zero_hpz_partition_size", "zero_quantized_gradients"}},
    {"zero_optimization.offload_param", {"device", "nvme_path", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu"}},
    {"zero_optimization.offload_optimizer", {"device", "nvme_path"}},
    {"pipeline", {"stages", "partition", "activation_checkpoint_interval", "seed_layers"}},
    {"tensor_parallel", {"autotp_size", "partition_config", "preset_model"}},  // DeepSpeed's AutoTP training
    {"optimizer", {"type", "params"}},
    {"optimizer.params", {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "muon_lr", "adam_lr", "momentum"}},
    {"scheduler", {"type", "params"}},
    {"scheduler.params", {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps"}},
    {"activation_checkpointing", {"partition_activations", "cpu_checkpointing"}},
    {"compression_training", {"weight_quantization"}},
    {"compression_training.weight_quantization", {"shared_parameters", "different_groups"}},
    {"compression_training.weight_quantization.shared_parameters",
     {"enabled", "quantizer_kernel", "schedule_offset", "quantize_groups", "quantize_verbose", "quantization_type",
      "quantize_weight_in_forward", "rounding", "fp16_mixed_quantize"}},
    {"compression_training.weight_quantization.different_groups", {"*"}},
    {"compression_training.weight_quantization.different_groups.*", {"params", "modules"}},
    {"compression_training.weight_quantization.different_groups.*.params",
     {"start_bits", "target_bits", "quantization_period"}},
};

// "auto" for these flags is resolved by another flag too (the command line's own way to say it).
const std::map<std::string, std::string> kAlsoResolvedBy = {{"--accum", "--global-batch"}};
const std::map<std::string, const char*> kMeta = {{"--batch", "B"}, {"--accum", "K"}, {"--lr", "X"},
                                                   {"--weight-decay", "X"}, {"--clip", "X"}, {"--precision", "P"},
                                                   {"--warmup", "N"}, {"--warmup-min-lr", "X"}, {"--pipeline", "P"},
                                                   {"--sp", "S"}};

// One config being read: its path (for the messages), the command line ("auto" takes its values
// from there) and the flags it stands for.
struct Reader {
  std::string path;
  const std::map<std::string, std::string>& command_line;
  DsConfig out;
  std::vector<std::pair<std::string, std::string>> auto_missing;  // {key, flag}: "auto", and no flag to fill it

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    if (key.empty()) user_error("--config %s: %s", path.c_str(), what.c_str());  // the file as a whole
    user_error("--config %s: %s: %s", path.c_str(), printable(key).c_str(), what.c_str());
  }
  static std::string join(const std::string& where, const std::string& key) {
    return where.empty() ? key : where + "." + key;
  }
  void note(const std::string& key, const std::string& what) {
    out.notes.push_back("--config " + path + ": " + printable(key) + ": " + what);
  }
  // Every key of the file must be one of kKnownKeys' or kNoEffect's: all the others are refused
  // together, in one line, before any value is read. `pattern` is where's path with "*" for a
  // key of any name.
  void check_keys(const json& obj, const std::string& where, const std::string& pattern,
                  std::vector<std::string>* unknown) const {
    const auto known = kKnownKeys.find(pattern);
    if (known == kKnownKeys.end() || !obj.is_object()) return;  // a wrong type: its reader says so
    const bool any = known->second.count("*") > 0;
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      const std::string key = join(where, it.key());
      if (any || known->second.count(it.key()))
        check_keys(it.value(), key, join(pattern, any ? "*" : it.key()), unknown);
      else if (!kNoEffect.count(key))
        unknown->push_back(key);
    }
  }
  void refuse_unknown_keys(const json& c) const {
    std::vector<std::string> unknown;
    check_keys(c, "", "", &unknown);
    if (unknown.size() == 1) {  // one: the keys its section may hold
      const std::string& key = unknown[0];
      const std::string where = key.find('.') == std::string::npos ? "" : key.substr(0, key.rfind('.'));
      std::string pattern, list;
      for (const std::string& part : split_path(where)) pattern = join(pattern, kKnownKeys.count(join(pattern, "*")) ? "*" : part);
      for (const std::string& k : kKnownKeys.at(pattern)) list += (list.empty() ? "" : ", ") + k;
      fail(key, "unknown or unsupported key, expected " + (where.empty() ? std::string("a top-level key: ") : where + "'s keys: ") +
                    list + ", or one of DeepSpeed's that change nothing here (docs/deepspeed_config.md); remove it");
    }
    if (!unknown.empty()) {
      std::string list;
      for (const std::string& k : unknown) list += (list.empty() ? "" : ", ") + printable(k);
      fail("", std::to_string(unknown.size()) + " unknown or unsupported keys: " + list + "; expected the keys "
               "docs/deepspeed_config.md lists (DeepSpeed's that change nothing here among them); remove them");
    }
  }
  static std::vector<std::string> split_path(const std::string& path) {
    std::vector<std::string> parts;
    for (size_t at = 0; !path.empty() && at <= path.size();) {
      const size_t dot = std::min(path.find('.', at), path.size());
      parts.push_back(path.substr(at, dot - at));
      at = dot + 1;
    }
    return parts;
  }
  // A section the reader uses: an object, whose keys of kNoEffect's are checked for their type and
  // noted once, here (its unknown keys were refused already: refuse_unknown_keys).
  void only(const json& obj, const std::string& where) {
    if (!obj.is_object()) fail(where, "expected an object { ... }, got " + shown(obj) + "; write the section as one");
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      const std::string key = join(where, it.key());
      auto ne = kNoEffect.find(key);
      if (ne == kNoEffect.end()) continue;
      const json& v = it.value();
      const Kind kind = ne->second.kind;
      if (kind == Kind::Bool && !v.is_boolean()) fail(key, "expected true or false, got " + shown(v) + "; write one");
      if (kind == Kind::Size && !is_auto(v) && !v.is_null() && !(v.is_number() && v.get<double>() >= 0))
        fail(key, "expected a number >= 0 or \"auto\", got " + shown(v) + "; write one");
      if (kind == Kind::Section && !v.is_object()) fail(key, "expected an object { ... }, got " + shown(v) + "; write one");
      if (where == "zero_optimization") out.zero_knobs[it.key()] = is_auto(v) ? "auto" : v.dump();
      note(key, std::string(ne->second.why) + ": ignored");
    }
  }
  // "auto": the value of `flag` on the command line, which is applied after the file anyway, so
  // nothing is taken from here. Without the flag it is remembered, and refused at the end with
  // every such flag in one line.
  bool take_auto(const json& v, const std::string& key, const std::string& flag) {
    if (!is_auto(v)) return false;
    auto also = kAlsoResolvedBy.find(flag);
    if (!command_line.count(flag) && (also == kAlsoResolvedBy.end() || !command_line.count(also->second)))
      auto_missing.push_back({key, flag});
    return true;
  }
  double number(const json& v, const std::string& key) const {
    if (is_auto(v)) fail(key, "\"auto\": no command-line flag stands for this key, expected a number; write one");
    if (!v.is_number()) fail(key, "expected a number, got " + shown(v) + "; write one");
    return v.get<double>();
  }
  // A whole number in [lo, hi], written as an integer or as a float without a fraction (DeepSpeed's
  // examples write 5e8). Checked before any conversion, so no value wraps around.
  long long whole(const json& v, const std::string& key, long long lo = 0, long long hi = INT64_MAX) const {
    const std::string range = "expected a whole number " + (hi == INT64_MAX ? ">= " + std::to_string(lo)
                                                                          : "from " + std::to_string(lo) + " to " + std::to_string(hi));
    if (is_auto(v)) fail(key, "\"auto\": no command-line flag stands for this key, " + range + "; write one");
    if (!v.is_number()) fail(key, "got " + shown(v) + ", " + range + "; write one");
    long long x;
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > uint64_t(hi)) fail(key, shown(v) + ": out of range, " + range + "; change it");
      x = (long long)v.get<uint64_t>();
    } else if (v.is_number_integer()) {
      x = v.get<int64_t>();
    } else {
      const double d = v.get<double>();
      if (d != std::floor(d)) fail(key, shown(v) + ": not whole, " + range + "; change it");
      if (!(d >= double(lo) && d <= double(hi))) fail(key, shown(v) + ": out of range, " + range + "; change it");
      x = (long long)d;
    }
    if (x < lo || x > hi) fail(key, shown(v) + ": out of range, " + range + "; change it");
    return x;
  }
  bool boolean(const json& v, const std::string& key) const {
    if (!v.is_boolean()) fail(key, "expected true or false, got " + shown(v) + "; write one");
    return v.get<bool>();
  }
  std::string text(const json& v, const std::string& key) const {
    if (!v.is_string()) fail(key, "expected a string, got " + shown(v) + "; write one");
    return v.get<std::string>();
  }
  // flag = value, for `key`, whose value the file shows as `as_written`.
  void flag(const std::string& f, const std::string& value, const std::string& key, const std::string& as_written) {
    out.flags.push_back({f, value, key, as_written});
  }
  // A number as its flag reads it: the shortest text that reads back as the same double.
  void number_flag(const std::string& f, const json& v, const std::string& key) {
    number(v, key);
    flag(f, v.dump(), key, shown(v));
  }
  void whole_flag(const std::string& f, const json& v, const std::string& key) {
    flag(f, std::to_string(whole(v, key)), key, shown(v));
  }
  // enabled of the fp16 or bf16 section: false when absent (DeepSpeed's default); "auto" is
  // whether the command line's --precision is this one.
  bool enabled(const json& section, const std::string& name) {
    if (!section.contains("enabled")) return false;
    const json& e = section["enabled"];
    if (take_auto(e, name + ".enabled", "--precision"))
      return command_line.count("--precision") && command_line.at("--precision") == name;
    return boolean(e, name + ".enabled");
  }
};

// The binary that runs a config's ZeRO stage (with or without offload_optimizer, offload_param, or
// ZeRO++'s keys).
std::string binary_for(long long stage, bool offload, bool param_offload, bool zeropp) {
  if (param_offload) return "infinity";
  if (offload) return "offload";
  if (zeropp) return "zeropp";
  return stage == 0 ? "stage0_ddp" : "stage" + std::to_string(stage);
}

}  // namespace

DsConfig read_ds_config(const std::string& path, const std::string& program,
                        const std::map<std::string, std::string>& command_line) {
  Reader r{path, command_line, {}, {}};
  const std::string text = read_input_file("--config", path, kMaxConfigBytes, "a DeepSpeed JSON config");
  json parsed;
  // The parser keeps its own stack (no recursion), but everything after it would recurse as deep
  // as the file nests: it is stopped at the first value past kMaxConfigDepth.
  json::parser_callback_t depth_check = [&](int depth, json::parse_event_t, json&) {
    if (depth > kMaxConfigDepth)
      user_error("--config %s: nested more than %d levels deep, expected a DeepSpeed config (4 levels at most); fix the "
                 "file", path.c_str(), kMaxConfigDepth);
    return true;
  };
  try {
    parsed = json::parse(text, depth_check, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {  // a syntax error, or a number beyond a double (out_of_range)
    user_error("--config %s: not valid JSON (%s), expected a DeepSpeed config; fix the file", path.c_str(),
               printable(std::string(e.what()).substr(0, 200)).c_str());
  }
  const json& c = parsed;  // read only: operator[] on a const object never adds a key
  r.refuse_unknown_keys(c);
  r.only(c, "");

  // ---- batch: micro-batch per rank, accumulation, and their product over the ranks ----
  // The flags check their ranges (--batch, --accum: 1 to 65536) and name the key when it is out.
  if (c.contains("train_micro_batch_size_per_gpu")) {
    const json& v = c["train_micro_batch_size_per_gpu"];
    if (!r.take_auto(v, "train_micro_batch_size_per_gpu", "--batch")) r.whole_flag("--batch", v, "train_micro_batch_size_per_gpu");
  }
  if (c.contains("gradient_accumulation_steps")) {
    const json& v = c["gradient_accumulation_steps"];
    if (!r.take_auto(v, "gradient_accumulation_steps", "--accum")) r.whole_flag("--accum", v, "gradient_accumulation_steps");
  }
  // "auto": whatever micro-batch x accumulation x ranks comes to (the Hugging Face integration
  // computes it so); --global-batch on the command line sets it
  if (c.contains("train_batch_size") && !is_auto(c["train_batch_size"]))
    r.out.train_batch_size = r.whole(c["train_batch_size"], "train_batch_size", 1, 1LL << 53);
  // no gradient_clipping: DeepSpeed's default, 0 (no clipping)
  if (!c.contains("gradient_clipping")) r.flag("--clip", "0", "gradient_clipping", "absent (DeepSpeed's default: 0)");
  else if (!r.take_auto(c["gradient_clipping"], "gradient_clipping", "--clip")) r.number_flag("--clip", c["gradient_clipping"], "gradient_clipping");

  // ---- precision: fp16 (with its loss scaler) or bf16; fp32 when neither is enabled ----
  bool fp16 = false, bf16 = false;
  if (c.contains("fp16")) {
    const json& h = c["fp16"];
    r.only(h, "fp16");
    fp16 = r.enabled(h, "fp16");
    if (fp16 && h["enabled"].is_boolean()) r.flag("--precision", "fp16", "fp16.enabled", "true");
    if (fp16) {
      if (h.contains("initial_scale_power")) {  // 2^99 ~ 6e29: within --loss-scale's range
        const long long p = r.whole(h["initial_scale_power"], "fp16.initial_scale_power", 0, 99);
        r.flag("--loss-scale", json(std::ldexp(1.0, int(p))).dump(), "fp16.initial_scale_power", std::to_string(p));
      }
      if (h.contains("loss_scale_window")) r.whole_flag("--loss-scale-window", h["loss_scale_window"], "fp16.loss_scale_window");
      if (h.contains("hysteresis")) r.whole_flag("--loss-scale-hysteresis", h["hysteresis"], "fp16.hysteresis");
      if (h.contains("min_loss_scale")) r.number_flag("--loss-scale-min", h["min_loss_scale"], "fp16.min_loss_scale");
      // loss_scale 0 (DeepSpeed's default) means dynamic; any other value is a static scale
      if (h.contains("loss_scale") && r.number(h["loss_scale"], "fp16.loss_scale") != 0) {
        r.number_flag("--loss-scale", h["loss_scale"], "fp16.loss_scale");
        r.flag("--loss-scale-window", "0", "fp16.loss_scale", shown(h["loss_scale"]));
      }
    }
  }
  if (c.contains("bf16")) {
    r.only(c["bf16"], "bf16");
    bf16 = r.enabled(c["bf16"], "bf16");
    if (bf16 && c["bf16"]["enabled"].is_boolean()) r.flag("--precision", "bf16", "bf16.enabled", "true");
  }
  if (fp16 && bf16) r.fail("fp16.enabled and bf16.enabled", "both true, expected one of them; disable the other");
  // communication_data_type: DeepSpeed's type for the gradients' reduction (by default the
  // training's); here the gradients are always reduced in the run's own precision, so the key may
  // only restate it (the command line's --precision, else the file's)
  if (c.contains("communication_data_type")) {
    const std::string key = "communication_data_type";
    std::string type = r.text(c[key], key);
    for (char& ch : type) ch = char(tolower((unsigned char)ch));  // DeepSpeed compares in lower case
    if (type == "bfp16") type = "bf16";                              // its older spelling
    const std::string run = command_line.count("--precision") ? command_line.at("--precision")
                            : fp16                            ? "fp16"
                            : bf16                            ? "bf16"
                                                              : "fp32";
    if (type != "fp32" && type != "fp16" && type != "bf16")
      r.fail(key, shown(c[key]) + ", expected fp32, fp16 or bf16; write the run's precision (" + run + ")");
    if (type != run)
      r.fail(key, shown(c[key]) + ": here the gradients are reduced in the run's own precision, " + run +
                      ", expected \"" + run + "\"; remove the key, or write \"" + run + "\"");
    r.note(key, shown(c[key]) + ": DeepSpeed reduces the gradients in this type; here they are reduced in the run's "
                "precision, the same: ignored");
  }

  // ---- ZeRO stage and offload: which binary runs this config ----
  long long stage = 0;
  bool offload = false, param_offload = false;
  bool zeropp = false;  // one of ZeRO++'s keys is on: build/bin/zeropp (stage 3 with them)
  if (c.contains("zero_optimization") && c["zero_optimization"].is_boolean()) {
    stage = c["zero_optimization"].get<bool>() ? 1 : 0;  // DeepSpeed's old spelling: true is stage 1
  } else if (c.contains("zero_optimization")) {
    const json& z = c["zero_optimization"];
    r.only(z, "zero_optimization");
    if (z.contains("stage")) stage = r.whole(z["stage"], "zero_optimization.stage", 0, 3);
    // ZeRO-Infinity's parameter offload (device cpu or nvme): build/bin/infinity, whose optimizer
    // state goes where the parameters go
    std::string param_device = "none";
    const std::string p_key = "zero_optimization.offload_param";
    if (z.contains("offload_param")) {
      const json& p = z["offload_param"];
      r.only(p, p_key);
      param_device = p.contains("device") ? r.text(p["device"], p_key + ".device") : "none";
      if (param_device == "cpu" || param_device == "nvme") {
        param_offload = true;
        r.flag("--offload-param", param_device == "cpu" ? "cpu" : "disk", p_key + ".device", shown(p["device"]));
        if (p.contains("nvme_path")) {
          const std::string dir = r.text(p["nvme_path"], p_key + ".nvme_path");
          if (param_device == "nvme") r.flag("--offload-dir", dir, p_key + ".nvme_path", shown(p["nvme_path"]));
          else r.note(p_key + ".nvme_path", "DeepSpeed uses it with device nvme only, and this is device cpu: ignored");
        } else if (param_device == "nvme" && !command_line.count("--offload-dir")) {
          r.fail(p_key + ".device", "\"nvme\" without nvme_path, expected the directory for the parameter files "
                                    "beside it; add \"nvme_path\": \"/a/directory\"");
        }
        for (const char* k : {"pin_memory", "buffer_count", "buffer_size", "max_in_cpu"})
          if (p.contains(k))
            r.note(p_key + "." + k, "DeepSpeed's buffers for swapping parameters; here each unit's slice is read "
                                    "into one of two host buffers: ignored");
      } else if (param_device != "none") {
        r.fail(p_key + ".device", "\"" + printable(param_device) + "\", expected cpu, nvme or none; write one of them");
      } else {
        r.note(p_key, "device none: DeepSpeed keeps the parameters on the device, as here: ignored");
      }
    }
    // ZeRO++ (docs/zeropp.md): qwZ, hpZ (a partition size of 1, DeepSpeed's default, is off), qgZ
    for (auto [key, flag] : {std::pair{"zero_quantized_weights", "--qwz"}, std::pair{"zero_quantized_gradients", "--qgz"}})
      if (z.contains(key) && r.boolean(z[key], std::string("zero_optimization.") + key)) {
        r.flag(flag, "true", std::string("zero_optimization.") + key, "true");
        zeropp = true;
      }
    if (z.contains("zero_hpz_partition_size")) {
      const long long G = r.whole(z["zero_hpz_partition_size"], "zero_optimization.zero_hpz_partition_size", 1, 1 << 20);
      if (G > 1) {
        r.flag("--hpz", std::to_string(G), "zero_optimization.zero_hpz_partition_size", std::to_string(G));
        zeropp = true;
      }
    }
    if (zeropp && stage != 3)
      r.fail("zero_optimization", "ZeRO++'s keys with stage " + std::to_string(stage) + ", expected stage 3: ZeRO++ "
             "builds on it; set zero_optimization.stage to 3, or remove the zero_quantized_* and zero_hpz_* keys");
    if (zeropp && param_offload)
      r.fail(p_key, "device " + param_device + " with ZeRO++'s keys, expected one of them: build/bin/infinity "
                    "and build/bin/zeropp are separate rungs; remove offload_param, or the zero_quantized_* and "
                    "zero_hpz_* keys");
    if (z.contains("offload_optimizer")) {
      const std::string o_key = "zero_optimization.offload_optimizer";
      const json& o = z["offload_optimizer"];
      r.only(o, o_key);
      const std::string device = o.contains("device") ? r.text(o["device"], o_key + ".device") : "none";
      if (param_offload) {  // infinity: the optimizer state lives with the parameter slices
        if (device != param_device)
          r.fail(o_key + ".device", "\"" + printable(device) + "\" beside offload_param's \"" + param_device +
                                    "\", expected the same device: build/bin/infinity keeps the optimizer state with "
                                    "the parameter slices; set both to " + param_device);
        if (o.contains("nvme_path") && z["offload_param"].contains("nvme_path") &&
            o["nvme_path"] != z["offload_param"]["nvme_path"])
          r.fail(o_key + ".nvme_path", shown(o["nvme_path"]) + " beside offload_param's " +
                                       shown(z["offload_param"]["nvme_path"]) + ", expected the same directory; "
                                       "write one path in both");
        r.note(o_key, "device " + device + ": the optimizer state goes where offload_param puts the parameters, "
                      "as here");
      } else if (device == "cpu" || device == "nvme") {
        offload = true;
        r.flag("--offload-to", device == "cpu" ? "cpu" : "disk", o_key + ".device", shown(o["device"]));
      } else if (device != "none") {
        r.fail(o_key + ".device", "\"" + printable(device) + "\", expected cpu, nvme or none; write one of them");
      }
      if (!param_offload && o.contains("nvme_path")) {
        const std::string dir = r.text(o["nvme_path"], o_key + ".nvme_path");
        if (device == "nvme") r.flag("--offload-dir", dir, o_key + ".nvme_path", shown(o["nvme_path"]));
        else r.note(o_key + ".nvme_path", "DeepSpeed uses it with device nvme only, and this is device " + device + ": ignored");
      } else if (!param_offload && device == "nvme" && !command_line.count("--offload-dir")) {
        r.fail(o_key + ".device", "\"nvme\" without nvme_path, expected the directory for the optimizer files beside "
                                  "it; add \"nvme_path\": \"/a/directory\"");
      }
    }
    // DeepSpeed's old spelling of offload_optimizer's device cpu
    if (z.contains("cpu_offload") && r.boolean(z["cpu_offload"], "zero_optimization.cpu_offload")) {
      if (z.contains("offload_optimizer"))
        r.fail("zero_optimization.cpu_offload", "true beside offload_optimizer, expected one of them; remove cpu_offload");
      if (param_offload)
        r.fail("zero_optimization.cpu_offload", "true beside offload_param, expected offload_optimizer's device; "
                                                "remove cpu_offload (infinity keeps the optimizer with the parameters)");
      offload = true;
      r.flag("--offload-to", "cpu", "zero_optimization.cpu_offload", "true");
    }
    if (param_offload && stage != 3)
      r.fail(p_key, "device " + param_device + " with stage " + std::to_string(stage) + ", expected stage 3: "
                    "parameters are offloaded only once they are sharded; set zero_optimization.stage 3");
    if (offload && stage != 2)
      r.fail("zero_optimization.offload_optimizer",
             "not supported with stage " + std::to_string(stage) + " yet, expected stage 2: ZeRO-Offload here is stage "
             "2's; run build/bin/offload with zero_optimization.stage 2 (or add offload_param for build/bin/infinity)");
  }
  // ---- the pipeline (build/bin/pipeline): DeepSpeed's pipeline section ----
  // stages (DeepSpeed's pipeline stages: segments here) is --pipeline ("auto", DeepSpeed's default,
  // is the command line's); partition "parameters" is the balance by parameters this project does
  // too (and "best", the section's default, means it in DeepSpeed); "uniform" and "type:..." are not built (--partition gives the
  // boundaries). An activation_checkpoint_interval of 1 keeps every block's input and recomputes it
  // (--activation-checkpointing); longer intervals are not built. ZeRO-1 fits a pipeline, 2 and 3 do
  // not (pipeline.cpp says why).
  bool pipeline = program == "pipeline";
  if (c.contains("pipeline")) {
    const json& p = c["pipeline"];
    const std::string k = "pipeline.";
    r.only(p, "pipeline");
    if (p.contains("stages") && !pipeline && is_auto(p["stages"])) {
      r.note(k + "stages", "\"auto\": " + program + " is one segment: ignored");
    } else if (p.contains("stages") && !r.take_auto(p["stages"], k + "stages", "--pipeline")) {
      const long long P = r.whole(p["stages"], k + "stages", 1, 1 << 16);
      if (P > 1 && !pipeline)
        user_error("--config %s: a config for a pipeline of %lld segments, and this is %s, expected build/bin/pipeline; "
                   "run build/bin/pipeline with it", path.c_str(), P, program.c_str());
      if (pipeline) r.whole_flag("--pipeline", p["stages"], k + "stages");
    }
    if (p.contains("partition")) {
      const std::string method = r.text(p["partition"], k + "partition");
      if (method != "parameters" && method != "best")
        r.fail(k + "partition", "\"" + printable(method) + "\" is not built here, expected \"parameters\" (balance "
                                "the parameters, the default); give the segments' first units with --partition");
      r.note(k + "partition", "\"" + method + "\": the segments balance their parameters, as here by default");
    }
    if (p.contains("activation_checkpoint_interval")) {
      const std::string key = k + "activation_checkpoint_interval";
      const long long every = r.whole(p["activation_checkpoint_interval"], key, 0, 1 << 30);
      if (every > 1)
        r.fail(key, std::to_string(every) + ": here a checkpoint is every block's input (interval 1), expected 0 or "
                    "1; set it to 1 (or 0: none)");
      if (every == 1) r.flag("--activation-checkpointing", "", key, "1");
    }
    if (p.contains("seed_layers")) {
      r.boolean(p["seed_layers"], k + "seed_layers");
      r.note(k + "seed_layers", "every unit is initialised from (--seed, its index) whatever the partition: ignored");
    }
  }
  if (pipeline && stage >= 2)
    r.fail("zero_optimization.stage", std::to_string(stage) + ": ZeRO-" + std::to_string(stage) + " shards the "
           "gradient, but in a pipeline a unit's gradient accumulates over micro-batches whose backwards arrive at "
           "different times, so it cannot be sharded away after each one, expected 0 or 1; set it to 1");
  if (pipeline && stage == 1) r.flag("--zero", "1", "zero_optimization.stage", "1");
  // begin tensor parallelism's section (build/bin/tensor, docs/tensor.md): DeepSpeed's AutoTP training
  // names the tensor degree tensor_parallel.autotp_size (0, its default, is off; Megatron-DeepSpeed's
  // launcher says --tensor-model-parallel-size): > 1 is --tensor T. The split is Megatron's, fixed by
  // the model (qkv and fc by columns, the output projections by rows, the vocabulary by rows), so
  // AutoTP's partition rules are refused. ZeRO-1 over the replicas is built, not 2 or 3, nor offload.
  bool tensor = program == "tensor";
  if (c.contains("tensor_parallel")) {
    const json& t = c["tensor_parallel"];
    const std::string k = "tensor_parallel.";
    r.only(t, "tensor_parallel");
    const long long T = t.contains("autotp_size") ? r.whole(t["autotp_size"], k + "autotp_size", 0, 1 << 16) : 0;
    if (T > 1 && !tensor && !program.empty())
      user_error("--config %s: a config for tensor parallelism over %lld ranks (tensor_parallel.autotp_size), and this "
                 "is %s, expected build/bin/tensor; run build/bin/tensor with it", path.c_str(), T, program.c_str());
    if (T > 1) tensor = true;  // (zero_estimate: the file's binary)
    if (T >= 1 && program == "tensor") r.whole_flag("--tensor", t["autotp_size"], k + "autotp_size");
    for (const char* key : {"partition_config", "preset_model"})
      if (t.contains(key))
        r.fail(k + key, "AutoTP's rules for which matrices split how; here the split is Megatron's, fixed by the "
                        "model (qkv and fc by columns, the output projections by rows, the embedding by vocabulary), "
                        "expected no such key; remove it");
  }
  if (tensor && (offload || param_offload || zeropp))
    r.fail("zero_optimization", std::string(zeropp ? "ZeRO++'s keys" : "offload") + " with tensor parallelism, "
           "expected neither: build/bin/tensor shards the optimizer state over its replicas (ZeRO-1) and no more; "
           "remove them, or run without tensor_parallel");
  if (tensor && stage >= 2)
    r.fail("zero_optimization.stage", std::to_string(stage) + " with tensor parallelism: build/bin/tensor shards "
           "only the optimizer state over its D replicas (ZeRO-1; DeepSpeed's AutoTP takes stage 2 too, not built "
           "here), expected 0 or 1; set it to 1");
  if (program == "tensor" && stage == 1) r.flag("--zero", "1", "zero_optimization.stage", "1");
  // end tensor parallelism's section
  // begin ulysses config: sequence_parallel_size (DeepSpeed's Ulysses, as ALST and the Hugging Face
  // integration set it) is --sp S of build/bin/ulysses, where it means the same: S consecutive ranks
  // split each sequence into S contiguous slices, attention between two all-to-alls over the heads, and
  // ZeRO-3 shards the model states over all N ranks (DeepSpeed's sequence-and-data group). This rung is
  // that with ZeRO-3 and nothing else: another stage, offload, ZeRO++ or a pipeline beside it is refused.
  // A stage-3 config without the key runs ulysses too (its --sp from the command line).
  bool ulysses = program == "ulysses" && stage == 3 && !offload && !param_offload && !zeropp && !pipeline;
  if (c.contains("sequence_parallel_size")) {
    const std::string key = "sequence_parallel_size";
    const json& v = c[key];
    if (is_auto(v) && program != "ulysses") {
      r.note(key, "\"auto\": " + (program.empty() ? std::string("this table") : program) +
                      " does not split the sequence: ignored");
    } else if (!r.take_auto(v, key, "--sp")) {
      const long long S = r.whole(v, key, 1, 1 << 16);
      if (S > 1 || program == "ulysses") {
        const char* beside = pipeline ? "a pipeline" : param_offload ? "offload_param" : offload ? "offload_optimizer"
                             : zeropp ? "ZeRO++'s keys" : nullptr;
        if (beside)
          r.fail(key, std::to_string(S) + " beside " + beside + ": build/bin/ulysses splits the sequence with plain "
                      "ZeRO-3 only, expected neither; remove one of them");
        if (stage != 3)
          r.fail(key, std::to_string(S) + " with zero_optimization.stage " + std::to_string(stage) + ": here sequence "
                      "parallelism is build/bin/ulysses, which shards with ZeRO-3 over all ranks (as ALST runs it), "
                      "expected stage 3; set zero_optimization.stage to 3");
        ulysses = true;
        r.whole_flag("--sp", v, key);
      } else {
        r.note(key, "1: no sequence parallelism, as here: ignored");
      }
    }
  }
  // end ulysses config
  const std::string want = pipeline ? "pipeline" : tensor ? "tensor" : ulysses ? "ulysses"
                                    : binary_for(stage, offload, param_offload, zeropp);
  r.out.binary = want;
  if (!program.empty() && want != program)
    user_error("--config %s: a config for ZeRO stage %lld%s, and this is %s, expected build/bin/%s; run build/bin/%s "
               "with it", path.c_str(), stage,
               ulysses ? " with sequence_parallel_size" : param_offload ? " with offload_param" : offload
               ? " with offload_optimizer" : zeropp ? " with ZeRO++'s keys" : "",
               program.c_str(), want.c_str(), want.c_str());

  // ---- the optimizer: AdamW (DeepSpeed's "Adam" is AdamW too, its adam_w_mode on by default) ----
  // Without the section DeepSpeed steps the client's optimizer: this project's AdamW and its flags.
  // With it, an absent lr or weight_decay is DeepSpeed's Adam's default (1e-3, 0).
  if (c.contains("optimizer")) {
    const json& o = c["optimizer"];
    r.only(o, "optimizer");
    std::string type = o.contains("type") ? r.text(o["type"], "optimizer.type") : "AdamW";
    for (char& ch : type) ch = char(tolower((unsigned char)ch));  // DeepSpeed compares in lower case
    if (type != "adamw" && type != "adam" && type != "muon")
      r.fail("optimizer.type", "\"" + printable(o["type"].get<std::string>()) + "\": this project has AdamW and Muon "
                               "only, expected \"AdamW\", \"Adam\" or \"Muon\"; write one of them");
    const json p = o.contains("params") ? o["params"] : json::object();
    r.only(p, "optimizer.params");
    // begin muon config: DeepSpeed's "Muon" (its hybrid: Muon for hidden 2-D weights, Adam for the rest)
    if (type == "muon") {
      r.flag("--optimizer", "muon", "optimizer.type", shown(o["type"]));
      if (p.contains("muon_lr") && !r.take_auto(p["muon_lr"], "optimizer.params.muon_lr", "--muon-lr"))
        r.number_flag("--muon-lr", p["muon_lr"], "optimizer.params.muon_lr");
      if (p.contains("adam_lr") && !r.take_auto(p["adam_lr"], "optimizer.params.adam_lr", "--adam-lr"))
        r.number_flag("--adam-lr", p["adam_lr"], "optimizer.params.adam_lr");
      if (p.contains("momentum") && !is_auto(p["momentum"]) && r.number(p["momentum"], "optimizer.params.momentum") != 0.95)
        r.fail("optimizer.params.momentum", shown(p["momentum"]) + ": Muon's momentum is fixed at 0.95 here "
                                            "(common/muon.h), expected that; remove it");
    } else {
      for (const char* k : {"muon_lr", "adam_lr", "momentum"})
        if (p.contains(k))
          r.fail(std::string("optimizer.params.") + k, "a Muon key beside type \"" + printable(type) +
                                                          "\", expected it with type \"Muon\" only; remove it");
    }
    // end muon config
    if (!p.contains("lr")) r.flag("--lr", "0.001", "optimizer.params.lr", "absent (DeepSpeed's default: 0.001)");
    else if (!r.take_auto(p["lr"], "optimizer.params.lr", "--lr")) r.number_flag("--lr", p["lr"], "optimizer.params.lr");
    if (!p.contains("weight_decay")) r.flag("--weight-decay", "0", "optimizer.params.weight_decay", "absent (DeepSpeed's default: 0)");
    else if (!r.take_auto(p["weight_decay"], "optimizer.params.weight_decay", "--weight-decay"))
      r.number_flag("--weight-decay", p["weight_decay"], "optimizer.params.weight_decay");
    // betas and eps are the constants of optim.cpp: a config may restate them ("auto": these), not change them
    if (!p.contains("betas")) {
      r.note("optimizer.params.betas", "absent: DeepSpeed's Adam would use [0.9, 0.999]; this project's AdamW has "
                                       "[0.9, 0.95] (common/optim.cpp)");
    } else if (!is_auto(p["betas"])) {
      const json& b = p["betas"];
      if (!b.is_array() || b.size() != 2 || r.number(b[0], "optimizer.params.betas") != 0.9 ||
          r.number(b[1], "optimizer.params.betas") != 0.95)
        r.fail("optimizer.params.betas", shown(b) + ": fixed at [0.9, 0.95] here (common/optim.cpp), expected those; "
                                         "remove it");
    }
    if (p.contains("eps") && !is_auto(p["eps"]) && r.number(p["eps"], "optimizer.params.eps") != 1e-8)
      r.fail("optimizer.params.eps", shown(p["eps"]) + ": fixed at 1e-8 here (common/optim.cpp), expected that; remove it");
    if (p.contains("adam_w_mode") && !r.boolean(p["adam_w_mode"], "optimizer.params.adam_w_mode"))
      r.fail("optimizer.params.adam_w_mode", "false (Adam with L2 regularisation) is not built here, expected true "
                                             "(AdamW); remove it");
  }

  // ---- the learning-rate curve: DeepSpeed's WarmupLR (then constant) and WarmupDecayLR (then linear to 0) ----
  // No scheduler section: DeepSpeed keeps the optimizer's learning rate, constant.
  if (!c.contains("scheduler")) {
    r.flag("--lr-curve", "constant", "scheduler", "absent (DeepSpeed: a constant learning rate)");
  } else {
    const json& s = c["scheduler"];
    r.only(s, "scheduler");
    const std::string type = s.contains("type") ? r.text(s["type"], "scheduler.type") : "";
    if (type == "WarmupLR") r.flag("--lr-curve", "warmup", "scheduler.type", shown(s["type"]));
    else if (type == "WarmupDecayLR") r.flag("--lr-curve", "warmup-decay", "scheduler.type", shown(s["type"]));
    else r.fail("scheduler.type", "\"" + printable(type) + "\", expected WarmupLR or WarmupDecayLR; write one of them");
    const json p = s.contains("params") ? s["params"] : json::object();
    r.only(p, "scheduler.params");
    if (type == "WarmupLR" && p.contains("total_num_steps"))
      r.fail("scheduler.params.total_num_steps", "WarmupDecayLR's key beside WarmupLR (which never decays), expected "
                                                 "it absent; remove it, or make the type WarmupDecayLR");
    // an absent parameter is DeepSpeed's default: from 0 to 0.001 over 1000 steps, log warm-up
    const std::string k = "scheduler.params.";
    if (!p.contains("warmup_min_lr")) r.flag("--warmup-min-lr", "0", k + "warmup_min_lr", "absent (DeepSpeed's default: 0)");
    else if (!r.take_auto(p["warmup_min_lr"], k + "warmup_min_lr", "--warmup-min-lr"))
      r.number_flag("--warmup-min-lr", p["warmup_min_lr"], k + "warmup_min_lr");
    if (!p.contains("warmup_max_lr")) r.flag("--lr", "0.001", k + "warmup_max_lr", "absent (DeepSpeed's default: 0.001)");
    else if (!r.take_auto(p["warmup_max_lr"], k + "warmup_max_lr", "--lr"))
      r.number_flag("--lr", p["warmup_max_lr"], k + "warmup_max_lr");
    if (!p.contains("warmup_num_steps")) r.flag("--warmup", "1000", k + "warmup_num_steps", "absent (DeepSpeed's default: 1000)");
    else if (!r.take_auto(p["warmup_num_steps"], k + "warmup_num_steps", "--warmup"))
      r.whole_flag("--warmup", p["warmup_num_steps"], k + "warmup_num_steps");
    const std::string warmup_type = p.contains("warmup_type") ? r.text(p["warmup_type"], k + "warmup_type") : "log";
    if (warmup_type != "log" && warmup_type != "linear")
      r.fail(k + "warmup_type", "\"" + printable(warmup_type) + "\", expected log or linear; write one of them");
    r.flag("--warmup-type", warmup_type, k + "warmup_type", p.contains("warmup_type") ? shown(p["warmup_type"]) : "absent (DeepSpeed's default: log)");
    // "auto" (or absent): the run's --steps, as the Hugging Face integration fills it in
    if (p.contains("total_num_steps") && !is_auto(p["total_num_steps"]))
      r.whole_flag("--lr-total-steps", p["total_num_steps"], k + "total_num_steps");
  }

  // ---- activation checkpointing ----
  // The section turns on --activation-checkpointing (every block recomputed in its backward). Of
  // its keys, the two that would change where checkpoints live are refused when true:
  // partition_activations splits them over model-parallel ranks (there are none here) and
  // cpu_checkpointing moves them to the host (not built). The others change nothing (kNoEffect).
  if (c.contains("activation_checkpointing")) {
    const json& a = c["activation_checkpointing"];
    const std::string k = "activation_checkpointing.";
    r.only(a, "activation_checkpointing");
    if (a.contains("partition_activations") && r.boolean(a["partition_activations"], k + "partition_activations"))
      r.fail(k + "partition_activations",
             "true splits checkpoints over model-parallel ranks, and these trainers have none, expected false; set it "
             "to false");
    if (a.contains("cpu_checkpointing") && r.boolean(a["cpu_checkpointing"], k + "cpu_checkpointing"))
      r.fail(k + "cpu_checkpointing",
             "true (checkpoints on the host) is not supported, expected false; set it to false");
    r.flag("--activation-checkpointing", "", "activation_checkpointing", "{...}");
  }

  // ---- quantization-aware training: compression_training.weight_quantization -> --qat ----
  // What maps: enabled, symmetric, round to nearest, from step 0, quantized in the forward, and one
  // group of every module ("*") at fixed bits (start_bits = target_bits, 8 or 4). The rest changes
  // the numbers in a way not built here and is refused: DeepSpeed's other compression methods,
  // progressive bits, a module list, and quantize_groups (its scale per group of a weight matrix;
  // here a scale per --qat-block values from each unit's start). docs/compression.md.
  if (c.contains("compression_training")) {
    const std::string k = "compression_training.weight_quantization";
    r.only(c["compression_training"], "compression_training");
    const json& wq = c["compression_training"].value("weight_quantization", json::object());
    r.only(wq, k);
    const json& sp = wq.value("shared_parameters", json::object());
    const std::string sk = k + ".shared_parameters";
    r.only(sp, sk);
    if (sp.contains("enabled") && r.boolean(sp["enabled"], sk + ".enabled")) {
      auto at = [&](const std::string& key) { return sk + "." + key; };
      auto require = [&](const std::string& key, bool ok, const std::string& why) {
        if (!ok) r.fail(at(key), why);
      };
      for (const char* key : {"quantizer_kernel", "quantize_verbose"})
        if (sp.contains(key)) {
          r.boolean(sp[key], at(key));
          r.note(at(key), "DeepSpeed's CUDA kernel or its log; the same rule runs here on the CPU: ignored");
        }
      const bool from_start =
          !sp.contains("schedule_offset") || r.whole(sp["schedule_offset"], at("schedule_offset")) == 0;
      require("schedule_offset", from_start,
              "QAT from a later step is not built, expected 0; set it to 0");
      require("quantize_groups", !sp.contains("quantize_groups"),
              "DeepSpeed's groups per weight matrix, expected it absent: here one scale per --qat-block values "
              "counted from each unit's start; remove it (and give --qat-block B)");
      const bool symmetric = !sp.contains("quantization_type") ||
                             r.text(sp["quantization_type"], at("quantization_type")) == "symmetric";
      require("quantization_type", symmetric,
              "only symmetric is built (kernels/quantize.h), expected \"symmetric\"; change it");
      require("rounding", !sp.contains("rounding") || r.text(sp["rounding"], at("rounding")) == "nearest",
              "only round to nearest is built, expected \"nearest\"; change it");
      require("quantize_weight_in_forward",
              sp.contains("quantize_weight_in_forward") &&
                  r.boolean(sp["quantize_weight_in_forward"], at("quantize_weight_in_forward")),
              "false (DeepSpeed's default) quantizes the stored weights in the optimizer step; here a copy is "
              "quantized for the forward and backward, expected true; set it to true");
      const json& mixed = sp.value("fp16_mixed_quantize", json::object());
      require("fp16_mixed_quantize", !mixed.is_object() || !mixed.contains("enabled") ||
                                         !r.boolean(mixed["enabled"], at("fp16_mixed_quantize.enabled")),
              "mixing quantized and unquantized weights is not built, expected enabled false; set it to false");
      const json& groups = wq.value("different_groups", json::object());
      if (!groups.is_object() || groups.size() != 1)
        r.fail(k + ".different_groups", "expected one group, got " + shown(groups) + " (" +
                                            std::to_string(groups.size()) + "); here every unit is quantized alike: "
                                            "write one group with modules [\"*\"]");
      const std::string gk = k + ".different_groups." + groups.begin().key();
      const json& g = groups.begin().value();
      r.only(g, gk);
      const json& gp = g.value("params", json::object());
      r.only(gp, gk + ".params");
      const long long bits = gp.contains("start_bits") ? r.whole(gp["start_bits"], gk + ".params.start_bits") : 0;
      if (bits != 8 && bits != 4) r.fail(gk + ".params.start_bits", "expected 8 or 4; change it");
      if (!gp.contains("target_bits") || r.whole(gp["target_bits"], gk + ".params.target_bits") != bits)
        r.fail(gk + ".params.target_bits",
               "progressive bits are not built, expected start_bits (" + std::to_string(bits) + "); set it");
      if (gp.contains("quantization_period")) {
        r.whole(gp["quantization_period"], gk + ".params.quantization_period");
        r.note(gk + ".params.quantization_period",
               "the steps between DeepSpeed's bit reductions; fixed bits here: ignored");
      }
      if (!g.contains("modules") || g["modules"] != json::array({"*"}))
        r.fail(gk + ".modules", "expected [\"*\"]: every unit is quantized here (--qat-skip embedding leaves the "
                                "embedding out); write [\"*\"]");
      r.flag("--qat", bits == 8 ? "int8" : "int4", gk + ".params.start_bits", std::to_string(bits));
    }
  }

  // ---- "auto" with no flag to take its value from: every one of them, in one line ----
  if (!r.auto_missing.empty()) {
    std::string keys, flags;
    std::set<std::string> listed;
    for (const auto& [key, flag] : r.auto_missing) {
      keys += (keys.empty() ? "" : ", ") + key + " (" + flag + ")";
      if (listed.insert(flag).second) flags += " " + flag + " " + kMeta.at(flag);
    }
    user_error("--config %s: \"auto\" in %s, expected each value from its flag on the command line (as the Hugging "
               "Face integration fills it in); add%s", path.c_str(), keys.c_str(), flags.c_str());
  }
  return r.out;
}


}  // namespace nz
