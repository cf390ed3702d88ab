// checkpoint.cpp — writing, finding, verifying and reading sharded checkpoints (checkpoint.h).
#include "io/checkpoint.h"

#include <dirent.h>    // opendir: listing the checkpoints
#include <fcntl.h>     // open
#include <sys/file.h>  // flock: one job at a time in a --ckpt-dir
#include <sys/stat.h>  // mkdir, stat
#include <unistd.h>    // pread, unlink, rmdir

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>   // std::isfinite
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>  // std::unique_ptr
#include <random>  // std::random_device: the run's id
#include <sstream>
#include <thread>  // std::this_thread::sleep_for

#include "io/atomic_file.h"  // AtomicFile: temporary file, fsync, rename
#include "runtime/check.h"
#include "io/model_file.h"   // first_non_finite, element_name
#include "io/crc32c.h"
#include "runtime/heartbeat.h"     // heartbeat: a unit loaded (writes beat in AtomicFile)
#include "kernels/kernels.h"      // cpu::cast: stored bf16/fp16 params widened to be checked
#include "kernels/quantize.h"     // valid_quant_block: a MANIFEST's pad_block

namespace nz {

void HeldState::get_params(size_t at, size_t n, void* host) const {
  const size_t e = dtype_bytes(dt);
  if (slices) return slices->read(at, n, host);
  copy_bytes(host, Location::Host, (const char*)params->data() + at * e, params->location(), n * e);
}

void HeldState::put_params(size_t at, size_t n, const void* host) const {
  const size_t e = dtype_bytes(dt);
  if (slices) return slices->write(at, n, host);
  copy_bytes((char*)params->data() + at * e, params->location(), host, Location::Host, n * e);
}
namespace {

constexpr size_t kChunkElems = 1 << 20;  // host memory used while streaming a shard in or out

std::string step_dir(const std::string& parent, int step) {
  char name[32];
  snprintf(name, sizeof name, "step-%08d", step);
  return parent + "/" + name;
}
std::string shard_name(int rank) {
  char name[32];
  snprintf(name, sizeof name, "rank-%05d.shard", rank);
  return name;
}
// The step of a directory entry named step-NNNNNNNN; -1 for anything else.
int step_of(const std::string& name) {
  if (name.size() != 13 || name.compare(0, 5, "step-") != 0) return -1;
  for (size_t i = 5; i < 13; i++)
    if (name[i] < '0' || name[i] > '9') return -1;
  return atoi(name.c_str() + 5);
}
// The step-* entries of `parent`, newest first.
std::vector<std::pair<int, std::string>> list_checkpoints(const std::string& parent) {
  std::vector<std::pair<int, std::string>> out;
  DIR* d = opendir(parent.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    int s = step_of(e->d_name);
    if (s >= 0) out.push_back({s, parent + "/" + e->d_name});
  }
  closedir(d);
  std::sort(out.rbegin(), out.rend());
  return out;
}
bool exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}
// A name a checkpoint writer gives a file in a step directory: MANIFEST, rank-R.shard (R: five or
// more digits), or the temporary file (atomic_file.h) of either.
bool is_checkpoint_file(const std::string& name, bool temporary) {
  const std::string base = temporary ? temp_file_target(name) : name;
  if (base == "MANIFEST") return true;
  if (base.size() < 16 || base.compare(0, 5, "rank-") != 0 || base.compare(base.size() - 6, 6, ".shard") != 0)
    return false;
  for (size_t i = 5; i < base.size() - 6; i++)
    if (base[i] < '0' || base[i] > '9') return false;
  return true;
}
// Removes the files of `dir` a checkpoint writer makes (all of them, or only the temporary ones);
// anything else in it stays.
void remove_checkpoint_files(const std::string& dir, bool temporary_only) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (is_checkpoint_file(e->d_name, true) || (!temporary_only && is_checkpoint_file(e->d_name, false)))
        names.push_back(e->d_name);
    closedir(d);
  }
  for (const std::string& n : names) unlink((dir + "/" + n).c_str());
}
// A checkpoint directory: its MANIFEST goes first, so a half-removed one is never valid; then
// the shards; the directory itself only if nothing else (a file the user put there) is left.
void remove_checkpoint(const std::string& dir) {
  unlink((dir + "/MANIFEST").c_str());
  sync_dir(dir);
  remove_checkpoint_files(dir, false);
  rmdir(dir.c_str());  // fails, and leaves it, when it is not empty
}


// The run's id, when it starts from step 0: random, never 0 (which marks a checkpoint from before ids).
uint64_t fresh_run_id() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0)  // the clock and pid too, in case random_device is a fixed sequence somewhere
    id = ((uint64_t(rd()) << 32) | rd()) ^
         uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull ^
         uint64_t(getpid()) << 40;
  return id;
}

