// zero_estimate — the per-rank memory and traffic of every ZeRO stage, from the formulas, allocating nothing.
//
//   build/bin/zero_estimate [--preset NAME | --params PSI] [--world N[,N...]] [--precision P]
//                           [--stage NAME|all] [--offload] [--batch B] [--seq T] [--accum K] [--json]
//                           [--activation-checkpointing] [--attention gemm|flash] [--fit SIZE]
//   build/bin/zero_estimate --zeropp G [--qw-block B] [--qg-block B] [--preset NAME] [--world N[,N...]]
//                           [--precision P] [--accum K] [--json] [--network INTRA,INTER [--compute-ms C]]
//   build/bin/zero_estimate --tensor T [--zero 1] [--sequence-parallel] [--preset NAME] [--world N[,N...]]
//   build/bin/zero_estimate --tensor T --pipeline P [--schedule S] [--partition U,..] [--world N] (3D)
//                           [--precision P] [--batch B] [--seq T] [--accum K] [--json]
//   build/bin/zero_estimate --paper-table
//   build/bin/zero_estimate --quiz [--seed S] [--count N] [--key | --check FILE [--explain] [--result]]
//   build/bin/zero_estimate --verify LINE [--course-pub FILE]
//   build/bin/zero_estimate --quiz --student ID --course-pub FILE [--count N] [--key | --check FILE [--explain]]
//   build/bin/zero_estimate --quiz --sign FILE --student ID --signing-key FILE
//   build/bin/zero_estimate --course-keys DIR
//
// The numbers come from common/zero_formulas.h and model.h (make_layout): the
// same functions the trainers print beside their memory ledger and the tests assert against it,
// so `zero_estimate --preset tiny --world 4 --stage stage2` predicts, to the byte, the ledger of
// `mpirun -np 4 build/bin/stage2 --preset tiny` (defaults are the trainers' defaults).
//
// It also prints the elements each rank sends per optimizer step with --accum K micro-steps
// (expected_comm_elems): flat in K for stages 0 and 1, which sum the gradient locally and reduce it
// once; growing with K from stage2 on, which must reduce-scatter every micro-step.
//
// --zeropp G: stage3 against ZeRO++ (zeropp/train.cpp) on nodes of G ranks: the bytes each rank sends
// per step, inside its node and across nodes, with each of qwZ, hpZ, qgZ alone and all three
// (zeropp_comm_per_step), qgZ in two hops and flat (--qgz-flat), and the bytes ZeRO++ adds per rank
// (zeropp_state_bytes): what the ledger of `mpirun -np N build/bin/zeropp --qwz --hpz G --qgz` shows, to the byte.
//
// --config FILE (docs/faq.md): a DeepSpeed config read by common/input/ds_config.h, as the trainers read it,
// and its zero_optimization knobs counted as the bytes DeepSpeed's own buffers may hold (ds_buffers).
// --deepspeed-estimator: DeepSpeed's estimate_zero2/zero3_model_states_mem_needs restated, beside the ledger.
//
// --params PSI (e.g. 7.5B, 125M, 1e12) takes a raw parameter count instead of a model shape. There
// is no unit layout then: Ψ is padded to a multiple of N (fewer than N zeros) and held in no unit,
// so the buffers of one unit (buckets, gathered units, stage0/1's incoming unit gradient) and the
// activations are not counted — only the paper's model states, (2 + 2 + K)Ψ with K = 12 in bf16
// mixed precision (fp32 master, Adam m and v), 16Ψ in fp32. --paper-table prints the ZeRO paper's
// Table 1 that way. (The paper's K is the optimizer's bytes per parameter; --accum's K is a count of
// micro-steps.)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/check.h"          // user_error
#include "input/cli.h"            // fmt_bytes
#include "kernels/cuda/flash_attention.h"  // cuda::flash_attention_fits: the head sizes flash attention takes
#include "runtime/json.h"           // JsonWriter
#include "model.h"          // presets, make_layout, activation_bytes
#include "zero_formulas.h"  // Stage, parse_stage, expected_state_bytes, expected_comm_elems
#include "pipeline/formulas.h"  // pipeline_segment_bytes, pipeline_activation_bytes
#include "ulysses/formulas.h"   // ulysses_activation_bytes, ulysses_all_to_all_elems
#include "zeropp/formulas.h"    // zeropp_state_bytes, zeropp_comm_per_step
#include "muon_formulas.h"      // muon_estimate_text: --optimizer muon
#include "tensor/formulas.h"    // tensor_state_bytes, tensor_activation_bytes, tensor_comm_elems
#include "tensor/tensor.h"      // tensor_layout
#include "tools/zero_quiz.h"      // make_quiz, check_quiz
#include "kernels/quantize.h"       // valid_quant_block
#ifndef __EMSCRIPTEN__
#include "input/ds_config.h"        // read_ds_config: --config, DeepSpeed's JSON (no files in the explorer's page)
#endif
#include <map>

using namespace nz;

namespace {

const Stage kAllStages[] = {Stage::DDP, Stage::Z1, Stage::Z2, Stage::Z3, Stage::Offload, Stage::Infinity};
// The model-state categories, in the order the trainers' memory table prints them.
const Category kStateCats[] = {Category::Params, Category::Grads, Category::Master, Category::AdamM,
                               Category::AdamV, Category::CommBuffers, Category::Gathered};

// Where a category lives: offload keeps the gradient shard and the optimizer on the host;
// infinity the parameter slices too (--offload-param cpu; on disk they are the disk's).
Location location_of(Stage s, Category c) {
  const bool state = c == Category::Grads || c == Category::Master || c == Category::AdamM || c == Category::AdamV;
  bool on_host = (s == Stage::Offload && state) || (s == Stage::Infinity && (state || c == Category::Params));
  return on_host ? Location::Host : Location::Device;
}

// The host buffer a reduced gradient slice lands in (offload, infinity): the largest unit's slice.
uint64_t host_landing_bytes(const Layout& L, DType dt) { return L.max_unit_padded / L.world * dtype_bytes(dt); }

struct Estimate {
  Stage stage;
  Layout L;
  StateBytes b;
  uint64_t activations = 0;               // in the totals: checkpointed with --activation-checkpointing
  uint64_t activations_plain = 0, activations_ckpt = 0;  // both, for the table
  uint64_t device = 0, host = 0;  // everything above (activations included), split by location
  uint64_t comm_elems = 0, link_elems = 0;  // per optimizer step of `accum` micro-steps
  int fit = -1, fit_ckpt = -1;  // --fit: the largest micro-batch that fits, without and with checkpointing
};

// raw: a parameter count, not a model (no units, so no per-unit buffers; no activations).
Estimate estimate(Stage s, const Layout& L, DType dt, bool raw, uint64_t activations, int accum,
                  bool checkpointing = false) {
  Estimate e{s, L, expected_state_bytes(s, L, dt)};
  e.activations = raw ? 0 : activations;
  e.device = e.activations;
  for (Category c : kStateCats) (location_of(s, c) == Location::Host ? e.host : e.device) += e.b.of(c);
  NZ_CHECK(e.host == e.b.host, "host bytes %llu, formula %llu", (unsigned long long)e.host,
           (unsigned long long)e.b.host);
  // offload, infinity: one unit's reduced gradient slice lands in host memory before it is added to
  // the host's gradient slice (the landing buffer of offload/train.cpp and infinity/train.cpp, the
  // ledger's host scratch): the largest unit's slice, eU/N. No unit (a raw count): none.
  if (s == Stage::Offload || s == Stage::Infinity) e.host += host_landing_bytes(L, dt);
  e.comm_elems = expected_comm_elems(s, L, accum);  // the same with checkpointing (zero_formulas.h)
  e.link_elems = expected_link_elems(s, L, accum);
  return e;
}

// "7.5B", "125M", "1T", "3e9", "85900000" -> a whole number of parameters.
uint64_t parse_count(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  double x = strtod(v.c_str(), &end);
  std::string suffix = end ? end : "";
  double mult = suffix == "" ? 1 : suffix == "K" || suffix == "k" ? 1e3 : suffix == "M" ? 1e6
              : suffix == "B" || suffix == "G" ? 1e9 : suffix == "T" ? 1e12 : -1;
  x *= mult;
  if (v.empty() || mult < 0 || !std::isfinite(x) || x < 1 || x > 1e16)
    user_error("%s %s: expected a parameter count from 1 to 1e16, e.g. 7.5B, 125M, 1T or 3e9", flag.c_str(), v.c_str());
  return uint64_t(std::llround(x));
}

int parse_pos(const std::string& flag, const std::string& v, long hi) {
  char* end = nullptr;
  long x = strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || x < 1 || x > hi)
    user_error("%s %s: expected a whole number from 1 to %ld; e.g. %s 4", flag.c_str(), v.c_str(), hi, flag.c_str());
  return int(x);
}

// "1,2,4,1024" -> {1, 2, 4, 1024}
std::vector<int> parse_worlds(const std::string& flag, const std::string& v) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= v.size()) {
    size_t comma = v.find(',', at);
    if (comma == std::string::npos) comma = v.size();
    std::string item = v.substr(at, comma - at);
    char* end = nullptr;
    long x = strtol(item.c_str(), &end, 10);
    if (item.empty() || *end || x < 1 || x > (1 << 24))
      user_error("%s %s: expected world sizes N >= 1 (up to 16777216), e.g. %s 4 or %s 1,2,4,8", flag.c_str(),
                 v.c_str(), flag.c_str(), flag.c_str());
    out.push_back(int(x));
    at = comma + 1;
  }
  return out;
}

// The paper prints 3 significant digits, halves rounded up (41.25 -> 41.3, 1.875 -> 1.88), and
// whole GB from 1000 up (printf would round 41.25 to the even 41.2).
std::string paper_gb(double bytes) {
  double gb = bytes / 1e9;
  int decimals = gb >= 1000 ? 0 : std::max(0, 2 - int(std::floor(std::log10(gb))));
  double scale = std::pow(10.0, decimals);
  char buf[32];
  snprintf(buf, sizeof buf, "%.*f", decimals, std::floor(gb * scale + 0.5) / scale);
  std::string s = buf;  // 30.0 -> 30, 7.50 -> 7.5
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s;
}

// ZeRO paper, Table 1: model-state GB per device for 7.5B, 128B and 1T parameters.
void print_paper_table() {
  const double models[] = {7.5e9, 128e9, 1e12};
  const char* names[] = {"7.5B", "128B", "1T"};
  printf("ZeRO paper, Table 1: per-device memory of model states, in GB (1e9 bytes)\n");
  printf("mixed precision with Adam: (2 + 2 + K)Ψ bytes, K = 12 (fp32 master, m, v); raw parameter counts\n");
  printf("(no units: no buckets, gathered units, incoming unit gradients or activations). Columns:\n");
  printf("baseline = stage0_ddp, P_os = stage1, P_os+g = stage2, P_os+g+p = stage3. From common/zero_formulas.h.\n\n");
  printf("%6s", "");
  for (const char* n : names) printf(" | %-37s", (std::string(n) + " model").c_str());
  printf("\n%6s", "N");
  for (int m = 0; m < 3; m++) printf(" | %8s %8s %8s %9s", "baseline", "P_os", "P_os+g", "P_os+g+p");
  printf("\n");
  for (int N : {1, 4, 16, 64, 256, 1024}) {
    printf("%6d", N);
    for (double psi : models) {
      Layout L = paper_layout(uint64_t(psi), N);
      printf(" |");
      for (Stage s : {Stage::DDP, Stage::Z1, Stage::Z2, Stage::Z3}) {
        Estimate e = estimate(s, L, DType::BF16, true, 0, 1);
        printf(s == Stage::Z3 ? " %9s" : " %8s", paper_gb(double(e.b.total())).c_str());
      }
    }
    printf("\n");
  }
}

