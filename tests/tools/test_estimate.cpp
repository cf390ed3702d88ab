// test_estimate.cpp — zero_estimate against three independent truths: the ZeRO paper's Table 1,
// the per-stage formulas written out here by hand (bytes, and elements sent per step for --accum
// K = 1, 2, 3), and the memory ledger and comm ledger of real training runs (every stage whose
// trainer is built, N = 1..4, to the byte and to the element).
#include <gtest/gtest.h>
#include <unistd.h>  // access

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "harness.h"

using namespace nzt;

namespace {

const std::vector<const char*>& kStages = all_stages();  // stages.txt
const char* kStateCats[] = {"params", "grads", "master", "adam_m", "adam_v", "comm_buffers", "gathered"};

Json estimate_json(const std::string& flags) {
  std::string out;
  int rc = run_command(bin_dir() + "/zero_estimate --json " + flags, &out);
  if (rc != 0) throw std::runtime_error("zero_estimate " + flags + " failed: " + out);
  return Json::parse(out);
}

bool have_binary(const std::string& name) { return access((bin_dir() + "/" + name).c_str(), X_OK) == 0; }

}  // namespace

// The paper's 7.5B, N = 64 row: 120 GB baseline, 31.4 GB P_os, 16.6 GB P_os+g, 1.88 GB P_os+g+p.
// Every other cell: the paper's closed forms (2+2+K)Ψ, 4Ψ + KΨ/N, 2Ψ + (2+K)Ψ/N, (2+2+K)Ψ/N, K = 12,
// within the 3 significant digits printed.
TEST(Estimate, PrintsThePaperTable) {
  std::string out;
  ASSERT_EQ(run_command(bin_dir() + "/zero_estimate --paper-table", &out), 0) << out;
  printf("%s", out.c_str());
  const double psis[] = {7.5e9, 128e9, 1e12};
  int rows = 0;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream ls(line);
    int N;
    if (!(ls >> N)) continue;  // headers
    rows++;
    std::vector<std::string> cells;
    for (std::string tok; ls >> tok;)
      if (tok != "|") cells.push_back(tok);
    ASSERT_EQ(cells.size(), 12u) << line;
    if (N == 64) {
      EXPECT_EQ(std::vector<std::string>(cells.begin(), cells.begin() + 4),
                (std::vector<std::string>{"120", "31.4", "16.6", "1.88"}));
    }
    for (int m = 0; m < 3; m++) {
      const double P = psis[m], K = 12;
      const double want[4] = {(2 + 2 + K) * P, 4 * P + K * P / N, 2 * P + (2 + K) * P / N, (2 + 2 + K) * P / N};
      for (int s = 0; s < 4; s++)
        EXPECT_NEAR(std::stod(cells[m * 4 + s]), want[s] / 1e9, 0.005 * want[s] / 1e9) << line;
    }
  }
  EXPECT_EQ(rows, 6);  // N = 1, 4, 16, 64, 256, 1024
}