std::string run_name(uint64_t id) {
  char s[24];
  snprintf(s, sizeof s, "%016" PRIx64, id);
  return s;
}

// The shard header's precision code.
uint32_t precision_code(DType dt) { return dt == DType::F32 ? 0u : dt == DType::BF16 ? 1u : 2u; }
DType precision_of(const std::string& p) { return p == "bf16" ? DType::BF16 : p == "fp16" ? DType::F16 : DType::F32; }

std::string manifest_text(const CheckpointConfig& a, Stage stage, int world, int data_world, size_t pad_block,
                          int step, const std::vector<Manifest::File>& files, const LossScaler* scaler,
                          uint64_t run_id) {
  std::ostringstream o;
  char buf[256];
  o << "nanozero-checkpoint 1\n";
  o << "run " << run_name(run_id) << "\n";
  o << "step " << step << "\n" << "stage " << stage_name(stage) << "\n" << "world " << world << "\n";
  // zeropp's units are padded to N x block (layout.h): the ranges of its shards are in that layout
  if (pad_block > 1) o << "pad_block " << pad_block << "\n";
  o << "precision " << a.precision << "\n";
  o << "model " << a.cfg.vocab << " " << a.cfg.ctx << " " << a.cfg.layers << " " << a.cfg.dim << " " << a.cfg.heads
    << "\n";
  o << "num_params " << param_count_formula(a.cfg) << "\n" << "seed " << a.seed << "\n";
  snprintf(buf, sizeof buf, "lr %.9g\nweight_decay %.9g\nclip %.9g\n", a.lr, a.weight_decay, a.clip);
  o << buf;
  o << "warmup " << a.warmup << "\n" << "steps " << a.steps << "\n" << "batch " << a.batch << "\n"
    << "seq " << a.seq << "\n" << "accum " << a.accum << "\n";
  if (a.qat != "none") o << "qat " << a.qat << "\n";
  if (a.prune != "none") o << "prune " << a.prune << "\n";
  const LossScaleState ls = scaler && scaler->enabled() ? scaler->state() : LossScaleState{};
  if (scaler && scaler->enabled()) {  // fp16: the loss scaler goes on where it was
    snprintf(buf, sizeof buf, "loss_scale %.9g %ld %ld %d %d\n", double(ls.scale), ls.iter, ls.last_overflow_iter,
             ls.hysteresis_left, ls.skipped);
    o << buf;
  }
  // for the reader: where the run goes on (the step is the data position; not parsed)
  snprintf(buf, sizeof buf, "next_lr %.9g\nnext_adam_t %d\nnext_sequence %llu\n", lr_at(a.lr_schedule, step - ls.skipped),
           step - ls.skipped + 1, (unsigned long long)step * a.accum * data_world * a.batch);
  o << buf;
  for (const Manifest::File& f : files) {
    snprintf(buf, sizeof buf, "file %s %" PRIu64 " %08x\n", f.name.c_str(), f.bytes, f.crc);
    o << buf;
  }
  std::string body = o.str();
  snprintf(buf, sizeof buf, "end %08x\n", crc32c(0, body.data(), body.size()));  // the manifest's own checksum
  return body + buf;
}

}  // namespace

// ---------------------------------------------------------------- the run and its directory

namespace {
int lock_fd = -1;  // DIR/LOCK, locked by rank 0 until the process ends (the kernel lets go at any exit)

// Rank 0: makes --ckpt-dir and takes its lock. "" or the one line to end the run with.
std::string lock_checkpoint_dir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return "--ckpt-dir " + dir + ": cannot create it (" + strerror(errno) + "); expected a writable directory: pass another";
  const std::string path = dir + "/LOCK";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return "--ckpt-dir " + dir + ": cannot create " + path + " (" + strerror(errno) +
           "); expected a writable directory: fix its permissions or pass another";
  // A job relaunched at once (scripts/train_resilient.sh) may find its predecessor's rank 0 not
  // quite gone: a few seconds of patience before calling the directory taken.
  int rc = -1;
  for (int tries = 0; tries < 30 && (rc = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EWOULDBLOCK; tries++)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (rc != 0 && errno == EWOULDBLOCK) {
    char holder[128] = "";
    const ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
    holder[n > 0 ? n : 0] = '\0';
    if (char* nl = strchr(holder, '\n')) *nl = '\0';
    close(fd);
    return "--ckpt-dir " + dir + ": another job is writing checkpoints there now (it holds " + path +
           (holder[0] ? std::string(": ") + holder : std::string()) +
           "); expected a directory no running job uses: wait for that job to end, or pass another --ckpt-dir";
  }
  if (rc == 0) {  // whose it is, for the message above in another job
    char me[128], host[64] = "?";
    gethostname(host, sizeof host - 1);
    const int len = snprintf(me, sizeof me, "pid %d on %s\n", int(getpid()), host);
    if (ftruncate(fd, 0) == 0 && pwrite(fd, me, size_t(len), 0) < 0) {}  // only a courtesy
  }
  // rc != 0 with another errno: a file system without locks (some network ones); go on without
  lock_fd = fd;
  return "";
}
}  // namespace