void print_usage() {
  printf("usage: zero_estimate [--preset NAME | --params PSI] [--world N[,N...]] [--precision fp32|bf16|fp16]\n"
         "                     [--stage NAME|all] [--offload] [--batch B] [--seq T] [--accum K] [--json]\n"
         "                     [--activation-checkpointing] [--attention gemm|flash] [--fit SIZE]\n"
         "       zero_estimate --zeropp G [--qw-block B] [--qg-block B] [--preset NAME] [--world N[,N...]] ...\n"
         "       zero_estimate --tensor T [--zero 1] [--sequence-parallel] [--preset NAME] [--world N[,N...]] ...\n"
         "       zero_estimate --tensor T --pipeline P [--schedule S] [--partition U1,..] [--world N] ...  (3D)\n"
         "       zero_estimate --paper-table\n"
         "       zero_estimate --config DS.json [--preset NAME | --params PSI] [--world N[,N...]] ...\n"
         "       zero_estimate --deepspeed-estimator [--preset NAME | --params PSI [--largest-layer L]] [--world N[,N...]]\n"
         "                     --precision bf16|fp16 [--gpus-per-node G]\n"
         "       zero_estimate --quiz [--seed S] [--count N] [--key | --check FILE [--explain] [--result]]\n"
         "       zero_estimate --verify LINE [--course-pub FILE]\n"
         "       zero_estimate --quiz --student ID --course-pub FILE [--count N] [--key | --check FILE [--explain]]\n"
         "       zero_estimate --quiz --sign FILE --student ID --signing-key FILE\n"
         "       zero_estimate --course-keys DIR\n"
         "       zero_estimate --grade-seed ID --signing-key FILE | --sign-grade LINE --signing-key FILE\n"
         "Per-rank bytes of every ZeRO stage, and the elements each rank sends per optimizer step, from the\n"
         "formulas (common/zero_formulas.h), allocating nothing.\n"
         "  --preset       model preset: %s (default small, like the trainers)\n"
         "  --layers, --dim, --heads   override the preset's shape, as the trainers do\n"
         "  --params PSI   a raw parameter count instead (7.5B, 125M, 1T, 3e9): model states only\n"
         "  --world        number of ranks N, or a list: 1,2,4,1024 (default 1)\n"
         "  --precision    fp32 (default), bf16 or fp16 (mixed: 16-bit params and grads, fp32 master and Adam)\n"
         "  --stage        stage0_ddp, stage1, stage2, stage3, offload, infinity (or 0..3), or all (default)\n"
         "  --offload      short for --stage offload: stage2 with grads shard, master, Adam on the host\n"
         "  --batch, --seq micro-batch per rank and sequence length, for the activations\n"
         "                 (default 4 and 64, or the context if shorter)\n"
         "  --zeropp G     stage3 against ZeRO++ (qwZ, hpZ, qgZ) on nodes of G ranks: bytes per rank per step\n"
         "                 inside and across nodes, and the bytes ZeRO++ adds per rank (docs/zeropp.md);\n"
         "                 --qw-block, --qg-block: values per scale of int8 and int4 (default 256);\n"
         "                 --network INTRA,INTER (GB/s) [--compute-ms C]: a time per step, C + inside/INTRA +\n"
         "                 across/INTER (no overlap, no latency: the model's limits are in docs/zeropp.md)\n"
         "  --optimizer muon   after the table, Muon's own (docs/muon.md): which hidden matrices the slices\n"
         "                 cut at each N, and per stage adam_v (AdamW elements only) and the elements sent\n"
         "                 point to point (default adamw: the table alone); with --json, a \"muon\" array\n"
         "  --accum K      micro-steps per optimizer step, for the elements sent per step (default 1):\n"
         "                 stage0, stage1 2(N-1)S whatever K; stage2, offload (K+1)(N-1)S; stage3, infinity\n"
         "                 3K(N-1)S\n"
         "                 (S = padded params / N); the bytes do not depend on K\n"
         "  --activation-checkpointing   count the activations of a checkpointed run in the totals (the\n"
         "                 table prints both: block inputs plus one block, against every block's internals)\n"
         "  --attention    gemm (default) or flash: the activations of a CUDA run with --attention flash, where\n"
         "                 each block keeps one fp32 log-sum-exp per row, B*NH*T, instead of the B*NH*T*T\n"
         "                 probabilities (the CPU has no flash attention: use gemm for CPU runs)\n"
         "  --fit SIZE     the largest micro-batch per rank whose device peak (model states on the device +\n"
         "                 activations) fits SIZE (64MiB, 2GB, ...), per stage, with and without checkpointing:\n"
         "                 what a trainer's --batch auto --memory-budget SIZE picks\n"
         "  --pipeline P   the pipeline's table (pipeline/train.cpp) on --world N ranks (default N = P): each\n"
         "                 segment's units, model states and activations (a segment: DeepSpeed's pipeline stage);\n"
         "                 --schedule 1f1b (default) or gpipe, --partition U1,U2,... (default: balance the\n"
         "                 parameters), --accum K micro-batches, --zero 1 (each segment's optimizer state\n"
         "                 sharded over its N/P replicas); --json: exact\n"
         "  --ctx N        the model's context (wpe's rows; default the preset's), for a longer --seq\n"
         "  --sp S         ulysses' table (ulysses/train.cpp) on --world N ranks (default N = S): S sequence\n"
         "                 slices x N/S replicas, per rank stage3's model states over N, the activations of a\n"
         "                 slice of --seq (1/S of stage3's) and the all-to-all elements; --json: exact\n"
         "  --sp-mode ring with --sp S: ring attention's table instead (activations, k|v around the ring)\n"
         "  --sp S --fit SIZE  the longest sequence per rank whose model states (stage3's over N, wpe grown to T)\n"
         "                 and activations fit SIZE: stage3 alone, Ulysses and ring at S, with and without\n"
         "                 checkpointing (a formula for ulysses); no --seq\n"
         "  --json         one JSON object on stdout (exact bytes; scripts/plots.py reads it)\n"
         "  --config FILE  a DeepSpeed config: its stage, micro-batch, accumulation, precision and checkpointing\n"
         "                 (flags given here win), and the bytes its zero_optimization knobs (reduce_bucket_size,\n"
         "                 allgather_bucket_size, overlap_comm, stage3_prefetch_bucket_size, stage3_max_live_parameters,\n"
         "                 stage3_max_reuse_distance, stage3_param_persistence_threshold, sub_group_size) may hold on a\n"
         "                 GPU as DeepSpeed's buffers, beside the ledger's; \"auto\" as the Hugging Face integration fills it\n"
         "  --deepspeed-estimator  DeepSpeed's estimate_zero2/zero3_model_states_mem_needs, every offload and zero_init\n"
         "                 case, beside the ledger's model states, each difference named (docs/faq.md); --gpus-per-node G\n"
         "                 (default min(N, 8)); --largest-layer L with --params (a model shape gives it)\n"
         "  --paper-table  the ZeRO paper's Table 1 (7.5B, 128B, 1T parameters; N = 1..1024)\n"
         "  --vocab V      the vocabulary size (default: the preset's, 256 bytes; GPT-2 has 50257)\n"
         "  --quiz         numeric questions from these formulas, without their answers (--seed S,\n"
         "                 default 1, picks the questions; --count N, default 10)\n"
         "  --key          with --quiz: the answer key instead, for the instructor\n"
         "  --check FILE   with --quiz: grade the answers in FILE (lines `Q<n> <number>`, in each\n"
         "                 question's unit); exit 0 when all are right, 1 otherwise\n"
         "  --explain      with --check: the worked answer under each wrong one\n"
         "  --result       with --check: a result line to paste for an instructor (seed, answers, score, check code)\n"
         "  --quiz-edition E  with --quiz: the questions of an older edition (1), as lines nzquiz1/nzcert1 name\n"
         "                 them; the default is the newest (2) (docs/certificates.md, \"Editions\")\n"
         "  --verify LINE  check a result line: its code, and its answers graded again (exit 0 when it holds);\n"
         "                 a course's certificate with --course-pub FILE: its signature, seed and score\n"
         "  a course's quiz (docs/certificates.md):\n"
         "  --course-keys DIR   the instructor's key pair, once: DIR/course.key (private) and DIR/course.pub\n"
         "  --student ID        with --quiz: the student's own quiz (its seed from ID and the course's key)\n"
         "  --course-pub FILE   the course's public key (course.pub)\n"
         "  --sign FILE         with --quiz: the instructor signs a student's answers file: a certificate\n"
         "  --signing-key FILE  with --sign: the course's private key (course.key)\n"
         "  --grade-seed ID     the seed of a student's hidden grading runs (make grade SIGNING_KEY=...)\n"
         "  --sign-grade LINE   sign a student's exercise verdicts (make grade writes LINE); --verify checks it\n",
         preset_names());
}

// One rung's estimate as JSON: a rank's model-state bytes by category, its communication buffers and
// gathered units where the rung has them (ulysses: stage3's), and its activations.
void json_bytes(JsonWriter& j, const StateBytes& b, uint64_t acts, bool buffers) {
  j.key("bytes");
  j.begin_object();
  j.kv("params", b.params), j.kv("grads", b.grads), j.kv("master", b.master), j.kv("adam_m", b.adam_m);
  j.kv("adam_v", b.adam_v);
  if (buffers) j.kv("comm_buffers", b.comm_buffers), j.kv("gathered", b.gathered_peak);
  j.kv("activations", acts);
  j.end_object();
}

// --pipeline P: the per-segment table of pipeline/train.cpp on N ranks (P segments x N/P replicas),
// as its memory table prints it: each segment's units, model states and activation slots.
void print_pipeline_table(const GPTConfig& cfg, int N, int P, const std::string& schedule,
                          const std::string& partition, int zero, DType dt, int B, int T, int K, bool ckpt,
                          Attention attn, bool json) {
  const PipelinePlan plan = make_pipeline_plan(cfg, N, 0, P, schedule, partition, zero);
  const Layout L = make_layout(cfg, plan.replicas);
  if (json) {  // the same numbers, exact, one record per pipeline segment
    JsonWriter j;
    j.begin_object();
    j.kv("segments", P), j.kv("replicas", plan.replicas), j.kv("world", N), j.kv("zero", zero);
    j.kv("schedule", schedule_name(plan.schedule)), j.kv("micro_batches", K), j.kv("batch", B), j.kv("seq", T);
    j.kv("precision", dtype_name(dt)), j.kv("activation_checkpointing", ckpt), j.kv("bubble", bubble_formula(P, K));
    j.key("estimates");
    j.begin_array();
    for (int s = 0; s < P; s++) {
      const StateBytes b = pipeline_segment_bytes(L, dt, plan, s);
      const uint64_t acts = pipeline_activation_bytes(cfg, B, T, dt, ckpt, attn, plan, s, K);
      j.begin_object();
      j.kv("segment", s), j.kv("first_unit", plan.first_unit[s]), j.kv("last_unit", plan.first_unit[s + 1] - 1);
      json_bytes(j, b, acts, false);
      j.kv("slots", activation_slots(plan.schedule, P, s, K));
      j.kv("total", b.total() + acts);
      j.end_object();
    }
    j.end_array();
    j.end_object();
    printf("%s\n", j.str().c_str());
    return;
  }
  printf("pipeline: %d segments x %d replicas (%d ranks), %s, %d micro-batches of %d x %d, %s | bubble (P-1)/(K+P-1) = "
         "%.3f\n", P, plan.replicas, N, schedule_name(plan.schedule), K, B, T, dtype_name(dt),
         bubble_formula(P, K));
  printf("%-7s %-8s %12s %12s %12s %12s %12s %6s %12s %14s\n", "segment", "units", "params", "grads", "master", "adam_m",
         "adam_v", "slots", "activations", "total");
  for (int s = 0; s < P; s++) {
    const StateBytes b = pipeline_segment_bytes(L, dt, plan, s);
    const uint64_t acts = pipeline_activation_bytes(cfg, B, T, dt, ckpt, attn, plan, s, K);
    char units[32];
    snprintf(units, sizeof units, "%d..%d", plan.first_unit[s], plan.first_unit[s + 1] - 1);
    printf("%-7d %-8s %12llu %12llu %12llu %12llu %12llu %6d %12llu %14llu\n", s, units,
           (unsigned long long)b.params, (unsigned long long)b.grads, (unsigned long long)b.master,
           (unsigned long long)b.adam_m, (unsigned long long)b.adam_v, activation_slots(plan.schedule, P, s, K),
           (unsigned long long)acts, (unsigned long long)(b.total() + acts));
  }
}

