// model_file.cpp — writing and reading the model file, and collecting a trained model's units into it.
#include "io/model_file.h"

#include <sys/stat.h>  // stat: the file's size before reading it


#include <cerrno>
#include <cmath>  // std::isfinite
#include <cstdio>
#include <cstring>

#include "comm.h"            // control_broadcast: every rank learns whether the file was written
#include "io/atomic_file.h"  // AtomicFile: temporary file, fsync, rename
#include "runtime/check.h"
#include "runtime/device.h"  // copy_bytes
#include "io/crc32c.h"
#include "io/pruned_file.h"  // load_model reads a pruned model too
#include "kernels/kernels.h"  // cpu::cast, to widen bf16 parameters to fp32
#include "runtime/heartbeat.h"  // heartbeat: a unit collected

namespace nz {

bool write_model_file(const std::string& path, const GPTConfig& c, const std::vector<float>& params, std::string* why) {
  NZ_CHECK(params.size() == param_count_formula(c), "save_model: %zu parameters for a model of %zu",
           params.size(), param_count_formula(c));
  AtomicFile f(path);
  int32_t hdr[5] = {c.vocab, c.ctx, c.layers, c.dim, c.heads};
  uint64_t n = params.size();
  f.write(kModelMagic, 8) && f.write(&kModelVersion, 4) && f.write(hdr, sizeof hdr) && f.write(&n, 8) &&
      f.write(params.data(), n * 4);
  const uint32_t crc = f.crc();  // of every byte before it
  f.write(&crc, 4);
  if (f.commit()) return true;
  *why = f.error();
  return false;
}

void save_model(const std::string& path, const GPTConfig& c, const std::vector<float>& params, const char* flag) {
  std::string why;
  if (!write_model_file(path, c, params, &why))
    user_error("%s %s: %s; nothing was replaced. HINT: choose a writable path with free space", flag, path.c_str(),
               why.c_str());
}

size_t save_model_from_units(Comm& comm, const std::string& path, const GPTConfig& cfg, const Layout& layout, DType dt,
                             bool writer, const std::function<const void*(int u)>& acquire,
                             const std::function<void(int u)>& release, std::string* error) {
  std::vector<float> all;  // Ψ floats, built on the writer only
  for (int u = 0; u < layout.num_units(); u++) {
    const Unit& unit = layout.units[u];
    const void* p = acquire(u);
    if (writer) {  // the unit's padding is left out: the file holds exactly Ψ parameters
      std::vector<char> raw(unit.numel * dtype_bytes(dt));
      copy_bytes(raw.data(), Location::Host, p, Location::Device, raw.size());
      size_t at = all.size();
      all.resize(at + unit.numel);
      NZ_DISPATCH_TRAIN_DTYPE(dt, cpu::cast<float, T>(all.data() + at, (const T*)raw.data(), unit.numel));
    }
    release(u);
    heartbeat();
  }
  error->clear();
  if (writer) write_model_file(path, cfg, all, error);
  // every rank learns the writer's verdict (rank 0), so all end the run the same way
  *error = comm.control_broadcast(*error);
  return all.size();
}

size_t first_non_finite(const float* p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!std::isfinite(p[i])) return i;
  return n;
}

std::string element_name(const Layout& L, int u, size_t k) {
  const Unit& unit = L.units[u];
  for (const TensorSpec& t : unit.tensors)
    if (k >= t.offset && k < t.offset + t.numel)
      return "unit " + unit.name + ", " + t.name + "[" + std::to_string(k - t.offset) + "]";
  return "unit " + unit.name + ", padding element " + std::to_string(k);
}

