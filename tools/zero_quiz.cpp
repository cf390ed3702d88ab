// zero_quiz.cpp — questions from the formulas, and their grader (zero_quiz.h).
#include "tools/zero_quiz.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/check.h"          // user_error
#include "model.h"          // GPTConfig, param_count_formula
#include "runtime/rng.h"            // Rng: the same questions for the same seed
#include "zero_formulas.h"  // expected_state_bytes, expected_comm_elems, expected_link_elems

namespace nz {

namespace {

// GPT-2's four sizes, with GPT-2's vocabulary of 50257 tokens and context 1024 (not this project's
// byte vocabulary): 124M, 355M, 774M and 1.56B parameters by param_count_formula.
struct Shape { const char* name; int layers, dim, heads; };
const Shape kShapes[] = {{"GPT-2 small", 12, 768, 12}, {"GPT-2 medium", 24, 1024, 16},
                         {"GPT-2 large", 36, 1280, 20}, {"GPT-2 XL", 48, 1600, 25}};

uint64_t params_of(const Shape& s) {
  GPTConfig c;
  c.vocab = 50257, c.ctx = 1024, c.layers = s.layers, c.dim = s.dim, c.heads = s.heads;
  return param_count_formula(c);
}

std::string shape_text(const Shape& s) {
  char t[200];
  snprintf(t, sizeof t, "%s (%d layers, width %d, %d heads, context 1024, vocabulary 50257, tied embedding)",
           s.name, s.layers, s.dim, s.heads);
  return t;
}

// What each precision keeps per parameter, said in every question: the fp32 case has no master copy
// (the params are the ones Adam updates), which a learner cannot guess from "fp32" alone.
const char* precision_text(DType dt) {
  return dt == DType::BF16 ? "bf16 mixed precision (bf16 params and grads, 2 bytes each; an fp32 master copy and "
                             "Adam m and v, 4 bytes each)"
                           : "fp32 (params, grads, Adam m and v, 4 bytes each; no separate master copy)";
}

template <class... A>
std::string fmt(const char* f, A... a) {
  char s[600];
  snprintf(s, sizeof s, f, a...);
  return s;
}

// Each category of a rank's model states, its bytes and whether it is whole or a slice: the worked
// answer of a model-state question, from the same StateBytes the answer is.
std::string explain_states(Stage s, uint64_t psi, int N, DType dt) {
  const Layout L = paper_layout(psi, N);
  const StateBytes b = expected_state_bytes(s, L, dt);
  const uint64_t P = L.padded_total, S = L.shard_total;
  // whole on every rank, or this rank's slice: what each stage shards (zero_formulas.h)
  const bool params_whole = s != Stage::Z3, grads_whole = s == Stage::DDP || s == Stage::Z1;
  const bool opt_whole = s == Stage::DDP;
  auto part = [&](const char* name, uint64_t bytes, bool whole) {
    if (!bytes) return std::string();
    return fmt("%s %llu x %s = %llu; ", name, (unsigned long long)(bytes / (whole ? P : S)), whole ? "P" : "S",
               (unsigned long long)bytes);
  };
  return fmt("Ψ = %llu parameters; on %d ranks P = Ψ padded to a multiple of N = %llu, S = P/N = %llu per rank. "
             "%s keeps, in bytes: ", (unsigned long long)psi, N, (unsigned long long)P, (unsigned long long)S,
             stage_name(s)) +
         part("params", b.params, params_whole) + part("grads", b.grads, grads_whole) +
         part("fp32 master", b.master, opt_whole) + part("Adam m", b.adam_m, opt_whole) +
         part("Adam v", b.adam_v, opt_whole) +
         fmt("total %llu bytes = %.4g GB (P: the whole model, S: this rank's slice).",
             (unsigned long long)b.total(), double(b.total()) / 1e9);
}

}  // namespace

std::vector<QuizQuestion> make_quiz(uint64_t seed, int count) {
  Rng rng(seed, 0x717a);  // its own stream
  auto pick = [&](int n) { return int(rng.next() % uint64_t(n)); };
  const int worlds[] = {4, 8, 16, 32, 64};
  const Stage zero[] = {Stage::DDP, Stage::Z1, Stage::Z2, Stage::Z3};
  std::vector<QuizQuestion> q;
  for (int i = 0; int(q.size()) < count; i++) {
    const Shape& shape = kShapes[pick(4)];
    const uint64_t psi = params_of(shape);
    const int N = worlds[pick(5)];
    const DType dt = pick(2) ? DType::BF16 : DType::F32;
    switch (i % 5) {
      case 0: {  // model-state bytes per rank
        const Stage s = zero[pick(4)];
        const double gb = double(expected_state_bytes(s, paper_layout(psi, N), dt).total()) / 1e9;
        q.push_back({fmt("%s, %s, %s on %d ranks: how many GB (10^9 bytes) of model states (params, grads, "
                         "optimizer states; no activations, no buffers) does each rank hold?",
                         shape_text(shape).c_str(), precision_text(dt), stage_name(s), N),
                     gb, 0.01, "GB"});
        q.back().explanation = explain_states(s, psi, N, dt);
        break;
      }
      case 1: {  // elements sent per optimizer step, with accumulation
        const Stage s = zero[pick(4)];
        const int K = 1 + pick(8);
        const Layout L = paper_layout(psi, N);
        const double m = double(expected_comm_elems(s, L, K)) / 1e6;
        // The paper counts a whole collective per rank: expected_comm_elems without its (N-1)/N.
        const double paper_m = double(expected_comm_elems(s, L, K)) / double(N - 1) * double(N) / 1e6;
        QuizQuestion qq{fmt("%s, %s on %d ranks with gradient accumulation over %d micro-steps (the gradient is "
                            "reduced as real systems do: stages 0 and 1 once per step, stages 2 and 3 every "
                            "micro-step): how many million elements does each rank send per optimizer step in the "
                            "model-state collectives? Count either way: as the ZeRO paper does (a reduce-scatter "
                            "or an all-gather of X elements costs X per rank), or exactly, as a ring sends them "
                            "(X(N-1)/N per rank); both are accepted, and the grader says which you used.",
                            shape_text(shape).c_str(), stage_name(s), N, K),
                        m, 0.01, "M elements"};
        qq.convention = "exact, with (N-1)/N";
        qq.paper_answer = paper_m;
        qq.paper_convention = "the ZeRO paper's count, without (N-1)/N";
        const uint64_t sent = expected_comm_elems(s, L, K), per = (uint64_t(N) - 1) * L.shard_total;
        qq.explanation = fmt("Ψ = %llu, S = Ψ/N padded = %llu, so one reduce-scatter or all-gather sends "
                             "(N-1) S = %llu elements per rank. %s with K = %d %s: %llu x %llu = %llu elements = "
                             "%.6g M (the paper's count: %llu x Ψ = %.6g M).",
                             (unsigned long long)psi, (unsigned long long)L.shard_total, (unsigned long long)per,
                             stage_name(s), K,
                             s == Stage::Z3   ? "gathers in the forward and the backward and reduce-scatters, every "
                                                "micro-step: 3K collectives"
                             : s == Stage::Z2 ? "reduce-scatters every micro-step and all-gathers once: K + 1 "
                                                "collectives"
                                              : "sums the gradient locally and reduces it once (reduce-scatter + "
                                                "all-gather): 2 collectives, whatever K",
                             (unsigned long long)(sent / per), (unsigned long long)per, (unsigned long long)sent, m,
                             (unsigned long long)(sent / per), paper_m);
        q.push_back(qq);
        break;
      }
      case 2: {  // offload: host memory and the link
        const int K = 1 + pick(4);
        if (pick(2)) {
          const double gb = double(expected_state_bytes(Stage::Offload, paper_layout(psi, N), dt).host) / 1e9;
          // The host keeps an fp32 master copy of its slice in fp32 runs too (zero_formulas.cpp): the
          // question says so, since "fp32, no separate master" holds on the device only.
          q.push_back({fmt("%s, %s, ZeRO-Offload on %d ranks: stage2 on the device, and in each rank's host "
                           "memory its slice of the gradient (in the params' precision), an fp32 master copy of "
                           "its slice of the params (kept on the host in fp32 runs too, apart from the device's "
                           "params) and Adam m and v (fp32) for that slice. How many GB (10^9 bytes) of host "
                           "memory does each rank's optimizer side take?",
                           shape_text(shape).c_str(), precision_text(dt), N),
                       gb, 0.01, "GB"});
          const Layout L = paper_layout(psi, N);
          q.back().explanation = fmt("S = Ψ/N padded = %llu; the host keeps the gradient slice (%d bytes each), an "
                                     "fp32 master slice and Adam m and v (4 bytes each): (%d + 12) S = %.6g GB.",
                                     (unsigned long long)L.shard_total, int(dtype_bytes(dt)), int(dtype_bytes(dt)), gb);
        } else {
          const double m = double(expected_link_elems(Stage::Offload, paper_layout(psi, N), K)) / 1e6;
          q.push_back({fmt("%s, ZeRO-Offload on %d ranks with %d micro-steps per optimizer step (each "
                           "micro-step's reduced gradient slice goes down to the host; the updated slice comes "
                           "up once): how many million elements cross each rank's host<->device link per "
                           "step?", shape_text(shape).c_str(), N, K),
                       m, 0.01, "M elements"});
          q.back().explanation = fmt("S = Ψ/N padded = %llu; every micro-step's reduced gradient slice goes down "
                                     "(K S) and the updated slice comes up once (S): (K + 1) S = %d x %llu = %.6g M.",
                                     (unsigned long long)paper_layout(psi, N).shard_total, K + 1,
                                     (unsigned long long)paper_layout(psi, N).shard_total, m);
        }
        break;
      }
      case 3: {  // the fewest ranks for a stage to fit a device
        const Stage s = zero[1 + pick(3)];
        const int cap = 16 << pick(3);  // 16, 32 or 64 GB
        int fewest = 0;
        for (int n = 1; n <= 1024 && !fewest; n *= 2)
          if (double(expected_state_bytes(s, paper_layout(psi, n), DType::BF16).total()) <= cap * 1e9) fewest = n;
        if (!fewest || fewest == 1) continue;  // a question with an answer worth computing
        std::string tried;
        for (int n = 1; n <= fewest; n *= 2)
          tried += fmt("%sN = %d: %.4g GB", n == 1 ? "" : ", ", n,
                       double(expected_state_bytes(s, paper_layout(psi, n), DType::BF16).total()) / 1e9);
        q.push_back({fmt("%s, bf16 mixed precision, %s: what is the fewest ranks N, a power of two, for which "
                         "each rank's model states fit in %d GB (10^9 bytes)?",
                         shape_text(shape).c_str(), stage_name(s), cap),
                     double(fewest), 0.0, "ranks"});
        q.back().explanation = fmt("Ψ = %llu; each rank's model states, doubling N: %s. The first at or under %d GB: "
                                   "N = %d.", (unsigned long long)psi, tried.c_str(), cap, fewest);
        break;
      }
      case 4: {  // the largest model a stage fits
        const Stage s = zero[pick(4)];
        const int cap = 80;
        const uint64_t probe = uint64_t(N) * 1000000000ull;  // a multiple of N: no padding
        const double per_param =
            double(expected_state_bytes(s, paper_layout(probe, N), DType::BF16).total()) / double(probe);
        const double billions = cap * 1e9 / per_param / 1e9;
        q.push_back({fmt("bf16 mixed precision (16 bytes of model states per parameter before sharding), %s on "
                         "%d ranks with %d GB (10^9 bytes) each: how many billion parameters is the largest "
                         "model whose model states fit?", stage_name(s), N, cap),
                     billions, 0.01, "B parameters"});
        q.back().explanation = fmt("%s on %d ranks keeps %.4g bytes per parameter of the model (2 + 2 + 12 = 16 bytes, "
                                   "each category divided by N where the stage shards it); %d GB / %.4g bytes = %.4g "
                                   "billion parameters.", stage_name(s), N, per_param, cap, per_param, billions);
        break;
      }
    }
  }
  return q;
}

// Whether v answers q in its unit: within its tolerance of the exact answer, or of the paper's.
static bool right_exact(const QuizQuestion& q, double v, double want) {
  return std::isfinite(v) && std::isfinite(want) &&
         (q.rel_tol == 0 ? v == want : std::fabs(v - want) <= q.rel_tol * std::fabs(want));
}

int check_quiz(uint64_t seed, int count, const std::string& path, bool explain, bool result) {
  std::ifstream in(path);
  if (!in) user_error("--check %s: cannot read it (%s); give the file with your answers", path.c_str(), strerror(errno));
  const std::vector<QuizQuestion> q = make_quiz(seed, count);
  std::vector<double> given(q.size(), NAN);
  std::vector<std::string> given_text(q.size(), "-");
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    lineno++;
    if (size_t h = line.find('#'); h != std::string::npos) line.resize(h);
    std::istringstream ls(line);
    std::string label, value;
    if (!(ls >> label)) continue;  // blank
    if (!(ls >> value)) user_error("--check %s, line %d: \"%s\" is not an answer; expected `Q<n> <number>`",
                                   path.c_str(), lineno, line.c_str());
    if (label[0] == 'Q' || label[0] == 'q') label = label.substr(1);
    if (!label.empty() && (label.back() == ':' || label.back() == '.')) label.pop_back();
    char* end = nullptr;
    const long n = strtol(label.c_str(), &end, 10);
    if (label.empty() || *end || n < 1 || n > long(q.size()))
      user_error("--check %s, line %d: no question \"%s\" in this quiz (Q1..Q%zu, --seed %llu --count %d)",
                 path.c_str(), lineno, label.c_str(), q.size(), (unsigned long long)seed, count);
    const double v = strtod(value.c_str(), &end);
    if (*end || !std::isfinite(v))
      user_error("--check %s, line %d: \"%s\" is not a number; write the answer in the question's unit",
                 path.c_str(), lineno, value.c_str());
    given[n - 1] = v;
    given_text[n - 1] = value;
  }
  int wrong = 0;
  for (size_t i = 0; i < q.size(); i++) {
    const QuizQuestion& qi = q[i];
    const double v = given[i];
    auto matches = [&](double want) { return right_exact(qi, v, want); };
    const bool exact = matches(qi.answer), paper = !exact && matches(qi.paper_answer);
    const std::string tol = qi.rel_tol == 0 ? " exactly" : fmt(" within %g%%", qi.rel_tol * 100);
    wrong += !(exact || paper);
    if (!std::isfinite(v)) printf("Q%zu  no answer\n", i + 1);
    else if (exact && qi.convention.empty()) printf("Q%zu  right (%g %s)\n", i + 1, v, qi.unit.c_str());
    else if (exact || paper)
      printf("Q%zu  right (%g %s; %s)\n", i + 1, v, qi.unit.c_str(),
             (exact ? qi.convention : qi.paper_convention).c_str());
    else if (std::isnan(qi.paper_answer))
      printf("Q%zu  wrong: %g %s, expected %.4g%s\n", i + 1, v, qi.unit.c_str(), qi.answer, tol.c_str());
    else
      printf("Q%zu  wrong: %g %s, expected %.4g (%s) or %.4g (%s)%s\n", i + 1, v, qi.unit.c_str(), qi.answer,
             qi.convention.c_str(), qi.paper_answer, qi.paper_convention.c_str(), tol.c_str());
    if (explain && std::isfinite(v) && !(exact || paper)) printf("    %s\n", qi.explanation.c_str());
  }
  printf("score: %zu of %zu right\n", q.size() - wrong, q.size());
  if (result) printf("result: %s\n", quiz_result_line(seed, count, given_text, int(q.size()) - wrong).c_str());
  return wrong;
}

