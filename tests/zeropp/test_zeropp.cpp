// test_zeropp.cpp — ZeRO++ (zeropp/train.cpp) held to exact references, run under mpirun as a
// learner runs it. What must hold:
//   - the equality matrix, bit for bit (every step's loss and grad norm, and the saved model):
//       --hpz G alone             = stage3 (it moves no number differently)
//       --qwz, --qgz, all three   = the fake-quant reference (tests/zeropp/fake_quant_ddp.cpp:
//                                   stage0_ddp's replicas with the parameters, or each rank's
//                                   gradient, quantized and dequantized in the same blocks)
//     at N = 4 with accumulation 2, N = 3 (padding), in bf16 and fp16 (skipped steps included); and
//     the quantization really acts;
//   - qgZ's two hops (inside the node, then the node's sum re-quantized across nodes) = the
//     fake-quant reference of that scheme, at N = 2, 4, 6 with nodes of 1, 2, 4 ranks, fp32 and bf16;
//     one hop (one node, or nodes of one rank) = --qgz-flat, two hops not;
//   - deliberately broken copies (tests/zeropp/mutants.mk) fail it;
//   - bytes on the wire, per rank and step, to the byte: the comm ledger of a real run at N = 8,
//     G = 4 = the formula written out below = zero_formulas' (inside a node and across nodes; qgZ
//     in two hops and flat), and
//     the headline: across-node bytes, stage3 against ZeRO++;
//   - memory: hpZ's secondary shard and the quantization buffers in the ledger = the formula; and
//     --batch auto fits ZeRO++'s peak, not stage3's;
//   - bad input: one line, exit 2.
#include <gtest/gtest.h>

#include <map>

#include "harness.h"
#include "model.h"          // preset_config
#include "zero_formulas.h"  // expected_device_peak: what --batch auto fits
#include "zeropp/formulas.h"  // ZeroppConfig, zeropp_state_bytes

using namespace nzt;

namespace {

const std::string kFlags =
    "--preset tiny --seq 32 --batch 2 --lr 3e-3 --warmup 2 --eval-every 0 --eval-windows 4 --clip 0.5 ";
const std::string kBlocks = " --qw-block 64 --qg-block 64";  // small blocks: the tiny model has many
// `flags` with the small blocks of the techniques it turns on (a block size without its technique is refused)
std::string with_blocks(const std::string& flags) {
  return flags + (flags.find("--qwz") != std::string::npos ? " --qw-block 64" : "") +
         (flags.find("--qgz") != std::string::npos ? " --qg-block 64" : "");
}
const int kSteps = 4;

const RunResult& run(const std::string& trainer, int N, int accum, const std::string& extra,
                     const std::string& prec = "fp32", int steps = kSteps) {
  // fp16: the loss scale of the stages' tests (harness.h): the first steps overflow and are skipped
  const std::string flags = kFlags + "--steps " + std::to_string(steps) + " --accum " + std::to_string(accum) +
                            " --precision " + prec + fp16_flags(prec, accum) + " " + extra;
  return run_cached(trainer, N, flags, prec);
}

// zeropp and its reference for one combination of the three
struct Pair {
  std::string zeropp_flags, reference;  // reference: "stage3" or the fake-quant reference's flags
};
int steps_of(const std::string& prec) { return prec == "fp16" ? 8 : kSteps; }  // fp16: past the skipped ones
const RunResult& reference_of(const Pair& p, int N, int K, const std::string& prec) {
  if (p.reference == "stage3") return run("stage3", N, K, "", prec, steps_of(prec));
  return run("zeropp_reference", N, K, with_blocks(p.reference), prec, steps_of(prec));
}

std::string describe(const Verdict& v) { return v.str(); }

}  // namespace

