// trainer.cpp — set-up, logging, validation, the model file and the reports shared by all stages.
#include "trainer.h"

#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "check.h"
#include "checkpoint.h"
#include "json.h"
#include "ops.h"
#ifdef NZ_HAVE_CUDA
#include "cuda/cuda_backend.h"  // set_matmul_impl
#endif

namespace nz {

// ---- throughput on GPUs: model FLOPs utilisation (MFU) = model FLOP/s achieved / peak FLOP/s ----
// FLOPs per token of one training step (forward + backward), as counted in the PaLM paper:
//  - each weight multiplies each token once in the forward (2 FLOPs: multiply, add) and twice in
//    the backward (input gradient, weight gradient): 6 FLOPs per parameter, 6Ψ. The LM head
//    reuses wte, so 6Ψ covers it; biases, norms and wpe are counted too (under 2% of Ψ).
//  - attention has no weights but two products per layer and token: scores q·K^T (C channels
//    against T keys: 2TC) and att·V (2TC); 4TC forward, twice that backward: 12TC per layer,
//    12LTC in all, counting the whole T x T (the causal half that is skipped too, by convention).
static double flops_per_token(const Args& a, size_t num_params) {
  return 6.0 * double(num_params) + 12.0 * a.cfg.layers * double(a.seq) * a.cfg.dim;
}

// Dense peak FLOP/s of the GPU for the run's precision, or 0 when unknown. bf16 runs its
// matmuls on tensor cores (bf16 in, fp32 accumulate); fp32 runs on the fp32 units (cuBLAS with
// CUBLAS_COMPUTE_32F, no TF32). NZ_PEAK_TFLOPS=<number> overrides (another GPU, clocks, sparsity).
static double peak_flops(DType dt) {
  if (const char* env = getenv("NZ_PEAK_TFLOPS")) {
    char* end = nullptr;
    double t = strtod(env, &end);
    if (end == env || *end != '\0' || !(t > 0))
      user_error("NZ_PEAK_TFLOPS=%s: not a positive number; set it to the GPU's peak in TFLOP/s "
                 "(e.g. 989 for an H100 in bf16) or unset it", env);
    return t * 1e12;
  }
  struct Peak { const char* name; double bf16, fp32; };  // TFLOP/s, dense, from the data sheets
  static const Peak peaks[] = {{"H100 PCIe", 756, 51}, {"H100 NVL", 835, 60}, {"H200 NVL", 835, 60},
                               {"H100", 989, 67},       {"H200", 989, 67},     {"A100", 312, 19.5}};
  const char* name = cuda_rt::device_name();
  for (const Peak& p : peaks)
    if (strstr(name, p.name)) return (dt == DType::BF16 ? p.bf16 : p.fp32) * 1e12;
  return 0;
}

// MFU at this many tokens per second (over all ranks): 0 on the CPU or when the peak is unknown.
static double mfu(const Trainer& t, double tokens_per_s) {
  if (current_device() != Device::CUDA) return 0;
  const double peak = peak_flops(t.dtype) * t.comm.gpus_in_use();  // ranks sharing a GPU share its peak
  return peak > 0 ? flops_per_token(t.args, t.layout.num_params) * tokens_per_s / peak : 0;
}

Trainer::Trainer(int argc, char** argv, Stage st)
    : comm(&argc, &argv), args(parse_args(argc, argv, stage_name(st))), stage(st) {
  // Threads per rank = cores / ranks on this machine, so 4 ranks on 2 cores do not fight.
  int cores = int(std::thread::hardware_concurrency());
  omp_set_num_threads(std::max(1, cores / comm.local_size()));
  // the data is read (and checked) before anything else happens, so bad data is one line
  data = std::make_unique<DataLoader>(args.data, args.batch, args.seq, args.seed);
  select_device(args.device.c_str(), comm.local_rank(), rank() == 0);
#ifdef NZ_HAVE_CUDA
  if (current_device() == Device::CUDA)
    cuda::set_matmul_impl(args.matmul == "tiled" ? cuda::MatmulImpl::Tiled : cuda::MatmulImpl::Cublas);
#endif
  comm.use_device_backend();  // NCCL when every rank has its own GPU; else MPI (comm.h)
  if (current_device() == Device::CUDA) peak_flops(args.dtype);  // checks NZ_PEAK_TFLOPS on every rank
  dtype = args.dtype;
  elem_bytes = dtype_bytes(dtype);
  layout = make_layout(args.cfg, world());
  Ledger::get().set_timeline_last_step(1);
  model = std::make_unique<GPT>(layout, dtype, args.batch, args.seq);
  tokens_.resize(size_t(args.batch) * args.seq);
  targets_.resize(tokens_.size());
  if (rank() == 0) {
    const GPTConfig& c = args.cfg;
    printf("%s | %d ranks | %s: %d layers, width %d, %d heads, context %d | %zu parameters (%zu padded, %zu per rank)\n",
           stage_name(stage), world(), args.preset.c_str(), c.layers, c.dim, c.heads, c.ctx,
           layout.num_params, layout.padded_total, layout.shard_total);
    printf("%s | %s | batch %d x seq %d x accum %d per rank | %d steps | %d threads per rank | data %s (%zu bytes)\n",
           dtype_name(dtype), current_device() == Device::CUDA ? "cuda" : "cpu", args.batch, args.seq,
           args.accum, args.steps, omp_get_max_threads(), args.data.c_str(),
           data->train_bytes() + data->val_bytes());
    if (current_device() == Device::CUDA) {
      char peak[64] = "an unknown peak (set NZ_PEAK_TFLOPS)";
      if (peak_flops(dtype) > 0) snprintf(peak, sizeof peak, "%.0f TFLOP/s per GPU", peak_flops(dtype) / 1e12);
      printf("cuda: %s, %d GPU%s for %d rank%s | collectives: %s | matmul: %s | MFU against %s\n",
             cuda_rt::device_name(), comm.gpus_in_use(), comm.gpus_in_use() == 1 ? "" : "s", world(),
             world() == 1 ? "" : "s",
             comm.uses_nccl() ? "NCCL (sums not rank-ordered)" : "MPI through pinned host memory (rank-ordered)",
             args.matmul.c_str(), peak);
    }
    fflush(stdout);
  }
  t_start_ = std::chrono::steady_clock::now();
}

Trainer::~Trainer() = default;

void Trainer::init_params(int u, Slice part, void* dst) {
  std::vector<float> unit(layout.units[u].padded);
  init_unit(layout, u, args.seed, unit.data());
  std::vector<char> conv(part.size() * elem_bytes);
  const float* src = unit.data() + part.begin;
  if (dtype == DType::F32) cpu::cast<float, float>((float*)conv.data(), src, part.size());
  else cpu::cast<bf16, float>((bf16*)conv.data(), src, part.size());
  copy_bytes(dst, Location::Device, conv.data(), Location::Host, conv.size());
}

void Trainer::load_micro_batch(int step, int k) {
  data->train_batch(step, k, args.accum, world(), rank(), tokens_.data(), targets_.data());
  model->set_batch(tokens_.data(), targets_.data(), args.batch);
}

void Trainer::begin_step(int step) {
  Ledger::get().set_step(step);
  phase("forward");
  device_sync();
  t_step_ = std::chrono::steady_clock::now();
  comm_at_step_start_ = comm.stats();
}

void Trainer::end_step(int step, double loss_sum, double grad_norm) {
  device_sync();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_step_).count();
  CommStats step_comm = comm.stats() - comm_at_step_start_;
  phase("log");
  double loss = loss_sum;
  comm.sum_scalars(&loss, 1);
  const double tokens = double(world()) * args.accum * args.batch * args.seq;
  loss /= tokens;
  double worst_ms = ms;  // the step is as slow as the slowest rank
  std::vector<double> all_ms = comm.gather_scalar(ms);
  for (double x : all_ms) worst_ms = std::max(worst_ms, x);
  std::vector<double> peaks = comm.gather_scalar(double(Ledger::get().peak_total(Location::Device)));
  StepRecord rec{step, loss, lr(step), grad_norm, worst_ms, tokens / (worst_ms / 1000.0), step_comm};
  steps_.push_back(rec);
  if (rank() == 0 && !args.quiet) {
    std::string peak_str;
    double max_peak = 0;
    for (double p : peaks) max_peak = std::max(max_peak, p);
    if (peaks.size() <= 4) {
      for (double p : peaks) peak_str += (peak_str.empty() ? "" : "/") + fmt_bytes(p);
    } else {
      peak_str = "max " + fmt_bytes(max_peak);
    }
    printf("step %5d/%d | loss %.6f | lr %.2e | norm %8.4f | %7.1f ms | %8.0f tok/s | peak device mem %s",
           step + 1, args.steps, loss, rec.lr, grad_norm, worst_ms, rec.tokens_per_s, peak_str.c_str());
    if (mfu(*this, rec.tokens_per_s) > 0) printf(" | MFU %.1f%%", 100 * mfu(*this, rec.tokens_per_s));  // GPUs only
    printf("\n");
    fflush(stdout);
  }
  if (args.eval_every > 0 && (step + 1) % args.eval_every == 0 && step + 1 < args.steps) {
    double v = evaluate();
    evals_.push_back({step + 1, v});
    if (rank() == 0 && !args.quiet) printf("step %5d | validation loss %.6f\n", step + 1, v);
  }
}