uint64_t claim_checkpoint_dir(Comm& comm, const CheckpointConfig& args, const std::string& resume_from) {
  uint64_t id = 0;
  std::string problem;
  if (comm.rank() == 0) {
    Manifest m;
    std::string why;
    id = !resume_from.empty() && read_manifest(resume_from, &m, &why) ? m.run_id : fresh_run_id();
    if (!args.ckpt_dir.empty()) problem = lock_checkpoint_dir(args.ckpt_dir);
    if (!args.ckpt_dir.empty() && problem.empty()) {
      // Another run's checkpoints here would be replaced step by step and removed by the clean-up.
      std::vector<std::string> others;
      uint64_t other_id = 0;
      for (auto& [s, d] : list_checkpoints(args.ckpt_dir))
        if (read_manifest(d, &m, &why) && m.run_id != id) {
          if (others.empty()) other_id = m.run_id;
          others.push_back(d);
        }
      if (!others.empty() && !args.ckpt_overwrite) {
        problem = "--ckpt-dir " + args.ckpt_dir + ": holds " + std::to_string(others.size()) + " checkpoint" +
                  (others.size() == 1 ? "" : "s") + " of another run (run " + run_name(other_id) + ", newest " +
                  others.front() + "); expected a directory for this run's own checkpoints: pass another --ckpt-dir, " +
                  (resume_from.empty() ? "resume that run (--resume auto), " : "") +
                  "or add --ckpt-overwrite to remove them";
      } else if (!others.empty()) {
        for (const std::string& d : others) remove_checkpoint(d);
        sync_dir(args.ckpt_dir);
        fprintf(stderr, "note: --ckpt-overwrite: removed %zu checkpoint%s of another run (newest %s) from %s\n",
                others.size(), others.size() == 1 ? "" : "s", others.front().c_str(), args.ckpt_dir.c_str());
        fflush(stderr);
      }
    }
  }
  comm.control_broadcast(&id, sizeof id);
  problem = comm.control_broadcast(problem);
  if (!problem.empty()) user_error("%s", problem.c_str());
  return id;
}

// ---------------------------------------------------------------- writing