TEST(Zeropp, EqualityMatrixBitForBit) {
  struct Case { int N, K; std::string prec; Pair p; };
  const std::vector<Case> cases = {
      {4, 2, "fp32", {"", "stage3"}},  // none of the three: stage3 itself
      {4, 2, "fp32", {"--hpz 2", "stage3"}},
      {4, 2, "fp32", {with_blocks("--qwz"), "--qwz"}},
      {4, 2, "fp32", {with_blocks("--qgz"), "--qgz"}},
      {4, 2, "fp32", {"--qwz --hpz 2 --qgz" + kBlocks, "--qwz --qgz --ranks-per-node 2"}},  // qgZ in two hops
      {3, 1, "fp32", {"--qwz --hpz 3 --qgz" + kBlocks, "--qwz --qgz"}},
      {2, 1, "bf16", {"--qwz --hpz 2 --qgz" + kBlocks, "--qwz --qgz"}},
      // fp16: an overflowing gradient block dequantizes to NaN, so the step is skipped as in stage3
      {2, 1, "fp16", {"--qwz --hpz 2 --qgz" + kBlocks, "--qwz --qgz"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("zeropp " + c.p.zeropp_flags + " N=" + std::to_string(c.N) + " accum=" + std::to_string(c.K) + " " +
                 c.prec);
    const RunResult& ref = reference_of(c.p, c.N, c.K, c.prec);
    const RunResult& z = run("zeropp", c.N, c.K, c.p.zeropp_flags, c.prec, steps_of(c.prec));
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    ASSERT_EQ(z.exit_code, 0) << z.output;
    ASSERT_EQ(step_values(z.report, "loss").size(), size_t(steps_of(c.prec)));
    if (c.prec == "fp16") {
      EXPECT_GT(skipped_steps(z.report), 0) << "the fp16 case must skip some steps";
      EXPECT_LT(skipped_steps(z.report), steps_of(c.prec)) << "and train in others";
    }
    const Verdict v = compare_runs(ref, z);
    printf("zeropp %-32s N=%d accum=%d %s = %s: %s\n", c.p.zeropp_flags.c_str(), c.N, c.K, c.prec.c_str(),
           c.p.reference == "stage3" ? "stage3" : ("reference " + c.p.reference).c_str(), describe(v).c_str());
    EXPECT_TRUE(v.identical()) << describe(v);
  }
  // The quantization acts: with it the run is another run (else the equalities above prove nothing).
  const Verdict q = compare_runs(run("stage3", 4, 2, ""), run("zeropp", 4, 2, "--qwz --hpz 2 --qgz" + kBlocks));
  EXPECT_FALSE(q.losses_equal || q.model_equal) << "ZeRO++'s quantization changed nothing: " << describe(q);
  printf("ZeRO++ against stage3 (not equal, as it must be): %s\n", describe(q).c_str());
}

// The tests of the tests: each broken copy trains, and its own equality check reports it.
TEST(Zeropp, BrokenVariantsAreCaught) {
  struct Mutant { const char* name; int N, K; std::string prec; Pair p; };
  const std::vector<Mutant> mutants = {
      {"sum_kept_quantized", 4, 2, "fp32", {with_blocks("--qgz"), "--qgz"}},
      {"per_tensor_scale", 4, 2, "fp32", {"--qwz --hpz 2 --qgz" + kBlocks, "--qwz --qgz --ranks-per-node 2"}},
      {"own_slice_exact", 4, 2, "fp32", {with_blocks("--qgz"), "--qgz"}},
      {"hpz_stale", 4, 2, "fp32", {"--hpz 2", "stage3"}},
      {"bf16_read_as_fp16", 2, 1, "bf16", {"--qwz --hpz 2 --qgz" + kBlocks, "--qwz --qgz"}},
  };
  for (const Mutant& m : mutants) {
    const std::string bin = std::string("mutant_zeropp_") + m.name;
    SCOPED_TRACE(bin);
    const RunResult& ref = reference_of(m.p, m.N, m.K, m.prec);
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    const RunResult& r = run(bin, m.N, m.K, m.p.zeropp_flags, m.prec, steps_of(m.prec));
    if (r.exit_code != 0) {  // a broken run that cannot finish is caught too (bf16 read as fp16: NaN)
      printf("%-20s stops: %s\n", m.name, r.output.substr(r.output.find("error:") == std::string::npos
                                                               ? 0 : r.output.find("error:"), 140).c_str());
      continue;
    }
    const Verdict v = compare_runs(ref, r);
    printf("%-20s %s\n", m.name, describe(v).c_str());
    EXPECT_FALSE(v.identical()) << bin << " passes the equality check";
  }
}

// qgZ in two hops (zeropp/train.cpp, reduce_scatter_int4_two_hops) against the fake-quant reference of
// the same scheme (tests/zeropp/fake_quant_ddp.cpp: node k's sum of its ranks' dequantized int4
// gradients, quantized again, the nodes' results added in node order), bit for bit: every step's loss
// and grad norm and the model file, at N = 2, 4 and 6 with nodes of 1, 2, 3, 4 ranks, fp32 and bf16.
// Two hops run only with several nodes of several ranks; otherwise the one hop left is the flat
// all-to-all, and the run must equal --qgz-flat's. Where the hops run they must not (the
// re-quantization acts), and --qgz-flat there equals the flat reference.
TEST(Zeropp, QgzTwoHopsEqualTheirFakeQuantReference) {
  struct Case { int N, G, K; std::string prec; };
  const std::vector<Case> cases = {{2, 1, 1, "fp32"}, {2, 2, 1, "fp32"}, {2, 1, 1, "bf16"}, {2, 2, 1, "bf16"},
                                   {4, 1, 1, "fp32"}, {4, 2, 2, "fp32"}, {4, 4, 1, "fp32"}, {4, 1, 1, "bf16"},
                                   {4, 2, 1, "bf16"}, {4, 4, 1, "bf16"}, {6, 2, 1, "fp32"}};
  for (const Case& c : cases) {
    const std::string nodes = " --ranks-per-node " + std::to_string(c.G);
    SCOPED_TRACE("--qgz" + nodes + " N=" + std::to_string(c.N) + " accum=" + std::to_string(c.K) + " " + c.prec);
    const bool two_hops = c.G > 1 && c.G < c.N;
    const RunResult& ref = run("zeropp_reference", c.N, c.K, with_blocks("--qgz" + nodes), c.prec);
    const RunResult& z = run("zeropp", c.N, c.K, with_blocks("--qgz" + nodes), c.prec);
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    ASSERT_EQ(z.exit_code, 0) << z.output;
    ASSERT_EQ(step_values(z.report, "loss").size(), size_t(kSteps));
    EXPECT_EQ(z.report["zeropp"]["qgz_two_hops"].b, two_hops);
    const Verdict v = compare_runs(ref, z);
    EXPECT_TRUE(v.identical()) << describe(v);
    const RunResult& flat = run("zeropp", c.N, c.K, with_blocks("--qgz --qgz-flat" + nodes), c.prec);
    ASSERT_EQ(flat.exit_code, 0) << flat.output;
    const Verdict f = compare_runs(flat, z);
    printf("qgZ N=%d nodes of %d accum=%d %s: %s = reference: %s; against --qgz-flat: %s\n", c.N, c.G, c.K,
           c.prec.c_str(), two_hops ? "two hops" : "one hop ", describe(v).c_str(), describe(f).c_str());
    if (two_hops) {
      EXPECT_FALSE(f.losses_equal || f.model_equal) << "the re-quantization between the hops changed nothing";
      const RunResult& flat_ref = run("zeropp_reference", c.N, c.K, with_blocks("--qgz --qgz-flat" + nodes), c.prec);
      EXPECT_TRUE(compare_runs(flat_ref, flat).identical()) << "--qgz-flat: " << describe(compare_runs(flat_ref, flat));
    } else {
      EXPECT_TRUE(f.identical()) << "one hop is the flat all-to-all: " << describe(f);
    }
  }
  // --node-size, the flag's old name, is --ranks-per-node
  const Verdict alias = compare_runs(run("zeropp", 4, 2, with_blocks("--qgz --ranks-per-node 2")),
                                     run("zeropp", 4, 2, with_blocks("--qgz --node-size 2")));
  EXPECT_TRUE(alias.identical()) << "--node-size 2: " << describe(alias);
  // broken copies of the two hops (tests/zeropp/mutants.mk): each trains and differs from the reference
  struct Mutant { const char* name; int N, G; };
  for (const Mutant& m : {Mutant{"two_hops_exact_across", 4, 2}, Mutant{"two_hops_nodes_reversed", 6, 2},
                          Mutant{"two_hops_flat_group", 4, 2}, Mutant{"two_hops_node_groups", 4, 2}}) {
    SCOPED_TRACE(m.name);
    const std::string flags = with_blocks("--qgz --ranks-per-node " + std::to_string(m.G));
    const RunResult& ref = run("zeropp_reference", m.N, m.N == 4 ? 2 : 1, flags);
    const RunResult& r = run(std::string("mutant_zeropp_") + m.name, m.N, m.N == 4 ? 2 : 1, flags);
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const Verdict v = compare_runs(ref, r);
    printf("%-24s N=%d nodes of %d: %s\n", m.name, m.N, m.G, describe(v).c_str());
    EXPECT_FALSE(v.identical()) << m.name << " passes the equality check";
  }
}

// fp16 with qgZ, an overflow defined (docs/zeropp.md): a gradient block holding an infinity has no
// scale, dequantizes to NaN, and the step's overflow check skips the step, as stage3's does. One
// infinity is planted in rank 1's gradient of lnf in step 2 (tests/zeropp/mutants.mk, inf_in_grad),
// at a loss scale under which this model never overflows by itself: step 2, and only step 2, is
// skipped. The same fault with the NaN block added as zeros (inf_hidden) trains through it: the
// check below sees that.
TEST(Zeropp, Fp16OverflowInOneGradientBlockSkipsTheStep) {
  auto skipped = [](const RunResult& r) {
    std::vector<int> v;
    for (const Json& s : r.report["steps_log"].arr) v.push_back(s["skipped"].b ? 1 : 0);
    return v;
  };
  const std::string flags = "--qwz --hpz 2 --qgz" + kBlocks + " --precision fp16 --loss-scale 1024";
  const RunResult& fault = run_cached("mutant_zeropp_inf_in_grad", 2, kFlags + "--steps 3 " + flags, "fp16");
  ASSERT_EQ(fault.exit_code, 0) << fault.output;
  EXPECT_EQ(skipped(fault), (std::vector<int>{0, 1, 0})) << "the overflowed block's step, and no other";
  const RunResult& hidden = run_cached("mutant_zeropp_inf_hidden", 2, kFlags + "--steps 3 " + flags, "fp16");
  ASSERT_EQ(hidden.exit_code, 0) << hidden.output;
  EXPECT_NE(skipped(hidden), skipped(fault)) << "an overflow added as zeros must not pass as handled";
}

namespace {

// Sizes for ZeRO++'s layout, recomputed from the report's unit list: each unit padded to a multiple
// of N x block (block 1 when nothing is quantized).
Sizes zeropp_sizes(const Json& report, int N, uint64_t block) {
  Sizes z;
  const uint64_t m = N * block;
  for (const Json& u : report["units"].arr) {
    z.padded.push_back((u["numel"].u() + m - 1) / m * m);
    z.P += z.padded.back();
    z.S += z.padded.back() / N;
    z.U = std::max(z.U, z.padded.back());
  }
  return z;
}
// n values packed as `bits`-bit codes and one fp32 scale per block of 64 (kernels/quantize.h)
uint64_t packed(int bits, uint64_t n) { return n * bits / 8 + 4 * ((n + 63) / 64); }

struct Bytes { uint64_t total = 0, across = 0; };

}  // namespace

// N = 8 ranks in 2 simulated nodes of G = 4, bf16 (e = 2, the paper's fp16 bytes), one step:
// the comm ledger against the formula written out here, term by term, per rank.
//   stage3 (zeropp with none of the three; --ranks-per-node 4 only splits the ledger): every collective
//   sends e s_u to each of the N - 1 others, N - G of them on the other node:
//       gathers: forward every unit + the embedding again, backward every unit but the embedding;
//       one reduce-scatter per unit: 3 (N-1) e S in all, 3 (N-G) e S across.
//   ZeRO++ (--qwz --hpz 4 --qgz, blocks of 64): forward gathers send q8(s_u) = s_u + 4 s_u/64
//   to each peer; backward gathers e p_u / G to the G - 1 others of my node only; qgZ sends
//   q4(s_u) = s_u / 2 + 4 s_u / 64 per slice, in two hops (M = N/G = 2 nodes): M slices to each
//   of the G - 1 others of my node, then one slice to each of the M - 1 ranks of my local index
//   on the other nodes: (N - 1) q4(s_u) in all, (M - 1) q4(s_u) across;
//   --qgz-flat: one all-to-all, q4(s_u) to each of the N - 1 others, N - G of them across.
TEST(Zeropp, BytesOnTheWireEqualTheFormulaInsideAndAcrossNodes) {
  const int N = 8, G = 4, M = N / G;
  const uint64_t e = 2;
  const RunResult& z3 = run("zeropp", N, 1, "--ranks-per-node 4", "bf16", 1);
  const RunResult& zpp = run("zeropp", N, 1, "--qwz --hpz 4 --qgz" + kBlocks, "bf16", 1);
  const RunResult& flat = run("zeropp", N, 1, "--qwz --hpz 4 --qgz --qgz-flat" + kBlocks, "bf16", 1);
  ASSERT_EQ(z3.exit_code, 0) << z3.output;
  ASSERT_EQ(zpp.exit_code, 0) << zpp.output;
  ASSERT_EQ(flat.exit_code, 0) << flat.output;
  // stage3
  const Sizes a = zeropp_sizes(z3.report, N, 1);
  const uint64_t s_E3 = a.padded[0] / N;
  Bytes want3;
  want3.total = (N - 1) * e * ((a.S + s_E3) + (a.S - s_E3) + a.S);
  want3.across = (N - G) * e * ((a.S + s_E3) + (a.S - s_E3) + a.S);
  // ZeRO++, its qgZ in two hops and flat
  const Sizes b = zeropp_sizes(zpp.report, N, 64);
  Bytes want, want_flat;
  uint64_t gathers = 0, gathers_across = 0, rs = 0, rs_elems = 0, rs_across = 0, rs_across_flat = 0;
  for (int u = 0; u < b.units(); u++) {
    const uint64_t p = b.padded[u], s = p / N;
    const int forward = u == 0 ? 2 : 1;  // the embedding again for the LM head
    gathers += forward * (N - 1) * packed(8, s);
    gathers_across += forward * (N - G) * packed(8, s);
    if (u != 0) gathers += (G - 1) * e * p / G;  // hpZ: inside the node
    rs += (G - 1) * M * packed(4, s) + (M - 1) * packed(4, s);  // the two hops: all of it, (N - 1) q4(s)
    rs_elems += (N - 1) * s;
    rs_across += (M - 1) * packed(4, s);
    rs_across_flat += (N - G) * packed(4, s);
  }
  want.total = want_flat.total = gathers + rs;
  want.across = gathers_across + rs_across;
  want_flat.across = gathers_across + rs_across_flat;
  EXPECT_EQ(rs_across_flat, G * rs_across) << "flat qgZ sends G times as much across nodes";
  for (auto [r, w, name] : {std::tuple{&z3, want3, "stage3"}, std::tuple{&zpp, want, "ZeRO++"},
                            std::tuple{&flat, want_flat, "ZeRO++ --qgz-flat"}}) {
    SCOPED_TRACE(name);
    const Json& f = (*r).report["zeropp"];
    EXPECT_EQ(f["comm_bytes_per_step"].u(), w.total) << "zero_formulas.cpp against the formula here";
    EXPECT_EQ(f["comm_bytes_across_nodes_per_step"].u(), w.across) << "zero_formulas.cpp against the formula here";
    for (const Json& s : (*r).report["steps_log"].arr) {
      EXPECT_EQ(s["comm_bytes"].u(), w.total) << "rank 0's ledger, step " << s["step"].u();
      EXPECT_EQ(s["comm_bytes_across_nodes"].u(), w.across) << "rank 0's ledger, step " << s["step"].u();
    }
    // every rank, by collective (the run's totals: the step, then validation's and the model file's exact
    // gathers): the reduce-scatter's all-to-all is the step's alone, the gathers the same on every rank
    const Json& c0 = (*r).report["ranks"][0]["comm"];
    for (const Json& rank : (*r).report["ranks"].arr) {
      const Json& c = rank["comm"];
      const unsigned long long rk = rank["rank"].u();
      if (r != &z3) {
        EXPECT_EQ(c["all_to_all"]["bytes_sent"].u(), rs) << "rank " << rk;
        EXPECT_EQ(c["all_to_all"]["elems_sent"].u(), rs_elems) << "rank " << rk;
        EXPECT_EQ(c["all_to_all"]["bytes_across_nodes"].u(), r == &zpp ? rs_across : rs_across_flat) << "rank " << rk;
        EXPECT_EQ(c["reduce_scatter"]["bytes_sent"].u(), 0u) << "rank " << rk;
      } else {
        EXPECT_EQ(c["reduce_scatter"]["bytes_sent"].u(), (N - 1) * e * a.S) << "rank " << rk;
        EXPECT_EQ(c["reduce_scatter"]["bytes_across_nodes"].u(), (N - G) * e * a.S) << "rank " << rk;
      }
      EXPECT_EQ(c["all_gather"]["bytes_sent"].u(), c0["all_gather"]["bytes_sent"].u()) << "rank " << rk;
      EXPECT_EQ(c["all_gather"]["bytes_across_nodes"].u(), c0["all_gather"]["bytes_across_nodes"].u()) << "rank " << rk;
    }
  }
  // zeropp/formulas.h's qgZ part alone, two hops and flat, against the same sums
  {
    nz::GPTConfig tiny;
    nz::preset_config("tiny", &tiny);
    const nz::Layout L = nz::make_layout(tiny, N, 64);
    for (bool is_flat : {false, true}) {
      nz::ZeroppConfig z{true, G, true, G, 64, 64, is_flat};
      const nz::ZeroppComm q = nz::qgz_comm_per_step(L, z, 1);
      EXPECT_EQ(q.elems, rs_elems);
      EXPECT_EQ(q.bytes, rs);
      EXPECT_EQ(q.bytes_across, is_flat ? rs_across_flat : rs_across);
    }
  }
  // the parts: forward gathers, backward gathers, gradients, across nodes
  const uint64_t fwd3 = (N - G) * e * (a.S + s_E3), bwd3 = (N - G) * e * (a.S - s_E3), rs3 = (N - G) * e * a.S;
  printf("across nodes, bytes per rank per step: forward gathers %llu -> %llu (%.3f; paper 0.5), backward gathers "
         "%llu -> 0 (paper 0), gradients %llu -> %llu in two hops (%.3f), %llu flat (%.3f; paper 0.25)\n",
         (unsigned long long)fwd3, (unsigned long long)gathers_across, double(gathers_across) / double(fwd3),
         (unsigned long long)bwd3, (unsigned long long)rs3, (unsigned long long)rs_across,
         double(rs_across) / double(rs3), (unsigned long long)rs_across_flat, double(rs_across_flat) / double(rs3));
  // zero_estimate --zeropp prints the same numbers without running anything
  std::string est;
  ASSERT_EQ(run_command(bin_dir() + "/zero_estimate --zeropp 4 --preset tiny --world 8 --precision bf16 --qw-block 64 "
                        "--qg-block 64 --json --network 100,10 --compute-ms 5", &est), 0) << est;
  const Json ej = Json::parse(est);
  int rows = 0;
  for (const Json& row : ej["estimates"].arr) {
    const std::string t = row["technique"].str;
    if (t != "stage3" && t != "ZeRO++" && t != "ZeRO++ flat qgZ") continue;
    rows++;
    const Bytes& w = t == "stage3" ? want3 : t == "ZeRO++" ? want : want_flat;
    EXPECT_EQ(row["comm_bytes_per_step"].u(), w.total) << "zero_estimate " << t;
    EXPECT_EQ(row["comm_bytes_across_nodes_per_step"].u(), w.across) << "zero_estimate " << t;
    // the network model: 5 ms of compute, inside bytes at 100 GB/s, across bytes at 10 GB/s, in turn
    const double ms = 5 + 1e3 * (double(w.total - w.across) / 100e9 + double(w.across) / 10e9);
    EXPECT_NEAR(row["step_ms"].d(), ms, 1e-9 * ms) << "zero_estimate --network " << t;
  }
  EXPECT_EQ(rows, 3) << est;
  const double ratio = double(want.across) / double(want3.across);
  const double ratio_flat = double(want_flat.across) / double(want3.across);
  printf("N=8, G=4, bf16, blocks of 64, per rank per step: stage3 sends %llu bytes, %llu across nodes; ZeRO++ %llu, "
         "%llu across nodes: %.3f of stage3's (%llu, %.3f with flat qgZ; the paper's 0.75M / 3M = 0.25 for large "
         "blocks)\n", (unsigned long long)want3.total, (unsigned long long)want3.across, (unsigned long long)want.total,
         (unsigned long long)want.across, ratio, (unsigned long long)want_flat.across, ratio_flat);
  // in the paper's limit (large blocks, one gather of every unit per pass) flat qgZ gives 0.25, two
  // hops 0.5/3 + 0.25/(3G); here the scales add 4/64 byte per value, and the forward gathers the
  // embedding twice (a quarter of the tiny model)
  EXPECT_GT(ratio, 0.5 / 3 + 0.25 / (3 * G));
  EXPECT_LT(ratio, ratio_flat);
  EXPECT_GT(ratio_flat, 0.25);
  EXPECT_LT(ratio_flat, 0.35);
}

// Memory per rank, to the byte (bf16: e = 2), in the same two runs: stage3's formula (S, U from
// ZeRO++'s padded layout) plus
//   params        + e P / G                      hpZ's secondary shard
//   comm_buffers  + (N + 1) q8(U/N)              qwZ: my slice and every rank's, int8 + scales
//                 + N q4(U/N) + 2 * 4 U/N        qgZ: a slice per rank in int4, two fp32 slices
//                 + 4 (N/G) U/N                  qgZ's two hops: my node's sums of N/G slices, fp32
TEST(Zeropp, LedgerHoldsTheSecondaryShardAndQuantizationBuffers) {
  const int N = 8, G = 4;
  const uint64_t e = 2;
  const RunResult& zpp = run("zeropp", N, 1, "--qwz --hpz 4 --qgz" + kBlocks, "bf16", 1);
  ASSERT_EQ(zpp.exit_code, 0) << zpp.output;
  const Sizes b = zeropp_sizes(zpp.report, N, 64);
  const uint64_t s = b.U / N;
  const std::map<std::string, uint64_t> want = {
      {"params", e * b.S + e * b.P / G},
      {"grads", e * b.S},
      {"master", 4 * b.S},
      {"adam_m", 4 * b.S},
      {"adam_v", 4 * b.S},
      {"comm_buffers", e * b.U + (N + 1) * packed(8, s) + N * packed(4, s) + 8 * s + 4 * (N / G) * s}};
  for (const Json& rank : zpp.report["ranks"].arr)
    for (auto& [cat, bytes] : want)
      EXPECT_EQ(rank["ledger"]["device"]["peak"][cat].u() + rank["ledger"]["host"]["peak"][cat].u(), bytes)
          << "rank " << rank["rank"].u() << " " << cat;
  for (auto& [cat, bytes] : want) EXPECT_EQ(zpp.report["formula"][cat].u(), bytes) << "zero_formulas.cpp: " << cat;
  EXPECT_EQ(zpp.report["zeropp"]["pad_block"].u(), 64u) << "the report says how the units are padded";
  printf("N=8, G=4, bf16: hpZ's secondary shard %llu bytes per rank (eP/G), quantization buffers %llu bytes\n",
         (unsigned long long)(e * b.P / G), (unsigned long long)(want.at("comm_buffers") - e * b.U));
}

// --batch auto (and the fits check) count what ZeRO++ adds to stage3 (zeropp_state_bytes) on its
// padded layout. The budget is ZeRO++'s predicted device peak at micro-batch B0 = 2, into which
// stage3's formula would fit a larger batch: the run must pick B0, and every rank's measured device
// peak (the ledger's) must equal the prediction to the byte (tests/stages/test_batch_fit.cpp's
// check for the ladder).
TEST(Zeropp, BatchAutoFitsZeroppsPeakNotStage3s) {
  const int N = 4, B0 = 2, T = 16;  // 16 tokens: a sequence's activations weigh less than ZeRO++'s additions
  nz::GPTConfig tiny;
  nz::preset_config("tiny", &tiny);
  const nz::Layout L = nz::make_layout(tiny, N, 64);
  const nz::ZeroppConfig z{true, 2, true, 2, 64, 64};
  const nz::StateBytes zpp = nz::zeropp_state_bytes(L, nz::DType::BF16, z);
  auto peak = [&](int B, const nz::StateBytes* states) {
    return nz::expected_device_peak(nz::Stage::ZeroPP, L, B, T, nz::DType::BF16, false, nz::Attention::Gemm, states);
  };
  const uint64_t budget = peak(B0, &zpp);
  ASSERT_LE(peak(B0 + 1, nullptr), budget) << "the case this test is about: stage3's formula fits more";
  ASSERT_GT(peak(B0 + 1, &zpp), budget);
  const RunResult& fit = run("zeropp", N, 1, "--qwz --hpz 2 --qgz" + kBlocks + " --seq 16 --batch auto " +
                             "--memory-budget " + std::to_string(budget), "bf16", 1);
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  EXPECT_EQ(int(fit.report["batch"].u()), B0) << fit.output;
  for (const Json& rank : fit.report["ranks"].arr)
    EXPECT_EQ(rank["ledger"]["device"]["peak"]["total"].u(), budget) << "rank " << rank["rank"].u();
}

TEST(Zeropp, BadInputIsOneLineAndExitCodeTwo) {
  struct Bad { std::string bin; int N; std::string flags, says; int code; };
  const std::vector<Bad> bad = {
      {"zeropp", 2, "--qwz --qw-block 100", "error: --qw-block 100: 100 values per scale, expected a power of two", 2},
      {"zeropp", 2, "--qgz --qg-block 4", "error: --qg-block 4: 4 values per scale, expected a power of two", 2},
      {"zeropp", 4, "--hpz 3", "error: --hpz 3: the 4 ranks do not make whole nodes of 3", 2},
      {"stage3", 2, "--qgz", "error: --qgz: stage3 does not use it", 2},
      {"zeropp", 2, "--qgz-flat", "error: --qgz-flat: it says how --qgz reduces the gradients, expected it with --qgz",
       2},
      {"zeropp", 4, "--qgz --ranks-per-node 3", "error: --ranks-per-node 3: the 4 ranks do not make whole nodes of 3",
       2},
      {"zeropp", 4, "--qgz --ranks-per-node 0", "error: --ranks-per-node 0:", 2},
      {"zeropp", 4, "--hpz 2 --node-size 4", "error: --ranks-per-node 4 with --hpz 2: hpZ's nodes are qgZ's and the "
       "ledger's nodes, expected the same G", 2},
      {"stage3", 2, "--ranks-per-node 2", "error: --ranks-per-node 2: stage3 does not use it", 2},
      {"mutant_zeropp_nan_in_params", 2, "--qwz", "error: qwZ: embed's parameters: element 5 is NaN", 2},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.bin + " " + b.flags);
    std::string out;
    const int code = run_command("timeout -k 5 120 mpirun -np " + std::to_string(b.N) + " " + program_path(b.bin) +
                                     " " + kFlags + "--steps 3 --quiet " + b.flags, &out);
    EXPECT_EQ(code, b.code) << out;
    EXPECT_NE(out.find(b.says), std::string::npos) << out;
    size_t errors = 0;
    for (size_t at = out.find("error:"); at != std::string::npos; at = out.find("error:", at + 1)) errors++;
    EXPECT_EQ(errors, 1u) << "one line, from one rank: " << out;
  }
}

// DeepSpeed's keys (common/input/ds_config.cpp): zero_quantized_weights, zero_hpz_partition_size and
// zero_quantized_gradients on stage 3 are --qwz, --hpz G, --qgz, to the bit; with another stage, refused.
TEST(Zeropp, DeepSpeedKeysAreTheFlags) {
  const std::string dir = temp_dir();
  auto write = [&](const std::string& name, int stage) {
    const std::string path = dir + "/" + name;
    FILE* f = fopen(path.c_str(), "w");
    fprintf(f, "{\"zero_optimization\": {\"stage\": %d, \"zero_quantized_weights\": true, "
               "\"zero_hpz_partition_size\": 2, \"zero_quantized_gradients\": true}}\n", stage);
    fclose(f);
    return path;
  };
  const RunResult& flags = run("zeropp", 4, 2, "--qwz --hpz 2 --qgz" + kBlocks);
  // without a scheduler section a config means a constant rate: the flags run's schedule is named
  const RunResult& config = run("zeropp", 4, 2, "--config " + write("zpp.json", 3) + " --lr-schedule cosine" + kBlocks);
  ASSERT_EQ(config.exit_code, 0) << config.output;
  const Verdict v = compare_runs(flags, config);
  EXPECT_TRUE(v.identical()) << describe(v);
  EXPECT_TRUE(config.report["zeropp"]["qwz"].b && config.report["zeropp"]["qgz"].b);
  EXPECT_EQ(config.report["zeropp"]["hpz"].u(), 2u);
  std::string out;
  const int code = run_command("mpirun -np 2 " + bin_dir() + "/zeropp --config " + write("z2.json", 2) + " " + kFlags +
                                   "--steps 1 --quiet", &out);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("error: --config " + dir + "/z2.json: zero_optimization: ZeRO++'s keys with stage 2, expected "
                     "stage 3"), std::string::npos) << out;
}