double Trainer::evaluate() {
  NZ_CHECK(params.acquire != nullptr, "the stage did not set Trainer::params");
  const char* saved_phase = "eval";
  phase(saved_phase);
  const int W = std::min(args.eval_windows, data->num_val_windows());
  const int N = world(), B = args.batch, T = args.seq;
  // Rank r takes windows r, r + N, r + 2N, ...; every rank runs the same number of batches
  // (stage3 gathers are collective), padding with a dummy window that is not counted.
  const int per_rank = (W + N - 1) / N;
  const int batches = (per_rank + B - 1) / B;
  double sum = 0;
  for (int bi = 0; bi < batches; bi++) {
    int b = 0;
    for (; b < B; b++) {
      int j = (bi * B + b) * N + rank();
      if (j >= W || bi * B + b >= per_rank) break;
      data->val_window(j, tokens_.data() + size_t(b) * T, targets_.data() + size_t(b) * T);
    }
    const int real = b;
    if (real == 0) data->val_window(0, tokens_.data(), targets_.data());
    model->set_batch(tokens_.data(), targets_.data(), std::max(real, 1));
    for (int u = 0; u < layout.num_units(); u++) {
      model->forward(u, params.acquire(u));
      params.release(u);
    }
    double s = model->head_forward(params.acquire(layout.embed_unit()));
    params.release(layout.embed_unit());
    if (real > 0) sum += s;
  }
  comm.sum_scalars(&sum, 1);
  return sum / (double(W) * T);
}

