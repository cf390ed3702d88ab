// harness.h — run a trainer or tool as a subprocess (under mpirun) and read its report.
// Used by the integration tests: they compare whole training runs, as a learner would.
#pragma once
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
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

// Where the binaries are: build/bin, or $NZ_BIN_DIR (a private build directory).
inline std::string bin_dir() {
  const char* d = getenv("NZ_BIN_DIR");
  return d && *d ? d : "build/bin";
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
  // a hung run fails on its own after 5 minutes instead of waiting for the suite's timeout
  std::string cmd = "timeout -k 5 300 mpirun -np " + std::to_string(np) + " " + bin_dir() + "/" + stage + " --quiet --log-json " +
                    json + " --save-model " + r.model_path + " " + flags;
  r.exit_code = run_command(cmd, &r.output);
  if (r.exit_code == 0) r.report = Json::parse(read_file(json));
  return r;
}

// Every step's loss and grad norm, as written (full precision).
inline std::vector<double> step_values(const Json& report, const char* key) {
  std::vector<double> v;
  for (const Json& s : report["steps_log"].arr) v.push_back(s[key].d());
  return v;
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

// The parameters stored in a model file (fp32, layout order).
inline std::vector<float> model_params(const std::string& path) {
  std::string raw = read_file(path);
  const size_t header = 8 + 4 + 20 + 8;
  if (raw.size() < header) return {};
  std::vector<float> p((raw.size() - header) / 4);
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

}  // namespace nzt
