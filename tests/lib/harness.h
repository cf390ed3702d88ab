// harness.h — run a trainer or tool as a subprocess (under mpirun) and read its report.
// Used by the integration tests: they compare whole training runs, as a learner would.
#pragma once
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <cerrno>
#include <map>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "json_read.h"

namespace nzt {

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout + stderr
  Json report;         // --log-json, when the run succeeded
  std::string model_path;
};

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// One scratch directory per test process, removed when the process ends.
inline std::string temp_dir() {
  struct Dir {
    std::string path;
    Dir() {
      char tmpl[] = "/tmp/nanozero-test.XXXXXX";
      path = mkdtemp(tmpl);
    }
    ~Dir() {
      if (!path.empty() && !getenv("NZ_KEEP_TEST_FILES")) (void)!system(("rm -rf '" + path + "'").c_str());
    }
  };
  static Dir dir;
  return dir.path;
}

// A fresh, empty directory under this process's scratch directory (checkpoints, a disk tier's files).
inline std::string fresh_dir(const std::string& name) {
  const std::string d = temp_dir() + "/" + name;
  (void)!system(("rm -rf '" + d + "' && mkdir -p '" + d + "'").c_str());
  return d;
}

// The names in a directory (none for one that does not exist): what a run left behind.
inline std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.push_back(e->d_name);
    closedir(d);
  }
  return names;
}

// Where the binaries are: build/bin, or $NZ_BIN_DIR (a private build directory).
inline std::string bin_dir() {
  const char* d = getenv("NZ_BIN_DIR");
  return d && *d ? d : "build/bin";
}

// The deliberately broken trainers (tests/*/*mutants.mk) have their own folder, so that build/bin
// holds only what a learner runs: build/mutants/bin, or $NZ_MUTANT_DIR.
inline std::string mutant_dir() {
  const char* d = getenv("NZ_MUTANT_DIR");
  return d && *d ? d : "build/mutants/bin";
}

// The path of a trainer or tool by name: the test-only trainers (mutant_*, and the references built
// for a test, *_reference) from mutant_dir(), the rest from bin_dir().
inline std::string program_path(const std::string& name) {
  const bool test_only = name.rfind("mutant_", 0) == 0 ||
                         (name.size() > 10 && name.compare(name.size() - 10, 10, "_reference") == 0);
  return (test_only ? mutant_dir() : bin_dir()) + "/" + name;
}

// The rungs of the ladder, in order: stages.txt (the one list the Makefile and the scripts read
// too), from the directory the tests run in (the repository's root). Missing: the test stops.
inline const std::vector<const char*>& all_stages() {
  static const std::vector<const char*> names = [] {
    std::vector<const char*> v;
    std::ifstream f("stages.txt");
    if (!f) throw std::runtime_error("stages.txt not found: run the tests from the repository's root");
    for (std::string line; std::getline(f, line);)
      if (!line.empty() && std::isalpha((unsigned char)line[0]))  // the first word: the rest are columns
        v.push_back(strdup(line.substr(0, line.find(' ')).c_str()));
    return v;
  }();
  return names;
}

