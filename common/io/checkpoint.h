// checkpoint.h — the sharded training checkpoint: stop anywhere, resume bit for bit, at any stage and
// any world size. (The model file, weights only, is model_file.h.)
//
// A checkpoint is a directory DIR/step-NNNNNNNN (N: optimizer steps completed) holding
//   rank-RRRRR.shard   one per rank: exactly what that rank holds (its parameters, full or its
//                      slices; the fp32 master copy, if it keeps one; Adam m and v of its slices)
//   MANIFEST           written last, by rank 0, once every shard is on the disk: the step, the
//                      run's configuration, and each shard's size and CRC-32C (a text file; it
//                      also names the next learning rate, Adam step and first sequence index;
//                      in fp16 it holds the loss scaler's state, loss_scale.h), and the run's id.
// A directory without a complete, valid MANIFEST is not a checkpoint.
//
// A run owns its --ckpt-dir: rank 0 holds a lock on DIR/LOCK while the run lives (a second job
// writing there at the same time is refused), and every checkpoint carries the run's id, a random
// 64-bit number chosen when the run starts from step 0 and kept when it resumes. A fresh run in a
// directory holding another run's checkpoints is refused before its first step (--ckpt-overwrite
// removes them instead); the --ckpt-keep clean-up removes only this run's checkpoints, and of a
// step directory only the files a run writes there (MANIFEST, rank-R.shard, their temporary files):
// the directory itself goes only when nothing else is left in it. Nothing else has state: a
// micro-batch is a pure function of (seed, step, micro-step, accum, world, rank) (data.h), Adam's
// step count is step + 1, the learning rate a function of the step. So the step is the data
// position and the learning-rate curve's position, and the seed the whole RNG state. (fp16: Adam and the
// learning-rate curve count the updates applied, step minus the skipped steps the MANIFEST records.)
//
// Shard file (little-endian):
//   bytes 0..7   magic "NZCKSHRD"
//   uint32 x 6   version (1), rank, world, precision (0 fp32, 1 bf16, 2 fp16), units U, has_master (0/1)
//   uint64 x 4U  per unit: params [begin, end), optimizer state [begin, end), in unit elements
//   params       for each unit its params range, in the storage type
//   master       (if has_master) for each unit its optimizer range, fp32; then m; then v
// Element i of a unit is the same parameter whatever the world size (a unit's padding is only at
// its end), so a reader at another stage or world size just asks every shard for the element
// ranges it needs now: resharding is the normal load path. zeropp pads its units further, to a
// multiple of N x its quantization block (layout.h): its MANIFEST says so in a line "pad_block B",
// the reader lays out the writer's units with it, and the padding is never read (only elements
// below a unit's size are); every other stage writes no such line.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm.h"
#include "io/held_params.h"  // HeldParams: parameters held away from a buffer
#include "loss_scale.h"  // LossScaler, LossScaleState (fp16)
#include "layout.h"
#include "optim.h"
#include "lr_schedule.h"  // LrScheduleConfig: the next update's learning rate, in the MANIFEST
#include "zero_formulas.h"  // Stage