// --sp S: ulysses/train.cpp on N ranks (S sequence slices x N/S replicas), as its memory table prints
// it: every rank the same, stage3's model states over all N ranks, the activations of T/S tokens
// (attention's probabilities of all T tokens for NH/S heads), and the all-to-alls per block.
// --sp-mode ring: ring attention's activations (no T^2 term) and its point-to-point elements instead.
void print_ulysses_table(const GPTConfig& cfg, int N, int S, DType dt, int B, int T, int K, bool json,
                         bool ring = false) {
  const Layout L = make_layout(cfg, N);
  const StateBytes b = expected_state_bytes(Stage::Ulysses, L, dt);
  if (ring) {
    const uint64_t acts = ring_activation_bytes(cfg, B, T, S, dt);
    const uint64_t fwd = ring_p2p_elems_forward_per_block(cfg, B, T, S), per_block = ring_p2p_elems_per_block(cfg, B, T, S);
    const uint64_t per_step = uint64_t(K) * cfg.layers * per_block;
    if (json) {
      JsonWriter j;
      j.begin_object();
      j.kv("sp", S), j.kv("sp_mode", "ring"), j.kv("replicas", N / S), j.kv("world", N), j.kv("batch", B);
      j.kv("seq", T), j.kv("accum", K), j.kv("precision", dtype_name(dt));
      json_bytes(j, b, acts, true);
      j.kv("ulysses_activations", ulysses_activation_bytes(cfg, B, T, S, dt));
      j.kv("p2p_elems_forward_per_block", fwd), j.kv("p2p_elems_per_block", per_block);
      j.kv("p2p_elems_per_step", per_step);
      j.kv("model_state_elems_per_step", expected_comm_elems(Stage::Ulysses, L, K));
      j.end_object();
      printf("%s\n", j.str().c_str());
      return;
    }
    printf("ulysses --sp-mode ring: %d ranks in a ring x %d replicas (%d ranks), micro-batch %d x %d tokens (%d per "
           "rank, two zig-zag chunks), accum %d, %s\n", S, N / S, N, B, T, T / S, K, dtype_name(dt));
    printf("per rank: model states %llu bytes (stage3's over %d), activations %llu bytes (ulysses: %llu)\n",
           (unsigned long long)b.total(), N, (unsigned long long)acts,
           (unsigned long long)ulysses_activation_bytes(cfg, B, T, S, dt));
    printf("ring: 2 B (T/S) C (S-1) = %llu elements per block forward, %llu forward + backward, per micro-step and "
           "rank (%s), %llu per step; model states: stage3's %llu\n", (unsigned long long)fwd,
           (unsigned long long)per_block, fmt_bytes(double(per_block * dtype_bytes(dt))).c_str(),
           (unsigned long long)per_step, (unsigned long long)expected_comm_elems(Stage::Ulysses, L, K));
    return;
  }
  const uint64_t acts = ulysses_activation_bytes(cfg, B, T, S, dt);
  const uint64_t stage3_acts = expected_activation_bytes(cfg, B, T, dt, false, Attention::Gemm);
  const uint64_t per_block = ulysses_all_to_all_elems_per_block(cfg, B, T, S);
  const uint64_t per_step = ulysses_all_to_all_elems(cfg, B, T, S, K);
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.kv("sp", S), j.kv("replicas", N / S), j.kv("world", N), j.kv("batch", B), j.kv("seq", T);
    j.kv("accum", K), j.kv("precision", dtype_name(dt));
    json_bytes(j, b, acts, true);
    j.kv("stage3_activations", stage3_acts);
    j.kv("scores_per_block", ulysses_scores_bytes(cfg, B, T, S, dt));
    j.kv("all_to_all_elems_per_block", per_block), j.kv("all_to_all_elems_per_step", per_step);
    j.kv("model_state_elems_per_step", expected_comm_elems(Stage::Ulysses, L, K));
    j.end_object();
    printf("%s\n", j.str().c_str());
    return;
  }
  printf("ulysses: %d sequence slices x %d replicas (%d ranks), micro-batch %d x %d tokens (%d per rank), "
         "accum %d, %s\n", S, N / S, N, B, T, T / S, K, dtype_name(dt));
  printf("%-9s %12s %12s %12s %12s %12s %12s %12s %12s %14s\n", "", "params", "grads", "master", "adam_m",
         "adam_v", "comm_buffers", "gathered", "activations", "total");
  printf("%-9s %12llu %12llu %12llu %12llu %12llu %12llu %12llu %12llu %14llu\n", "per rank",
         (unsigned long long)b.params, (unsigned long long)b.grads, (unsigned long long)b.master,
         (unsigned long long)b.adam_m, (unsigned long long)b.adam_v, (unsigned long long)b.comm_buffers,
         (unsigned long long)b.gathered_peak, (unsigned long long)acts, (unsigned long long)(b.total() + acts));
  printf("activations: %s per rank against stage3's %s (attention's probabilities %s per block: all %d tokens, "
         "%d of the %d heads)\n", fmt_bytes(double(acts)).c_str(), fmt_bytes(double(stage3_acts)).c_str(),
         fmt_bytes(double(ulysses_scores_bytes(cfg, B, T, S, dt))).c_str(), T, cfg.heads / S, cfg.heads);
  printf("all-to-all: 8 B (T/S) C (S-1)/S = %llu elements per block and micro-step per rank (%s), %llu per step; "
         "model states: stage3's %llu\n", (unsigned long long)per_block,
         fmt_bytes(double(per_block * dtype_bytes(dt))).c_str(), (unsigned long long)per_step,
         (unsigned long long)expected_comm_elems(Stage::Ulysses, L, K));
}

// ---- --sp S --fit SIZE: the longest sequence a device holds, stage3 alone against Ulysses and ring at S ----
// Per rank: stage3's model states over N ranks (the model's wpe grown to the sequence: learned positions)
// plus the activations, with and without activation checkpointing (ulysses/formulas.h,
// ulysses_longest_seq; checkpointing is a formula there, not built for the rung). Ulysses needs S to
// divide the heads: otherwise its rows say so, and the ring's still stand.
constexpr int kFitMaxSeq = 1 << 20;  // 1M tokens: the search's bound, the longest --seq takes

void print_ulysses_fit(const GPTConfig& cfg, const std::string& preset, int N, int S, int B, DType dt,
                       uint64_t budget, bool json) {
  struct Row { const char* name; bool ckpt, ring, stage3, possible; SeqFit f; };
  std::vector<Row> rows;
  for (const bool ckpt : {false, true}) {
    rows.push_back({"stage3", ckpt, false, true, true, {}});
    rows.push_back({"ulysses", ckpt, false, false, cfg.heads % S == 0, {}});
    rows.push_back({"ring", ckpt, true, false, true, {}});
  }
  for (Row& r : rows)
    if (r.possible) r.f = ulysses_longest_seq(cfg, N, S, B, dt, budget, r.ckpt, r.ring, r.stage3, kFitMaxSeq);
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.kv("sp", S), j.kv("world", N), j.kv("replicas", N / S), j.kv("batch", B), j.kv("precision", dtype_name(dt));
    j.kv("heads", cfg.heads), j.kv("budget", budget), j.kv("max_seq", kFitMaxSeq);
    j.key("fit");
    j.begin_object();
    for (const Row& r : rows) {
      j.key(std::string(r.name) + (r.ckpt ? "_checkpointing" : ""));
      if (!r.possible) {
        j.raw("null");
        continue;
      }
      j.begin_object();
      j.kv("seq", r.f.seq), j.kv("state", r.f.state), j.kv("activations", r.f.activations);
      j.end_object();
    }
    j.end_object();
    j.end_object();
    printf("%s\n", j.str().c_str());
    return;
  }
  printf("the longest sequence per rank in %s (%s): preset %s, %d ranks, S = %d, micro-batch %d, %s\n",
         fmt_bytes(double(budget)).c_str(), "model states + activations", preset.c_str(), N, S, B, dtype_name(dt));
  printf("%-30s %10s %14s %14s\n", "", "longest T", "model states", "activations");
  for (const Row& r : rows) {
    const std::string name = std::string(r.name) + (r.stage3 ? " alone" : ", S = " + std::to_string(S)) +
                             (r.ckpt ? ", checkpointing" : "");
    if (!r.possible)
      printf("%-30s not possible: %d heads do not split over S = %d\n", name.c_str(), cfg.heads, S);
    else if (r.f.seq == 0)
      printf("%-30s %10s   (the model states and T = %d do not fit)\n", name.c_str(), "none",
             r.stage3 ? 1 : r.ring ? 2 * S : S);
    else
      printf("%-30s %10d %14s %14s%s\n", name.c_str(), r.f.seq, fmt_bytes(double(r.f.state)).c_str(),
             fmt_bytes(double(r.f.activations)).c_str(), r.f.seq == kFitMaxSeq ? "  (the search's bound)" : "");
  }
  printf("T: a multiple of S (ring: of 2S); wpe grows to T rows (learned positions); checkpointing keeps each "
         "block's input and one block's internals (a formula: ulysses does not build it)\n");
}

// --zeropp G: per world size, stage3 and ZeRO++'s three techniques, alone and together.
// --network INTRA,INTER (GB/s) and --compute-ms C: a time per step from the bytes, the simplest model
// that says when ZeRO++ pays: each rank sends its inside-node bytes at INTRA and its across-node bytes
// at INTER, one after the other, and nothing overlaps the compute C:
//     step = C + inside / INTRA + across / INTER
// It ignores latency (many small messages), the overlap of prefetched gathers with compute, links
// shared by the ranks of a node, the collectives' algorithms (rings, trees) and the time spent
// quantizing: an upper bound of the communication for large messages, not a prediction.
struct Network { double intra_gbs = 0, inter_gbs = 0, compute_ms = 0; };

