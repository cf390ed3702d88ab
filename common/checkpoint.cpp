// checkpoint.cpp — writing and reading the model file, and collecting a trained model's units into it.
#include "checkpoint.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "check.h"
#include "kernels.h"  // cpu::cast, to widen bf16 parameters to fp32

namespace nz {

void save_model(const std::string& path, const GPTConfig& c, const std::vector<float>& params) {
  NZ_CHECK(params.size() == param_count_formula(c), "save_model: %zu parameters for a model of %zu",
           params.size(), param_count_formula(c));
  std::string tmp = path + ".tmp";
  FILE* f = fopen(tmp.c_str(), "wb");
  if (!f) user_error("--save-model %s: cannot write (%s); choose a writable path", path.c_str(), strerror(errno));
  int32_t hdr[5] = {c.vocab, c.ctx, c.layers, c.dim, c.heads};
  uint64_t n = params.size();
  bool ok = fwrite(kModelMagic, 1, 8, f) == 8 && fwrite(&kModelVersion, 4, 1, f) == 1 &&
            fwrite(hdr, 4, 5, f) == 5 && fwrite(&n, 8, 1, f) == 1 &&
            fwrite(params.data(), 4, n, f) == n;
  ok = (fclose(f) == 0) && ok;
  if (!ok) {
    remove(tmp.c_str());
    user_error("--save-model %s: write failed (disk full?); nothing was replaced", path.c_str());
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    remove(tmp.c_str());
    user_error("--save-model %s: cannot replace the file (%s)", path.c_str(), strerror(errno));
  }
}

size_t save_model_from_units(const std::string& path, const GPTConfig& cfg, const Layout& layout, DType dt,
                             bool writer, const std::function<const void*(int u)>& acquire,
                             const std::function<void(int u)>& release) {
  std::vector<float> all;  // Ψ floats, built on the writer only
  for (int u = 0; u < layout.num_units(); u++) {
    const Unit& unit = layout.units[u];
    const void* p = acquire(u);
    if (writer) {  // the unit's padding is left out: the file holds exactly Ψ parameters
      std::vector<char> raw(unit.numel * dtype_bytes(dt));
      copy_bytes(raw.data(), Location::Host, p, Location::Device, raw.size());
      size_t at = all.size();
      all.resize(at + unit.numel);
      if (dt == DType::F32) cpu::cast<float, float>(all.data() + at, (const float*)raw.data(), unit.numel);
      else cpu::cast<float, bf16>(all.data() + at, (const bf16*)raw.data(), unit.numel);
    }
    release(u);
  }
  if (writer) save_model(path, cfg, all);
  return all.size();
}

void load_model(const std::string& path, GPTConfig* c, std::vector<float>* params) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) user_error("--model %s: cannot open (%s); give a file written by --save-model", path.c_str(), strerror(errno));
  char magic[8];
  uint32_t version = 0;
  int32_t hdr[5];
  uint64_t n = 0;
  if (fread(magic, 1, 8, f) != 8 || memcmp(magic, kModelMagic, 8) != 0) {
    fclose(f);
    user_error("--model %s: not a nanoZeRO model file (bad magic). HINT: write one with a trainer's --save-model PATH",
               path.c_str());
  }
  if (fread(&version, 4, 1, f) != 1 || version != kModelVersion) {
    fclose(f);
    user_error("--model %s: model file version %u, this build reads version %u. HINT: save it again with this build",
               path.c_str(), version, kModelVersion);
  }
  if (fread(hdr, 4, 5, f) != 5 || fread(&n, 8, 1, f) != 1) {
    fclose(f);
    user_error("--model %s: truncated header. HINT: the file was cut short; save the model again", path.c_str());
  }
  *c = GPTConfig{hdr[0], hdr[1], hdr[2], hdr[3], hdr[4]};
  if (c->vocab <= 0 || c->ctx <= 0 || c->layers < 0 || c->dim <= 0 || c->heads <= 0 ||
      c->dim % c->heads != 0 || n != param_count_formula(*c)) {
    fclose(f);
    user_error("--model %s: inconsistent header (config and parameter count disagree). HINT: the file is damaged",
               path.c_str());
  }
  params->resize(n);
  size_t got = fread(params->data(), 4, n, f);
  char extra;
  bool trailing = fread(&extra, 1, 1, f) == 1;
  fclose(f);
  if (got != n)
    user_error("--model %s: truncated: %zu of %llu parameters present. HINT: the file was cut short; save the model again",
               path.c_str(), got, (unsigned long long)n);
  if (trailing)
    user_error("--model %s: unexpected bytes after the parameters. HINT: the file is damaged", path.c_str());
}

}  // namespace nz