bool save_checkpoint(Comm& comm, const CheckpointConfig& args, Stage stage, const HeldState& h, int steps_done) {
  const auto t0 = std::chrono::steady_clock::now();
  const Layout& L = *h.L;
  const int rank = comm.rank(), world = comm.size();
  const std::string dir = step_dir(args.ckpt_dir, steps_done);
  // Rank 0 makes the directory; a MANIFEST already there (an older try of this run reached this
  // step) goes first, so the directory is not a checkpoint again until this one is complete.
  // Temporary files that a killed write left in any step directory go too: the directory is this
  // run's (its lock), and the other ranks start their files only after this.
  std::string problem;
  if (rank == 0) {
    mkdir(args.ckpt_dir.c_str(), 0755);
    for (auto& [s, d] : list_checkpoints(args.ckpt_dir)) remove_checkpoint_files(d, true);
    Manifest there;
    std::string why;
    if (read_manifest(dir, &there, &why) && there.run_id != h.run_id) {
      problem = dir + " holds a checkpoint of another run (run " + run_name(there.run_id) + "), left as it is";
    } else {
      unlink((dir + "/MANIFEST").c_str());
      sync_dir(dir);
      if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) problem = "cannot create " + dir + ": " + strerror(errno);
      sync_dir(args.ckpt_dir);
    }
  }
  problem = comm.control_broadcast(problem);

  // Every rank writes its shard: the header, then its params, then master, m, v.
  std::unique_ptr<AtomicFile> f;
  if (problem.empty()) {
    f = std::make_unique<AtomicFile>(dir + "/" + shard_name(rank));
    const OptimizerState& opt = *h.opt;
    const int U = L.num_units();
    uint32_t head[6] = {kShardVersion, uint32_t(rank), uint32_t(world), precision_code(h.dt), uint32_t(U),
                        opt.has_master() ? 1u : 0u};
    std::vector<uint64_t> ranges;
    for (int u = 0; u < U; u++) {
      Slice p = h.params_range(u), o = opt.owned()[u];
      ranges.insert(ranges.end(), {p.begin, p.end, o.begin, o.end});
    }
    f->write(kShardMagic, 8) && f->write(head, sizeof head) && f->write(ranges.data(), ranges.size() * 8);
    const size_t e = dtype_bytes(h.dt);
    std::vector<char> chunk(kChunkElems * 4);
    for (int u = 0; u < U && f->ok(); u++) {  // params, in the storage type, straight from the device
      const size_t n = h.params_range(u).size(), at = h.params_at(u);
      for (size_t a = 0; a < n && f->ok(); a += kChunkElems) {
        const size_t k = std::min(kChunkElems, n - a);
        h.get_params(at + a, k, chunk.data());
        f->write(chunk.data(), k * e);
      }
    }
    for (OptArray which : {OptArray::Master, OptArray::M, OptArray::V}) {
      if (which == OptArray::Master && !opt.has_master()) continue;
      for (size_t a = 0; a < opt.owned_elems() && f->ok(); a += kChunkElems) {  // packed: all units in order
        const size_t k = std::min(kChunkElems, opt.owned_elems() - a);
        h.opt->get(which, a, k, (float*)chunk.data());
        f->write(chunk.data(), k * 4);
      }
    }
    if (!f->commit()) problem = dir + "/" + shard_name(rank) + ": " + f->error();
  }
  // Rank 0 learns every shard's size and checksum (or what went wrong), then writes the MANIFEST.
  struct Report {
    uint64_t bytes;
    uint32_t crc, ok;
  } mine{f ? f->bytes() : 0, f ? f->crc() : 0, problem.empty() ? 1u : 0u};
  std::vector<Report> all(world);
  comm.control_gather(&mine, sizeof mine, all.data());
  const bool said_once = !f && rank != 0;  // rank 0's problem before any shard: every rank has it
  std::string problems = comm.gather_strings(problem.empty() || said_once ? "" : problem + "; ", "");
  auto finish_on_rank0 = [&]() -> bool {
    if (!problems.empty()) {
      problems.resize(problems.size() - 2);  // the last "; "
      fprintf(stderr, "warning: checkpoint at step %d not written (%s); training goes on\n", steps_done,
              problems.c_str());
      return false;
    }
    std::vector<Manifest::File> files;
    for (int r = 0; r < world; r++) files.push_back({shard_name(r), all[r].bytes, all[r].crc});
    const std::string text =
        manifest_text(args, stage, world, h.data_world, h.L->pad_block, steps_done, files, h.scaler, h.run_id);
    AtomicFile m(dir + "/MANIFEST");
    m.write(text.data(), text.size());
    if (!m.commit()) {
      fprintf(stderr, "warning: checkpoint at step %d: cannot write %s/MANIFEST (%s); training goes on\n", steps_done,
              dir.c_str(), m.error().c_str());
      return false;
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // Keep the newest --ckpt-keep of this run's complete checkpoints up to this one; its older ones,
    // and incomplete ones older than this one, go. Newer directories (a try of this run that went
    // further) and another run's checkpoints (--ckpt-overwrite let them be) are left alone.
    int kept = 0;
    for (auto& [s, d] : list_checkpoints(args.ckpt_dir)) {
      if (s > steps_done) continue;
      Manifest old;
      std::string why;
      const bool complete = read_manifest(d, &old, &why);
      if (complete && old.run_id != h.run_id) continue;
      if (complete && kept < args.ckpt_keep) kept++;
      else if (s < steps_done) remove_checkpoint(d);
    }
    const uint64_t payload = h.params_bytes() + h.optimizer_bytes();
    // rank 0's shard: the same size on every rank of a ZeRO stage; a pipeline's segments hold different units
    printf("checkpoint %s: %" PRIu64 " bytes in rank 0's shard (params %" PRIu64 " + optimizer %" PRIu64
           " = the ledger's params, master, Adam m and v; header %zu) written in %.1f ms\n",
           dir.c_str(), payload, h.params_bytes(), h.optimizer_bytes(), shard_header_bytes(L.num_units()), ms);
    fflush(stdout);
    return true;
  };
  int written = rank == 0 ? int(finish_on_rank0()) : 0;
  comm.control_broadcast(&written, sizeof written);  // every rank counts the checkpoints written
  return written != 0;
}

// ---------------------------------------------------------------- manifest and verification