static uint32_t fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

std::string quiz_result_line(uint64_t seed, int count, const std::vector<std::string>& answers, int right) {
  std::string line = fmt("nzquiz1 seed=%llu count=%d answers=", (unsigned long long)seed, count);
  for (size_t i = 0; i < answers.size(); i++) line += (i ? "," : "") + answers[i];
  line += fmt(" score=%d/%d", right, count);
  return line + fmt(" code=%08x", fnv1a(line));
}

int verify_quiz_result(const std::string& text) {
  std::string line = text;
  if (line.rfind("result: ", 0) == 0) line = line.substr(8);  // as --check --result prints it
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) line.pop_back();
  unsigned long long seed = 0;
  int count = 0, right = 0, of = 0, used = 0;
  char answers[20000], code[16];
  const bool parsed = line.size() < sizeof answers &&
                      sscanf(line.c_str(), "nzquiz1 seed=%llu count=%d answers=%19999s score=%d/%d code=%8[0-9a-f]%n",
                             &seed, &count, answers, &right, &of, code, &used) == 6 &&
                      size_t(used) == line.size() && strlen(code) == 8 && count >= 1 && count <= 1000 && of == count;
  if (!parsed)
    user_error("--verify \"%.80s\": not a quiz result line, expected `nzquiz1 seed=S count=C answers=A1,A2,... "
               "score=R/C code=XXXXXXXX`; paste the whole line the quiz printed", line.c_str());
  std::vector<std::string> given;
  std::stringstream ss(answers);
  for (std::string a; std::getline(ss, a, ',');) given.push_back(a);
  if (int(given.size()) != count)
    user_error("--verify: %zu answers for a quiz of %d questions, expected one per question (`-` for none); paste "
               "the whole line the quiz printed", given.size(), count);
  const std::string body = line.substr(0, line.rfind(" code="));
  if (fmt("%08x", fnv1a(body)) != code) {
    printf("not verified: the check code does not match the line (edited, or garbled when copied); ask for the line "
           "again\n");
    return 1;
  }
  const std::vector<QuizQuestion> q = make_quiz(seed, count);
  int regraded = 0;
  for (int i = 0; i < count; i++) {
    char* end = nullptr;
    const double v = given[i] == "-" ? NAN : strtod(given[i].c_str(), &end);
    if (given[i] != "-" && (given[i].empty() || *end))
      user_error("--verify: answer %d \"%s\" is not a number or `-`; paste the whole line the quiz printed", i + 1,
                 given[i].c_str());
    regraded += right_exact(q[i], v, q[i].answer) || right_exact(q[i], v, q[i].paper_answer);
  }
  if (regraded != right) {
    printf("not verified: the line says %d of %d right, its answers grade %d of %d (--seed %llu --count %d)\n", right,
           count, regraded, count, seed, count);
    return 1;
  }
  printf("verified: --seed %llu --count %d, %d of %d right\n", seed, count, right, count);
  return 0;
}

void print_quiz_key(uint64_t seed, int count) {
  const std::vector<QuizQuestion> q = make_quiz(seed, count);
  printf("ZeRO quiz answer key (--seed %llu --count %d), for the instructor: a file of these lines scores 100%%\n",
         (unsigned long long)seed, count);
  for (size_t i = 0; i < q.size(); i++) {
    const QuizQuestion& qi = q[i];
    const std::string tol = qi.rel_tol == 0 ? "exactly" : fmt("within %d%%", int(qi.rel_tol * 100));
    if (std::isnan(qi.paper_answer))
      printf("Q%zu %.6g   # %s, %s\n", i + 1, qi.answer, qi.unit.c_str(), tol.c_str());
    else
      printf("Q%zu %.6g   # %s, %s (%s); also right: %.6g (%s)\n", i + 1, qi.answer, qi.unit.c_str(), tol.c_str(),
             qi.convention.c_str(), qi.paper_answer, qi.paper_convention.c_str());
  }
}

}  // namespace nz