// Checkpoints. An hpZ run holds stage3's state (the secondary shard is refilled by the next forward),
// so its checkpoint resumes bit for bit in zeropp and in stage3. A quantized run's units are padded
// to N x block (its MANIFEST says "pad_block 64"; checkpoint.h): still
//   - stopped at step 2 and resumed, with and without hpZ, every later loss and grad norm and the
//     model file equal the uninterrupted run's, bit for bit;
//   - consolidate (the reader every stage uses) merges its last checkpoint into the run's model file;
//   - it loads in stage3 on 2 ranks (another world size and layout): the same numbers as stage0_ddp
//     resumed from it (all stages agree bit for bit at accumulation 1), and no padding read;
//   - the reverse: stage3's checkpoint of 4 ranks resumed by zeropp --qwz --qgz on 2 ranks equals
//     the fake-quant reference resumed from it (which holds whole units, not slices).
TEST(Zeropp, CheckpointsResumeBitForBitAndCrossToStage3) {
  auto losses_and_norms_after = [](const RunResult& r, int step) {
    std::vector<double> v;
    for (const Json& s : r.report["steps_log"].arr)
      if (int(s["step"].d()) > step) v.push_back(s["loss"].d()), v.push_back(s["grad_norm"].d());
    return v;
  };
  const std::string step2 = "/step-00000002";
  {  // hpZ alone: its checkpoint is stage3's
    const std::string dir = fresh_dir("zeropp_hpz_ckpt");
    const RunResult& full = run("zeropp", 4, 1, "--hpz 2 --ckpt-dir " + dir + " --ckpt-every 2");
    ASSERT_EQ(full.exit_code, 0) << full.output;
    for (const std::string trainer : {"zeropp", "stage3"}) {
      const RunResult& resumed =
          run(trainer, 4, 1, (trainer == "zeropp" ? "--hpz 2 " : "") + std::string("--resume ") + dir + step2);
      ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
      EXPECT_TRUE(same_model_bits(full.model_path, resumed.model_path)) << trainer << " resumed from zeropp --hpz 2";
    }
  }
  std::string quantized_dir;
  for (const std::string flags : {"--qwz --qgz", "--qwz --hpz 2 --qgz"}) {  // the padded layout
    SCOPED_TRACE(flags);
    const std::string dir = fresh_dir("zeropp_ckpt");
    const RunResult& full = run("zeropp", 4, 1, flags + kBlocks + " --ckpt-dir " + dir + " --ckpt-every 2");
    ASSERT_EQ(full.exit_code, 0) << full.output;
    EXPECT_NE(read_file(dir + step2 + "/MANIFEST").find("\npad_block 64\n"), std::string::npos);
    const RunResult& resumed = run("zeropp", 4, 1, flags + kBlocks + " --resume " + dir + step2);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_EQ(losses_and_norms_after(resumed, 0).size(), 4u) << "steps 3 and 4 only: it did not start over";
    EXPECT_EQ(losses_and_norms_after(resumed, 2), losses_and_norms_after(full, 2));
    EXPECT_TRUE(same_model_bits(full.model_path, resumed.model_path));
    std::string out;
    const std::string merged = dir + ".model";
    ASSERT_EQ(run_command(bin_dir() + "/consolidate --ckpt " + dir + " --out " + merged, &out), 0) << out;
    EXPECT_TRUE(same_model_bits(full.model_path, merged)) << "consolidate of the padded checkpoint";
    quantized_dir = dir;
  }
  // zeropp's padded checkpoint of 4 ranks in stage3 (and stage0_ddp) on 2 ranks
  const RunResult& z3 = run("stage3", 2, 1, "--resume " + quantized_dir + step2);
  const RunResult& ddp = run("stage0_ddp", 2, 1, "--resume " + quantized_dir + step2);
  ASSERT_EQ(z3.exit_code, 0) << z3.output;
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  EXPECT_TRUE(compare_runs(ddp, z3).identical()) << describe(compare_runs(ddp, z3));
  // stage3's checkpoint of 4 ranks in zeropp --qwz --qgz on 2 ranks (padded to 2 x 64 now)
  const std::string dir3 = fresh_dir("stage3_ckpt");
  const RunResult& s3 = run("stage3", 4, 1, "--ckpt-dir " + dir3 + " --ckpt-every 2");
  ASSERT_EQ(s3.exit_code, 0) << s3.output;
  EXPECT_EQ(read_file(dir3 + step2 + "/MANIFEST").find("pad_block"), std::string::npos) << "stage3's format as before";
  const RunResult& zpp = run("zeropp", 2, 1, "--qwz --qgz" + kBlocks + " --resume " + dir3 + step2);
  const RunResult& ref = run("zeropp_reference", 2, 1, "--qwz --qgz" + kBlocks + " --resume " + dir3 + step2);
  ASSERT_EQ(zpp.exit_code, 0) << zpp.output;
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  EXPECT_TRUE(compare_runs(ref, zpp).identical()) << describe(compare_runs(ref, zpp));
  EXPECT_EQ(losses_and_norms_after(zpp, 0).size(), 4u);
}