namespace nz {

constexpr char kShardMagic[8] = {'N', 'Z', 'C', 'K', 'S', 'H', 'R', 'D'};
constexpr uint32_t kShardVersion = 1;
inline size_t shard_header_bytes(int units) { return 8 + 6 * 4 + size_t(units) * 4 * 8; }

// Where checkpoints go and which one to resume, with the run's settings that every MANIFEST records
// and a resume compares (the trainer fills it from the command line: --ckpt-dir, --ckpt-keep,
// --ckpt-overwrite, --resume, --resume-changed, and the model, precision and training flags).
struct CheckpointConfig {
  std::string ckpt_dir;          // DIR/step-N; none without it
  int ckpt_keep = 2;             // keep the newest M checkpoints
  bool ckpt_overwrite = false;   // remove another run's checkpoints from ckpt_dir instead of refusing it
  std::string resume;            // a checkpoint, a ckpt_dir, or "auto"
  bool resume_changed = false;   // resume with settings other than the checkpoint's (else refused)
  // the run's settings
  GPTConfig cfg;
  std::string precision;
  uint64_t seed = 0;
  float lr = 0, weight_decay = 0, clip = 0;
  int warmup = 0, steps = 0, batch = 0, seq = 0, accum = 0;
  LrScheduleConfig lr_schedule;
  std::string qat = "none";      // --qat: "none", or e.g. "int4/64" (trainer.cpp, checkpoint_config)
  // --prune-mask: "none", or the mask's identity "<pruned count>/<CRC-32C of its bits>" (trainer.cpp)
  std::string prune = "none";
};

// What one rank holds, as its stage registered it (Trainer::checkpoint_state).
struct HeldState {
  const Layout* L = nullptr;
  DType dt = DType::F32;
  Buffer* params = nullptr;  // all padded units (stages 0-2, offload), this rank's slices (stage3), or
  bool params_full = true;   // the pipeline: its segment's units [first_unit, end_unit), whole
  int first_unit = 0, end_unit = 1 << 30;
  int data_world = 1;        // the replicas that split the data (N, but D = N / P in the pipeline)
  // or this rank's slices held away from a buffer (held_params.h), instead of a params buffer
  HeldParams* slices = nullptr;
  OptimizerState* opt = nullptr;
  LossScaler* scaler = nullptr;  // fp16: its state is saved and restored too
  int rank = 0;
  uint64_t run_id = 0;  // claim_checkpoint_dir's: recorded in every MANIFEST this run writes
  bool holds(int u) const { return u >= first_unit && u < end_unit; }
  Slice params_range(int u) const {
    return !holds(u) ? Slice{0, 0} : params_full ? L->full(u) : L->shard(u, rank);
  }
  // where unit u's params range starts in the params buffer, in elements
  size_t params_at(int u) const {
    if (!holds(u)) return 0;
    return params_full ? L->units[u].offset - L->units[first_unit].offset : L->units[u].shard_offset;
  }
  uint64_t params_bytes() const { return slices ? L->shard_total * dtype_bytes(dt) : params->bytes(); }
  // elements [at, at + n) of the params held, to or from host memory
  void get_params(size_t at, size_t n, void* host) const;
  void put_params(size_t at, size_t n, const void* host) const;
  uint64_t optimizer_bytes() const { return uint64_t(opt->has_master() ? 3 : 2) * 4 * opt->owned_elems(); }
};

// The MANIFEST, parsed.
struct Manifest {
  uint64_t run_id = 0;  // 0: written before checkpoints carried one
  int step = 0, world = 0;
  size_t pad_block = 1;  // the writer's units padded to world x pad_block (zeropp; layout.h); else 1
  std::string stage, precision;
  GPTConfig cfg;
  uint64_t num_params = 0, seed = 0;
  float lr = 0, weight_decay = 0, clip = 0;
  int warmup = 0, steps = 0, batch = 0, seq = 0, accum = 0;
  std::string qat = "none";     // --qat (no "qat" line: written before QAT existed, or without it)
  std::string prune = "none";   // --prune-mask's identity (no "prune" line: written without a mask)
  bool has_loss_scale = false;  // fp16
  LossScaleState loss_scale;
  struct File {
    std::string name;
    uint64_t bytes = 0;
    uint32_t crc = 0;
  };
  std::vector<File> files;  // one per rank, in rank order
};

// Collective, once, before training (after find_resume_checkpoint). Settles the run's id: the
// resumed checkpoint's, or else a fresh random one (rank 0's, broadcast). With --ckpt-dir, claims
// the directory: makes it, takes its lock, and checks that it holds no checkpoint of another run
// (with --ckpt-overwrite: removes them, with a note). A directory another job holds, or one with
// another run's checkpoints, is one line and exit 2. Returns the id.
uint64_t claim_checkpoint_dir(Comm& comm, const CheckpointConfig& args, const std::string& resume_from);

// Collective. Writes the checkpoint of `steps_done` completed steps into args.ckpt_dir, then keeps
// only the newest args.ckpt_keep of this run's. Rank 0 prints one line (size per rank, time). A
// failure (disk full) is a warning and the training goes on: no MANIFEST, so no checkpoint.
// Returns, on every rank, whether the checkpoint was written. Stale temporary files of an earlier
// write that was killed (*.tmp.*) are removed first.
bool save_checkpoint(Comm& comm, const CheckpointConfig& args, Stage stage, const HeldState& held, int steps_done);

// Collective. The checkpoint --resume names (a checkpoint, or a directory of them: its newest
// valid one; "auto": the newest valid one in --ckpt-dir). Each invalid one skipped is a note on
// stderr. Returns "" for "auto" when there is none (the run starts from step 0); an explicit
// --resume that is not a valid checkpoint is one line and exit 2. So is a checkpoint of another
// model or precision, one already past --steps, or one whose recorded settings (--seed, --lr,
// --weight-decay, --clip, --warmup, --batch, --seq, --accum) differ from this run's unless
// --resume-changed is given; a larger --steps is a note.
std::string find_resume_checkpoint(Comm& comm, const CheckpointConfig& args);

// Collective. Loads this rank's state from checkpoint `dir` (already verified), whatever stage
// and world size wrote it. Returns the number of steps it holds. A checkpoint of another model
// or precision is one line and exit 2; changed settings (find_resume_checkpoint) are notes. A
// parameter, master weight or Adam moment that is NaN or infinite (a diverged run's checkpoint,
// checksums and all) is one line naming the first, and exit 2.
int load_checkpoint(Comm& comm, const CheckpointConfig& args, const HeldState& held, const std::string& dir);

// ---- single-process pieces (consolidate, tests) ----

// Parses DIR/MANIFEST; false and *why if it is missing or damaged, or a value is out of range (a
// negative step, a step other than DIR's name says, a counter or a setting no run writes).
bool read_manifest(const std::string& dir, Manifest* m, std::string* why);
// read_manifest, then every shard's size and checksum. False and *why at the first problem.
bool verify_checkpoint(const std::string& dir, Manifest* m, std::string* why);
// `path` is a checkpoint (verified), or a directory of them (the newest valid one; each skipped
// one adds a line to *notes). "" and *why when there is none.
std::string find_checkpoint(const std::string& path, std::vector<std::string>* notes, std::string* why);

// Reads element ranges of a verified checkpoint, from whichever shards hold them.
class CheckpointReader {
 public:
  CheckpointReader(const std::string& dir, const Manifest& m);  // exits 2 (one line) on a bad shard
  ~CheckpointReader();
  const Layout& layout() const { return L_; }  // of the world size that wrote it
  DType dtype() const { return dt_; }
  bool has_master() const { return has_master_; }
  // Unit u's elements [a, b) (indices >= numel are padding: zeros): params in the checkpoint's
  // storage type, or an fp32 array (the master: the params themselves when there is none).
  void params(int u, size_t a, size_t b, void* dst);
  void array(OptArray which, int u, size_t a, size_t b, float* dst);

 private:
  struct Shard {
    int fd = -1;
    std::vector<uint64_t> range;       // 4 per unit: params begin, end; optimizer begin, end
    std::vector<uint64_t> params_at;   // per unit: file offset of its params
    std::vector<uint64_t> array_at[3]; // per array, per unit: file offset
  };
  std::string dir_;
  Layout L_;
  DType dt_;
  bool has_master_ = false;
  std::vector<Shard> shards_;
  void read_range(bool params, int array, int u, size_t a, size_t b, size_t elem, char* dst);
};

}  // namespace nz
