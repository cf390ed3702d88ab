// cli.cpp — flag parsing and validation.
#include "input/cli.h"

#include "kernels/quantize.h"  // valid_quant_block

#include <sys/stat.h>  // stat (--offload-dir)
#include <unistd.h>

#include <algorithm>  // std::find
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "runtime/check.h"
#include "input/data.h"       // check_data_file
#include "input/ds_config.h"  // read_ds_config: --config, DeepSpeed's JSON file

namespace nz {

namespace {

constexpr double kMinLossScale = 0x1p-24, kMaxLossScale = 1e30;  // --loss-scale-min's lowest; both's highest

// What a flag's value names on disk. Every flag whose value is a path says which of these it is,
// and the checks at the end of parse_args go through the flag table by these kinds: an output is
// compared with every input and every other output, so a new input flag cannot be forgotten.
enum class PathKind {
  None,     // not a path
  InFile,   // read: never written over (--data, --config, --prune-mask)
  InDir,    // read: nothing is written into it (--resume)
  OutFile,  // written whole (--save-model, --log-json)
  OutDir,   // written into, and cleaned up: nothing else may live there (--ckpt-dir)
  WorkDir,  // the run's own temporary files, made with unique names and removed (--offload-dir)
};

struct Flag {
  const char* name;
  const char* meta;
  const char* help;
  std::function<void(const std::string& flag, const std::string& value)> set;
  PathKind path = PathKind::None;  // what the value names on disk
  const std::string* value = nullptr;  // where the value is kept (for a path)
};

// A flag whose value is a path, kept as given in *dst.
Flag path_flag(const char* name, const char* meta, const char* help, PathKind kind, std::string* dst) {
  return {name, meta, help, [dst](const std::string&, const std::string& v) { *dst = v; }, kind, dst};
}

long parse_int(const std::string& flag, const std::string& v, long lo, long hi, const char* what) {
  errno = 0;
  char* end = nullptr;
  long x = strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || (errno == ERANGE && x < lo))
    user_error("%s %s: expected %s; e.g. %s %ld", flag.c_str(), v.c_str(), what, flag.c_str(), lo > 0 ? lo : 1);
  if (x < lo || x > hi || errno == ERANGE)  // the limit it broke, by name
    user_error("%s %s: out of range: expected %s from %ld to %ld", flag.c_str(), v.c_str(), what, lo, hi);
  return x;
}

float parse_float(const std::string& flag, const std::string& v, double lo, double hi, const char* what) {
  char* end = nullptr;
  double x = strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x) || x < lo || x > hi)
    user_error("%s %s: expected %s", flag.c_str(), v.c_str(), what);
  return float(x);
}

// What a path refers to, so that two spellings of one file compare equal: device and inode when
// it exists; otherwise its directory's real path and its name.
std::string file_identity(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0) return "inode " + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  char real[PATH_MAX];
  if (realpath(dir.empty() ? "/" : dir.c_str(), real)) return std::string("path ") + real + "/" + path.substr(path.rfind('/') + 1);
  return "path " + path;
}

// The absolute path `path` names, with symbolic links, "." and ".." resolved: realpath() of the
// longest part that exists, then the rest taken name by name (a path not made yet).
std::string canonical_path(const std::string& path) {
  std::string head = path.empty() ? "." : path, tail;
  char real[PATH_MAX];
  while (!realpath(head.c_str(), real)) {  // strip names until what is left exists
    while (head.size() > 1 && head.back() == '/') head.pop_back();
    const size_t slash = head.rfind('/');
    const std::string name = slash == std::string::npos ? head : head.substr(slash + 1);
    tail = tail.empty() ? name : name + "/" + tail;
    head = slash == std::string::npos ? "." : slash == 0 ? "/" : head.substr(0, slash);
  }
  std::vector<std::string> parts;
  std::string out = real, part;
  for (size_t at = 0; at <= tail.size(); at++) {
    if (at < tail.size() && tail[at] != '/') {
      part += tail[at];
      continue;
    }
    if (part == "..") {
      if (out.size() > 1) out = out.substr(0, std::max<size_t>(out.rfind('/'), 1));
    } else if (!part.empty() && part != ".") {
      out += (out == "/" ? "" : "/") + part;
    }
    part.clear();
  }
  return out;
}

}  // namespace

void check_not_inside(const char* flag, const std::string& path, const char* dir_flag, const std::string& dir) {
  if (path.empty() || dir.empty()) return;
  const std::string p = canonical_path(path), d = canonical_path(dir);
  struct stat a, b;
  const bool same = p == d || (stat(path.c_str(), &a) == 0 && stat(dir.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
                               a.st_ino == b.st_ino);
  if (same || p.compare(0, d.size() + 1, d == "/" ? "/" : d + "/") == 0)
    user_error("%s %s: %s %s %s; expected a path outside it: pass another %s", flag, path.c_str(),
               same ? "is" : "lies inside", dir_flag, dir.c_str(), flag);
}

void check_output_file(const char* flag, const std::string& path) {
  struct stat st;
  if (path.back() == '/' || (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)))
    user_error("%s %s: a directory; expected a file name: add one, e.g. %s %s%smodel.bin", flag, path.c_str(), flag,
               path.c_str(), path.back() == '/' ? "" : "/");
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    user_error("%s %s: exists and is not a regular file; expected a file to write: choose another path", flag,
               path.c_str());
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  if (dir.empty()) dir = "/";
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    user_error("%s %s: cannot write to directory %s (%s); choose a writable path", flag, path.c_str(), dir.c_str(),
               strerror(errno));
}

namespace {

// An output directory (--ckpt-dir): an existing writable directory, or one that can be made.
void check_output_dir(const char* flag, const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      user_error("%s %s: not a directory; expected a directory (it is made if missing): choose another path", flag,
                 dir.c_str());
    if (access(dir.c_str(), W_OK | X_OK) != 0)
      user_error("%s %s: not writable (%s); expected a writable directory: fix its permissions or pass another", flag,
                 dir.c_str(), strerror(errno));
    return;
  }
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  std::string parent = trimmed.find('/') == std::string::npos ? "." : trimmed.substr(0, trimmed.rfind('/'));
  if (parent.empty()) parent = "/";
  if (access(parent.c_str(), W_OK | X_OK) != 0)
    user_error("%s %s: cannot be made: %s is not a writable directory (%s); create it or pass another", flag,
               dir.c_str(), parent.c_str(), strerror(errno));
}

}  // namespace