bool read_manifest(const std::string& dir, Manifest* m, std::string* why) {
  std::ifstream in(dir + "/MANIFEST", std::ios::binary);
  if (!in) {
    *why = "no MANIFEST (an incomplete checkpoint)";
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const size_t end = text.rfind("end ");
  unsigned stored = 0;
  // the last line is "end" and the CRC-32C of everything before it, and nothing follows
  if (end == std::string::npos || text.size() != end + 13 || text.back() != '\n' ||
      sscanf(text.c_str() + end, "end %8x", &stored) != 1 || crc32c(0, text.data(), end) != stored) {
    *why = "MANIFEST damaged (its checksum does not match)";
    return false;
  }
  *m = Manifest{};
  std::istringstream lines(text.substr(0, end));
  std::string line, key, version;
  std::getline(lines, version);
  if (version != "nanozero-checkpoint 1") {
    *why = "MANIFEST of an unknown format '" + version + "'";
    return false;
  }
  while (std::getline(lines, line)) {
    std::istringstream l(line);
    l >> key;
    if (key == "run") l >> std::hex >> m->run_id;
    else if (key == "step") l >> m->step;
    else if (key == "stage") l >> m->stage;
    else if (key == "world") l >> m->world;
    else if (key == "pad_block") l >> m->pad_block;
    else if (key == "precision") l >> m->precision;
    else if (key == "model") l >> m->cfg.vocab >> m->cfg.ctx >> m->cfg.layers >> m->cfg.dim >> m->cfg.heads;
    else if (key == "num_params") l >> m->num_params;
    else if (key == "seed") l >> m->seed;
    else if (key == "lr") l >> m->lr;
    else if (key == "weight_decay") l >> m->weight_decay;
    else if (key == "clip") l >> m->clip;
    else if (key == "warmup") l >> m->warmup;
    else if (key == "steps") l >> m->steps;
    else if (key == "batch") l >> m->batch;
    else if (key == "seq") l >> m->seq;
    else if (key == "accum") l >> m->accum;
    else if (key == "qat") l >> m->qat;
    else if (key == "prune") l >> m->prune;
    else if (key == "loss_scale") {
      LossScaleState& s = m->loss_scale;
      m->has_loss_scale = bool(l >> s.scale >> s.iter >> s.last_overflow_iter >> s.hysteresis_left >> s.skipped);
    }
    else if (key == "file") {
      Manifest::File f;
      l >> f.name >> f.bytes >> std::hex >> f.crc;
      m->files.push_back(f);
    }
  }
  // Every number within what a run can write (a crafted or damaged one must not train from step -1,
  // nor size a layout of a billion layers), the step the directory's name says, and the shards
  // named as the writer names them (a MANIFEST never points outside its directory).
  const GPTConfig& c = m->cfg;
  const bool model_ok = c.vocab == 256 && c.ctx >= 1 && c.ctx <= (1 << 20) && c.layers >= 0 && c.layers <= 4096 &&
                        c.dim >= 1 && c.dim <= (1 << 16) && c.heads >= 1 && c.dim % c.heads == 0 &&
                        m->num_params == param_count_formula(c);
  bool files_ok = m->world >= 1 && m->world <= (1 << 20) && int(m->files.size()) == m->world &&
                  (m->pad_block == 1 || valid_quant_block(long(m->pad_block)));
  for (int r = 0; files_ok && r < m->world; r++) files_ok = m->files[r].name == shard_name(r);
  if (!files_ok || !model_ok || (m->precision != "fp32" && m->precision != "bf16" && m->precision != "fp16") ||
      (m->precision == "fp16") != m->has_loss_scale) {
    *why = "MANIFEST inconsistent (world size, files, model or precision)";
    return false;
  }
  const std::string base = dir.substr(dir.find_last_of('/') == std::string::npos ? 0 : dir.find_last_of('/') + 1);
  const LossScaleState& ls = m->loss_scale;
  const bool finite = std::isfinite(m->lr) && std::isfinite(m->weight_decay) && std::isfinite(m->clip);
  if (m->step < 0 || m->step > (1 << 30) || (step_of(base) >= 0 && step_of(base) != m->step) || m->steps < 1 ||
      m->steps > (1 << 30) || m->warmup < 0 || m->batch < 1 || m->seq < 1 || m->seq > c.ctx || m->accum < 1 ||
      !finite || m->lr < 0 || m->weight_decay < 0 || m->clip < 0 ||
      (m->has_loss_scale && (!std::isfinite(ls.scale) || ls.scale <= 0 || ls.iter < 0 || ls.last_overflow_iter < -1 ||
                             ls.hysteresis_left < 0 || ls.skipped < 0 || ls.skipped > m->step))) {
    char s[200];
    snprintf(s, sizeof s, "MANIFEST out of range (step %d, steps %d, warmup %d, batch %d, seq %d, accum %d, or a "
             "setting or loss-scale counter no run writes)", m->step, m->steps, m->warmup, m->batch, m->seq, m->accum);
    *why = s;
    return false;
  }
  return true;
}

bool verify_checkpoint(const std::string& dir, Manifest* m, std::string* why) {
  if (!read_manifest(dir, m, why)) return false;
  std::vector<char> buf(1 << 20);
  for (const Manifest::File& f : m->files) {
    const std::string path = dir + "/" + f.name;
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      *why = f.name + " missing";
      return false;
    }
    if (uint64_t(st.st_size) != f.bytes) {
      *why = f.name + (uint64_t(st.st_size) < f.bytes ? " truncated" : " too long") + ": " +
             std::to_string(st.st_size) + " bytes, the MANIFEST says " + std::to_string(f.bytes);
      return false;
    }
    FILE* in = fopen(path.c_str(), "rb");
    if (!in) {
      *why = f.name + ": cannot read (" + strerror(errno) + ")";
      return false;
    }
    uint32_t crc = 0;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), in)) > 0) crc = crc32c(crc, buf.data(), n);
    fclose(in);
    if (crc != f.crc) {
      char s[160];
      snprintf(s, sizeof s, "%s: checksum mismatch (CRC-32C %08x, the MANIFEST says %08x): the shard is damaged",
               f.name.c_str(), crc, f.crc);
      *why = s;
      return false;
    }
  }
  return true;
}