void Trainer::finish() {
  Ledger::get().set_step(args.steps);
  double v = evaluate();
  evals_.push_back({args.steps, v});
  last_val_loss_ = v;
  double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count();
  if (rank() == 0) {
    double ms = 0;
    int n = 0;
    for (size_t i = steps_.size() > 1 ? 1 : 0; i < steps_.size(); i++, n++) ms += steps_[i].ms;  // skip the first
    printf("done: %d steps in %.1f s | final train loss %.6f | validation loss %.6f (unigram baseline %.4f) | "
           "%.1f ms/step\n",
           args.steps, total_s, steps_.empty() ? 0.0 : steps_.back().loss, v, data->unigram_baseline(),
           n ? ms / n : 0.0);
    if (current_device() == Device::CUDA && n > 0) {
      const double tokens = double(world()) * args.accum * args.batch * args.seq, tok_s = tokens / (ms / n / 1000);
      char mfu_str[48] = "MFU ? (unknown GPU: set NZ_PEAK_TFLOPS)";
      if (mfu(*this, tok_s) > 0) snprintf(mfu_str, sizeof mfu_str, "MFU %.1f%%", 100 * mfu(*this, tok_s));
      printf("throughput: %.0f tokens/s | %s (%.3g FLOPs per token = 6 x %zu params + 12 x %d layers x %d seq x "
             "%d dim; %d GPU%s)\n",
             tok_s, mfu_str, flops_per_token(args, layout.num_params), layout.num_params, args.cfg.layers,
             args.seq, args.cfg.dim, comm.gpus_in_use(), comm.gpus_in_use() == 1 ? "" : "s");
    }
  }
  if (current_device() == Device::CUDA) {
    // The ledger against the GPU's own count: what cudaMemGetInfo says is in use, minus what the
    // ledger holds now, is what the ledger does not track (CUDA context, cuBLAS and NCCL
    // workspaces, the kernels' scratch, allocation rounding). Ranks sharing a GPU are summed.
    size_t free_bytes = 0, total_bytes = 0;
    cuda_rt::mem_get_info(&free_bytes, &total_bytes);
    const double used = double(total_bytes - free_bytes);
    const double now = comm.sum_on_my_gpu(double(Ledger::get().current_total(Location::Device)));
    const double peak = comm.sum_on_my_gpu(double(Ledger::get().peak_total(Location::Device)));
    if (rank() == 0)
      printf("GPU memory (rank 0's GPU, %d rank%s): ledger peak %s, now %s | in use %s (cudaMemGetInfo "
             "total - free) | not in the ledger %s (CUDA context, library workspaces, scratch, rounding)\n",
             comm.ranks_on_my_gpu(), comm.ranks_on_my_gpu() == 1 ? "" : "s", fmt_bytes(peak).c_str(),
             fmt_bytes(now).c_str(), fmt_bytes(used).c_str(), fmt_bytes(used - now).c_str());
  }
  if (!args.save_model.empty()) {
    phase("save");
    std::vector<float> all;
    for (int u = 0; u < layout.num_units(); u++) {
      const Unit& unit = layout.units[u];
      const void* p = params.acquire(u);
      if (rank() == 0) {
        std::vector<char> raw(unit.numel * elem_bytes);
        copy_bytes(raw.data(), Location::Host, p, Location::Device, raw.size());
        size_t at = all.size();
        all.resize(at + unit.numel);
        if (dtype == DType::F32) cpu::cast<float, float>(all.data() + at, (const float*)raw.data(), unit.numel);
        else cpu::cast<float, bf16>(all.data() + at, (const bf16*)raw.data(), unit.numel);
      }
      params.release(u);
    }
    if (rank() == 0) {
      save_model(args.save_model, args.cfg, all);
      printf("model written to %s (%zu parameters, fp32)\n", args.save_model.c_str(), all.size());
    }
  }
  print_memory_table();
  write_report();
  fflush(stdout);
}