namespace {

// Outputs are checked before training, not after an hour of it: each must be writable, a file where
// a file is meant, and never an input or another output, however spelled. Which flags are inputs
// and outputs comes from the flag table alone (PathKind), so a new flag is checked as soon as it
// says what it names. resume_auto: --resume auto names no directory.
void check_paths(const std::vector<Flag>& flags, bool resume_auto) {
  std::vector<const Flag*> given;  // the path flags in force, in the table's order
  for (const Flag& f : flags) {
    const std::string m = f.meta;
    NZ_CHECK(f.path != PathKind::None || (m != "FILE" && m != "PATH" && m != "DIR"),
             "%s names a %s: give it a PathKind (cli.cpp), so that outputs are checked against it", f.name, f.meta);
    if (f.path != PathKind::None && !f.value->empty() && !(f.path == PathKind::InDir && resume_auto))
      given.push_back(&f);
  }
  for (const Flag* f : given) {
    if (f->path == PathKind::OutFile) check_output_file(f->name, *f->value);
    if (f->path == PathKind::OutDir) check_output_dir(f->name, *f->value);
  }
  auto is_file = [](const Flag* f) { return f->path == PathKind::InFile || f->path == PathKind::OutFile; };
  // an output file is no input file and no other output file
  for (size_t j = 0; j < given.size(); j++)
    for (size_t i = 0; i < j; i++) {
      const Flag *x = given[i], *y = given[j];
      if (!is_file(x) || !is_file(y) || (x->path != PathKind::OutFile && y->path != PathKind::OutFile)) continue;
      if (file_identity(*x->value) != file_identity(*y->value)) continue;
      const Flag* input = x->path == PathKind::InFile ? x : y->path == PathKind::InFile ? y : nullptr;
      const Flag* output = input == x ? y : input == y ? x : y;
      const Flag* other = output == x ? y : x;
      user_error("%s %s and %s %s: the same file; expected %s: pass another path", output->name,
                 output->value->c_str(), other->name, other->value->c_str(),
                 input ? "outputs that never overwrite an input" : "a separate file for each output");
    }
  // Nothing goes into the checkpoint directory but checkpoints (its clean-up removes step
  // directories), nothing is read from it but them (--resume), and nothing is written into the
  // checkpoint being resumed from.
  for (const Flag* dir : given)
    for (const Flag* f : given) {
      if (dir->path == PathKind::OutDir && is_file(f)) check_not_inside(f->name, *f->value, dir->name, *dir->value);
      if (dir->path == PathKind::InDir && f->path == PathKind::OutFile)
        check_not_inside(f->name, *f->value, dir->name, *dir->value);
    }
}

}  // namespace