std::string find_checkpoint(const std::string& path, std::vector<std::string>* notes, std::string* why) {
  Manifest m;
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *why = "not a directory";
    return "";
  }
  std::string base = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  if (exists(path + "/MANIFEST") || step_of(base) >= 0) {  // one checkpoint: it must be valid
    if (verify_checkpoint(path, &m, why)) return path;
    return "";
  }
  auto all = list_checkpoints(path);
  for (auto& [s, d] : all) {
    std::string reason;
    if (verify_checkpoint(d, &m, &reason)) return d;
    notes->push_back("skipping checkpoint " + d + ": " + reason);
  }
  *why = all.empty() ? "no checkpoints (step-* directories) in it" : "no valid checkpoint in it";
  return "";
}

// The model and the precision must be the run's; anything else may change (notes, load_checkpoint).
static void check_compatible(const CheckpointConfig& args, const Manifest& m, const std::string& dir) {
  const GPTConfig& c = args.cfg;
  if (m.cfg.vocab != c.vocab || m.cfg.ctx != c.ctx || m.cfg.layers != c.layers || m.cfg.dim != c.dim ||
      m.cfg.heads != c.heads)
    user_error("--resume %s: a checkpoint of another model (%d layers, width %d, %d heads, context %d; this run: %d, "
               "%d, %d, %d). HINT: pass the model flags it was trained with",
               dir.c_str(), m.cfg.layers, m.cfg.dim, m.cfg.heads, m.cfg.ctx, c.layers, c.dim, c.heads, c.ctx);
  if (m.precision != args.precision)
    user_error("--resume %s: a %s checkpoint, this run is %s. HINT: pass --precision %s", dir.c_str(),
               m.precision.c_str(), args.precision.c_str(), m.precision.c_str());
}

// What this run sets differently from the run that wrote `m`: " --flag now (was then)" each.
// --steps is apart: a larger one is the way to train on from a finished run.
static std::string changed_settings(const CheckpointConfig& args, const Manifest& m) {
  std::string changed;
  auto note = [&](const char* flag, const std::string& now, const std::string& then) {
    if (now != then) changed += std::string(" ") + flag + " " + now + " (was " + then + ")";
  };
  char a[32], b[32];
  auto f = [](char* s, float x) { return snprintf(s, 32, "%.9g", x), std::string(s); };
  note("--seed", std::to_string(args.seed), std::to_string(m.seed));
  note("--lr", f(a, args.lr), f(b, m.lr));
  note("--weight-decay", f(a, args.weight_decay), f(b, m.weight_decay));
  note("--clip", f(a, args.clip), f(b, m.clip));
  note("--warmup", std::to_string(args.warmup), std::to_string(m.warmup));
  note("--batch", std::to_string(args.batch), std::to_string(m.batch));
  note("--seq", std::to_string(args.seq), std::to_string(m.seq));
  note("--accum", std::to_string(args.accum), std::to_string(m.accum));
  note("--qat", args.qat, m.qat);
  // a dense checkpoint fine-tuned pruned from here on is what --prune-mask is for (docs/compression.md);
  // dropping a run's mask, or changing it, is a change
  if (m.prune != "none") note("--prune-mask", args.prune, m.prune);
  return changed;
}