// GPT-2's shape: the layout counted by hand (units padded to N), then the ledger table (docs/memory.md) of bytes
// per parameter per stage, and the elements each rank sends per optimizer step of K micro-steps:
// stages 0 and 1 accumulate the full gradient locally and reduce it once, 2(N-1)S whatever K;
// stage2 and offload reduce-scatter every micro-step and all-gather once, (K+1)(N-1)S; stage3
// gathers twice and reduce-scatters every micro-step, 3K(N-1)S, and infinity too. Offload's host link:
// K·S + S; infinity's: K·S down and 2K·S up (its slice of each unit before each gather).
TEST(Estimate, AgreesWithTheFormulasWrittenOut) {
  const uint64_t V = 256, T = 1024, C = 768, layers = 12;
  for (const char* prec : {"fp32", "bf16"}) {
    for (uint64_t N : {1, 3, 8, 1000}) {
      for (uint64_t K : {1, 2, 3}) {
        auto pad = [&](uint64_t n) { return (n + N - 1) / N * N; };
        const uint64_t embed = pad(V * C + T * C), block = pad(12 * C * C + 13 * C), lnf = pad(2 * C);
        const uint64_t P = embed + layers * block + lnf, S = P / N, U = std::max(embed, block);
        // stage3 gathers a unit while its neighbour on the cycle embed, blocks, lnf computes: at most
        // two neighbours at once
        const uint64_t two = std::max({embed + block, 2 * block, block + lnf, lnf + embed});
        const uint64_t e = std::string(prec) == "fp32" ? 4 : 2, master = e == 2 ? 4 : 0;
        Json j = estimate_json("--preset gpt2 --stage all --precision " + std::string(prec) + " --world " +
                               std::to_string(N) + " --accum " + std::to_string(K));
        EXPECT_EQ(j["num_params"].u(), V * C + T * C + layers * (12 * C * C + 13 * C) + 2 * C);
        EXPECT_EQ(j["accum"].u(), K);
        // stage -> bytes of {params, grads, master, adam_m, adam_v, comm_buffers, gathered}; stages 0
        // and 1 hold the full accumulated gradient plus one unit's gradient of the current micro-step
        // on its way into it, and need no bucket
        std::map<std::string, std::vector<uint64_t>> want = {
            {"stage0_ddp", {e * P, e * P + e * U, master * P, 4 * P, 4 * P, 0, 0}},
            {"stage1", {e * P, e * P + e * U, master * S, 4 * S, 4 * S, 0, 0}},
            {"stage2", {e * P, e * S, master * S, 4 * S, 4 * S, e * U, 0}},
            {"stage3", {e * S, e * S, master * S, 4 * S, 4 * S, e * U, e * two}},
            {"offload", {e * P, e * S, 4 * S, 4 * S, 4 * S, e * U, 0}},  // fp32 master on the host always
            {"infinity", {e * S, e * S, 4 * S, 4 * S, 4 * S, e * U, e * two}},  // and the slices there too
        };
        // stage -> elements sent per rank per optimizer step, in units of (N-1)S
        std::map<std::string, uint64_t> sent = {
            {"stage0_ddp", 2}, {"stage1", 2}, {"stage2", K + 1}, {"stage3", 3 * K}, {"offload", K + 1},
            {"infinity", 3 * K}};
        // off the device: the states, and the buffer the largest unit's reduced slice lands in (eU/N)
        const uint64_t landing = e * U / N;
        std::map<std::string, uint64_t> host = {{"offload", e * S + 12 * S + landing},
                                                {"infinity", 2 * e * S + 12 * S + landing}};
        std::map<std::string, uint64_t> link = {{"offload", K * S + S}, {"infinity", 3 * K * S}};
        ASSERT_EQ(j["estimates"].size(), 6u);
        for (const Json& r : j["estimates"].arr) {
          const std::string st = r["stage"].str;
          SCOPED_TRACE(st + " " + prec + " N=" + std::to_string(N) + " K=" + std::to_string(K));
          EXPECT_EQ(r["padded_params"].u(), P);
          uint64_t sum = 0;
          for (int c = 0; c < 7; c++) {
            EXPECT_EQ(r["bytes"][kStateCats[c]].u(), want[st][c]) << kStateCats[c];
            sum += want[st][c];
          }
          EXPECT_EQ(r["model_state"].u(), sum);
          EXPECT_EQ(r["host"].u(), host[st]);
          EXPECT_EQ(r["device"].u() + r["host"].u(), sum + r["bytes"]["activations"].u() +
                                                           (st == "offload" || st == "infinity" ? landing : 0));
          EXPECT_EQ(r["comm_elems_per_step"].u(), sent[st] * (N - 1) * S);
          EXPECT_EQ(r["link_elems_per_step"].u(), link[st]);
        }
      }
    }
  }
}