void load_model(const std::string& path, GPTConfig* c, std::vector<float>* params, const char* flag) {
  const char* p = path.c_str();
  struct stat st;
  if (stat(p, &st) != 0)
    user_error("%s %s: cannot open (%s); give a file written by --save-model", flag, p, strerror(errno));
  if (!S_ISREG(st.st_mode))
    user_error("%s %s: not a regular file; give a file written by --save-model", flag, p);
  if (is_pruned_file(path)) {  // a pruned model (pruned_file.h): its pruned weights are 0
    std::vector<uint8_t> keep;
    return load_pruned(path, c, params, &keep, flag);
  }
  FILE* f = fopen(p, "rb");
  if (!f) user_error("%s %s: cannot open (%s); give a file written by --save-model", flag, p, strerror(errno));
  const uint64_t size = uint64_t(st.st_size);
  char magic[8];
  uint32_t version = 0;
  int32_t h[5];
  uint64_t n = 0;
  if (fread(magic, 1, 8, f) != 8 || memcmp(magic, kModelMagic, 8) != 0) {
    fclose(f);
    user_error("%s %s: not a nanoZeRO model file (bad magic). HINT: write one with a trainer's --save-model PATH",
               flag, p);
  }
  if (fread(&version, 4, 1, f) != 1 || version < 1 || version > kModelVersion) {
    fclose(f);
    user_error("%s %s: model file version %u, this build reads versions 1..%u. HINT: save it again with this build",
               flag, p, version, kModelVersion);
  }
  if (fread(h, 4, 5, f) != 5 || fread(&n, 8, 1, f) != 1) {
    fclose(f);
    user_error("%s %s: truncated header. HINT: the file was cut short; save the model again", flag, p);
  }
  // The header is checked against sane limits and the file's size before anything is allocated.
  *c = GPTConfig{h[0], h[1], h[2], h[3], h[4]};
  const bool sane = c->vocab == 256 && c->ctx >= 1 && c->ctx <= (1 << 20) && c->layers >= 0 &&
                    c->layers <= 4096 && c->dim >= 1 && c->dim <= (1 << 16) && c->heads >= 1 &&
                    c->dim % c->heads == 0;
  if (!sane || n != param_count_formula(*c)) {
    fclose(f);
    user_error("%s %s: inconsistent header (vocab %d, context %d, %d layers, width %d, %d heads, %llu parameters; "
               "expected vocab 256, context <= 2^20, <= 4096 layers, width <= 2^16 divisible by heads, and the "
               "parameter count they imply). HINT: the file is damaged; save the model again",
               flag, p, h[0], h[1], h[2], h[3], h[4], (unsigned long long)n);
  }
  const uint64_t want = kModelHeaderBytes + 4 * n + (version >= 2 ? 4 : 0);
  if (size != want) {
    fclose(f);
    user_error("%s %s: %s: %llu bytes, the header implies %llu. HINT: the file was %s; save the model again", flag, p,
               size < want ? "truncated" : "unexpected bytes after the parameters", (unsigned long long)size,
               (unsigned long long)want, size < want ? "cut short" : "damaged");
  }
  params->resize(n);
  size_t got = fread(params->data(), 4, n, f);
  uint32_t stored = 0;
  bool have_crc = version < 2 || fread(&stored, 4, 1, f) == 1;
  fclose(f);
  if (got != n || !have_crc)
    user_error("%s %s: truncated while reading (%zu of %llu parameters). HINT: save the model again", flag, p, got,
               (unsigned long long)n);
  if (version < 2) {
    fprintf(stderr, "note: %s %s: a version 1 model file, which has no checksum; saving it again adds one\n", flag, p);
  } else {
    uint32_t crc = crc32c(0, kModelMagic, 8);
    crc = crc32c(crc, &version, 4);
    crc = crc32c(crc, h, sizeof h);
    crc = crc32c(crc, &n, 8);
    crc = crc32c(crc, params->data(), n * 4);
    if (crc != stored)
      user_error("%s %s: checksum mismatch (CRC-32C %08x, the file says %08x): the parameters are damaged. HINT: "
                 "save the model again, or consolidate it from a checkpoint",
                 flag, p, crc, stored);
  }
  // A diverged run saves NaN or Inf weights under a valid checksum: they would only give NaN logits.
  const size_t bad = first_non_finite(params->data(), n);
  if (bad < n) {
    const Layout L = make_layout(*c, 1);  // one rank: no padding, units back to back as in the file
    int u = 0;
    size_t at = 0;
    while (bad >= at + L.units[u].numel) at += L.units[u++].numel;
    user_error("%s %s: weight %zu (%s) is %g; expected finite weights (the run that saved it diverged). HINT: use a "
               "model from before the divergence (consolidate an earlier checkpoint) or train again with a lower --lr",
               flag, p, bad, element_name(L, u, bad - at).c_str(), double((*params)[bad]));
  }
}

}  // namespace nz