// Before anything is made: the checkpoint is one this run can go on from.
static void check_resumable(const CheckpointConfig& args, const Manifest& m, const std::string& dir) {
  check_compatible(args, m, dir);
  if (m.step > args.steps)
    user_error("--resume %s: a checkpoint of %d steps, already past --steps %d; expected --steps of %d or more (the "
               "total, not the steps to add): give a larger --steps",
               dir.c_str(), m.step, args.steps, m.step);
  const std::string changed = changed_settings(args, m);
  if (!changed.empty() && !args.resume_changed)
    user_error("--resume %s: this run's settings differ from the ones its checkpoint was trained with:%s; expected "
               "the same: pass the old values, or add --resume-changed to go on with the new ones",
               dir.c_str(), changed.c_str());
}

std::string find_resume_checkpoint(Comm& comm, const CheckpointConfig& args) {
  const bool automatic = args.resume == "auto";
  const std::string where = automatic ? args.ckpt_dir : args.resume;
  std::string dir, why;
  if (comm.rank() == 0) {
    std::vector<std::string> notes;
    if (!automatic || exists(where)) dir = find_checkpoint(where, &notes, &why);
    else why = "it does not exist yet";
    for (const std::string& n : notes) fprintf(stderr, "note: %s\n", n.c_str());
    if (dir.empty() && automatic)
      printf("--resume auto: no valid checkpoint in %s (%s); starting from step 0\n", where.c_str(), why.c_str());
    if (!dir.empty()) why.clear();
    fflush(stdout);
    fflush(stderr);
  }
  dir = comm.control_broadcast(dir);
  why = comm.control_broadcast(why);
  if (dir.empty() && !automatic)
    user_error("--resume %s: %s. HINT: give a checkpoint (DIR/step-N) or a --ckpt-dir holding one; --resume auto "
               "starts from scratch when there is none",
               where.c_str(), why.c_str());
  Manifest m;
  if (!dir.empty() && read_manifest(dir, &m, &why)) check_resumable(args, m, dir);  // before anything is made
  return dir;
}

// ---------------------------------------------------------------- reading

CheckpointReader::CheckpointReader(const std::string& dir, const Manifest& m)
    : dir_(dir), L_(make_layout(m.cfg, m.world, m.pad_block)), dt_(precision_of(m.precision)) {
  const int U = L_.num_units();
  const size_t e = dtype_bytes(dt_);
  for (int r = 0; r < m.world; r++) {
    Shard s;
    const std::string path = dir + "/" + m.files[r].name;
    s.fd = open(path.c_str(), O_RDONLY);
    char magic[8];
    uint32_t head[6];
    s.range.resize(size_t(U) * 4);
    bool ok = s.fd >= 0 && pread(s.fd, magic, 8, 0) == 8 && memcmp(magic, kShardMagic, 8) == 0 &&
              pread(s.fd, head, sizeof head, 8) == ssize_t(sizeof head) && head[0] == kShardVersion &&
              head[1] == uint32_t(r) && head[2] == uint32_t(m.world) && head[3] == precision_code(dt_) &&
              head[4] == uint32_t(U) && pread(s.fd, s.range.data(), s.range.size() * 8, 32) == ssize_t(s.range.size() * 8);
    if (ok) {
      has_master_ = head[5] != 0;
      uint64_t at = shard_header_bytes(U);
      for (int u = 0; u < U; u++) {
        const uint64_t* q = &s.range[size_t(u) * 4];
        ok = ok && q[0] <= q[1] && q[1] <= L_.units[u].padded && q[2] <= q[3] && q[3] <= L_.units[u].padded;
        s.params_at.push_back(at);
        at += (q[1] - q[0]) * e;
      }
      for (int a = has_master_ ? 0 : 1; a < 3; a++)
        for (int u = 0; u < U; u++) {
          s.array_at[a].push_back(at);
          at += (s.range[size_t(u) * 4 + 3] - s.range[size_t(u) * 4 + 2]) * 4;
        }
      ok = ok && at == m.files[r].bytes;
    }
    if (!ok)
      user_error("checkpoint %s: %s does not match its MANIFEST (header, ranges or size). HINT: the checkpoint is "
                 "damaged; resume from an older one",
                 dir.c_str(), m.files[r].name.c_str());
    shards_.push_back(std::move(s));
  }
}

CheckpointReader::~CheckpointReader() {
  for (Shard& s : shards_)
    if (s.fd >= 0) close(s.fd);
}

