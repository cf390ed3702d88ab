// trainer_setup.cpp — the Trainer's set-up: the flags checked, the batch settled, the model made.
// (trainer.h; the step protocol is trainer.cpp, the reports report.cpp)
#include "trainer.h"

#include <omp.h>
#include <unistd.h>      // sysconf: this machine's memory

#include <algorithm>     // std::max, std::min
#include <climits>       // INT_MAX
#include <cstdio>
#include <cstdlib>      // getenv: OMP_NUM_THREADS
#include <thread>

#include "runtime/check.h"       // NZ_CHECK
#include "io/checkpoint.h"        // save_checkpoint, find_resume_checkpoint, load_checkpoint
#include "kernels/gemm_bf16.h"    // bf16_gemm_path: which path CPU bf16 products take
#include "watchdog.h"            // Watchdog: a rank that stops making progress ends the job
#include "mfu.h"         // peak_flops, flops_per_token, recompute_flops_per_token
#include "kernels/ops.h"         // cpu::cast; set_kernels (kernels.h)

namespace nz {

namespace {

// A model (with its batch) that cannot fit this machine is one line before anything is allocated,
// not an allocation failure later: the formulas' bytes per rank (zero_formulas.h), times the ranks
// sharing the memory, against the memory there is (the GPU's, and the host's for state kept off it;
// on the CPU backend everything is in host memory). A necessary condition only: what the ledger
// does not count (libraries, scratch) comes on top.
// states: the model-state bytes per rank (the rung's, Trainer::state_bytes) of layout L.
void check_model_fits(const Args& args, Stage stage, const Comm& comm, const Layout& L, const StateBytes& states) {
  const Device device_kind = select_device(args.device.c_str(), comm.local_rank(), false);  // quietly: once more aloud later
  const Attention attn = flash_attention_in_force(args.cfg.dim, args.cfg.heads) ? Attention::Flash : Attention::Gemm;
  const double device = double(expected_device_peak(stage, L, args.batch, args.seq, args.dtype,
                                                    args.activation_checkpointing, attn, &states));
  // (the disk tier's files are not host memory: their room is checked when they are made)
  const Location tier = args.state_on_disk() ? Location::Disk : Location::Host;
  const double host = double(offload_state_bytes(stage, L, args.dtype, tier).host);
  const double ram = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  int sharing = comm.local_size();  // ranks sharing the memory that does not fit
  double need = (device + host) * sharing, have = ram;
  const char* where = "host memory";
  if (device_kind == Device::CUDA) {
    size_t free_bytes = 0, total_bytes = 0;
    cuda_rt::mem_get_info(&free_bytes, &total_bytes);
    const int gpus = cuda_rt::device_count();
    int on_gpu = 0;  // local ranks on my GPU (select_device: local rank l uses GPU l % gpus)
    for (int l = 0; l < comm.local_size(); l++) on_gpu += l % gpus == comm.local_rank() % gpus;
    if (device * on_gpu > double(total_bytes)) {
      sharing = on_gpu, need = device * on_gpu, have = double(total_bytes), where = "GPU memory";
    } else {
      need = host * comm.local_size();
    }
  }
  // every rank stops alike (the others would wait in the next collective), the first that cannot
  // fit saying why in one line
  const int mine = ram > 0 && need > have ? comm.rank() : INT_MAX;
  const int first = comm.control_min(mine);
  if (first == INT_MAX) return;
  if (comm.rank() == first)
    user_error_this_rank(
        "--preset %s with %d layers, width %d: %zu parameters and their batch need %s of %s (%s, %d rank%s sharing "
        "it; zero_formulas.h), expected at most the %s there is; use a smaller model (--layers, --dim), a smaller "
        "--batch or --seq, a later stage or more machines",
        args.preset.c_str(), args.cfg.layers, args.cfg.dim, L.num_params, fmt_bytes(need).c_str(), where,
        stage_name(stage), sharing, sharing == 1 ? "" : "s", fmt_bytes(have).c_str());
  comm.exit_quietly(2);
}

// ---- the command line into the core's config structs: the one place the core meets Args ----

LossScaleConfig loss_scale_config(const Args& a) {
  return {a.dtype == DType::F16, a.loss_scale, a.loss_scale_window, a.loss_scale_hysteresis,
          a.loss_scale_backoff, a.loss_scale_min};
}

LrScheduleConfig lr_schedule_config(const Args& a) {
  return {a.lr, a.warmup, a.steps, a.lr_schedule, a.warmup_min_lr, a.warmup_type, a.lr_total_steps};
}

CheckpointConfig checkpoint_config(const Args& a) {
  CheckpointConfig c;
  c.ckpt_dir = a.ckpt_dir;
  c.ckpt_keep = a.ckpt_keep;
  c.ckpt_overwrite = a.ckpt_overwrite;
  c.resume = a.resume;
  c.resume_changed = a.resume_changed;
  c.cfg = a.cfg;
  c.precision = a.precision;
  c.seed = a.seed;
  c.lr = a.lr, c.weight_decay = a.weight_decay, c.clip = a.clip;
  c.warmup = a.warmup, c.steps = a.steps, c.batch = a.batch, c.seq = a.seq, c.accum = a.accum;
  c.lr_schedule = lr_schedule_config(a);
  return c;  // (--qat's and --prune-mask's identities: Compression::read)
}

}  // namespace

void Trainer::configs_from_args() {
  adamw.weight_decay = args.weight_decay;  // betas and eps: AdamWConfig's (no flag sets them)
  lr_schedule = lr_schedule_config(args);
  checkpoint_ = std::make_unique<CheckpointConfig>(checkpoint_config(args));
}

Trainer::Trainer(int argc, char** argv, Stage st, TopologyOf topology_of, RungSetUp set_up)
    : comm(&argc, &argv), args(parse_args(argc, argv, stage_name(st))), stage(st),
      columns(rung_columns(stage_name(st))), compression(args), loss_scaler_(loss_scale_config(args)) {
  // where this rank stands: the rung's topology (one that cannot be made is one line there), or
  // every rank a replica of the whole model
  if (topology_of) topology = topology_of(args, world(), rank());
  if (topology.dp_world == 0) topology.dp_world = world(), topology.dp_rank = rank();
  if (topology.end_unit < 0) topology.end_unit = args.cfg.layers + 2;  // to the final layernorm
  if (set_up) set_up(*this);  // the rung's own flag checks and set-up hooks
  if (columns.cpu_only && args.device == "cuda")
    user_error("--device cuda: %s runs on the CPU backend only (cpu-only in stages.txt; its docs say why), "
               "expected --device cpu or auto", stage_name(stage));
  resolve_batch(args, dp_world());  // --config's train_batch_size: checked, or the missing factor derived
  // Threads per rank = cores / ranks on this machine, so 4 ranks on 2 cores do not fight; or
  // OMP_NUM_THREADS when set (the fast CPU kernels' bits depend on the thread count: runs compared
  // bit for bit on different numbers of ranks, or one rung's against another's, set it alike).
  int cores = int(std::thread::hardware_concurrency());
  const char* omp_threads = getenv("OMP_NUM_THREADS");
  if (!omp_threads || atoi(omp_threads) < 1) omp_set_num_threads(std::max(1, cores / comm.local_size()));
  set_kernels(args.kernels == "reference" ? Kernels::Reference : Kernels::Fast);
  set_attention(args.attention == "flash" ? Attention::Flash : Attention::Gemm);  // before --batch auto: it sizes att
  if (args.batch_auto || args.global_batch > 0) settle_batch();  // sets args.batch, args.accum
  // the data is read (and checked) before anything else happens, so bad data is one line
  data = std::make_unique<DataLoader>(args.data, args.batch, args.seq, args.seed);
  {  // one line, before anything is printed or allocated
    const Layout L = make_layout(args.cfg, dp_world(), args.quant_pad_block());
    check_model_fits(args, stage, comm, L, state_bytes(L, args.dtype));
  }
  configs_from_args();                  // after settle_batch: the batch and accum are final
  // --qat's and --prune-mask's (read and checked now, a bad one is one line) identities in checkpoints
  compression.read(args, stage_name(stage), columns.prune_mask, rungs_with(&RungColumns::prune_mask),
                   checkpoint_.get());
  // which checkpoint to resume from (rank 0 verifies it; loaded when the stage registers its state)
  if (!args.resume.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    resume_from_ = find_resume_checkpoint(comm, *checkpoint_);
    verify_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  run_id_ = claim_checkpoint_dir(comm, *checkpoint_, resume_from_);  // --ckpt-dir: this run's alone, or one line
  // a cpu-only rung and --qat run on the CPU (auto: even where a GPU is visible)
  select_device(columns.cpu_only || compression.qat.on() ? "cpu" : args.device.c_str(), comm.local_rank(),
                rank() == 0);
  comm.use_device_backend();  // NCCL when every rank has its own GPU; else MPI (comm.h)
  if (current_device() == Device::CUDA) {
    peak_flops(args.dtype);  // checks NZ_PEAK_TFLOPS on every rank
    // The device-memory baseline: the context, cuBLAS and NCCL (when used) are up, the model has
    // not allocated yet. Ranks sharing a GPU all come up before any measures, and all measure
    // before any allocates (the barriers), so each sees the same baseline.
    cuda_rt::start_libraries();
    comm.control_barrier();
    size_t free_bytes = 0, total_bytes = 0;
    cuda_rt::mem_get_info(&free_bytes, &total_bytes);
    gpu_baseline_bytes_ = double(total_bytes - free_bytes);
    comm.control_barrier();
  }
  dtype = args.dtype;
  elem_bytes = dtype_bytes(dtype);
  // each unit padded for the data-parallel replicas (and to whole quantization blocks per slice, where
  // a rung quantizes its collectives: args.quant_pad_block()); ulysses: for the replicas' sequence
  // slices too, which shard the model states with them
  layout = make_layout(args.cfg, dp_world() * std::max(topology.seq.slices, 1), args.quant_pad_block());
  Ledger::get().set_timeline_last_step(1);
  // the units this rank runs and the micro-batches it keeps in flight (the topology's)
  const Topology& t = topology;
  model = std::make_unique<GPT>(layout, dtype, args.batch, t.own_model ? 1 : args.seq, args.activation_checkpointing,
                                t.first_unit, t.end_unit, t.activation_slots ? t.activation_slots(args.accum) : 1, t.seq);
  tokens_.resize(size_t(args.batch) * args.seq);
  targets_.resize(tokens_.size());
  compression.set_up(layout, *model, adamw, rank() == 0);  // --qat on the model, --prune-mask on it and AdamW
  if (rank() == 0) {
    const GPTConfig& c = args.cfg;
    // the machines, where there are several (the comm ledger counts the bytes between them)
    const std::string nodes = comm.host_nodes() > 1 ? " on " + std::to_string(comm.host_nodes()) + " nodes" : "";
    printf("%s | %d ranks%s | %s: %d layers, width %d, %d heads, context %d | %zu parameters (%zu padded, %zu per rank)\n",
           stage_name(stage), world(), nodes.c_str(), args.preset.c_str(), c.layers, c.dim, c.heads, c.ctx,
           layout.num_params, layout.padded_total, layout.shard_total);
    printf("%s | %s | batch %d x seq %d x accum %d per rank | %d steps | %d threads per rank | data %s (%zu bytes)\n",
           dtype_name(dtype), current_device() == Device::CUDA ? "cuda" : "cpu", args.batch, args.seq,
           args.accum, args.steps, omp_get_max_threads(), args.data.c_str(),
           data->train_bytes() + data->val_bytes());
    for (const std::string& note : args.config_notes) printf("note: %s\n", note.c_str());  // --config's ignored keys
    if (dtype == DType::BF16 && current_device() == Device::CPU)  // which path, decided once (gemm_bf16.h)
      printf("bf16 products: %s\n", cpu::bf16_gemm_path());
    if (args.activation_checkpointing)
      printf("activation checkpointing: each block's input kept, its forward recomputed in its backward: "
             "activations %s per rank (%s without) | recompute %.4g FLOPs per token (+%.1f%% over the %.4g of a "
             "step; MFU leaves it out, HFU counts it)\n",
             fmt_bytes(double(expected_activation_bytes(args.cfg, args.batch, args.seq, dtype, true, model->attention()))).c_str(),
             fmt_bytes(double(expected_activation_bytes(args.cfg, args.batch, args.seq, dtype, false, model->attention()))).c_str(),
             recompute_flops_per_token(args.cfg, args.seq),
             100 * recompute_flops_per_token(args.cfg, args.seq) / flops_per_token(args.cfg, args.seq, layout.num_params),
             flops_per_token(args.cfg, args.seq, layout.num_params));
    if (current_device() == Device::CUDA) {
      char peak[64] = "an unknown peak (set NZ_PEAK_TFLOPS)";
      if (peak_flops(dtype) > 0) snprintf(peak, sizeof peak, "%.0f TFLOP/s per GPU", peak_flops(dtype) / 1e12);
      printf("cuda: %s, %d GPU%s for %d rank%s | collectives: %s | kernels: %s%s | MFU against %s\n",
             cuda_rt::device_name(), comm.gpus_in_use(), comm.gpus_in_use() == 1 ? "" : "s", world(),
             world() == 1 ? "" : "s",
             comm.uses_nccl()         ? "NCCL (sums not rank-ordered)"
             : comm.one_rank_on_gpu() ? "none, one rank (device copies, no NCCL)"
                                      : "MPI through pinned host memory (rank-ordered)",
             args.kernels.c_str(), args.kernels == "fast" ? (", attention " + args.attention).c_str() : "", peak);
    }
    fflush(stdout);
  }
  if (args.watchdog > 0) watchdog_ = std::make_unique<Watchdog>(comm, args.watchdog);
  t_start_ = std::chrono::steady_clock::now();
}

Trainer::~Trainer() = default;

void Trainer::settle_batch() {
  const int N = dp_world();
  const Layout L = make_layout(args.cfg, N, args.quant_pad_block());  // padded as the run's will be
  const StateBytes states = state_bytes(L, args.dtype);  // the rung's own
  std::string budget_from = "--memory-budget";
  int fit = 0;
  // the device (chosen here quietly, again later aloud) and the kernels decide attention's activations:
  // flash attention in force keeps only its log-sum-exp (zero_formulas.h)
  const Device device = args.batch_auto ? select_device(args.device.c_str(), comm.local_rank(), false) : Device::CPU;
  const Attention attn =
      flash_attention_in_force(args.cfg.dim, args.cfg.heads) ? Attention::Flash : Attention::Gemm;
  // --qat: the model's fake-quantized unit is on the device beside the states and activations
  const uint64_t qat_copy = qat_bytes(L, args.dtype, compression.qat);
  auto peak_at = [&](int B) {
    return expected_device_peak(stage, L, B, args.seq, args.dtype, args.activation_checkpointing, attn, &states) +
           qat_copy;
  };
  if (args.batch_auto) {
    uint64_t budget = args.memory_budget;
    if (budget == 0) {  // the GPU's free memory, shared by the ranks on it; the smallest over all ranks
      if (device != Device::CUDA)
        user_error("--batch auto: no GPU memory to measure on the CPU backend; give the budget per rank, e.g. "
                   "--memory-budget 256MiB");
      size_t free_bytes = 0, total_bytes = 0;
      cuda_rt::mem_get_info(&free_bytes, &total_bytes);
      const int gpus = cuda_rt::device_count();
      int sharing = 0;  // local ranks on my GPU (select_device: local rank l uses GPU l % gpus)
      for (int l = 0; l < comm.local_size(); l++) sharing += l % gpus == comm.local_rank() % gpus;
      uint64_t mine = free_bytes / uint64_t(std::max(sharing, 1));
      budget = comm.control_min(mine);
      budget_from = "the GPU's free memory (cudaMemGetInfo" + std::string(sharing > 1 ? ", shared by its ranks)" : ")");
    }
    args.memory_budget = budget;
    fit = budget < qat_copy ? 0 : largest_fitting_batch(stage, L, args.seq, args.dtype, args.activation_checkpointing,
                                                       budget - qat_copy, 1 << 16, attn, &states);
    if (fit == 0) {
      const uint64_t need = peak_at(1);
      user_error("--batch auto: a micro-batch of 1 needs %s per rank, more than the budget of %s (%s); raise the "
                 "budget, or use a later stage, more ranks, --activation-checkpointing or a shorter --seq",
                 fmt_bytes(double(need)).c_str(), fmt_bytes(double(budget)).c_str(), budget_from.c_str());
    }
    args.batch = fit;
  }
  if (args.global_batch > 0) {
    if (args.global_batch % N != 0)
      user_error("--global-batch %d: not a multiple of the %d ranks; expected a multiple of %d, e.g. %d",
                 args.global_batch, N, N, (args.global_batch / N + 1) * N);
    const int per_rank = args.global_batch / N;
    if (args.batch_auto) {  // the largest micro-batch that fits and divides this rank's share
      args.batch = std::min(fit, per_rank);
      while (per_rank % args.batch != 0) args.batch--;
    } else if (per_rank % args.batch != 0) {
      user_error("--global-batch %d on %d ranks: %d sequences per rank, not a multiple of %s; expected a batch "
                 "that divides %d", args.global_batch, N, per_rank,
                 args.origin("--batch", std::to_string(args.batch)).c_str(), per_rank);
    }
    args.accum = per_rank / args.batch;
  }
  if (rank() == 0 && args.batch_auto) {
    const bool ck = args.activation_checkpointing;
    const StateBytes& f = states;
    const uint64_t acts = expected_activation_bytes(args.cfg, args.batch, args.seq, args.dtype, ck, attn);
    printf("batch auto: micro-batch %d per rank, the largest that fits %s (%llu bytes) per rank (%s)%s: predicted peak %s = "
           "model states %s + activations %s%s (zero_formulas.h); %d would need %s\n",
           args.batch, fmt_bytes(double(args.memory_budget)).c_str(), (unsigned long long)args.memory_budget,
           budget_from.c_str(),
           args.batch < fit ? (" and divides the " + std::to_string(args.global_batch / N) + " sequences per rank").c_str() : "",
           fmt_bytes(double(peak_at(args.batch))).c_str(),
           fmt_bytes(double(f.total() - f.host)).c_str(), fmt_bytes(double(acts)).c_str(),
           qat_copy ? (" + the qat copy " + fmt_bytes(double(qat_copy))).c_str() : "", fit + 1,
           fmt_bytes(double(peak_at(fit + 1))).c_str());
  }
  if (rank() == 0 && args.global_batch > 0)
    printf("global batch %d = %d ranks x micro-batch %d x accum %d\n", args.global_batch, N, args.batch, args.accum);
  fflush(stdout);
}

StateBytes Trainer::state_bytes(const Layout& L, DType dt) const {
  return hooks.model_state_bytes ? hooks.model_state_bytes(L, dt) : expected_state_bytes(stage, L, dt);
}

void Trainer::init_params(int u, Slice part, void* dst, Location at) {
  std::vector<float> unit(layout.units[u].padded);
  // --prune-mask: the pruned model's weights; else the seed's
  if (!compression.initial_unit(layout, u, unit.data())) init_unit(layout, u, args.seed, unit.data());
  std::vector<char> conv(part.size() * elem_bytes);
  const float* src = unit.data() + part.begin;
  NZ_DISPATCH_TRAIN_DTYPE(dtype, cpu::cast<T, float>((T*)conv.data(), src, part.size()));
  copy_bytes(dst, at, conv.data(), Location::Host, conv.size());
  heartbeat();  // the watchdog's: set-up of a big model is long, but alive
}

}  // namespace nz