// One line per rank of peak bytes by category, then the formula, then the verdict.
void Trainer::print_memory_table() {
  const Ledger& led = Ledger::get();
  std::ostringstream mine;
  for (int c = 0; c < kNumCategories; c++) mine << led.peak(Category(c)) << ' ';
  mine << led.peak_total(Location::Device) << ' ' << led.peak_total(Location::Host);
  std::string all = comm.gather_strings(mine.str(), "\n");
  if (rank() != 0) return;
  const StateBytes f = expected_state_bytes(stage, layout, dtype);
  const uint64_t acts = activation_bytes(args.cfg, args.batch, args.seq, dtype);
  const Category cols[] = {Category::Params, Category::Grads, Category::Master, Category::AdamM,
                           Category::AdamV, Category::Activations, Category::CommBuffers, Category::Gathered};
  printf("\nper-rank memory, peak bytes (%s, %d ranks, %s; formulas: zero_formulas.h)\n", stage_name(stage),
         world(), dtype_name(dtype));
  printf("%-9s", "");
  for (Category c : cols) printf(" %12s", category_name(c));
  printf(" %14s %14s\n", "device total", "host total");
  std::istringstream in(all);
  std::string line;
  bool all_match = true;
  int r = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    uint64_t v[kNumCategories + 2];
    for (uint64_t& x : v) ls >> x;
    printf("rank %-4d", r++);
    for (Category c : cols) printf(" %12llu", (unsigned long long)v[int(c)]);
    printf(" %14llu %14llu\n", (unsigned long long)v[kNumCategories], (unsigned long long)v[kNumCategories + 1]);
    for (Category c : cols) {
      uint64_t want = c == Category::Activations ? acts : f.of(c);
      if (c == Category::Gathered ? v[int(c)] > want : v[int(c)] != want) all_match = false;
    }
  }
  printf("%-9s", "formula");
  for (Category c : cols) printf(" %12llu", (unsigned long long)(c == Category::Activations ? acts : f.of(c)));
  printf("\nledger %s the formulas on every rank (model state %s per rank; Ψ = %zu, padded %zu, shard %zu)\n",
         all_match ? "matches" : "DOES NOT MATCH", fmt_bytes(double(f.total())).c_str(), layout.num_params,
         layout.padded_total, layout.shard_total);
}