void CheckpointReader::read_range(bool params, int array, int u, size_t a, size_t b, size_t elem, char* dst) {
  std::fill(dst, dst + (b - a) * elem, 0);  // padding (elements >= numel) stays 0
  const size_t stop = std::min(b, L_.units[u].numel);
  size_t pos = a;
  while (pos < stop) {  // take each run of elements from the first shard holding it
    bool found = false;
    for (const Shard& s : shards_) {
      const uint64_t lo = s.range[size_t(u) * 4 + (params ? 0 : 2)], hi = s.range[size_t(u) * 4 + (params ? 1 : 3)];
      if (pos < lo || pos >= hi) continue;
      const size_t end = std::min<size_t>(stop, hi);
      const uint64_t at = (params ? s.params_at[u] : s.array_at[array][u]) + (pos - lo) * elem;
      const size_t bytes = (end - pos) * elem;
      if (pread(s.fd, dst + (pos - a) * elem, bytes, off_t(at)) != ssize_t(bytes))
        user_error("checkpoint %s: a shard could not be read (%s). HINT: resume from an older one", dir_.c_str(),
                   strerror(errno));
      pos = end;
      found = true;
      break;
    }
    if (!found)
      user_error("checkpoint %s: no shard holds element %zu of unit %s. HINT: the checkpoint is incomplete",
                 dir_.c_str(), pos, L_.units[u].name.c_str());
  }
}

void CheckpointReader::params(int u, size_t a, size_t b, void* dst) {
  read_range(true, 0, u, a, b, dtype_bytes(dt_), (char*)dst);
}

void CheckpointReader::array(OptArray which, int u, size_t a, size_t b, float* dst) {
  if (which == OptArray::Master && !has_master_) {  // fp32: the parameters are their own master
    NZ_CHECK(dt_ == DType::F32, "a bf16 checkpoint without a master copy");
    return params(u, a, b, dst);
  }
  read_range(false, int(which), u, a, b, 4, (char*)dst);
}

int load_checkpoint(Comm& comm, const CheckpointConfig& args, const HeldState& h, const std::string& dir) {
  Manifest m;
  std::string why;
  if (!read_manifest(dir, &m, &why)) user_error("--resume %s: %s. HINT: resume from another checkpoint", dir.c_str(), why.c_str());
  check_resumable(args, m, dir);
  if (comm.rank() == 0) {  // what check_resumable lets change (--steps; the rest with --resume-changed)
    std::string changed = changed_settings(args, m);
    if (args.steps != m.steps)
      changed += " --steps " + std::to_string(args.steps) + " (was " + std::to_string(m.steps) + ")";
    if (!changed.empty())
      fprintf(stderr, "note: resuming with changed settings:%s; the run goes on from step %d with them\n",
              changed.c_str(), m.step);
  }
  CheckpointReader in(dir, m);
  const Layout& L = *h.L;
  const size_t e = dtype_bytes(h.dt);
  // A diverged run's checkpoint holds NaN or Inf under valid checksums: found as it is read (the
  // first on this rank), then the ranks agree on the first of all, so every rank ends the same way.
  std::string bad;
  auto check_finite = [&](const char* what, int u, size_t begin, const float* p, size_t n) {
    const size_t i = bad.empty() ? first_non_finite(p, n) : n;
    if (i < n)
      bad = std::string(what) + " " + element_name(L, u, begin + i) + " is " + (std::isnan(p[i]) ? "nan" : "inf");
  };
  std::vector<char> host;
  std::vector<float> arr;
  for (int u = 0; u < L.num_units(); u++) {  // the params this rank holds now
    Slice s = h.params_range(u);
    host.resize(s.size() * e);
    in.params(u, s.begin, s.end, host.data());
    arr.resize(s.size());
    NZ_DISPATCH_TRAIN_DTYPE(h.dt, cpu::cast<float, T>(arr.data(), (const T*)host.data(), s.size()));
    check_finite("parameter", u, s.begin, arr.data(), arr.size());
    h.put_params(h.params_at(u), s.size(), host.data());
    heartbeat();
  }
  for (OptArray which : {OptArray::Master, OptArray::M, OptArray::V}) {  // its optimizer state
    if (which == OptArray::Master && !h.opt->has_master()) continue;
    for (int u = 0; u < L.num_units(); u++) {
      Slice s = h.opt->owned()[u];
      arr.resize(s.size());
      in.array(which, u, s.begin, s.end, arr.data());
      check_finite(which == OptArray::Master ? "master weight" : which == OptArray::M ? "Adam m" : "Adam v", u,
                   s.begin, arr.data(), arr.size());
      h.opt->put(which, h.opt->state_offset(u), s.size(), arr.data());
      heartbeat();
    }
  }
  std::string first = comm.gather_strings(bad.empty() ? "" : bad + "\n", "");  // rank order
  first = comm.control_broadcast(first.substr(0, first.find('\n')));
  if (!first.empty())
    user_error("--resume %s: %s; expected finite values (the run diverged before this checkpoint). HINT: resume "
               "from an earlier checkpoint, perhaps with a lower --lr (and --resume-changed)",
               dir.c_str(), first.c_str());
  if (h.scaler && m.has_loss_scale) h.scaler->restore(m.loss_scale);  // fp16
  return m.step;
}

}  // namespace nz