// A raw count: Ψ itself, the paper's (2 + 2 + 12)Ψ split by stage, nothing else (no unit, so no
// incoming unit gradient in stages 0 and 1 either). And the paper's example's traffic per step with
// --accum 4: 2, 2, 5, 12, 5, 12 times (N-1)S (infinity: nothing of it on the device).
TEST(Estimate, RawParameterCountIsThePapersModelStates) {
  const uint64_t psi = 7500000000ull, N = 64, S = psi / N;
  Json j = estimate_json("--params 7.5B --world 64 --precision bf16 --accum 4");
  EXPECT_EQ(j["num_params"].u(), psi);
  std::map<std::string, uint64_t> sent = {{"stage0_ddp", 2}, {"stage1", 2}, {"stage2", 5}, {"stage3", 12},
                                          {"offload", 5}, {"infinity", 12}};
  std::map<std::string, uint64_t> total = {{"stage0_ddp", 16 * psi}, {"stage1", 4 * psi + 12 * S},
                                           {"stage2", 2 * psi + 14 * S}, {"stage3", 16 * S},
                                           {"offload", 2 * psi + 14 * S}, {"infinity", 16 * S}};
  for (const Json& r : j["estimates"].arr) {
    const std::string st = r["stage"].str;
    EXPECT_EQ(r["model_state"].u(), total[st]) << st;
    EXPECT_EQ(r["bytes"]["comm_buffers"].u() + r["bytes"]["gathered"].u() + r["bytes"]["activations"].u(), 0u);
    EXPECT_EQ(r["device"].u(), st == "offload" ? 2 * psi : st == "infinity" ? 0 : total[st]) << st;
    EXPECT_EQ(r["bytes"]["grads"].u(), st == "stage0_ddp" || st == "stage1" ? 2 * psi : 2 * S) << st;
    EXPECT_EQ(r["comm_elems_per_step"].u(), sent[st] * (N - 1) * S) << st;
  }
  EXPECT_EQ(sent.size(), j["estimates"].size());
}

// The estimate is what the ledger measures: every stage of stages.txt (a missing binary fails), N = 1..4 in fp32 (N = 3
// pads the units) and N = 3 in bf16, on every rank, each category at the location it claims.
TEST(Estimate, MatchesTheLedgerOfRealRunsForEveryBuiltStage) {
  const std::string shape = "--preset tiny --seq 32 --batch 2";
  int checked = 0;
  for (const char* stage : kStages) {
    if (!have_binary(stage)) {
      ADD_FAILURE() << bin_dir() << "/" << stage << " is missing; expected every stage of stages.txt: build them (make)";
      continue;
    }
    std::vector<std::pair<int, std::string>> runs = {{1, "fp32"}, {2, "fp32"}, {3, "fp32"}, {4, "fp32"}, {3, "bf16"}};
    for (auto [N, prec] : runs) {
      SCOPED_TRACE(std::string(stage) + " N=" + std::to_string(N) + " " + prec);
      RunResult run = run_trainer(stage, N,
                                  shape + " --steps 1 --eval-every 0 --eval-windows 4 --device cpu --precision " + prec,
                                  "est");
      ASSERT_EQ(run.exit_code, 0) << run.output;
      const Json all = estimate_json(shape + " --stage " + stage + " --precision " + prec + " --world " +
                                     std::to_string(N));
      const Json& est = all["estimates"][0];
      ASSERT_EQ(run.report["ranks"].size(), size_t(N));
      for (const Json& rank : run.report["ranks"].arr) {
        const Json& led = rank["ledger"];
        std::vector<std::string> cats(std::begin(kStateCats), std::end(kStateCats));
        cats.push_back("activations");
        for (const std::string& c : cats) {
          const std::string where = est["location"][c].str;
          const uint64_t want = est["bytes"][c].u(), got = led[where]["peak"][c].u();
          // stage3's gathered units: the formula is the most alive at once, a bound
          if (c == "gathered") {
            EXPECT_LE(got, want) << c;
            EXPECT_EQ(got > 0, want > 0) << c;
          } else {
            EXPECT_EQ(got, want) << c << " on the " << where << ", rank " << rank["rank"].u();
          }
          for (const std::string other : {"device", "host", "disk"}) {
            if (other != where) {
              EXPECT_EQ(led[other]["peak"][c].u(), 0u) << c << " on the " << other;
            }
          }
        }
      }
      checked++;
    }
  }
  printf("checked %d runs against zero_estimate\n", checked);
  EXPECT_EQ(checked, 5 * int(kStages.size()));
}