// Runs a shell command, capturing stdout and stderr.
inline int run_command(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  out->clear();
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// build/bin/<stage> with `np` ranks and extra flags; always writes a report and a model file.
inline RunResult run_trainer(const std::string& stage, int np, const std::string& flags,
                             const std::string& tag) {
  static int counter = 0;
  RunResult r;
  std::string base = temp_dir() + "/" + stage + "_" + tag + "_" + std::to_string(counter++);
  std::string json = base + ".json";
  r.model_path = base + ".model";
  // A program that is not there is a failure of the test, never a run that "failed": a test that
  // expects a broken trainer to fail must not pass because the trainer was not built.
  const std::string program = program_path(stage);
  if (access(program.c_str(), X_OK) != 0)
    throw std::runtime_error(program + " is missing: build it with `make tests`");
  // a hung run fails on its own after 5 minutes instead of waiting for the suite's timeout
  std::string cmd = "timeout -k 5 300 mpirun -np " + std::to_string(np) + " " + program + " --quiet --log-json " +
                    json + " --save-model " + r.model_path + " " + flags;
  r.exit_code = run_command(cmd, &r.output);
  if (r.exit_code == 0) r.report = Json::parse(read_file(json));
  return r;
}

// ---- one run cache for every suite ----
// A test asks for a run by (program, ranks, flags). The same request in the same process gets the
// same RunResult back. With $NZ_RUN_CACHE (tests/run_all.sh sets one folder per `make test`) the
// same request from another suite is served from that folder too: the reference runs (stage0_ddp
// with the contract's flags) are computed once per `make test`, not once per suite. A request is
// the same when the program file (path, size, modification time), the ranks, the flags (blanks
// collapsed) and the environment that can change a run (NZ_* and OMP_* variables) are. Flags that
// name a file in this process's scratch folder never match another process's request.
inline std::string run_cache_key(const std::string& program, int np, const std::string& flags) {
  struct stat st{};
  stat(program.c_str(), &st);
  std::string key = program + " size=" + std::to_string(st.st_size) + " mtime=" +
                    std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) +
                    " np=" + std::to_string(np) + " flags=";
  std::istringstream words(flags);
  for (std::string w; words >> w;) key += w + " ";
  std::vector<std::string> env;
  for (char** e = environ; *e; e++) {
    const std::string v = *e;
    const std::string name = v.substr(0, v.find('='));
    if ((name.rfind("NZ_", 0) == 0 || name.rfind("OMP_", 0) == 0) && name != "NZ_PROGRESS_DIR" &&
        name != "NZ_RUN_CACHE" && name != "NZ_KEEP_TEST_FILES" && name.rfind("NZ_TIMEOUT", 0) != 0)
      env.push_back(v);
  }
  std::sort(env.begin(), env.end());
  for (const std::string& v : env) key += " env:" + v;
  return key;
}

inline const RunResult& run_cached(const std::string& stage, int np, const std::string& flags,
                                   const std::string& tag = "run") {
  static std::map<std::string, RunResult> done;
  const std::string key = run_cache_key(program_path(stage), np, flags);
  auto it = done.find(key);
  if (it != done.end()) return it->second;
  const char* cache = getenv("NZ_RUN_CACHE");
  if (!cache || !*cache) return done.emplace(key, run_trainer(stage, np, flags, tag)).first->second;
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)std::hash<std::string>{}(key));
  const std::string dir = std::string(cache) + "/" + hex;
  RunResult r;
  if (read_file(dir + "/key") == key) {  // served: what the same request wrote (key checked: no collision)
    r.exit_code = std::stoi(read_file(dir + "/exit"));
    r.output = read_file(dir + "/output");
    r.model_path = dir + "/model";
    if (r.exit_code == 0) r.report = Json::parse(read_file(dir + "/report.json"));
    return done.emplace(key, std::move(r)).first->second;
  }
  r = run_trainer(stage, np, flags, tag);
  // written under a private name, then renamed: a reader sees the whole entry or none
  const std::string tmp = dir + ".tmp." + std::to_string(getpid());
  if (mkdir(cache, 0755) == 0 || errno == EEXIST) {
    if (mkdir(tmp.c_str(), 0755) == 0) {
      std::ofstream(tmp + "/exit") << r.exit_code;
      std::ofstream(tmp + "/output", std::ios::binary) << r.output;
      if (r.exit_code == 0) {
        std::ofstream(tmp + "/report.json", std::ios::binary) << read_file(r.model_path.substr(0, r.model_path.size() - 6) + ".json");
        std::ofstream(tmp + "/model", std::ios::binary) << read_file(r.model_path);
      }
      std::ofstream(tmp + "/key", std::ios::binary) << key;
      if (rename(tmp.c_str(), dir.c_str()) != 0) (void)!system(("rm -rf '" + tmp + "'").c_str());
    }
  }
  return done.emplace(key, std::move(r)).first->second;
}

// Every step's loss and grad norm, as written (full precision).
inline std::vector<double> step_values(const Json& report, const char* key) {
  std::vector<double> v;
  for (const Json& s : report["steps_log"].arr) v.push_back(s[key].d());
  return v;
}