void print_zeropp_table(const GPTConfig& cfg, const std::string& preset, const std::vector<int>& worlds, int G,
                        size_t qw_block, size_t qg_block, DType dt, int accum, bool json, const Network& net) {
  const bool timed = net.intra_gbs > 0;
  auto step_ms = [&](const ZeroppComm& c) {
    return net.compute_ms + 1e3 * (double(c.bytes - c.bytes_across) / (net.intra_gbs * 1e9) +
                                   double(c.bytes_across) / (net.inter_gbs * 1e9));
  };
  // qgZ in two hops (inside the node, then across: the paper's), and as one flat all-to-all (--qgz-flat)
  struct Row { const char* name; bool qwz, hpz, qgz, qgz_flat; };
  const Row rows[] = {{"stage3", false, false, false, false}, {"qwZ", true, false, false, false},
                      {"hpZ", false, true, false, false},     {"qgZ", false, false, true, false},
                      {"qgZ flat", false, false, true, true}, {"ZeRO++", true, true, true, false},
                      {"ZeRO++ flat qgZ", true, true, true, true}};
  JsonWriter j;
  if (json) {
    j.begin_object();
    j.kv("model", preset), j.kv("precision", dtype_name(dt)), j.kv("accum", accum), j.kv("node_size", G);
    j.kv("qw_block", uint64_t(qw_block)), j.kv("qg_block", uint64_t(qg_block));
    j.key("estimates");
    j.begin_array();
  }
  for (int N : worlds) {
    if (N % G != 0)
      user_error("--zeropp %d with --world %d: %d ranks do not make whole nodes of %d, expected a world that %d "
                 "divides", G, N, N, G, G);
    if (!json)
      printf("%s, %s, N = %d in nodes of %d, accum %d, blocks of %zu (int8) and %zu (int4): bytes per rank per step\n"
             "%-16s %14s %14s %14s %9s %14s%s\n", preset.c_str(), dtype_name(dt), N, G, accum, qw_block, qg_block,
             "", "sent", "inside node", "across nodes", "across/3", "state added", timed ? "   step ms" : "");
    uint64_t across3 = 0;
    for (const Row& r : rows) {
      const ZeroppConfig z{r.qwz, r.hpz ? G : 0, r.qgz, G, qw_block, qg_block, r.qgz_flat};
      const Layout L = make_layout(cfg, N, std::max<size_t>({1, r.qwz ? qw_block : 1, r.qgz ? qg_block : 1}));
      const ZeroppComm c = zeropp_comm_per_step(L, dt, z, accum);
      const uint64_t added = zeropp_state_bytes(L, dt, z).total() - expected_state_bytes(Stage::Z3, L, dt).total();
      if (!r.qwz && !r.hpz && !r.qgz) across3 = c.bytes_across;
      if (json) {
        j.begin_object();
        j.kv("world", N), j.kv("technique", r.name);
        j.kv("comm_bytes_per_step", c.bytes), j.kv("comm_bytes_across_nodes_per_step", c.bytes_across);
        j.kv("state_bytes_added", added);
        if (timed) j.kv("step_ms", step_ms(c));
        j.end_object();
      } else {
        printf("%-16s %14llu %14llu %14llu %9.3f %14llu", r.name, (unsigned long long)c.bytes,
               (unsigned long long)(c.bytes - c.bytes_across), (unsigned long long)c.bytes_across,
               across3 ? double(c.bytes_across) / double(across3) : 0.0, (unsigned long long)added);
        if (timed) printf(" %9.3f", step_ms(c));
        printf("\n");
      }
    }
    if (!json) printf("(qgZ in two hops: inside the node, then the node's sum across; flat: one all-to-all of all N "
                      "ranks, G times the bytes across. The paper: across nodes 3M -> 0.75M, 0.25 of stage3's, for "
                      "large blocks)%s\n\n",
                      timed ? "; step ms = compute + inside/INTRA + across/INTER, nothing overlapped" : "");
  }
  if (json) {
    j.end_array();
    j.end_object();
    printf("%s\n", j.str().c_str());
  }
}


// The columns both tensor tables end with (--tensor T, and with --pipeline P): a rank's bytes by category,
// its total and the elements it sends per step, after the columns that say which rank it is.
void print_tensor_columns_head() {
  printf(" %12s %12s %12s %12s %12s %12s %14s %14s\n", "params", "grads", "master", "adam_m", "adam_v", "activations",
         "total", "sent/step");
}
void print_tensor_columns(const StateBytes& b, uint64_t acts, const TensorComm& c) {
  printf(" %12llu %12llu %12llu %12llu %12llu %12llu %14llu %14llu\n", (unsigned long long)b.params,
         (unsigned long long)b.grads, (unsigned long long)b.master, (unsigned long long)b.adam_m,
         (unsigned long long)b.adam_v, (unsigned long long)acts, (unsigned long long)(b.total() + acts),
         (unsigned long long)c.total());
}

// --tensor T: per world size N = D x T, what one tensor rank of tensor/train.cpp holds and sends
// (tensor/formulas.h): its pieces' model state, its activations, the elements it sends per step.
void print_tensor_table(const GPTConfig& cfg, const std::string& preset, const std::vector<int>& worlds, int T,
                        int zero, bool sp, DType dt, int B, int S, int K, bool json) {
  if (cfg.heads % T != 0)
    user_error("--tensor %d: the %d heads do not split over %d ranks, expected a T that divides the heads", T,
               cfg.heads, T);
  if (sp && (T == 1 || S % T != 0))
    user_error("--sequence-parallel with --tensor %d and --seq %d: expected T > 1 dividing the sequence", T, S);
  JsonWriter j;
  if (json) {
    j.begin_object();
    j.kv("model", preset), j.kv("precision", dtype_name(dt)), j.kv("tensor", T), j.kv("zero", zero);
    j.kv("sequence_parallel", sp), j.kv("batch", B), j.kv("seq", S), j.kv("accum", K);
    j.key("estimates");
    j.begin_array();
  } else {
    printf("%s, %s, tensor parallel T = %d%s%s, micro-batch %d x %d, accum %d: per rank\n", preset.c_str(),
           dtype_name(dt), T, zero == 1 ? ", ZeRO-1 over the replicas" : "", sp ? ", sequence parallel" : "", B, S,
           K);
    printf("%-6s %4s", "N", "D");
    print_tensor_columns_head();
  }
  for (int N : worlds) {
    if (N % T != 0)
      user_error("--tensor %d with --world %d: T does not divide the ranks, expected N = D x T", T, N);
    const int D = N / T;
    const Layout L = tensor_layout(cfg, T, D);
    const StateBytes b = tensor_state_bytes(L, dt, zero);
    const uint64_t acts = tensor_activation_bytes(cfg, T, dt, B, S, sp);
    const TensorComm c = tensor_comm_elems(cfg, T, D, L, B, S, K, sp);
    if (json) {
      j.begin_object();
      j.kv("world", N), j.kv("replicas", D), j.kv("params_per_rank", uint64_t(L.num_params));
      json_bytes(j, b, acts, false);
      j.kv("total", b.total() + acts);
      j.kv("all_reduce_elems_per_step", c.all_reduce), j.kv("all_gather_elems_per_step", c.all_gather);
      j.kv("reduce_scatter_elems_per_step", c.reduce_scatter), j.kv("comm_elems_per_step", c.total());
      j.end_object();
    } else {
      printf("%-6d %4d", N, D);
      print_tensor_columns(b, acts, c);
    }
  }
  if (json) {
    j.end_array();
    j.end_object();
    printf("%s\n", j.str().c_str());
  } else {
    printf("(elements sent per step: %s over the tensor ranks, the pieces' all-reduce over the D replicas; "
           "docs/tensor.md)\n", sp ? "reduce-scatters and all-gathers of b s C" : "4 all-reduces of b s C per block");
  }
}

// --tensor T --pipeline P (3D, tensor/pipe3d.cpp): on N = P x D x T ranks, what one rank of each
// pipeline segment holds (tensor/formulas.h: its pieces of its segment's units, its activation slots).
void print_tensor3d_table(const GPTConfig& cfg, const std::string& preset, int N, int T, int P,
                          const std::string& schedule, const std::string& partition, int zero, bool sp, DType dt,
                          int B, int S, int K, bool json) {
  if (cfg.heads % T != 0)
    user_error("--tensor %d: the %d heads do not split over %d ranks, expected a T that divides the heads", T,
               cfg.heads, T);
  if (sp && (T == 1 || S % T != 0))
    user_error("--sequence-parallel with --tensor %d and --seq %d: expected T > 1 dividing the sequence", T, S);
  if (P > cfg.layers + 2)
    user_error("--pipeline %d: more segments than the model's %d units, expected at most %d", P, cfg.layers + 2,
               cfg.layers + 2);
  if (N % (T * P) != 0)
    user_error("--tensor %d --pipeline %d with --world %d: T x P does not divide the ranks, expected N = P x D x T, "
               "e.g. --world %d", T, P, N, T * P);
  const PipelinePlan plan = make_pipeline_plan(cfg, N / T, 0, P, schedule, partition, zero);
  const int D = plan.replicas;
  const Layout L = tensor_layout(cfg, T, D);
  JsonWriter j;
  if (json) {
    j.begin_object();
    j.kv("model", preset), j.kv("precision", dtype_name(dt)), j.kv("tensor", T), j.kv("pipeline", P);
    j.kv("replicas", D), j.kv("world", N), j.kv("zero", zero), j.kv("sequence_parallel", sp);
    j.kv("schedule", schedule_name(plan.schedule)), j.kv("batch", B), j.kv("seq", S), j.kv("accum", K);
    j.key("estimates");
    j.begin_array();
  } else {
    printf("%s, %s, 3D: T = %d x D = %d x P = %d (%d ranks; T fastest, then D, then P)%s%s, %s, %d micro-batches of "
           "%d x %d: per rank of each segment\n", preset.c_str(), dtype_name(dt), T, D, P, N,
           zero == 1 ? ", ZeRO-1 over the replicas" : "", sp ? ", sequence parallel" : "", schedule_name(plan.schedule),
           K, B, S);
    printf("%-8s %-7s %5s", "segment", "units", "slots");
    print_tensor_columns_head();
  }
  for (int s = 0; s < P; s++) {
    const int u0 = plan.first_unit[s], u1 = plan.first_unit[s + 1], slots = activation_slots(plan.schedule, P, s, K);
    const StateBytes b = tensor3d_state_bytes(L, dt, zero, u0, u1, s == P - 1);
    const uint64_t acts = tensor_activation_bytes(cfg, T, dt, B, S, sp, u0, u1, slots);
    const TensorComm c = tensor3d_comm_elems(cfg, T, D, L, B, S, K, sp, u0, u1, s == 0, s == P - 1);
    if (json) {
      j.begin_object();
      j.kv("segment", s), j.kv("first_unit", u0), j.kv("end_unit", u1), j.kv("slots", slots);
      j.kv("all_reduce_elems_per_step", c.all_reduce), j.kv("all_gather_elems_per_step", c.all_gather);
      j.kv("reduce_scatter_elems_per_step", c.reduce_scatter), j.kv("point_to_point_elems_per_step", c.point_to_point);
      j.kv("comm_elems_per_step", c.total());
      json_bytes(j, b, acts, false);
      j.kv("total", b.total() + acts);
      j.end_object();
    } else {
      printf("%-8d %-7s %5d", s, (std::to_string(u0) + ".." + std::to_string(u1 - 1)).c_str(), slots);
      print_tensor_columns(b, acts, c);
    }
  }
  if (json) {
    j.end_array();
    j.end_object();
    printf("%s\n", j.str().c_str());
  } else {
    printf("(the last segment also holds its copy of its tensor ranks' wte rows and their gradient: the tied LM head; "
           "elements sent per step by one rank: its segment's tensor collectives, the activations and the tied wte "
           "point to point, its pieces over the D replicas; docs/tensor.md)\n");
  }
}

// ---- DeepSpeed beside the ledger: its buffers (--config FILE) and its estimator (--deepspeed-estimator) ----
// DeepSpeed's buffers are its own, not this project's: nanoZeRO's bucket is one unit (eU) and stage3
// gathers at most two neighbouring units (2eU), whatever a config says. These are what DeepSpeed's
// knobs let it hold on a GPU for the same model, N and precision, so that a config's share of the
// memory can be read beside the ledger's. Defaults: DeepSpeed's zero_optimization config (runtime/zero/
// config.py); "auto": as the Hugging Face integration fills it in (hidden size C: reduce_bucket_size
// C^2, stage3_prefetch_bucket_size 0.9 C^2, stage3_param_persistence_threshold 10 C).
struct DsKnob {
  const char* key;
  double fallback;  // DeepSpeed's default when the key is absent
  const char* meaning;
};
const DsKnob kDsKnobs[] = {
    {"reduce_bucket_size", 5e8, "gradient elements reduced at a time: one bucket of them (stages 1-3)"},
    {"overlap_comm", 0, "reduce on a second stream: stages 1-2 keep a second bucket (default: true at stage 3)"},
    {"allgather_bucket_size", 5e8, "parameter elements stages 1-2 all-gather at a time after the step"},
    {"stage3_prefetch_bucket_size", 5e7, "parameter elements stage 3 gathers ahead of their use"},
    {"stage3_max_live_parameters", 1e9, "the most parameter elements stage 3 keeps gathered at once"},
    {"stage3_max_reuse_distance", 1e9, "a gathered parameter used again this soon stays (within max_live)"},
    {"stage3_param_persistence_threshold", 1e5, "tensors smaller than this stay whole on every rank (stage 3)"},
    {"sub_group_size", 1e9, "elements stage 3's optimizer steps at a time: their fp32 gradient lives then"},
};