// "On the host" is the ledger's host total to the byte, on every rank: offload's and infinity's
// states off the device plus the buffer a reduced gradient slice lands in (eU/N, the ledger's host
// scratch), which the states alone leave out (small, 4 ranks, bf16: 4,262,208 bytes for infinity,
// not the states' 4,163,072); and tiny on 3 ranks, whose units are padded.
TEST(Estimate, OnTheHostIsTheLedgersHostTotal) {
  struct Case { const char* stage; int N; const char* flags; };
  for (const Case& c : {Case{"infinity", 4, "--preset small --precision bf16 --batch 2 --seq 32"},
                        Case{"offload", 4, "--preset small --precision bf16 --batch 2 --seq 32"},
                        Case{"infinity", 3, "--preset tiny --precision fp32 --batch 2 --seq 32"},
                        Case{"offload", 3, "--preset tiny --precision fp32 --batch 2 --seq 32"}}) {
    SCOPED_TRACE(std::string(c.stage) + " N=" + std::to_string(c.N) + " " + c.flags);
    RunResult run = run_trainer(c.stage, c.N, std::string(c.flags) + " --steps 1 --eval-every 0 --eval-windows 4 "
                                "--device cpu", "host_total");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const Json all = estimate_json(std::string(c.flags) + " --stage " + c.stage + " --world " + std::to_string(c.N));
    const uint64_t host = all["estimates"][0]["host"].u();
    ASSERT_EQ(run.report["ranks"].size(), size_t(c.N));
    for (const Json& rank : run.report["ranks"].arr) {
      const Json& peak = rank["ledger"]["host"]["peak"];
      EXPECT_EQ(host, peak["total"].u()) << "rank " << rank["rank"].u();
      EXPECT_GT(peak["scratch"].u(), 0u);  // the landing buffer, which the states alone leave out
      EXPECT_EQ(host - peak["scratch"].u(), all["estimates"][0]["bytes"]["grads"].u() +
                                                all["estimates"][0]["bytes"]["master"].u() +
                                                all["estimates"][0]["bytes"]["adam_m"].u() +
                                                all["estimates"][0]["bytes"]["adam_v"].u() +
                                                (std::string(c.stage) == "infinity" ? all["estimates"][0]["bytes"]["params"].u() : 0));
    }
    if (std::string(c.stage) == "infinity" && c.N == 4) {
      EXPECT_EQ(host, 4262208u);
    }
  }
}

// The elements sent per step are what the comm ledger counts: every stage (a missing binary fails), N = 3, --accum 3
// (rank 0, the last step), and offload's host link, down and up together.
TEST(Estimate, SentPerStepMatchesTheCommLedgerWithAccumulation) {
  const std::string shape = "--preset tiny --seq 32 --batch 2";
  int checked = 0;
  for (const char* stage : kStages) {
    if (!have_binary(stage)) {
      ADD_FAILURE() << bin_dir() << "/" << stage << " is missing; expected every stage of stages.txt: build them (make)";
      continue;
    }
    SCOPED_TRACE(stage);
    RunResult run = run_trainer(stage, 3, shape + " --accum 3 --steps 2 --eval-every 0 --eval-windows 4 --device cpu",
                                "est_accum");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const Json est = estimate_json(shape + " --stage " + stage + " --world 3 --accum 3")["estimates"][0];
    const Json& last = run.report["steps_log"].arr.back();
    EXPECT_EQ(last["comm_elems"].u(), est["comm_elems_per_step"].u());
    EXPECT_EQ(last["to_host_elems"].u() + last["to_device_elems"].u(), est["link_elems_per_step"].u());
    checked++;
  }
  EXPECT_EQ(checked, int(kStages.size()));
}