void Trainer::write_report() {
  JsonWriter mine;
  mine.begin_object();
  mine.kv("rank", rank());
  mine.key("ledger");
  mine.raw(Ledger::get().to_json());
  mine.key("comm");
  mine.raw(comm.stats().to_json());
  mine.end_object();
  std::string ranks = comm.gather_strings(mine.str(), ",");
  if (rank() != 0 || args.log_json.empty()) return;

  JsonWriter j;
  j.begin_object();
  j.kv("stage", stage_name(stage));
  j.kv("world", world());
  j.kv("preset", args.preset);
  j.key("config");
  j.begin_object();
  j.kv("vocab", args.cfg.vocab);
  j.kv("ctx", args.cfg.ctx);
  j.kv("layers", args.cfg.layers);
  j.kv("dim", args.cfg.dim);
  j.kv("heads", args.cfg.heads);
  j.end_object();
  j.kv("precision", dtype_name(dtype));
  j.kv("device", current_device() == Device::CUDA ? "cuda" : "cpu");
  j.kv("collectives", comm.uses_nccl() ? "nccl" : "mpi");
  if (current_device() == Device::CUDA) {
    j.kv("gpu", std::string(cuda_rt::device_name()));
    j.kv("gpus", comm.gpus_in_use());
    j.kv("matmul", args.matmul);
    j.kv("flops_per_token", flops_per_token(args, layout.num_params));
    j.kv("peak_flops_per_gpu", peak_flops(dtype));
  }
  j.kv("batch", args.batch);
  j.kv("seq", args.seq);
  j.kv("accum", args.accum);
  j.kv("steps", args.steps);
  j.kv("num_params", uint64_t(layout.num_params));
  j.kv("padded_params", uint64_t(layout.padded_total));
  j.kv("shard_params", uint64_t(layout.shard_total));
  j.kv("max_unit_padded", uint64_t(layout.max_unit_padded));
  j.key("units");
  j.begin_array();
  for (const Unit& u : layout.units) {
    j.begin_object();
    j.kv("name", u.name);
    j.kv("numel", uint64_t(u.numel));
    j.kv("padded", uint64_t(u.padded));
    j.end_object();
  }
  j.end_array();
  const StateBytes f = expected_state_bytes(stage, layout, dtype);
  j.key("formula");
  j.begin_object();
  for (Category c : {Category::Params, Category::Grads, Category::Master, Category::AdamM, Category::AdamV,
                     Category::CommBuffers, Category::Gathered})
    j.kv(category_name(c), f.of(c));
  j.kv("activations", uint64_t(activation_bytes(args.cfg, args.batch, args.seq, dtype)));
  j.kv("host", f.host);
  j.kv("comm_elems_per_step", expected_comm_elems(stage, layout, args.accum));
  j.kv("link_elems_per_step", expected_link_elems(stage, layout, args.accum));
  j.end_object();
  j.key("steps_log");
  j.begin_array();
  for (const StepRecord& s : steps_) {
    j.begin_object();
    j.kv("step", s.step + 1);
    j.kv("loss", s.loss);
    j.kv("lr", s.lr);
    j.kv("grad_norm", s.grad_norm);
    j.kv("ms", s.ms);
    j.kv("tokens_per_s", s.tokens_per_s);
    if (mfu(*this, s.tokens_per_s) > 0) j.kv("mfu", mfu(*this, s.tokens_per_s));  // GPUs only
    j.kv("comm_elems", s.comm.model_elems_sent());
    j.kv("comm_bytes", s.comm.model_bytes_sent());
    j.kv("to_host_elems", s.comm.link.to_host_elems);
    j.kv("to_device_elems", s.comm.link.to_device_elems);
    j.end_object();
  }
  j.end_array();
  j.key("evals");
  j.begin_array();
  for (auto& [step, loss] : evals_) {
    j.begin_object();
    j.kv("step", step);
    j.kv("val_loss", loss);
    j.end_object();
  }
  j.end_array();
  j.kv("final_val_loss", last_val_loss_);
  j.kv("unigram_baseline", data->unigram_baseline());
  j.key("ranks");
  j.raw("[" + ranks + "]");
  j.end_object();

  std::string tmp = args.log_json + ".tmp";
  FILE* f2 = fopen(tmp.c_str(), "w");
  if (!f2) {
    fprintf(stderr, "warning: --log-json %s: cannot write; report not saved\n", args.log_json.c_str());
    return;
  }
  bool ok = fwrite(j.str().data(), 1, j.str().size(), f2) == j.str().size();
  ok = fclose(f2) == 0 && ok;
  if (!ok || rename(tmp.c_str(), args.log_json.c_str()) != 0) {
    remove(tmp.c_str());
    fprintf(stderr, "warning: --log-json %s: write failed; report not saved\n", args.log_json.c_str());
  }
}

}  // namespace nz