struct DsBuffer {
  std::string key, value, from, meaning;
  uint64_t bytes = 0;
};

// DeepSpeed's ZeRO stage for a rung of this ladder.
int ds_stage(Stage s) {
  return s == Stage::DDP ? 0 : s == Stage::Z1 ? 1 : s == Stage::Z2 || s == Stage::Offload ? 2 : 3;
}

// The elements of the model's tensors smaller than `threshold` (DeepSpeed keeps them whole).
uint64_t persistent_elems(const Layout& L, double threshold) {
  uint64_t n = 0;
  for (const Unit& u : L.units)
    for (const TensorSpec& t : u.tensors)
      if (double(t.numel) < threshold) n += t.numel;
  return n;
}

// What each knob of `knobs` (zero_optimization's, as written) may hold on one GPU at `stage`
// (DeepSpeed's stage of the rung: 1, 2, 3) for layout L (raw: no tensors, no hidden size) in dtype dt.
std::vector<DsBuffer> ds_buffers(const std::map<std::string, std::string>& knobs, Stage rung, const Layout& L,
                                 const GPTConfig& cfg, bool raw, DType dt, const std::string& path) {
  const int stage = ds_stage(rung);
  const bool host_optimizer = rung == Stage::Offload || rung == Stage::Infinity;  // its optimizer steps on the host
  const uint64_t e = dtype_bytes(dt), psi = L.num_params, S = L.shard_total;
  const double C = raw ? 0 : double(cfg.dim);
  std::vector<DsBuffer> out;
  bool overlap = stage == 3;  // DeepSpeed's default: on at stage 3, off below
  double reduce = 0;
  for (const DsKnob& k : kDsKnobs) {
    DsBuffer b{k.key, "", "default", k.meaning};
    auto it = knobs.find(k.key);
    double v = k.fallback;
    if (std::string(k.key) == "overlap_comm") {
      if (it != knobs.end()) overlap = it->second == "true", b.from = "file";
      b.value = overlap ? "true" : "false";
      // stages 1-2 double-buffer the reduction bucket when they overlap it with the backward
      b.bytes = overlap && stage < 3 ? uint64_t(reduce) * e : 0;
      out.push_back(b);
      continue;
    }
    if (it != knobs.end() && it->second != "null") {
      if (it->second == "auto") {
        const std::string key = k.key;
        double filled = key == "reduce_bucket_size"                              ? C * C
                        : key == "stage3_prefetch_bucket_size" && stage == 3        ? std::floor(0.9 * C * C)
                        : key == "stage3_param_persistence_threshold" && stage == 3 ? 10 * C
                                                                                    : -1;
        if (filled < 0)
          user_error("--config %s: zero_optimization.%s: \"auto\", which the Hugging Face integration fills in for "
                     "reduce_bucket_size only (and at stage 3 for stage3_prefetch_bucket_size and "
                     "stage3_param_persistence_threshold), expected a number; write one", path.c_str(), k.key);
        if (raw)
          user_error("--config %s: zero_optimization.%s: \"auto\" is filled from the hidden size, and --params has "
                     "none, expected a model shape; use --preset (and --dim), or write a number", path.c_str(), k.key);
        v = filled, b.from = key == "reduce_bucket_size" ? "auto: C^2" : key == "stage3_prefetch_bucket_size"
                                                                           ? "auto: 0.9 C^2" : "auto: 10 C";
      } else {
        v = strtod(it->second.c_str(), nullptr), b.from = "file";  // checked >= 0 by read_ds_config
      }
    }
    char buf[32];
    snprintf(buf, sizeof buf, "%.0f", v);
    b.value = buf;
    const std::string key = k.key;
    const uint64_t n = uint64_t(v);
    if (key == "reduce_bucket_size") reduce = v, b.bytes = stage >= 1 ? n * e : 0;
    else if (key == "allgather_bucket_size") b.bytes = stage == 1 || stage == 2 ? std::min(n, psi) * e : 0;
    else if (key == "stage3_prefetch_bucket_size" || key == "stage3_max_live_parameters")
      b.bytes = stage == 3 ? std::min(n, psi) * e : 0;
    else if (key == "stage3_param_persistence_threshold") {
      if (stage == 3 && raw) b.meaning += " (--params: no tensors, not counted)";
      b.bytes = stage == 3 && !raw ? persistent_elems(L, v) * e : 0;
    } else if (key == "sub_group_size") {
      b.bytes = stage == 3 && !host_optimizer ? std::min(n, S) * 4 : 0;
      if (stage == 3 && host_optimizer) b.meaning += " (offloaded: on the host)";
    }
    out.push_back(b);
  }
  return out;
}

void print_ds_buffers(const std::vector<DsBuffer>& bufs, const std::string& path, const std::string& binary,
                      int stage, const Estimate& e, DType dt) {
  uint64_t sum = 0;
  for (const DsBuffer& b : bufs) sum += b.bytes;
  printf("\nDeepSpeed's buffers for --config %s (ZeRO stage %d, %s, N = %d): what each knob may hold on a GPU,\n"
         "beside this project's ledger (which has its own, smaller ones)\n", path.c_str(), stage, dtype_name(dt),
         e.L.world);
  printf("%-36s %12s %-14s %12s  %s\n", "zero_optimization.", "value", "from", "bytes", "meaning");
  for (const DsBuffer& b : bufs)
    printf("%-36s %12s %-14s %12llu  %s\n", b.key.c_str(), b.value.c_str(), b.from.c_str(),
           (unsigned long long)b.bytes, b.meaning.c_str());
  printf("%-36s %12s %-14s %12llu  %s\n", "= DeepSpeed's buffers", "", "", (unsigned long long)sum,
         fmt_bytes(double(sum)).c_str());
  printf("%-36s %12s %-14s %12llu  %s\n", ("nanoZeRO's own (" + binary + ")").c_str(), "", "",
         (unsigned long long)(e.b.comm_buffers + e.b.gathered_peak),
         "comm_buffers (one unit, eU) + gathered (two units at most, stage3)");
}

// DeepSpeed's estimator, restated (deepspeedai/DeepSpeed at 02aa38c: runtime/zero/stage_1_and_2.py,
// estimate_zero2_model_states_mem_needs; runtime/zero/stage3.py, estimate_zero3_model_states_mem_needs),
// Ψ parameters, LL the largest layer's (the module with the most parameters of its own), T = all GPUs,
// g = GPUs per node, n = nodes, f = additional_buffer_factor (1.5). Bytes per GPU and per node's host:
//   ZeRO-2, no offload:        GPU 2Ψ + 18Ψ/T (its comment: 2 bf16 grads + 4 fp32 grads + 4 fp32 params
//                              + 8 Adam; earlier releases: 4Ψ + 16Ψ/T)      CPU 4Ψ g f
//   ZeRO-2, optimizer on cpu:  GPU 2Ψ                                      CPU Ψ max(4T, 16) f
//   ZeRO-3, nothing offloaded: GPU 4LL + 18Ψ/T     CPU 4LL g f (zero_init), 4Ψ g f (without)
//   ZeRO-3, optimizer on cpu:  GPU 4LL + 2Ψ/T      CPU 16Ψ f/n (zero_init), Ψ max(4g, 16/n) f (without)
//   ZeRO-3, params and optimizer on cpu: GPU 4LL   CPU 18Ψ f/n (zero_init), Ψ max(4g, 18/n) f (without)
// (Python's int() truncates each product; so does this.) DeepSpeed prints bytes / 2^30 and calls it GB.
struct DsEstimate {
  const char* name;
  double gpu, cpu;
};
std::vector<DsEstimate> deepspeed_estimates(double psi, double LL, int total, int per_node, double f = 1.5) {
  const double T = total, g = per_node, n = double(total / per_node);
  auto i = [](double x) { return std::trunc(x); };
  return {
      {"ZeRO-2 offload_optimizer=none", i(2 * psi + i(18 * psi / T)), i(psi * 4 * g * f)},
      {"ZeRO-2 offload_optimizer=cpu", i(2 * psi), i(psi * std::max(4 * T, 16.0) * f)},
      {"ZeRO-3 none, zero_init=1", i(4 * LL + i(18 * psi / T)), i(LL * 4 * g * f)},
      {"ZeRO-3 none, zero_init=0", i(4 * LL + i(18 * psi / T)), i(psi * 4 * g * f)},
      {"ZeRO-3 optimizer=cpu, zero_init=1", i(4 * LL + i(2 * psi / T)), i(psi * 16 / n * f)},
      {"ZeRO-3 optimizer=cpu, zero_init=0", i(4 * LL + i(2 * psi / T)), i(psi * std::max(4 * g, 16 / n) * f)},
      {"ZeRO-3 param+optimizer=cpu, zero_init=1", i(4 * LL), i(psi * 18 / n * f)},
      {"ZeRO-3 param+optimizer=cpu, zero_init=0", i(4 * LL), i(psi * std::max(4 * g, 18 / n) * f)},
  };
}

// DeepSpeed's largest layer for this model: the module with the most parameters of its own, wte
// (V C), wpe (ctx C), or the MLP's fc (4C^2 + 4C, weight and bias).
uint64_t largest_module(const GPTConfig& c) {
  const uint64_t C = c.dim;
  return std::max({uint64_t(c.vocab) * C, uint64_t(c.ctx) * C, 4 * C * C + 4 * C});
}