// --attention flash: every kept block holds one fp32 log-sum-exp per head and token, B*H*T, instead of
// the B*H*T*T probabilities (each term 64-byte aligned): L blocks' worth less without checkpointing,
// one block's with it; the model states do not change.
TEST(Estimate, FlashAttentionKeepsTheLogSumExpInsteadOfTheSoftmax) {
  const uint64_t L = 12, H = 12, B = 2, T = 128;
  auto r64 = [](uint64_t n) { return (n + 63) / 64 * 64; };
  for (const char* prec : {"fp32", "bf16"}) {
    SCOPED_TRACE(prec);
    const uint64_t e = std::string(prec) == "fp32" ? 4 : 2;
    const std::string flags = "--preset gpt2 --stage stage3 --world 4 --batch 2 --seq 128 --precision " + std::string(prec);
    Json gemm = estimate_json(flags), flash = estimate_json(flags + " --attention flash");
    EXPECT_EQ(gemm["attention"].str, "gemm");
    EXPECT_EQ(flash["attention"].str, "flash");
    const uint64_t per_block = r64(B * H * T * T * e) - r64(4 * B * H * T);
    EXPECT_EQ(gemm["activations_plain"].u() - flash["activations_plain"].u(), L * per_block);
    EXPECT_EQ(gemm["activations_checkpointed"].u() - flash["activations_checkpointed"].u(), per_block);
    EXPECT_EQ(gemm["estimates"][size_t(0)]["model_state"].u(), flash["estimates"][size_t(0)]["model_state"].u());
  }
}

// --pipeline P --json (what the explorer draws) holds exactly the numbers of the table the same flags
// print, segment by segment: units, the five model-state categories, the slots, the activations, the total.
TEST(Estimate, PipelineJsonIsTheTable) {
  for (const std::string flags : {"--preset small --pipeline 2 --world 4 --accum 4",
                                  "--preset tiny --seq 32 --pipeline 3 --accum 8 --schedule gpipe --precision bf16",
                                  "--preset small --pipeline 4 --world 8 --zero 1 --precision fp16 "
                                  "--activation-checkpointing",
                                  "--preset small --pipeline 2 --partition 3 --accum 2"}) {
    SCOPED_TRACE(flags);
    std::string text;
    ASSERT_EQ(run_command(bin_dir() + "/zero_estimate " + flags, &text), 0) << text;
    const Json j = estimate_json(flags);
    const int P = int(j["segments"].u());
    ASSERT_EQ(j["estimates"].arr.size(), size_t(P));
    char bubble[32];
    snprintf(bubble, sizeof bubble, "= %.3f", j["bubble"].d());
    EXPECT_NE(text.find(bubble), std::string::npos) << text;
    for (int s = 0; s < P; s++) {
      const Json& e = j["estimates"][size_t(s)];
      const size_t row = text.find("\n" + std::to_string(s) + " ");
      ASSERT_NE(row, std::string::npos) << text;
      unsigned long long v[5], slots, acts, total;
      int first, last;
      ASSERT_EQ(sscanf(text.c_str() + row + 1, "%*d %d..%d %llu %llu %llu %llu %llu %llu %llu %llu", &first, &last,
                       &v[0], &v[1], &v[2], &v[3], &v[4], &slots, &acts, &total), 10) << text;
      EXPECT_EQ(uint64_t(first), e["first_unit"].u());
      EXPECT_EQ(uint64_t(last), e["last_unit"].u());
      const char* cats[] = {"params", "grads", "master", "adam_m", "adam_v"};
      for (int c = 0; c < 5; c++) EXPECT_EQ(v[c], e["bytes"][cats[c]].u()) << cats[c] << ", segment " << s;
      EXPECT_EQ(slots, e["slots"].u());
      EXPECT_EQ(acts, e["bytes"]["activations"].u());
      EXPECT_EQ(total, e["total"].u());
    }
  }
}