// fp16: how many steps were skipped for a gradient overflow (each step's "skipped").
inline int skipped_steps(const Json& report) {
  int n = 0;
  for (const Json& s : report["steps_log"].arr) n += s["skipped"].b;
  return n;
}

// Sizes recomputed from a report's unit list, independently of the trainer's layout code: each
// unit padded to the next multiple of N; P = Σ padded, S = P / N (what each rank owns), U = the
// largest unit (a bucket or gather buffer).
struct Sizes {
  std::vector<uint64_t> padded;  // per unit, in forward order: embed, blocks, lnf
  uint64_t P = 0, S = 0, U = 0;
  int units() const { return int(padded.size()); }
};
inline Sizes sizes_from_units(const Json& report, int N) {
  Sizes z;
  for (const Json& u : report["units"].arr) {
    z.padded.push_back((u["numel"].u() + N - 1) / N * N);
    z.P += z.padded.back();
    z.S += z.padded.back() / N;
    z.U = std::max(z.U, z.padded.back());
  }
  return z;
}

// Largest |a_i - b_i| over two series (step losses, grad norms).
inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); i++) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The parameters stored in a model file (fp32, layout order; docs/files.md, "Model file": a 40-byte
// header whose last field is the count Ψ, then Ψ floats, then the checksum).
inline std::vector<float> model_params(const std::string& path) {
  std::string raw = read_file(path);
  const size_t header = 8 + 4 + 20 + 8;
  if (raw.size() < header) return {};
  uint64_t n = 0;
  memcpy(&n, raw.data() + header - 8, 8);
  if (raw.size() < header + n * 4) return {};
  std::vector<float> p(n);
  memcpy(p.data(), raw.data() + header, p.size() * 4);
  return p;
}

// Largest |difference| between the parameters of two model files (INFINITY if shapes differ).
inline double max_param_diff(const std::string& a, const std::string& b) {
  std::vector<float> x = model_params(a), y = model_params(b);
  if (x.size() != y.size() || x.empty()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < x.size(); i++) m = std::max(m, double(std::fabs(x[i] - y[i])));
  return m;
}

// Two model files are the same bytes: the same model to the last bit.
inline bool same_model_bits(const std::string& a, const std::string& b) {
  std::string x = read_file(a), y = read_file(b);
  return !x.empty() && x == y;
}

// What the equality checks see between a run and its reference run (stage0_ddp, usually): the step
// losses and grad norms bit for bit (the report keeps %.17g), the model file byte for byte, and the
// largest |difference| of each (0 when equal).
struct Verdict {
  bool losses_equal, norms_equal, model_equal;
  double loss_diff, norm_diff, param_diff;
  bool identical() const { return losses_equal && norms_equal && model_equal; }
  double largest_diff() const { return std::max({loss_diff, norm_diff, param_diff}); }
  std::string str() const {
    char s[200];
    snprintf(s, sizeof s, "losses %s (max |diff| %.3g), grad norms %s (%.3g), model file %s (max |param diff| %.3g)",
             losses_equal ? "equal" : "DIFFER", loss_diff, norms_equal ? "equal" : "DIFFER", norm_diff,
             model_equal ? "equal" : "DIFFERS", param_diff);
    return s;
  }
};

inline Verdict compare_runs(const RunResult& ref, const RunResult& x) {
  std::vector<double> la = step_values(ref.report, "loss"), lb = step_values(x.report, "loss");
  std::vector<double> na = step_values(ref.report, "grad_norm"), nb = step_values(x.report, "grad_norm");
  Verdict v;
  v.losses_equal = !la.empty() && la == lb;
  v.norms_equal = !na.empty() && na == nb;
  v.model_equal = same_model_bits(ref.model_path, x.model_path);
  v.loss_diff = max_abs_diff(la, lb);
  v.norm_diff = max_abs_diff(na, nb);
  v.param_diff = max_param_diff(ref.model_path, x.model_path);
  return v;
}

// ---- the equality contract between the stages (docs/stages.md, "Exactly the same model") ----
//
// Two ways of averaging a gradient over N ranks and K micro-steps:
//   "local"   (stage0_ddp, stage1): each rank sums its K micro-step gradients x_rk itself, then
//             one reduction over ranks, then the scale s = 1/(NK):   s * Σ_r (Σ_k x_rk)
//   "sharded" (stage2, stage3, offload): a reduction over ranks every micro-step, each reduced
//             sum scaled and added to the owned slice:                  Σ_k (s * Σ_r x_rk)
// Within a group the same additions run in the same order: bit for bit at any K. At K = 1 the two
// are the same operations too: bit for bit across groups. At K > 1 the same numbers are added in
// another order, so the groups agree only within the bound below.
inline bool sums_micro_steps_locally(const std::string& trainer) {
  return trainer == "stage0_ddp" || trainer == "stage1";
}

// The cross-group bound, derived (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 4:
// a sum whose terms each pass through at most m rounded operations, each with relative error at
// most u, is within γ_m Σ|terms| of the exact sum, γ_m = m u / (1 - m u)).
// Both groups compute s Σ_rk x_rk from the same N K vectors x_rk (each micro-batch's gradient: the
// same parameters, data and kernels in both). Along the path of one term x_rk:
//   local:   K-1 additions (its rank's sum) + N-1 (the reduction) + 1 multiplication by s;
//   sharded: N-1 additions (the reduction) + 1 multiplication + K-1 additions (the accumulation).
// In fp32 each is one rounding: m = N + K - 1. In bf16 each operation is done in fp32 and its
// result rounded to bf16 when stored: the reduction is N-1 fp32 additions and one store (N), the
// multiplication and each addition of an accumulation are an fp32 rounding and a store (2 each),
// so m = N + 2K along either path, every rounding counted at the bf16 unit roundoff 2^-8. fp16 is
// the same with its unit roundoff 2^-11 (η = 2^-25). Its gradients are stored multiplied by the
// loss scale S, a power of two: the bound holds for the scaled sums, and dividing both norms by
// the same S (exactly) divides the difference and the bound alike; the subnormal term is kept at
// its scaled size, which only makes it larger than needed.
// So, elementwise, |a_i - b_i| <= 2 γ_m s Σ_rk |x_rk,i| (+ 2 m η per element for gradients in the
// subnormal range, η = half the smallest subnormal), and by the triangle inequality in the 2-norm
//   |‖a‖ - ‖b‖| <= ‖a - b‖ <= 2 γ_m s Σ_rk ‖x_rk‖ + 2 m η sqrt(P).
// The reported norms are computed in double (squares exact, P + N + 1 additions and a square root):
// relative error at most ε_d = γ_{P+N+2} in double, added for each norm.
// Σ_rk ‖x_rk‖ comes from micro_batch_norms(): one rank, K = 1, learning rate 0, N K steps.
struct CrossGroupVerdict {
  double norm_local = 0, norm_sharded = 0, diff = 0, bound = 0;
  bool within() const { return diff <= bound; }
  std::string str() const {
    char s[240];
    snprintf(s, sizeof s, "step-1 grad norm %.17g (local) vs %.17g (sharded): |diff| %.3g, derived bound %.3g%s",
             norm_local, norm_sharded, diff, bound, within() ? "" : " EXCEEDED");
    return s;
  }
};

// The unscaled gradient norm of each of the N K micro-batches of step 1 of an (N ranks, accum K)
// run: the data loader numbers micro-batch (step 0, k, rank r) as k N + r, which is step k N + r of
// a 1-rank run with accum 1; with --lr 0 the parameters never move, so each of those steps sees
// the step-1 parameters. (flags: the model and data flags of the runs being compared.)
inline std::vector<double> micro_batch_norms(const std::string& flags, int N, int K, const std::string& tag) {
  RunResult one = run_trainer("stage0_ddp", 1,
                              flags + " --accum 1 --lr 0 --steps " + std::to_string(N * K), "micro_" + tag);
  if (one.exit_code != 0) {
    fprintf(stderr, "micro_batch_norms: the 1-rank run failed:\n%s\n", one.output.c_str());
    return {};
  }
  return step_values(one.report, "grad_norm");
}

inline CrossGroupVerdict cross_group_step1(const RunResult& local, const RunResult& sharded, int N, int K,
                                           const std::string& prec, const std::vector<double>& micro_norms,
                                           uint64_t padded_params) {
  CrossGroupVerdict v;
  std::vector<double> na = step_values(local.report, "grad_norm"), nb = step_values(sharded.report, "grad_norm");
  if (na.empty() || nb.empty() || micro_norms.size() != size_t(N) * K) {
    v.diff = INFINITY;
    return v;
  }
  const bool fp32 = prec == "fp32", fp16 = prec == "fp16";
  const double u = fp32 ? std::ldexp(1.0, -24) : fp16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  const double eta = fp32 ? std::ldexp(1.0, -150) : fp16 ? std::ldexp(1.0, -25) : std::ldexp(1.0, -134);
  const double m = fp32 ? N + K - 1 : N + 2.0 * K;
  const double gamma = m * u / (1 - m * u);
  const double ud = std::ldexp(1.0, -53), nd = double(padded_params) + N + 2, eps_d = nd * ud / (1 - nd * ud);
  double sum_norms = 0;
  for (double x : micro_norms) sum_norms += x * (1 + eps_d);  // each measured norm is itself within ε_d
  const double s = double(1.0f / float(N * K));                  // the scale the trainers use (a float)
  v.norm_local = na[0];
  v.norm_sharded = nb[0];
  v.diff = std::fabs(na[0] - nb[0]);
  v.bound = 2 * gamma * s * sum_norms + 2 * m * eta * std::sqrt(double(padded_params)) +
            eps_d * (na[0] + nb[0]);
  v.bound *= 1 + 4 * ud;  // the bound's own arithmetic, in double, rounded up
  return v;
}

// fp16's extra flags in the contract tests. At accum 1 an initial scale of 2^18, 4 times
// DeepSpeed's default: the tiny model's first 3 steps overflow there (the first one absorbed by the
// hysteresis, then two halvings), so the stages must agree on the skipped steps and the lowered
// scale too. At accum > 1 the groups sum in different orders, and in fp16 that can
// decide an overflow (the local group's all-reduce adds N K scaled gradients before averaging, the
// sharded group's only N), so the cross-group bound needs a step 1 that overflows in neither: an
// initial scale of 1024 that doubles every 4 clean steps (growth inside the compared runs).
inline std::string fp16_flags(const std::string& prec, int accum) {
  if (prec != "fp16") return "";
  return accum > 1 ? " --loss-scale 1024 --loss-scale-window 4" : " --loss-scale 262144";
}

// The whole contract for one run `r` of `trainer` with N ranks and accum K:
//   - bit for bit stage0_ddp's run (`ddp`) at K = 1, or at any K in the local group;
//   - otherwise bit for bit `peer`'s run (another trainer of the sharded group, named peer_name),
//     and step 1's grad norm within the derived cross-group bound of stage0_ddp's.
// Returns the problems found (none: the contract holds); *summary gets one line for the log.
inline std::vector<std::string> contract_problems(const std::string& trainer, const RunResult& r, int N, int K,
                                                  const std::string& prec, const RunResult& ddp,
                                                  const std::string& peer_name, const RunResult* peer,
                                                  const std::vector<double>* micro_norms, std::string* summary) {
  std::vector<std::string> problems;
  const bool vs_ddp = K == 1 || sums_micro_steps_locally(trainer);
  const std::string ref_name = vs_ddp ? "stage0_ddp" : peer_name;
  const RunResult* ref = vs_ddp ? &ddp : peer;
  if (!ref || ref->exit_code != 0) return {"the reference run " + ref_name + " is missing or failed"};
  const Verdict v = compare_runs(*ref, r);
  *summary = "vs " + ref_name + ": " + v.str();
  if (!v.identical()) problems.push_back("not bit for bit " + ref_name + "'s: " + v.str());
  if (!vs_ddp) {
    if (!micro_norms) return {"no micro-batch norms for the cross-group bound"};
    const CrossGroupVerdict cg =
        cross_group_step1(ddp, r, N, K, prec, *micro_norms, r.report["padded_params"].u());
    *summary += "; vs stage0_ddp: " + cg.str();
    if (!cg.within()) problems.push_back("outside the cross-group bound of stage0_ddp: " + cg.str());
  }
  return problems;
}

}  // namespace nzt