uint64_t parse_bytes(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = strtod(v.c_str(), &end);
  std::string unit = end ? end : "";
  for (char& ch : unit) ch = char(tolower(ch));
  static const std::map<std::string, double> units = {
      {"", 1},         {"b", 1},          {"kb", 1e3},       {"mb", 1e6},       {"gb", 1e9},         {"tb", 1e12},
      {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  auto it = units.find(unit);
  if (v.empty() || end == v.c_str() || it == units.end() || !std::isfinite(x) || x <= 0 || x * it->second < 1 ||
      x * it->second > 1e18)
    user_error("%s %s: expected a size in bytes, e.g. %s 64MiB, 2GB, 1.5GiB or 500000000 (units: B, kB, MB, GB, TB, "
               "KiB, MiB, GiB, TiB)", flag.c_str(), v.c_str(), flag.c_str());
  return uint64_t(x * it->second);
}

std::string default_data_path() {
  const char* rel = "data/corpus.txt";
  if (access(rel, R_OK) == 0) return rel;
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {  // <repo>/build/bin/<program> -> <repo>/data/corpus.txt
    exe[n] = '\0';
    std::string p(exe);
    for (int up = 0; up < 3 && p.find('/') != std::string::npos; up++) p = p.substr(0, p.rfind('/'));
    std::string cand = p + "/" + rel;
    if (access(cand.c_str(), R_OK) == 0) return cand;
  }
  return rel;
}

Args parse_args(int argc, char** argv, const char* program) {
  Args a;
  bool from_config = false;  // the flags a --config file stands for are being applied
  // fp16's loss scales, up to 1e30 (the loss times the scale stays far inside fp32). The initial
  // (or static) scale is at least 1: scaling exists to lift small gradients into fp16's range, and
  // a scale below 1 pushes them further under it (at 1e-30 every gradient is 0); DeepSpeed's own
  // starts at 2^initial_scale_power, at least 1. The dynamic scale's floor may go lower, as in
  // DeepSpeed, but not below 2^-24, fp16's smallest value: there a gradient would have to exceed
  // 0.5 to stay nonzero.
  auto loss_scale = [&](float* dst, double lo, const char* why) {
    return [&, dst, lo, why](const std::string& f, const std::string& v) {
      char* end = nullptr;
      const double x = strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !std::isfinite(x) || x <= 0)
        user_error("%s %s: expected a positive scale, e.g. %s 65536", f.c_str(), v.c_str(), f.c_str());
      if (x < lo || x > kMaxLossScale)
        user_error("%s %s: out of range: expected a scale from %g (%s) to %g", f.c_str(), v.c_str(), lo, why,
                   kMaxLossScale);
      *dst = float(x);
      a.loss_scale_given |= !from_config;
    };
  };
  auto pos_int = [](int* dst, long hi) {
    return [dst, hi](const std::string& f, const std::string& v) {
      *dst = int(parse_int(f, v, 1, hi, "a positive whole number"));
    };
  };
  std::vector<Flag> flags = {
      {"--preset", "NAME", "model preset: tiny, small (default), gpt2",
       [&](auto&, auto& v) { a.preset = v; }},
      {"--layers", "N", "override the preset's number of transformer blocks", pos_int(&a.layers, 1000)},
      {"--dim", "N", "override the preset's width (channels)", pos_int(&a.dim, 1 << 16)},
      {"--heads", "N", "override the preset's attention heads (must divide --dim)", pos_int(&a.heads, 1 << 12)},
      {"--batch", "B", "micro-batch per rank, in sequences (default 4), or auto: the largest that fits "
       "--memory-budget",
       [&](auto& f, auto& v) {
         a.batch_auto = v == "auto";
         if (!a.batch_auto) a.batch = int(parse_int(f, v, 1, 1 << 16, "a positive whole number or auto"));
         a.batch_given = true;
       }},
      {"--memory-budget", "SIZE", "--batch auto: bytes per rank for model states and activations (e.g. 64MiB, "
       "2GB; default on a GPU: its free memory)",
       [&](auto& f, auto& v) { a.memory_budget = parse_bytes(f, v); }},
      {"--global-batch", "G", "sequences per optimizer step over all ranks: sets --accum to G / (ranks x batch)",
       pos_int(&a.global_batch, 1 << 30)},
      {"--seq", "T", "sequence length (at most the model's context; default 64)", pos_int(&a.seq, 1 << 20)},
      {"--accum", "K", "gradient accumulation steps per optimizer step (default 1)",
       [&](auto& f, auto& v) {
         a.accum = int(parse_int(f, v, 1, 1 << 16, "a positive whole number"));
         a.accum_given = true;
       }},
      {"--steps", "N", "optimizer steps (default 200)", pos_int(&a.steps, 1 << 30)},
      {"--lr", "X", "peak learning rate (default 3e-3; 0 computes gradients without moving the weights)",
       [&](auto& f, auto& v) { a.lr = parse_float(f, v, 0, 10, "a learning rate in [0, 10]"); }},
      {"--warmup", "N", "linear warm-up steps before cosine decay (default 20; 0 for none)",
       [&](auto& f, auto& v) { a.warmup = int(parse_int(f, v, 0, 1 << 30, "a whole number >= 0")); }},
      {"--lr-curve", "S", "the learning rate after the warm-up: cosine (default: to lr/10 at the last step), warmup "
       "(DeepSpeed's WarmupLR: constant) or warmup-decay (WarmupDecayLR: linear to 0); or constant (no warm-up: "
       "DeepSpeed without a scheduler)",
       [&](auto&, auto& v) { a.lr_schedule = v; }},
      {"--lr-schedule", "S", "the old name of --lr-curve (\"schedule\" is the pipeline's --schedule)",
       [&](auto&, auto& v) { a.lr_schedule = v; }},
      {"--warmup-min-lr", "X", "warmup, warmup-decay: the learning rate the warm-up starts from (default 0)",
       [&](auto& f, auto& v) { a.warmup_min_lr = parse_float(f, v, 0, 10, "a learning rate in [0, 10]"); }},
      {"--warmup-type", "T", "warmup, warmup-decay: log (DeepSpeed's default) or linear warm-up",
       [&](auto&, auto& v) { a.warmup_type = v; }},
      {"--lr-total-steps", "N", "warmup-decay: the step where the rate reaches 0 (default: --steps)",
       pos_int(&a.lr_total_steps, 1 << 30)},
      {"--weight-decay", "X", "AdamW decoupled weight decay (default 0.1; none on biases and layernorms)",
       [&](auto& f, auto& v) { a.weight_decay = parse_float(f, v, 0, 10, "a number in [0, 10]"); }},
      {"--clip", "X", "clip the global gradient norm to X (default 1.0; 0 turns it off)",
       [&](auto& f, auto& v) { a.clip = parse_float(f, v, 0, 1e9, "a number >= 0"); }},
      {"--seed", "N", "random seed for initialisation and data order (default 1337)",
       [&](auto& f, auto& v) { a.seed = uint64_t(parse_int(f, v, 0, LONG_MAX, "a whole number >= 0")); }},
      {"--precision", "P", "storage type of params, grads, activations: fp32 (default), bf16, or fp16 (with "
       "loss scaling)",
       [&](auto&, auto& v) { a.precision = v; }},
      {"--loss-scale", "X", "fp16: the initial loss scale, 1 to 1e30 (default 65536 = 2^16)",
       loss_scale(&a.loss_scale, 1, "below 1 it shrinks the gradients toward fp16's underflow instead of lifting them")},
      {"--loss-scale-window", "N", "fp16: clean steps before the scale doubles (default 1000; 0: a static scale)",
       [&](auto& f, auto& v) {
         a.loss_scale_window = int(parse_int(f, v, 0, 1 << 30, "a whole number >= 0"));
         a.loss_scale_given |= !from_config;
       }},
      {"--loss-scale-hysteresis", "H", "fp16: overflows before the scale is lowered (default 2)",
       [&](auto& f, auto& v) {
         a.loss_scale_hysteresis = int(parse_int(f, v, 1, 1 << 30, "a positive whole number"));
         a.loss_scale_given |= !from_config;
       }},
      {"--loss-scale-backoff", "F", "fp16: the scale is multiplied by F on overflow (default 0.5)",
       [&](auto& f, auto& v) {
         a.loss_scale_backoff = parse_float(f, v, 1e-6, 0.999999, "a factor in (0, 1)");
         a.loss_scale_given |= !from_config;
       }},
      {"--loss-scale-min", "X", "fp16: the smallest loss scale, 2^-24 to 1e30 (default 1)",
       loss_scale(&a.loss_scale_min, kMinLossScale, "2^-24, fp16's smallest value")},
      path_flag("--data", "FILE", "training text (default: data/corpus.txt, shipped with the project)",
                PathKind::InFile, &a.data),
      path_flag("--log-json", "PATH", "write rank 0's report: every step's loss, and every rank's ledger",
                PathKind::OutFile, &a.log_json),
      {"--eval-every", "N", "validation loss every N steps (default 50; 0: only at the end)",
       [&](auto& f, auto& v) { a.eval_every = int(parse_int(f, v, 0, 1 << 30, "a whole number >= 0")); }},
      {"--eval-windows", "N", "validation windows of --seq tokens (default 32)", pos_int(&a.eval_windows, 1 << 24)},
      path_flag("--save-model", "PATH", "write the trained model (format: docs/files.md, 'Model file')",
                PathKind::OutFile, &a.save_model),
      {"--device", "D", "auto (default: CUDA if a GPU is visible), cpu, or cuda",
       [&](auto&, auto& v) { a.device = v; }},
      {"--kernels", "K", "fast (default: BLAS on the CPU, cuBLAS on CUDA) or reference (the hand-written ones)",
       [&](auto&, auto& v) { a.kernels = v; }},
      {"--attention", "A", "CUDA attention with --kernels fast: gemm (default: batched cuBLAS, the T x T scores in "
                           "memory) or flash (tiles in shared memory, no T x T matrix)",
       [&](auto&, auto& v) { a.attention = v; }},
      {"--prefetch", "0|1", "stage3, infinity: gather the next unit while this one computes (default 1; "
                            "infinity on disk: and read its slice ahead)",
       [&](auto& f, auto& v) { a.prefetch = int(parse_int(f, v, 0, 1, "0 or 1")); }},
      {"--offload-to", "WHERE", "offload: keep the optimizer state in cpu memory (default) or on disk",
       [&](auto&, auto& v) { a.offload_to = v; }},
      {"--offload-param", "WHERE", "infinity: keep my parameter slices and the optimizer state in cpu memory "
                                   "(default) or on disk",
       [&](auto&, auto& v) { a.offload_param = v; }},
      path_flag("--offload-dir", "DIR", "offload --offload-to disk, infinity --offload-param disk: directory for "
                "the files", PathKind::WorkDir, &a.offload_dir),
      {"--offload-chunk", "N", "offload, infinity on disk: optimizer elements streamed through host memory at a "
                                "time",
       [&](auto& f, auto& v) { a.offload_chunk = parse_int(f, v, 1, 1L << 40, "a positive whole number"); }},
      {"--pipeline", "P", "pipeline: P segments (DeepSpeed's pipeline stages), each a contiguous run of units; N/P "
       "data-parallel replicas (default 1); tensor: 3D, P segments of T tensor ranks, N/(T P) replicas",
       pos_int(&a.pipeline, 1 << 16)},
      {"--schedule", "S", "pipeline: 1f1b (default: one forward, one backward; at most P-s micro-batches in "
       "flight on segment s) or gpipe (all forwards, then all backwards)",
       [&](auto&, auto& v) { a.schedule = v; }},
      {"--partition", "U1,U2,...", "pipeline: the first unit of segments 1..P-1, increasing (units: 0 embed, 1..L "
       "blocks, L+1 lnf; default: balance the parameters)",
       [&](auto&, auto& v) { a.partition = v; }},
      {"--zero", "0|1", "pipeline, tensor: 1 shards the optimizer state over the D replicas (ZeRO-1; 2 and 3 "
       "do not fit a pipeline: docs/pipeline.md)", [&](auto& f, auto& v) {
         // 2 and 3 are ZeRO stages the pipeline refuses with the reason (pipeline.cpp); anything else is not one
         const long z = parse_int(f, v, -(1L << 40), 1L << 40, "0 or 1");
         if (z < 0 || z > 3)
           user_error("%s %s: expected 0 or 1 (ZeRO-1 over the replicas); e.g. %s 1", f.c_str(), v.c_str(), f.c_str());
         a.zero = int(z);
       }},
      // begin tensor flags
      {"--tensor", "T", "tensor: T ranks split every matrix (heads, MLP columns, vocabulary: Megatron-LM); N/T "
       "data-parallel replicas (default 1)", pos_int(&a.tensor, 1 << 16)},
      {"--sequence-parallel", "", "tensor: each tensor rank keeps 1/T of the rows outside attention and the MLP "
       "(Megatron's sequence parallelism: a reduce-scatter and an all-gather for each all-reduce)", nullptr},
      // end tensor flags
      {"--qwz", "", "zeropp: all-gather the parameters as int8 blocks, one fp32 scale per --qw-block values", nullptr},
      {"--hpz", "G", "zeropp: simulated nodes of G ranks; a secondary parameter shard over my node's G ranks, so the "
       "backward gathers inside the node (default 0: off)",
       [&](auto& f, auto& v) { a.hpz = int(parse_int(f, v, 0, 1 << 20, "a whole number of ranks >= 0")); }},
      {"--qgz", "", "zeropp: reduce-scatter the gradients as an all-to-all of int4 blocks, one fp32 scale per "
       "--qg-block values, dequantized before the sum", nullptr},
      {"--qgz-flat", "", "zeropp --qgz: one all-to-all over all ranks instead of two hops (inside the node, then "
       "across nodes with the node's sum re-quantized)", nullptr},
      {"--ranks-per-node", "G", "zeropp: simulated nodes of G consecutive ranks, for qgZ's hops and the comm ledger's "
       "inside/across split (default: --hpz's G, else the machines)",
       [&](auto& f, auto& v) { a.node_size = int(parse_int(f, v, 1, 1 << 20, "a positive number of ranks")); }},
      {"--node-size", "G", "zeropp: the old name of --ranks-per-node",
       [&](auto& f, auto& v) { a.node_size = int(parse_int(f, v, 1, 1 << 20, "a positive number of ranks")); }},
      {"--qw-block", "B", "zeropp --qwz: values per scale, a power of two from 8 to 65536 (default 256)",
       [&](auto& f, auto& v) { a.qw_block = parse_int(f, v, -(1L << 40), 1L << 40, "a whole number"); }},
      {"--qg-block", "B", "zeropp --qgz: values per scale, a power of two from 8 to 65536 (default 256)",
       [&](auto& f, auto& v) { a.qg_block = parse_int(f, v, -(1L << 40), 1L << 40, "a whole number"); }},
      // begin ulysses flags
      {"--sp", "S", "ulysses: S ranks split each sequence into S contiguous slices (all-to-all before and after "
       "attention); N/S data-parallel replicas (default 1)", pos_int(&a.sp, 1 << 16)},
      {"--sp-mode", "M", "ulysses: ulysses (default: heads all-to-all) or ring (ring attention: k, v passed around, online softmax, zig-zag)",
       [&](auto&, auto& v) { a.sp_mode = v; }},
      {"--ctx", "N", "override the preset's context, the rows of wpe (a --seq longer than the preset's needs it)",
       pos_int(&a.ctx, 1 << 24)},
      // end ulysses flags
      // begin qat flags
      {"--qat", "int8|int4", "quantization-aware training: every unit computes with its weights quantized and "
       "dequantized in blocks of --qat-block, the optimizer updates the exact ones (docs/compression.md)",
       [&](auto& f, auto& v) {
         if (v != "int8" && v != "int4")
           user_error("%s %s: unknown format, expected int8 or int4; e.g. %s int8", f.c_str(), v.c_str(), f.c_str());
         a.qat_bits = v == "int8" ? 8 : 4;
       }},
      {"--qat-block", "B", "--qat: values per scale, counted from each unit's start, a power of two from 8 to "
       "65536 (default 64; a unit's last block may be shorter)",
       [&](auto& f, auto& v) { a.qat_block = parse_int(f, v, -(1L << 40), 1L << 40, "a whole number"); }},
      {"--qat-skip", "embedding", "--qat: keep the tied embedding (lookup and LM head) in full precision",
       [&](auto& f, auto& v) {
         if (v != "embedding")
           user_error("%s %s: unknown unit, expected embedding; e.g. %s embedding", f.c_str(), v.c_str(), f.c_str());
         a.qat_skip_embed = true;
       }},
      // end qat flags
      // begin muon flags
      {"--optimizer", "O", "adamw (default) or muon: Muon for the blocks' hidden matrices, AdamW for the rest "
       "(stage0_ddp..stage3; docs/muon.md)",
       [&](auto& f, auto& v) {
         if (v != "adamw" && v != "muon")
           user_error("%s %s: unknown optimizer, expected adamw or muon; e.g. %s muon", f.c_str(), v.c_str(), f.c_str());
         a.optimizer = v;
       }},
      {"--muon-lr", "X", "--optimizer muon: the hidden matrices' peak learning rate, on --lr's curve (default "
       "--lr; the update is scaled to AdamW's RMS)",
       [&](auto& f, auto& v) { a.muon_lr = parse_float(f, v, 0, 10, "a learning rate in [0, 10]"); }},
      {"--adam-lr", "X", "--optimizer muon: the embedding's, norms' and biases' AdamW peak learning rate (default "
       "--lr)",
       [&](auto& f, auto& v) { a.adam_lr = parse_float(f, v, 0, 10, "a learning rate in [0, 10]"); }},
      {"--muon-shard", "D", "--optimizer muon in stage1..stage3, how a matrix the slices cut is made whole: owners "
       "(default: its owners exchange their parts), gather-all (every rank gathers every matrix) or whole-matrices "
       "(each matrix orthogonalised by one rank)",
       [&](auto& f, auto& v) {
         if (v != "owners" && v != "gather-all" && v != "whole-matrices")
           user_error("%s %s: unknown design, expected owners, gather-all or whole-matrices; e.g. %s gather-all",
                      f.c_str(), v.c_str(), f.c_str());
         a.muon_shard = v;
       }},
      // end muon flags
      path_flag("--ckpt-dir", "DIR", "write sharded checkpoints to DIR/step-N (docs/checkpoints.md; made if missing)",
                PathKind::OutDir, &a.ckpt_dir),
      {"--ckpt-every", "K", "a checkpoint every K steps, and one at the end (default 0: only at the end)",
       [&](auto& f, auto& v) { a.ckpt_every = int(parse_int(f, v, 0, 1 << 30, "a whole number >= 0")); }},
      {"--ckpt-keep", "M", "keep the newest M checkpoints (default 2)", pos_int(&a.ckpt_keep, 1 << 20)},
      path_flag("--resume", "DIR", "resume from a checkpoint (DIR/step-N), a checkpoint directory's newest valid "
                "one, or auto (--ckpt-dir's; from step 0 if none); --steps stays the total", PathKind::InDir, &a.resume),
      {"--ckpt-overwrite", "", "let this run remove another run's checkpoints from --ckpt-dir (else refused)",
       nullptr},
      {"--resume-changed", "", "resume even though --seed, --lr, --weight-decay, --clip, --warmup, --batch, --seq, "
       "--accum or --qat differ from the checkpoint's (else refused)", nullptr},
      {"--watchdog", "SECONDS", "end the job, naming the rank holding it up, when no rank makes progress this long "
       "(default 300; 0: off)",
       [&](auto& f, auto& v) { a.watchdog = int(parse_int(f, v, 0, 1 << 20, "a whole number of seconds >= 0")); }},
      {"--activation-checkpointing", "", "keep only each block's input in the forward and recompute the block "
       "in its backward (less activation memory, one more forward)", nullptr},
      path_flag("--config", "FILE", "a DeepSpeed JSON config (docs/deepspeed_config.md); flags given here override "
                "it", PathKind::InFile, &a.config),
      {"--quiet", "", "no per-step lines", nullptr},
      // pruning (docs/compression.md): the model starts from the pruned file's weights, and its mask
      // keeps the pruned ones at exactly 0 (the gradient and AdamW masked: prune.h)
      path_flag("--prune-mask", "FILE", "fine-tune a pruned model file (build/bin/prune): start from its weights, "
                "keep the pruned ones at 0", PathKind::InFile, &a.prune_mask),
  };
  // switches: flags without a value
  const std::map<std::string, bool*> switches = {{"--quiet", &a.quiet},
                                                 {"--activation-checkpointing", &a.activation_checkpointing},
                                                 {"--ckpt-overwrite", &a.ckpt_overwrite},
                                                 {"--resume-changed", &a.resume_changed},
                                                 {"--qwz", &a.qwz}, {"--qgz", &a.qgz}, {"--qgz-flat", &a.qgz_flat},
                                                 {"--sequence-parallel", &a.sequence_parallel}};
  auto find_flag = [&](const std::string& name) -> const Flag* {
    for (const Flag& f : flags)
      if (name == f.name) return &f;
    return nullptr;
  };

  // The flags on the command line (flag -> value, the last one wins): --config's "auto" takes
  // values from here, and a few checks below need to know what the user typed.
  // A flag's old name counts as the flag (--lr-schedule is --lr-curve).
  const std::map<std::string, std::string> old_names = {{"--lr-schedule", "--lr-curve"}};
  std::map<std::string, std::string> typed;
  for (int i = 1; i < argc; i++) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string as_typed = arg.substr(0, eq);
    const std::string name = old_names.count(as_typed) ? old_names.at(as_typed) : as_typed;
    if (!find_flag(name)) continue;  // an unknown flag is reported by the pass below
    if (eq != std::string::npos) typed[name] = arg.substr(eq + 1);
    else if (switches.count(name)) typed[name] = "";
    else if (i + 1 < argc) typed[name] = argv[++i];
  }

  // --config first: the file's keys become flags, applied before the command line's (which win).
  // Each is set under the name of its key, so a value out of the flag's range is reported as the
  // key the user wrote ("--config ds.json: gradient_accumulation_steps 100000: out of range ...").
  if (typed.count("--config")) a.config = typed["--config"];
  if (!a.config.empty()) {
    const DsConfig ds = read_ds_config(a.config, program, typed);
    a.config_notes = ds.notes;
    from_config = true;
    for (const ConfigFlag& c : ds.flags) {
      const std::string key = "--config " + a.config + ": " + c.key;
      if (switches.count(c.flag)) *switches.at(c.flag) = true;  // a key that turns a switch on
      else find_flag(c.flag)->set(key, c.value);
      a.config_keys[c.flag] = key + " " + c.shown;
    }
    from_config = false;
    a.train_batch_size = ds.train_batch_size;
  }

  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      printf("usage: mpirun -np N %s [flags]\n\n", program);
      for (const Flag& f : flags) printf("  %-15s %-6s %s\n", f.name, f.meta, f.help);
      printf("  %-15s %-6s %s\n", "--help", "", "this list");
      exit(0);
    }
    if (switches.count(arg)) {
      *switches.at(arg) = true;
      a.config_keys.erase(arg);
      continue;
    }
    const std::string before_eq = arg.substr(0, arg.find('='));
    if (switches.count(before_eq))  // a switch: it has no value to give
      user_error("%s: %s takes no value; write %s alone", arg.c_str(), before_eq.c_str(), before_eq.c_str());
    std::string value;
    size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    const Flag* found = find_flag(arg);
    if (!found) user_error("unknown flag %s; see %s --help for the list", arg.c_str(), program);
    if (eq == std::string::npos) {
      if (i + 1 >= argc) user_error("%s needs a value (%s); see --help", arg.c_str(), found->meta);
      value = argv[++i];
    }
    found->set(arg, value);
    a.config_keys.erase(arg);  // the command line's value overrides the file's
  }

  // ---- cross-field validation ----
  if (!preset_config(a.preset, &a.cfg))
    user_error("--preset %s: unknown preset; valid: %s", a.preset.c_str(), preset_names());
  if (a.layers > 0) a.cfg.layers = a.layers;
  if (a.dim > 0) a.cfg.dim = a.dim;
  if (a.heads > 0) a.cfg.heads = a.heads;
  if (a.ctx > 0) a.cfg.ctx = a.ctx;  // (ulysses' block of flags: --ctx)
  if (a.cfg.dim % a.cfg.heads != 0)
    user_error("--heads %d: must divide the width %d (--dim); e.g. --heads %d", a.cfg.heads,
               a.cfg.dim, a.cfg.dim % 4 == 0 ? 4 : 1);
  if (a.seq > a.cfg.ctx)
    user_error("--seq %d: longer than the model's context %d (preset %s); use --seq %d or less, or a longer --ctx",
               a.seq, a.cfg.ctx, a.preset.c_str(), a.cfg.ctx);
  if (a.precision == "fp32") a.dtype = DType::F32;
  else if (a.precision == "bf16") a.dtype = DType::BF16;
  else if (a.precision == "fp16") a.dtype = DType::F16;
  else user_error("--precision %s: unknown precision; valid: fp32, bf16, fp16", a.precision.c_str());
  if (a.loss_scale_given && a.dtype != DType::F16)
    user_error("--loss-scale*: loss scaling is for --precision fp16 only (this run is %s); drop the flag or add "
               "--precision fp16", a.precision.c_str());
  auto number = [](double x) {
    char buf[32];
    snprintf(buf, sizeof buf, "%g", x);
    return std::string(buf);
  };
  if (a.dtype == DType::F16 && a.loss_scale < a.loss_scale_min)
    user_error("%s: below %s; expected an initial scale >= the minimum",
               a.origin("--loss-scale", number(a.loss_scale)).c_str(),
               a.origin("--loss-scale-min", number(a.loss_scale_min)).c_str());
  if (a.lr_schedule != "cosine" && a.lr_schedule != "warmup" && a.lr_schedule != "warmup-decay" &&
      a.lr_schedule != "constant")
    user_error("--lr-curve %s: unknown learning-rate curve; valid: cosine, warmup, warmup-decay, constant",
               a.lr_schedule.c_str());
  if (a.lr_schedule == "constant" && typed.count("--warmup"))
    user_error("--warmup %d: the learning rate is constant (%s), expected no warm-up; add --lr-curve cosine or "
               "warmup%s, or drop --warmup", a.warmup,
               a.config_keys.count("--lr-curve") ? ("--config " + a.config + " has no scheduler section").c_str()
                                                 : "--lr-curve constant",
               a.config_keys.count("--lr-curve") ? " (or a scheduler section to the config)" : "");
  // WarmupDecayLR falls linearly to 0 from the warm-up's end to its total step: a total before the
  // warm-up ends would leave no decay at all (DeepSpeed only warns; here it is refused)
  if (a.lr_schedule == "warmup-decay" && (a.lr_total_steps > 0 ? a.lr_total_steps : a.steps) < a.warmup) {
    const std::string total = a.lr_total_steps > 0 ? a.origin("--lr-total-steps", std::to_string(a.lr_total_steps))
                                                   : a.origin("--steps", std::to_string(a.steps)) + " (the total)";
    user_error("%s: fewer steps than the warm-up (%s), expected a total of at least the warm-up: WarmupDecayLR "
               "decays to 0 after it; raise the total, or shorten the warm-up", total.c_str(),
               a.origin("--warmup", std::to_string(a.warmup)).c_str());
  }
  if (a.warmup_type != "log" && a.warmup_type != "linear")
    user_error("--warmup-type %s: unknown warm-up; valid: log, linear", a.warmup_type.c_str());
  if (a.device != "auto" && a.device != "cpu" && a.device != "cuda")
    user_error("--device %s: unknown device; valid: auto, cpu, cuda", a.device.c_str());
  if (a.kernels != "fast" && a.kernels != "reference")
    user_error("--kernels %s: unknown kernels; valid: fast, reference", a.kernels.c_str());
  if (a.attention != "gemm" && a.attention != "flash")
    user_error("--attention %s: unknown attention; valid: gemm, flash", a.attention.c_str());
  if (a.schedule != "gpipe" && a.schedule != "1f1b")
    user_error("--schedule %s: unknown pipeline schedule; valid: gpipe, 1f1b", a.schedule.c_str());
  if (a.sp_mode != "ulysses" && a.sp_mode != "ring")
    user_error("--sp-mode %s: unknown sequence-parallel mode; valid: ulysses, ring", a.sp_mode.c_str());
  if (a.offload_to != "cpu" && a.offload_to != "disk")
    user_error("--offload-to %s: valid: cpu, disk", a.offload_to.c_str());
  if (a.offload_param != "cpu" && a.offload_param != "disk")
    user_error("--offload-param %s: valid: cpu, disk", a.offload_param.c_str());
  // A stage's own flag given to another stage would be ignored there: refused, naming the stages that use it.
  const std::pair<const char*, std::vector<std::string>> stage_flags[] = {
      {"--offload-to", {"offload"}}, {"--offload-param", {"infinity"}}, {"--offload-dir", {"offload", "infinity"}},
      {"--offload-chunk", {"offload", "infinity"}}, {"--prefetch", {"stage3", "infinity"}},
      {"--pipeline", {"pipeline", "tensor"}}, {"--schedule", {"pipeline", "tensor"}},
      {"--partition", {"pipeline", "tensor"}},
      {"--zero", {"tensor", "pipeline"}}, {"--tensor", {"tensor"}}, {"--sequence-parallel", {"tensor"}},
      {"--sp", {"ulysses"}}, {"--sp-mode", {"ulysses"}},
      {"--qwz", {"zeropp"}}, {"--hpz", {"zeropp"}}, {"--qgz", {"zeropp"}}, {"--node-size", {"zeropp"}},
      {"--ranks-per-node", {"zeropp"}}, {"--qgz-flat", {"zeropp"}},
      {"--qw-block", {"zeropp"}}, {"--qg-block", {"zeropp"}}};
  for (const auto& [flag, users] : stage_flags) {
    if (!typed.count(flag) || std::find(users.begin(), users.end(), program) != users.end()) continue;
    std::string with = "build/bin/" + users[0];
    for (size_t i = 1; i < users.size(); i++) with += " or build/bin/" + users[i];
    user_error("%s%s%s: %s does not use it, expected it with %s only; run %s, or drop the flag", flag,
               typed[flag].empty() ? "" : " ", typed[flag].c_str(), program, with.c_str(), with.c_str());
  }
  for (auto [flag, block] : {std::pair{"--qw-block", a.qw_block}, std::pair{"--qg-block", a.qg_block}})
    if (!valid_quant_block(block))
      user_error("%s: %ld values per scale, expected a power of two from 8 to 65536; e.g. %s 256",
                 a.origin(flag, std::to_string(block)).c_str(), block, flag);
  // flags that only set up another flag: refused without it, not silently ignored
  for (auto [flag, on, needs] : {std::tuple{"--qw-block", a.qwz, "--qwz"}, std::tuple{"--qg-block", a.qgz, "--qgz"}})
    if (typed.count(flag) && !on)
      user_error("%s %s: it sets the blocks of %s, expected it with %s; add %s, or drop %s", flag, typed[flag].c_str(),
                 needs, needs, needs, flag);
  if (a.qgz_flat && !a.qgz)
    user_error("--qgz-flat: it says how --qgz reduces the gradients, expected it with --qgz; add --qgz, or drop "
               "--qgz-flat");
  if (typed.count("--partition") && a.partition.empty())
    user_error("--partition '': no segment boundaries, expected the first unit of segments 1..P-1, e.g. --partition 2; "
               "drop the flag to balance the parameters");
  // begin qat checks
  if (!valid_quant_block(a.qat_block))
    user_error("%s: %ld values per scale, expected a power of two from 8 to 65536; e.g. --qat-block 64",
               a.origin("--qat-block", std::to_string(a.qat_block)).c_str(), a.qat_block);
  for (const char* flag : {"--qat-block", "--qat-skip"})
    if (typed.count(flag) && a.qat_bits == 0)
      user_error("%s: it sets up --qat, expected it with --qat int8 or int4; add --qat, or drop %s", flag, flag);
  if (a.qat_bits && a.device == "cuda")
    user_error("--qat with --device cuda: the fake quantization runs on the CPU backend only, expected --device "
               "cpu or auto; drop --qat on the GPU");
  // end qat checks
  // begin muon checks
  for (const char* flag : {"--muon-lr", "--adam-lr", "--muon-shard"})
    if (typed.count(flag) && a.optimizer != "muon")
      user_error("%s %s: it sets up Muon, expected it with --optimizer muon; add --optimizer muon, or drop %s", flag,
                 typed[flag].c_str(), flag);
  if (a.optimizer == "muon") {
    const std::string p = program;
    if (p == "offload" || p == "infinity")
      user_error("--optimizer muon with %s: its optimizer runs on the CPU element by element, and Muon needs whole "
                 "matrices (DeepSpeed does not offload Muon either); expected stage0_ddp, stage1, stage2 or stage3",
                 program);
    if (p != "stage0_ddp" && p != "stage1" && p != "stage2" && p != "stage3")
      user_error("--optimizer muon with %s: Muon is built for stage0_ddp, stage1, stage2 and stage3 only; run one of "
                 "them, or drop --optimizer muon", program);
    if (!a.ckpt_dir.empty() || !a.resume.empty())
      user_error("--optimizer muon with %s: Muon's state is not in the checkpoints yet (docs/muon.md); drop the "
                 "checkpoint flags, or use --optimizer adamw", !a.resume.empty() ? "--resume" : "--ckpt-dir");
    if (a.batch_auto)
      user_error("--optimizer muon with --batch auto: the fit counts AdamW's state, not Muon's (docs/muon.md); give "
                 "--batch B");
    if (!a.prune_mask.empty())
      user_error("--optimizer muon with --prune-mask: Muon's orthogonalised update would move the pruned weights; "
                 "expected --optimizer adamw for pruned fine-tuning");
    if (typed.count("--muon-shard") && p == "stage0_ddp")
      user_error("--muon-shard %s with stage0_ddp: every rank holds every matrix whole there, nothing to make whole; "
                 "expected it with stage1, stage2 or stage3, or drop it", a.muon_shard.c_str());
    if (a.muon_lr < 0) a.muon_lr = a.lr;
    if (a.adam_lr < 0) a.adam_lr = a.lr;
  }
  // end muon checks
  if (a.hpz > 0 && a.node_size > 0 && a.node_size != a.hpz)
    user_error("--ranks-per-node %d with --hpz %d: hpZ's nodes are qgZ's and the ledger's nodes, expected the same "
               "G; drop --ranks-per-node", a.node_size, a.hpz);
  const bool on_disk = a.offload_to == "disk" || a.offload_param == "disk";
  if (!on_disk && !a.offload_dir.empty())  // (a config sets it with device nvme only: on disk)
    user_error("--offload-dir %s: the disk tier's directory, and %s keeps its state in cpu memory, expected it with %s "
               "disk; add %s disk, or drop --offload-dir", a.offload_dir.c_str(), program,
               std::string(program) == "infinity" ? "--offload-param" : "--offload-to",
               std::string(program) == "infinity" ? "--offload-param" : "--offload-to");
  if (on_disk && a.offload_dir.empty())
    user_error("%s disk needs --offload-dir DIR (an existing, writable directory)",
               a.offload_param == "disk" ? "--offload-param" : "--offload-to");
  if (on_disk) {  // whether it has room is checked when the files are made (offload_store.h)
    struct stat st;
    const char* dir = a.offload_dir.c_str();
    std::string why;
    if (stat(dir, &st) != 0) why = strerror(errno);
    else if (!S_ISDIR(st.st_mode)) why = "not a directory";
    else if (access(dir, W_OK | X_OK) != 0) why = std::string("not writable: ") + strerror(errno);
    if (!why.empty())
      user_error("%s: %s; expected an existing, writable directory: create it or pass another",
                 a.origin("--offload-dir", dir).c_str(), why.c_str());
  }
  if (a.memory_budget > 0 && !a.batch_auto)
    user_error("--memory-budget %s: it sizes --batch auto; add --batch auto, or drop --memory-budget",
               fmt_bytes(double(a.memory_budget)).c_str());
  if (a.global_batch > 0 && a.accum_given)
    user_error("--global-batch %d and %s: the global batch sets the accumulation; give one of them", a.global_batch,
               a.origin("--accum", std::to_string(a.accum)).c_str());
  if (a.batch_auto && a.memory_budget == 0 && a.device == "cpu")
    user_error("--batch auto on the CPU needs --memory-budget SIZE (e.g. --memory-budget 256MiB): there is no "
               "device memory to measure");
  if (a.ckpt_every > 0 && a.ckpt_dir.empty())
    user_error("--ckpt-every %d needs --ckpt-dir DIR (where the checkpoints go)", a.ckpt_every);
  if (a.resume == "auto" && a.ckpt_dir.empty())
    user_error("--resume auto needs --ckpt-dir DIR (where to look for the newest valid checkpoint)");
  if (!a.resume.empty() && a.resume != "auto") {
    struct stat st;
    if (stat(a.resume.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      user_error("--resume %s: not a directory; expected a checkpoint (DIR/step-N), a --ckpt-dir, or auto",
                 a.resume.c_str());
  }
  if (a.data.empty()) a.data = default_data_path();
  check_paths(flags, a.resume == "auto");
  // --data: a regular file of bounded size (a FIFO would block, /dev/zero never end).
  check_data_file(a.data);
  if (access(a.data.c_str(), R_OK) != 0)
    user_error("--data %s: cannot read it (%s); give a readable text file", a.data.c_str(), strerror(errno));
  return a;
}

void resolve_batch(Args& a, int world) {
  const long long tbs = a.train_batch_size;
  if (tbs == 0 || a.global_batch > 0) return;  // --global-batch: the command line's train_batch_size wins
  const std::string t = "--config " + a.config + ": train_batch_size " + std::to_string(tbs);
  const std::string B = a.origin("--batch", std::to_string(a.batch)), K = a.origin("--accum", std::to_string(a.accum));
  constexpr long long kMax = 1 << 16;  // --batch's and --accum's largest
  if (a.batch_auto)
    user_error("%s and --batch auto: the micro-batch would be chosen by memory, expected a fixed one beside "
               "train_batch_size; give --batch B, or remove train_batch_size", t.c_str());
  if (a.batch_given && a.accum_given) {
    if ((long long)a.batch * a.accum * world != tbs)
      user_error("%s, but micro-batch %d x accumulation %d x %d ranks = %lld (%s, %s), expected them to agree; change "
                 "one of them, or -np", t.c_str(), a.batch, a.accum, world, (long long)a.batch * a.accum * world,
                 B.c_str(), K.c_str());
    return;
  }
  if (a.batch_given) {  // accumulation = train_batch_size / (micro-batch x ranks)
    const long long per_step = (long long)a.batch * world;
    if (tbs % per_step != 0)
      user_error("%s is not a multiple of micro-batch %d x %d ranks (%s), expected a multiple of %lld; change one of "
                 "them", t.c_str(), a.batch, world, B.c_str(), per_step);
    if (tbs / per_step > kMax)
      user_error("%s needs an accumulation of %lld (micro-batch %d x %d ranks), expected at most %lld; raise the "
                 "micro-batch, or lower train_batch_size", t.c_str(), tbs / per_step, a.batch, world, kMax);
    a.accum = int(tbs / per_step);
    return;
  }
  if (!a.accum_given) a.accum = 1;  // neither: no accumulation, the micro-batch takes it all
  const long long per_batch = (long long)a.accum * world;
  if (tbs % per_batch != 0)
    user_error("%s is not a multiple of accumulation %d x %d ranks (%s), expected a multiple of %lld; change one of "
               "them", t.c_str(), a.accum, world, a.accum_given ? K.c_str() : "the default", per_batch);
  if (tbs / per_batch > kMax)
    user_error("%s needs a micro-batch of %lld per rank (accumulation %d x %d ranks), expected at most %lld; give "
               "gradient_accumulation_steps (or --accum), or lower train_batch_size", t.c_str(), tbs / per_batch,
               a.accum, world, kMax);
  a.batch = int(tbs / per_batch);
}

}  // namespace nz