void print_deepspeed_estimator(const std::vector<int>& worlds, int per_node_arg, const GPTConfig& cfg, bool raw,
                               uint64_t raw_psi, uint64_t largest_arg, DType dt) {
  for (int N : worlds) {
    const int g = per_node_arg > 0 ? per_node_arg : std::min(N, 8);
    if (N % g != 0)
      user_error("--gpus-per-node %d with --world %d: %d ranks do not make whole nodes of %d, expected a world "
                 "that %d divides", g, N, N, g, g);
    const Layout L = raw ? paper_layout(raw_psi, N) : make_layout(cfg, N);
    const double psi = double(L.num_params);
    const uint64_t LL = raw ? largest_arg : largest_module(cfg);
    const std::vector<DsEstimate> ds = deepspeed_estimates(psi, double(LL), N, g);
    // the ledger's rung for each case: model states on the device per rank, on the host per node
    const Estimate z2 = estimate(Stage::Z2, L, dt, raw, 0, 1), off = estimate(Stage::Offload, L, dt, raw, 0, 1);
    const Estimate z3 = estimate(Stage::Z3, L, dt, raw, 0, 1), inf = estimate(Stage::Infinity, L, dt, raw, 0, 1);
    const Estimate* rung[] = {&z2, &off, &z3, &z3, nullptr, nullptr, &inf, &inf};
    printf("DeepSpeed's estimator beside the ledger: Ψ = %llu, largest layer LL = %llu%s, N = %d = %d node%s x %d GPUs, "
           "%s\n", (unsigned long long)L.num_params, (unsigned long long)LL,
           raw ? (largest_arg ? " (--largest-layer)" : " (--params: give --largest-layer)") : " (wte, wpe or fc)", N,
           N / g, N / g == 1 ? "" : "s", g, dtype_name(dt));
    printf("GB = 1e9 bytes (DeepSpeed prints bytes / 2^30 as GB); model states only, activations apart\n");
    printf("%-40s %10s %10s | %-9s %10s %10s | %s\n", "DeepSpeed case", "GPU/rank", "CPU/node", "rung", "device",
           "host/node", "device - DeepSpeed's GPU");
    for (size_t c = 0; c < ds.size(); c++) {
      printf("%-40s %10.2f %10.2f | ", ds[c].name, ds[c].gpu / 1e9, ds[c].cpu / 1e9);
      if (!rung[c]) {
        printf("%-9s %10s %10s | (no rung: nanoZeRO offloads stage3's optimizer only with its parameters)\n", "-",
               "-", "-");
        continue;
      }
      const Estimate& r = *rung[c];
      const double device = double(r.device), host = double(r.host) * g;
      printf("%-9s %10.2f %10.2f | %+.2f GB", stage_name(r.stage), device / 1e9, host / 1e9, (device - ds[c].gpu) / 1e9);
      if (device > 0) printf(" (DeepSpeed's = %.3f x the ledger's)", ds[c].gpu / device);
      printf("\n");
    }
    const double S = double(L.shard_total), e = double(dtype_bytes(dt)), U = double(L.max_unit_padded);
    printf("Differences, named (S = Ψ/N = %.0f, e = %.0f, the ledger's largest unit U = %.0f):\n", S, e, U);
    printf("  ZeRO-2 GPU: DeepSpeed 2Ψ + 18Ψ/N, the ledger eΨ + (e + 12)S + eU: DeepSpeed adds an fp32 copy of\n"
           "    the gradient slice (4S = %.2f GB) and counts 2-byte parameters whatever the precision; the ledger adds\n"
           "    its bucket eU (%.2f GB).\n", 4 * S / 1e9, e * U / 1e9);
    printf("  ZeRO-3 GPU: DeepSpeed 4LL + 18Ψ/N against the ledger's (2e + 12)S + 3eU: 18 per parameter against 16\n"
           "    (2S = %.2f GB), and the largest layer at 4 bytes (%.2f GB) against two gathered units and a bucket\n"
           "    (3eU = %.2f GB).\n", 2 * S / 1e9, 4 * double(LL) / 1e9, 3 * e * U / 1e9);
    printf("  CPU: DeepSpeed's figures are load-time peaks, not the steady state: without zero_init every process\n"
           "    holds the whole model in fp32 (4Ψ per GPU of the node), with offload ZeRO-2 max(4N, 16)Ψ, all times\n"
           "    the buffer factor 1.5; the ledger's host column is what the offload rungs hold while training.\n\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "small", precision = "fp32", stage_arg = "all", attention = "gemm";
  uint64_t raw_psi = 0;
  int layers = -1, dim = -1, heads = -1, batch = 4, seq = -1;  // seq: 64, or the context if shorter
  int accum = 1;                                                // micro-steps per optimizer step
  std::vector<int> worlds = {1};
  bool json = false, paper = false, have_preset = false, quiz = false, key = false, checkpointing = false;
  uint64_t fit_budget = 0;  // --fit SIZE
  int vocab = -1, quiz_count = 10;
  uint64_t quiz_seed = 1;
  std::string check_file;
  bool explain = false, result = false;  // with --check: worked answers under wrong ones; the result line
  CourseQuiz course;                     // a course's quiz: --student, --course-pub, --signing-key, --sign
  std::string verify_line, course_keys;
  bool verify = false, seed_given = false;
  int pipeline = 0;  // --pipeline P: the pipeline's per-segment table
  int sp = 0;        // --sp S: ulysses' table
  std::string sp_mode = "ulysses";  // --sp-mode ring: ring attention's instead
  int ctx = -1;      // --ctx N: the context (wpe's rows), as the trainers' --ctx
  int zero = 0;      // --zero 1 with --pipeline: ZeRO-1 inside each segment's replicas
  int zeropp_node = 0;  // --zeropp G: stage3 against ZeRO++ on nodes of G ranks
  int tensor = 0;       // --tensor T: a tensor rank's bytes and elements (tensor/formulas.h)
  bool sequence_parallel = false;
  long qw_block = 256, qg_block = 256;
  Network network;  // --network INTRA,INTER in GB/s, --compute-ms
  std::string schedule = "1f1b", partition;
  std::string ds_path;              // --config FILE: DeepSpeed's buffers for the file's stage
  bool ds_estimator = false;        // --deepspeed-estimator: DeepSpeed's formulas beside the ledger
  int gpus_per_node = 0;            // with it: GPUs per node (default min(N, 8))
  uint64_t largest_layer = 0;       // with it and --params: DeepSpeed's largest layer
  std::string optimizer = "adamw";  // --optimizer muon: Muon's cut matrices and bytes after the table
  std::map<std::string, std::string> typed;  // the flags given, which a config's "auto" and keys defer to
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i], v;
    if (a == "--help" || a == "-h") {
      print_usage();
      return 0;
    }
    if (a == "--json") { json = true; continue; }
    if (a == "--paper-table") { paper = true; continue; }
    if (a == "--quiz") { quiz = true; continue; }
    if (a == "--key") { key = true; continue; }
    if (a == "--offload") { stage_arg = "offload", typed["--stage"] = "offload"; continue; }
    if (a == "--activation-checkpointing") { checkpointing = true, typed[a] = ""; continue; }
    if (a == "--deepspeed-estimator") { ds_estimator = true; continue; }
    if (a == "--explain") { explain = true; continue; }
    if (a == "--result") { result = true; continue; }
    if (a == "--sequence-parallel") { sequence_parallel = true, typed[a] = ""; continue; }
    if (i + 1 >= argc) user_error("%s needs a value, or is unknown; see zero_estimate --help", a.c_str());
    v = argv[++i];
    typed[a] = v;
    if (a == "--preset") preset = v, have_preset = true;
    else if (a == "--params") raw_psi = parse_count(a, v);
    else if (a == "--layers") layers = parse_pos(a, v, 1000);
    else if (a == "--dim") dim = parse_pos(a, v, 1 << 16);
    else if (a == "--heads") heads = parse_pos(a, v, 1 << 12);
    else if (a == "--world") worlds = parse_worlds(a, v);
    else if (a == "--precision") precision = v;
    else if (a == "--stage") stage_arg = v;
    else if (a == "--batch") batch = parse_pos(a, v, 1 << 16);
    else if (a == "--seq") seq = parse_pos(a, v, 1 << 20);
    else if (a == "--accum") accum = parse_pos(a, v, 1 << 16);  // the trainers' limit too
    else if (a == "--vocab") vocab = parse_pos(a, v, 1 << 24);
    else if (a == "--seed") quiz_seed = uint64_t(parse_pos(a, v, 1 << 30)), seed_given = true;
    else if (a == "--count") quiz_count = parse_pos(a, v, 1000);
    else if (a == "--quiz-edition") course.edition = parse_pos(a, v, kQuizEditions);  // zero_quiz.h's editions
    else if (a == "--check") check_file = v;
    else if (a == "--verify") verify_line = v, verify = true;
    else if (a == "--student") course.student = v;
    else if (a == "--course-pub") course.course_pub = v;
    else if (a == "--signing-key") course.signing_key = v;
    else if (a == "--sign") course.sign_file = v;
    else if (a == "--course-keys") course_keys = v;
    else if (a == "--grade-seed") course.grade_seed_of = v;  // make grade's signed records (zero_quiz.h)
    else if (a == "--sign-grade") course.grade_line = v;
    else if (a == "--fit") fit_budget = parse_bytes(a, v);
    else if (a == "--attention") attention = v;
    else if (a == "--pipeline") pipeline = parse_pos(a, v, 1 << 16);
    else if (a == "--sp") sp = parse_pos(a, v, 1 << 16);
    else if (a == "--sp-mode") sp_mode = v;
    else if (a == "--ctx") ctx = parse_pos(a, v, 1 << 24);
    else if (a == "--schedule") schedule = v;
    else if (a == "--partition") partition = v;
    else if (a == "--zero") zero = v == "0" ? 0 : parse_pos(a, v, 3);  // 2, 3: refused by the plan
    else if (a == "--zeropp") zeropp_node = parse_pos(a, v, 1 << 20);
    else if (a == "--tensor") tensor = parse_pos(a, v, 1 << 16);
    else if (a == "--config") ds_path = v;
    else if (a == "--gpus-per-node") gpus_per_node = parse_pos(a, v, 1 << 20);
    else if (a == "--largest-layer") largest_layer = parse_count(a, v);
    else if (a == "--optimizer") {
      if (v != "adamw" && v != "muon")
        user_error("--optimizer %s: unknown optimizer, expected adamw or muon; e.g. --optimizer muon", v.c_str());
      optimizer = v;
    }
    else if (a == "--network") {
      char* end = nullptr;
      network.intra_gbs = strtod(v.c_str(), &end);
      network.inter_gbs = *end == ',' ? strtod(end + 1, &end) : 0;
      if (*end || !(network.intra_gbs > 0) || !(network.inter_gbs > 0) || network.intra_gbs > 1e6 ||
          network.inter_gbs > 1e6)
        user_error("--network %s: expected two bandwidths in GB/s, inside a node and across nodes, e.g. --network "
                   "300,25", v.c_str());
    } else if (a == "--compute-ms") {
      char* end = nullptr;
      network.compute_ms = strtod(v.c_str(), &end);
      if (v.empty() || *end || !(network.compute_ms >= 0) || network.compute_ms > 1e9)
        user_error("--compute-ms %s: expected the compute time of a step in milliseconds, >= 0, e.g. 120",
                   v.c_str());
    }
    else if (a == "--qw-block" || a == "--qg-block") {
      const long b = strtol(v.c_str(), nullptr, 10);
      if (!valid_quant_block(b))
        user_error("%s %s: values per scale, expected a power of two from 8 to 65536; e.g. %s 256", a.c_str(),
                   v.c_str(), a.c_str());
      (a == "--qw-block" ? qw_block : qg_block) = b;
    }
    else user_error("unknown flag %s; see zero_estimate --help for the list", a.c_str());
  }
  if (!course_keys.empty()) {
    make_course_keys(course_keys);
    return 0;
  }
  if (!course.grade_seed_of.empty() || !course.grade_line.empty()) return run_course_grade(course);
  if (course.edition && (verify || !quiz))
    user_error("--quiz-edition goes with --quiz (it prints or grades an old edition's quiz); --verify reads the "
               "edition from the line itself");
  if (verify) return verify_quiz_result(verify_line, course.course_pub) == 0 ? 0 : 1;
  if (paper) {
    print_paper_table();
    return 0;
  }
  if ((explain || result) && check_file.empty())
    user_error("%s goes with --quiz --check FILE (it adds to the grading); add them",
               explain ? "--explain" : "--result");
  if (!check_file.empty() && !quiz) user_error("--check grades a quiz: add --quiz (with the quiz's --seed and --count)");
  if (key && !quiz) user_error("--key prints a quiz's answer key: add --quiz (with the quiz's --seed and --count)");
  if (key && !check_file.empty()) user_error("--key and --check both given; expected one: --key prints the key, --check grades");
  const bool in_course = !course.student.empty() || !course.course_pub.empty() || !course.signing_key.empty() ||
                         !course.sign_file.empty();
  if (in_course && !quiz) user_error("--student, --course-pub, --signing-key and --sign go with --quiz; add --quiz");
  if (quiz && in_course) {
    course.check_file = check_file, course.key = key, course.explain = explain, course.result = result;
    course.seed_given = seed_given, course.count = quiz_count;
    return run_course_quiz(course);
  }
  if (quiz) {
    const int edition = course.edition ? course.edition : kQuizEdition;
    if (!check_file.empty())
      return check_quiz(quiz_seed, quiz_count, check_file, explain, result, edition) == 0 ? 0 : 1;
    if (key) {
      print_quiz_key(quiz_seed, quiz_count, edition);
      return 0;
    }
    // the questions only: the key is the instructor's (--key), never printed beside them
    const std::vector<QuizQuestion> q = make_quiz(quiz_seed, quiz_count, edition);
    const std::string flags = quiz_flags(quiz_seed, quiz_count, edition);
    printf("ZeRO quiz (%s): answer in each question's unit, one line each, e.g. `Q1 12.5`,\n"
           "then grade with: zero_estimate --quiz %s --check answers.txt\n\n", flags.c_str(), flags.c_str());
    for (size_t i = 0; i < q.size(); i++) printf("Q%zu. %s\n\n", i + 1, q[i].text.c_str());
    return 0;
  }

  // ---- --config FILE: a DeepSpeed config's stage, micro-batch, accumulation, precision and activation
  // checkpointing (a flag on the command line wins, as in the trainers), and its zero_optimization knobs,
  // counted below as DeepSpeed's buffers ----
  std::map<std::string, std::string> ds_knobs;
  if (!ds_path.empty()) {
#ifdef __EMSCRIPTEN__
    user_error("--config reads a file, and this page has none; run build/bin/zero_estimate --config FILE");
#else
    for (const char* other : {"--zeropp", "--pipeline", "--fit", "--sp"})
      if (typed.count(other))
        user_error("--config with %s: the config's buffers are counted for the ZeRO stages' table, expected one of "
                   "them; drop %s or --config", other, other);
    // "auto" takes the command line's value (zero_estimate's own defaults for batch, accum, precision);
    // the optimizer's and the learning-rate curve's keys change no byte here, so any value stands for them
    std::map<std::string, std::string> cl = {{"--batch", std::to_string(batch)}, {"--accum", std::to_string(accum)},
                                             {"--precision", precision}, {"--lr", "0"}, {"--weight-decay", "0"},
                                             {"--clip", "0"}, {"--warmup", "0"}, {"--warmup-min-lr", "0"},
                                             {"--pipeline", "1"}};
    const DsConfig ds = read_ds_config(ds_path, "", cl);
    if (ds.binary == "zeropp" || ds.binary == "pipeline" || ds.binary == "tensor" || ds.binary == "ulysses")
      user_error("--config %s: a config for build/bin/%s, expected one for the ZeRO stages (0-3, offload); use "
                 "zero_estimate %s for its table", ds_path.c_str(), ds.binary.c_str(),
                 ds.binary == "ulysses" ? "--sp S" : ("--" + ds.binary).c_str());
    for (const ConfigFlag& f : ds.flags) {
      if (typed.count(f.flag)) continue;  // the command line wins
      const std::string from = "--config " + ds_path + ": " + f.key;
      if (f.flag == "--batch") batch = parse_pos(from, f.value, 1 << 16);
      else if (f.flag == "--accum") accum = parse_pos(from, f.value, 1 << 16);
      else if (f.flag == "--precision") precision = f.value;
      else if (f.flag == "--activation-checkpointing") checkpointing = true;
    }
    if (!typed.count("--stage")) stage_arg = ds.binary;
    ds_knobs = ds.zero_knobs;
#endif
  }

  // ---- what to estimate ----
  const bool raw = raw_psi > 0;
  if (raw && fit_budget > 0)
    user_error("--fit needs a model shape (the activations grow with the batch); drop --params, use --preset");
  if (raw && (have_preset || layers > 0 || dim > 0 || heads > 0 || vocab > 0))
    user_error("--params gives a raw count; drop --preset/--layers/--dim/--heads/--vocab, or drop --params");
  GPTConfig cfg;
  if (!raw) {
    if (!preset_config(preset, &cfg))
      user_error("--preset %s: unknown preset; valid: %s", preset.c_str(), preset_names());
    if (layers > 0) cfg.layers = layers;
    if (dim > 0) cfg.dim = dim;
    if (heads > 0) cfg.heads = heads;
    if (ctx > 0) cfg.ctx = ctx;  // --ctx: a longer context (ulysses' long sequences)
    if (vocab > 0) cfg.vocab = vocab;
    if (cfg.dim % cfg.heads != 0)
      user_error("--heads %d: must divide the width %d (--dim); e.g. --heads %d", cfg.heads, cfg.dim,
                 cfg.dim % 4 == 0 ? 4 : 1);
    if (seq < 0) seq = std::min(64, cfg.ctx);
    if (seq > cfg.ctx)
      user_error("--seq %d: longer than the model's context %d (preset %s); use --seq %d or less", seq, cfg.ctx,
                 preset.c_str(), cfg.ctx);
  }
  if (attention != "gemm" && attention != "flash")
    user_error("--attention %s: unknown attention; valid: gemm, flash", attention.c_str());
  if (attention == "flash" && raw) user_error("--attention flash counts activations: drop --params, use --preset");
  if (attention == "flash" && !cuda::flash_attention_fits(cfg.dim, cfg.heads))
    user_error("--attention flash: head size %d (--dim %d / --heads %d) is above the flash kernels' %d, so a run "
               "falls back to gemm; use more --heads, or --attention gemm", cfg.dim / cfg.heads, cfg.dim, cfg.heads,
               cuda::kMaxFlashHeadSize);
  const Attention attn = attention == "flash" ? Attention::Flash : Attention::Gemm;
  DType dt;
  if (precision == "fp32") dt = DType::F32;
  else if (precision == "bf16") dt = DType::BF16;
  else if (precision == "fp16") dt = DType::F16;
  else user_error("--precision %s: unknown precision; valid: fp32, bf16, fp16", precision.c_str());
  if (zero > 0 && pipeline == 0 && tensor == 0)
    user_error("--zero %d: only with --pipeline P (the ZeRO stages are the table's columns without it); add --pipeline",
               zero);
  if ((gpus_per_node > 0 || largest_layer > 0) && !ds_estimator)
    user_error("%s goes with --deepspeed-estimator; add it", gpus_per_node > 0 ? "--gpus-per-node" : "--largest-layer");
  if (ds_estimator) {
    for (const char* other : {"--config", "--zeropp", "--pipeline", "--fit", "--stage", "--batch", "--seq", "--accum",
                              "--attention", "--activation-checkpointing", "--tensor", "--sequence-parallel", "--sp"})
      if (typed.count(other))
        user_error("--deepspeed-estimator with %s: DeepSpeed's estimator counts model states only, for every stage "
                   "and offload case at once, expected no %s; drop it", other, other);
    if (json) user_error("--deepspeed-estimator prints a table, expected no --json; drop --json");
    if (dt == DType::F32)
      user_error("--deepspeed-estimator with --precision fp32: DeepSpeed's estimator counts 16-bit training (2-byte "
                 "parameters and gradients, an fp32 master), expected bf16 or fp16; add --precision bf16");
    if (largest_layer > 0 && !raw)
      user_error("--largest-layer with a model shape: the model gives it (wte, wpe or fc), expected --params; drop "
                 "--largest-layer");
    print_deepspeed_estimator(worlds, gpus_per_node, cfg, raw, raw_psi, largest_layer, dt);
    return 0;
  }
  if (sequence_parallel && tensor == 0) user_error("--sequence-parallel goes with --tensor T; add --tensor");
  if (tensor > 0) {
    if (raw) user_error("--tensor needs a model shape (it splits the matrices); drop --params, use --preset");
    for (const char* other : {"--zeropp", "--fit", "--stage", "--config"})
      if (typed.count(other))
        user_error("--tensor with %s: two tables, expected one; drop one of them", other);
    if (zero > 1) user_error("--zero %d with --tensor: expected 0 or 1 (ZeRO-1 over the replicas)", zero);
    if (checkpointing)  // the tensor rung refuses it too: its table would count what no run holds
      user_error("--tensor with --activation-checkpointing: the tensor rung does not build checkpointing "
                 "(docs/tensor.md), expected no --activation-checkpointing; drop it");
    if (pipeline > 1) {  // 3D: one --world at a time (default T x P)
      if (worlds.size() > 1)
        user_error("--tensor %d --pipeline %d: one --world N at a time, expected N = P x D x T, e.g. --world %d", tensor,
                   pipeline, tensor * pipeline);
      print_tensor3d_table(cfg, preset, typed.count("--world") ? worlds[0] : tensor * pipeline, tensor, pipeline,
                           schedule, partition, zero, sequence_parallel, dt, batch, seq, accum, json);
      return 0;
    }
    print_tensor_table(cfg, preset, worlds, tensor, zero, sequence_parallel, dt, batch, seq, accum, json);
    return 0;
  }
  if (network.intra_gbs > 0 && zeropp_node == 0)
    user_error("--network prices ZeRO++'s bytes: add --zeropp G (the ranks per node)");
  if (zeropp_node > 0 && sp > 0)
    user_error("--zeropp with --sp: two tables, expected one; drop one of them");
  if (zeropp_node > 0) {
    if (raw) user_error("--zeropp needs a model shape (its blocks pad each unit); drop --params, use --preset");
    if (pipeline > 0)
      user_error("--zeropp with --pipeline: two tables, expected one; ZeRO++ shards the parameters like stage3, "
                 "which a pipeline does not take (docs/pipeline.md): drop one of them");
    if (fit_budget > 0)
      user_error("--fit with --zeropp: the fit is per stage of the ladder, expected one of them; drop --fit or "
                 "--zeropp");
    print_zeropp_table(cfg, preset, worlds, zeropp_node, size_t(qw_block), size_t(qg_block), dt, accum, json,
                       network);
    return 0;
  }
  if (sp == 0 && typed.count("--sp-mode"))
    user_error("--sp-mode without --sp: the mode of ulysses' table, expected --sp S with it; add --sp");
  if (sp > 0) {
    if (raw) user_error("--sp needs a model shape (its heads and layers); drop --params, use --preset");
    if (fit_budget > 0) {  // --sp S --fit SIZE: the longest sequence, every design (print_ulysses_fit)
      for (const char* other : {"--pipeline", "--stage", "--activation-checkpointing", "--attention", "--seq",
                                "--sp-mode"})
        if (typed.count(other))
          user_error("--sp with --fit and %s: the fit finds the sequence, for stage3, Ulysses and ring, with and "
                     "without checkpointing, expected no %s; drop it", other, other);
      if (worlds.size() != 1)
        user_error("--sp %d: one --world N at a time, expected N = S x replicas, e.g. --world %d", sp, sp);
      const int N = worlds[0] > 1 ? worlds[0] : sp;
      if (N % sp != 0)
        user_error("--sp %d with --world %d: S must divide N (whole sequence groups), expected e.g. --world %d", sp, N,
                   sp * std::max(1, N / sp));
      print_ulysses_fit(cfg, preset, N, sp, batch, dt, fit_budget, json);
      return 0;
    }
    for (const char* other : {"--pipeline", "--fit", "--stage", "--activation-checkpointing", "--attention"})
      if (typed.count(other))
        user_error("--sp with %s: ulysses' table is stage3 with gemm attention and no checkpointing, expected no "
                   "%s; drop it", other, other);
    if (worlds.size() != 1)
      user_error("--sp %d: one --world N at a time, expected N = S x replicas, e.g. --world %d", sp, sp);
    const int N = worlds[0] > 1 ? worlds[0] : sp;
    if (sp_mode != "ulysses" && sp_mode != "ring")
      user_error("--sp-mode %s: unknown sequence-parallel mode; valid: ulysses, ring", sp_mode.c_str());
    if (sp_mode == "ring" && (N % sp != 0 || seq % (2 * sp) != 0))
      user_error("--sp %d --sp-mode ring with --world %d and --seq %d: S must divide N and 2S the sequence, "
                 "expected e.g. --seq %d", sp, N, seq, 2 * sp * std::max(1, seq / (2 * sp)));
    if (sp_mode == "ring") {
      print_ulysses_table(cfg, N, sp, dt, batch, seq, accum, json, true);
      return 0;
    }
    if (N % sp != 0 || cfg.heads % sp != 0 || seq % sp != 0)
      user_error("--sp %d with --world %d, %d heads and --seq %d: S must divide each, expected e.g. --sp %d", sp, N,
                 cfg.heads, seq, cfg.heads % 2 == 0 && N % 2 == 0 && seq % 2 == 0 ? 2 : 1);
    print_ulysses_table(cfg, N, sp, dt, batch, seq, accum, json);
    return 0;
  }
  if (pipeline > 0) {
    if (raw) user_error("--pipeline needs a model shape (its segments are runs of units); drop --params, use --preset");
    if (worlds.size() != 1)
      user_error("--pipeline %d: one --world N at a time, expected N = P x D ranks, e.g. --world %d", pipeline, pipeline);
    print_pipeline_table(cfg, worlds[0] == 1 ? pipeline : worlds[0], pipeline, schedule, partition, zero, dt, batch,
                         seq, accum, checkpointing, attn, json);
    return 0;
  }
  if (optimizer == "muon" && (raw || !ds_path.empty()))
    user_error("--optimizer muon with %s: Muon's matrices need a model shape, expected --preset (or --layers, --dim) "
               "without --params or --config; drop %s", raw ? "--params" : "--config", raw ? "--params" : "--config");
  std::vector<Stage> stages;
  Stage one;
  if (stage_arg == "all") stages.assign(std::begin(kAllStages), std::end(kAllStages));
  else if (parse_stage(stage_arg, &one)) stages = {one};
  else user_error("--stage %s: unknown stage; valid: stage0_ddp, stage1, stage2, stage3, offload, infinity (or 0..3), "
                  "all", stage_arg.c_str());
  // activations: the same in every stage (zero_formulas.h), with and without checkpointing
  const uint64_t acts_plain = raw ? 0 : expected_activation_bytes(cfg, batch, seq, dt, false, attn);
  const uint64_t acts_ckpt = raw ? 0 : expected_activation_bytes(cfg, batch, seq, dt, true, attn);

  std::vector<Estimate> out;
  for (int N : worlds) {
    Layout L = raw ? paper_layout(raw_psi, N) : make_layout(cfg, N);
    for (Stage s : stages) {
      out.push_back(estimate(s, L, dt, raw, checkpointing ? acts_ckpt : acts_plain, accum, checkpointing));
      out.back().activations_plain = acts_plain;
      out.back().activations_ckpt = acts_ckpt;
      if (fit_budget > 0) {
        out.back().fit = largest_fitting_batch(s, L, seq, dt, false, fit_budget, 1 << 16, attn);
        out.back().fit_ckpt = largest_fitting_batch(s, L, seq, dt, true, fit_budget, 1 << 16, attn);
      }
    }
  }

  // --config: its knobs are resolved (and "auto" refused where nothing fills it) before anything prints
  for (const Estimate& e : out)
    if (!ds_path.empty()) ds_buffers(ds_knobs, e.stage, e.L, cfg, raw, dt, ds_path);

  // ---- JSON: exact bytes, one record per (world, stage) ----
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.kv("model", raw ? std::string("raw") : preset);
    j.kv("raw_params", raw);
    if (!raw) {
      j.key("config");
      j.begin_object();
      j.kv("vocab", cfg.vocab), j.kv("ctx", cfg.ctx), j.kv("layers", cfg.layers);
      j.kv("dim", cfg.dim), j.kv("heads", cfg.heads);
      j.end_object();
      j.kv("batch", batch), j.kv("seq", seq);  // of the activations
      j.kv("activation_checkpointing", checkpointing);  // which activations the totals count
      j.kv("attention", attention);                     // gemm: T x T probabilities; flash: lse
      j.kv("activations_plain", acts_plain);          // without checkpointing
      j.kv("activations_checkpointed", acts_ckpt);    // with it
    }
    j.kv("num_params", uint64_t(out.front().L.num_params));
    j.kv("precision", dtype_name(dt));
    j.kv("accum", accum);  // of comm_elems_per_step and link_elems_per_step
    j.key("estimates");
    j.begin_array();
    for (const Estimate& e : out) {
      j.begin_object();
      j.kv("stage", stage_name(e.stage));
      j.kv("world", e.L.world);
      j.kv("padded_params", uint64_t(e.L.padded_total));
      j.kv("shard_params", uint64_t(e.L.shard_total));
      j.kv("max_unit_padded", uint64_t(e.L.max_unit_padded));
      j.key("bytes");
      j.begin_object();
      for (Category c : kStateCats) j.kv(category_name(c), e.b.of(c));
      j.kv("activations", e.activations);
      j.end_object();
      j.key("location");
      j.begin_object();
      for (Category c : kStateCats) j.kv(category_name(c), location_name(location_of(e.stage, c)));
      j.kv("activations", "device");
      j.end_object();
      j.kv("model_state", e.b.total());
      j.kv("device", e.device);
      j.kv("host", e.host);
      j.kv("total", e.device + e.host);
      if (fit_budget > 0) {  // 0: not even a micro-batch of 1 fits
        j.kv("fit_batch", e.fit);
        j.kv("fit_batch_checkpointed", e.fit_ckpt);
      }
      if (!ds_path.empty()) {  // --config: DeepSpeed's buffers for this stage, by knob
        j.key("deepspeed_buffers");
        j.begin_object();
        for (const DsBuffer& b : ds_buffers(ds_knobs, e.stage, e.L, cfg, raw, dt, ds_path))
          j.kv(b.key, b.bytes);
        j.end_object();
      }
      j.kv("comm_elems_per_step", e.comm_elems);
      j.kv("link_elems_per_step", e.link_elems);
      j.end_object();
    }
    j.end_array();
    if (optimizer == "muon") {  // Muon's own, one object per N (muon_formulas.h)
      j.key("muon");
      j.begin_array();
      for (int N : worlds) j.raw(muon_estimate_json(make_layout(cfg, N), dt));
      j.end_array();
    }
    j.end_object();
    printf("%s\n", j.str().c_str());
    return 0;
  }

  // ---- the table a person reads ----
  if (raw)
    printf("raw parameter count Ψ = %llu, %s: model states only (no units: no buckets, gathered units,\n"
           "incoming unit gradients or activations); %s\n",
           (unsigned long long)raw_psi, dtype_name(dt),
           dt == DType::F32 ? "fp32: 4 + 4 + 8 = 16 bytes per parameter at stage0"
                            : "bf16 mixed: (2 + 2 + 12)Ψ, the paper's K = 12 (fp32 master, Adam m, v)");
  else
    printf("%s: %d layers, width %d, %d heads, context %d | Ψ = %llu parameters | %s | activations for batch %d x "
           "seq %d%s\n",
           preset.c_str(), cfg.layers, cfg.dim, cfg.heads, cfg.ctx, (unsigned long long)out.front().L.num_params,
           dtype_name(dt), batch,
           seq, attn == Attention::Flash ? ", flash attention (each block keeps the log-sum-exp, not the T x T)" : "");
  // One block per world size: a row per category, a column per stage.
  printf("per-rank bytes from common/zero_formulas.h (kB, MB, GB = 1e3, 1e6, 1e9 bytes); elements sent per\n"
         "optimizer step with --accum %d micro-step%s\n", accum, accum == 1 ? "" : "s");
  const size_t per_world = stages.size();
  for (size_t w = 0; w < out.size(); w += per_world) {
    const Estimate* row = &out[w];
    const Layout& L = row[0].L;
    if (raw)
      printf("\nN = %d rank%s: padded %llu, shard S = %llu per rank, no units\n", L.world, L.world == 1 ? "" : "s",
             (unsigned long long)L.padded_total, (unsigned long long)L.shard_total);
    else
      printf("\nN = %d rank%s: padded %llu, shard S = %llu per rank, largest unit %llu\n", L.world,
             L.world == 1 ? "" : "s", (unsigned long long)L.padded_total, (unsigned long long)L.shard_total,
             (unsigned long long)L.max_unit_padded);
    // pad to a width in characters, not bytes (Ψ is two bytes of UTF-8)
    auto padded = [](const std::string& s, size_t width, bool left) {
      size_t chars = 0;
      for (unsigned char ch : s) chars += (ch & 0xC0) != 0x80;
      std::string fill(chars < width ? width - chars : 0, ' ');
      return left ? s + fill : fill + s;
    };
    auto line = [&](const char* name, auto value_of) {
      printf("%s", padded(name, 14, true).c_str());
      for (size_t k = 0; k < per_world; k++) printf(" %s", padded(value_of(row[k]), 11, false).c_str());
      printf("\n");
    };
    auto bytes = [](uint64_t b) { return fmt_bytes(double(b)); };
    auto count = [](uint64_t n) {  // exact while it fits the column
      char buf[32];
      snprintf(buf, sizeof buf, n < 100000000000ull ? "%.0f" : "%.4g", double(n));
      return std::string(buf);
    };
    auto ratio = [](uint64_t n, uint64_t unit, const char* name) {
      char buf[32];
      if (unit == 0) return std::string("-");
      snprintf(buf, sizeof buf, "%.4g%s", double(n) / double(unit), name);
      return std::string(buf);
    };
    line("", [](const Estimate& e) { return std::string(stage_name(e.stage)); });
    for (Category c : kStateCats) line(category_name(c), [&](const Estimate& e) { return bytes(e.b.of(c)); });
    line("= model state", [&](const Estimate& e) { return bytes(e.b.total()); });
    line(checkpointing ? "activations" : "activations *", [&](const Estimate& e) { return bytes(e.activations_plain); });
    line(checkpointing ? "checkpointed *" : "  checkpointed", [&](const Estimate& e) { return bytes(e.activations_ckpt); });
    line("on the device", [&](const Estimate& e) { return bytes(e.device); });
    line("on the host", [&](const Estimate& e) { return bytes(e.host); });
    if (fit_budget > 0) {
      auto batch = [](int b) { return b == 0 ? std::string("none") : std::to_string(b); };
      line("fit: batch", [&](const Estimate& e) { return batch(e.fit); });
      line("  checkpointed", [&](const Estimate& e) { return batch(e.fit_ckpt); });
    }
    line("sent/step", [&](const Estimate& e) { return count(e.comm_elems); });
    line("  = (N-1)S x", [&](const Estimate& e) { return ratio(e.comm_elems, (L.world - 1) * L.shard_total, ""); });
    line("  = Ψ x", [&](const Estimate& e) { return ratio(e.comm_elems, L.num_params, ""); });
    line("host link/step", [&](const Estimate& e) { return count(e.link_elems); });
  }
  if (!raw)
    printf("\n* the activations in the totals (%s). checkpointed: --activation-checkpointing keeps each block's input\n"
           "and recomputes the block in its backward (L block inputs plus one block, instead of L blocks); the same\n"
           "elements are sent (stage3's recomputation uses the parameters its backward gathers).\n",
           checkpointing ? "with checkpointing" : "without checkpointing; --activation-checkpointing counts the other");
  if (fit_budget > 0)
    printf("\nfit: the largest micro-batch per rank (of --seq %d) whose device peak, model states on the device plus\n"
           "activations, fits %s (%llu bytes) per rank, without and with activation checkpointing (none: not even 1);\n"
           "what `--batch auto --memory-budget` picks in the trainers.\n",
           seq, fmt_bytes(double(fit_budget)).c_str(), (unsigned long long)fit_budget);
  for (const Estimate& e : out)
    if (e.stage == Stage::Offload || e.stage == Stage::Infinity) {
      printf("\non the host: offload's and infinity's states off the device, plus the buffer one unit's reduced\n"
             "gradient slice lands in before it is added (the largest unit's slice, eU/N), as the ledger counts it.\n");
      break;
    }
  if (!ds_path.empty())
    for (const Estimate& e : out)
      print_ds_buffers(ds_buffers(ds_knobs, e.stage, e.L, cfg, raw, dt, ds_path), ds_path,
                       stage_name(e.stage), ds_stage(e.stage), e, dt);
  printf("\nsent/step: elements each rank sends per optimizer step in the model-state collectives, with\n"
         "--accum K = %d micro-step%s. Stage0 and stage1 keep the full gradient, sum it locally over the micro-steps\n"
         "and reduce it once: 2(N-1)S whatever K. Stage2 and offload keep only their slice of it, so they\n"
         "reduce-scatter every micro-step, then all-gather once: (K+1)(N-1)S. Stage3 also gathers the\n"
         "parameters twice per micro-step: 3K(N-1)S, and so does infinity. host link/step: offload's K·S\n"
         "gradient elements down to the host and S parameters back up; infinity's K·S down and 2K·S up (my\n"
         "slice of each unit before each of its gathers).\n",
         accum, accum == 1 ? "" : "s");
  if (optimizer == "muon")
    for (int N : worlds) printf("\n%s", muon_estimate_text(make_layout(cfg, N), dt).c_str());
  return 0;
}