// Bad input: one line naming the problem, exit code 2.
TEST(Estimate, BadInputIsOneLineAndExitCodeTwo) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--stage stage4", "unknown stage"},
      {"--preset huge", "unknown preset"},
      {"--world 0", "--world 0"},
      {"--world 1,x", "--world 1,x"},
      {"--params -5", "--params -5"},
      {"--params 7.5Q", "--params 7.5Q"},
      {"--params 1B --preset tiny", "raw count"},
      {"--precision fp8", "unknown precision"},
      {"--preset tiny --seq 64", "longer than the model's context"},
      {"--dim 30", "must divide"},
      {"--bogus 1", "unknown flag --bogus"},
      {"--world", "needs a value"},
      {"--accum 0", "--accum 0"},
      {"--accum two", "--accum two"},
      {"--accum 65537", "--accum 65537"},
      {"--accum", "needs a value"},
      {"--attention fast", "unknown attention"},
      {"--params 1B --attention flash", "counts activations"},
      {"--dim 256 --heads 1 --attention flash", "above the flash kernels' 128"},
  };
  for (const auto& [flags, want] : cases) {
    std::string out;
    int rc = run_command(bin_dir() + "/zero_estimate " + flags, &out);
    int lines = 0;
    for (char ch : out) lines += ch == '\n';
    EXPECT_EQ(rc, 2) << flags << ": " << out;
    EXPECT_EQ(lines, 1) << flags << ": " << out;
    EXPECT_NE(out.find(want), std::string::npos) << flags << ": " << out;
  }
}

// The across-nodes ratio docs/zeropp.md and the README state for GPT-2 (N = 64, nodes of 8, blocks
// of 2048) is what zero_estimate computes, for the gpt2 preset's 256-byte vocabulary and for GPT-2's
// real 50,257 tokens, whose embedding (a third of the model, gathered twice by the forward) moves it;
// with qgZ in two hops (the ZeRO++ row) and flat (--qgz-flat).
TEST(Estimate, ZeroppRatioTheDocsStateForBothVocabularies) {
  auto across_ratio = [](const std::string& vocab, const std::string& technique) {
    const Json j = estimate_json("--zeropp 8 --preset gpt2 --world 64 --precision bf16 --qw-block 2048 --qg-block 2048" + vocab);
    double stage3 = 0, zpp = 0;
    for (const Json& e : j["estimates"].arr) {
      if (e["technique"].str == "stage3") stage3 = e["comm_bytes_across_nodes_per_step"].d();
      if (e["technique"].str == technique) zpp = e["comm_bytes_across_nodes_per_step"].d();
    }
    EXPECT_GT(stage3, 0);
    EXPECT_GT(zpp, 0) << technique;
    return zpp / stage3;
  };
  const double preset = across_ratio("", "ZeRO++"), gpt2 = across_ratio(" --vocab 50257", "ZeRO++");
  const double preset_flat = across_ratio("", "ZeRO++ flat qgZ"), gpt2_flat = across_ratio(" --vocab 50257", "ZeRO++ flat qgZ");
  char want[96];
  const std::string doc = read_file("docs/zeropp.md"), readme = read_file("README.md");
  snprintf(want, sizeof want, "gives %.3f (flat qgZ: %.3f)", preset, preset_flat);
  EXPECT_NE(doc.find(want), std::string::npos) << want;
  snprintf(want, sizeof want, "it gives %.3f, and %.3f with flat", gpt2, gpt2_flat);
  EXPECT_NE(doc.find(want), std::string::npos) << want;
  snprintf(want, sizeof want, "%.3f with GPT-2's own", gpt2);
  EXPECT_NE(readme.find(want), std::string::npos) << want;
  snprintf(want, sizeof want, "%.3f with GPT-2's own)", gpt2_flat);
  EXPECT_NE(readme.find(want), std::string::npos) << want;
  EXPECT_GT(gpt2, preset + 0.04);  // the real vocabulary: a clearly larger share across nodes
  EXPECT_GT(gpt2_flat, gpt2 + 0.04);  // flat qgZ: G times the gradients' bytes across
}
