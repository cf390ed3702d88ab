// pruned_file.cpp — writing and reading the pruned model file (pruned_file.h).
#include "io/pruned_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "io/atomic_file.h"
#include "io/crc32c.h"
#include "io/model_file.h"  // first_non_finite, element_name
#include "compression/prune.h"  // prunable: which bits may be 0
#include "runtime/check.h"

namespace nz {

bool write_pruned_file(const std::string& path, const GPTConfig& c, const std::vector<float>& params,
                       const std::vector<uint8_t>& keep, std::string* why) {
  const uint64_t n = params.size();
  NZ_CHECK(n == param_count_formula(c) && keep.size() == n, "write_pruned_file: %zu parameters, %zu mask bits for "
           "a model of %zu", params.size(), keep.size(), param_count_formula(c));
  std::vector<uint8_t> bits((n + 7) / 8, 0);
  std::vector<float> kept;
  for (uint64_t i = 0; i < n; i++)
    if (keep[i]) bits[i / 8] |= uint8_t(1u << (i % 8)), kept.push_back(params[i]);
  const uint64_t k = kept.size();
  int32_t hdr[5] = {c.vocab, c.ctx, c.layers, c.dim, c.heads};
  AtomicFile f(path);
  f.write(kPrunedMagic, 8) && f.write(&kPrunedVersion, 4) && f.write(hdr, sizeof hdr) && f.write(&n, 8) &&
      f.write(&k, 8) && f.write(bits.data(), bits.size()) && f.write(kept.data(), 4 * k);
  const uint32_t crc = f.crc();
  f.write(&crc, 4);
  if (f.commit()) return true;
  *why = f.error();
  return false;
}

bool is_pruned_file(const std::string& path) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) return false;
  char magic[8];
  const bool yes = fread(magic, 1, 8, f) == 8 && memcmp(magic, kPrunedMagic, 8) == 0;
  fclose(f);
  return yes;
}

void load_pruned(const std::string& path, GPTConfig* c, std::vector<float>* params, std::vector<uint8_t>* keep,
                 const char* flag) {
  const char* p = path.c_str();
  const char* hint = "HINT: write it again with build/bin/prune";
  struct stat st;
  if (stat(p, &st) != 0 || !S_ISREG(st.st_mode))
    user_error("%s %s: cannot open (%s); expected a pruned model file written by build/bin/prune", flag, p,
               stat(p, &st) != 0 ? strerror(errno) : "not a regular file");
  FILE* f = fopen(p, "rb");
  if (!f) user_error("%s %s: cannot open (%s); expected a readable pruned model file", flag, p, strerror(errno));
  const uint64_t size = uint64_t(st.st_size);
  char magic[8];
  uint32_t version = 0;
  int32_t h[5];
  uint64_t n = 0, k = 0;
#define FAIL(...) (fclose(f), user_error(__VA_ARGS__))
  if (fread(magic, 1, 8, f) != 8 || memcmp(magic, kPrunedMagic, 8) != 0)
    FAIL("%s %s: not a pruned model file (bad magic), expected one written by build/bin/prune; %s", flag, p, hint);
  if (fread(&version, 4, 1, f) != 1 || version != kPrunedVersion)
    FAIL("%s %s: pruned file version %u, expected %u; %s", flag, p, version, kPrunedVersion, hint);
  if (fread(h, 4, 5, f) != 5 || fread(&n, 8, 1, f) != 1 || fread(&k, 8, 1, f) != 1)
    FAIL("%s %s: truncated header, expected %zu bytes of header; the file was cut short, %s", flag, p,
         kPrunedHeaderBytes, hint);
  // The header is checked against sane limits and the file's size before anything is allocated.
  *c = GPTConfig{h[0], h[1], h[2], h[3], h[4]};
  const bool sane = c->vocab == 256 && c->ctx >= 1 && c->ctx <= (1 << 20) && c->layers >= 0 && c->layers <= 4096 &&
                    c->dim >= 1 && c->dim <= (1 << 16) && c->heads >= 1 && c->dim % c->heads == 0;
  if (!sane || n != param_count_formula(*c) || k > n)
    FAIL("%s %s: inconsistent header (vocab %d, context %d, %d layers, width %d, %d heads, %llu parameters, %llu "
         "kept), expected vocab 256, sane sizes, the parameter count they imply and kept <= parameters; the file is "
         "damaged, %s", flag, p, h[0], h[1], h[2], h[3], h[4], (unsigned long long)n, (unsigned long long)k, hint);
  const uint64_t want = pruned_file_bytes(n, k);
  if (size != want)
    FAIL("%s %s: %llu bytes, expected %llu (a header of %zu, a mask of ceil(%llu/8), 4 x %llu kept values, a CRC); "
         "the file was %s, %s", flag, p, (unsigned long long)size, (unsigned long long)want, kPrunedHeaderBytes,
         (unsigned long long)n, (unsigned long long)k, size < want ? "cut short" : "damaged", hint);
  std::vector<uint8_t> bits((n + 7) / 8);
  std::vector<float> kept(k);
  uint32_t stored = 0;
  if (fread(bits.data(), 1, bits.size(), f) != bits.size() || fread(kept.data(), 4, k, f) != k ||
      fread(&stored, 4, 1, f) != 1)
    FAIL("%s %s: truncated while reading, expected %llu bytes; %s", flag, p, (unsigned long long)want, hint);
#undef FAIL
  fclose(f);
  uint32_t crc = crc32c(0, kPrunedMagic, 8);
  crc = crc32c(crc, &version, 4);
  crc = crc32c(crc, h, sizeof h);
  crc = crc32c(crc, &n, 8);
  crc = crc32c(crc, &k, 8);
  crc = crc32c(crc, bits.data(), bits.size());
  crc = crc32c(crc, kept.data(), 4 * k);
  if (crc != stored)
    user_error("%s %s: checksum mismatch (CRC-32C %08x, the file says %08x), expected an intact file: the mask or "
               "the weights are damaged; %s", flag, p, crc, stored, hint);
  // The mask itself, even under a valid checksum: its bit count, the bits past Ψ, the unprunable tensors.
  uint64_t ones = 0;
  for (uint8_t b : bits) ones += uint64_t(__builtin_popcount(b));
  const uint8_t tail = n % 8 ? uint8_t(bits.back() >> (n % 8)) : 0;
  if (ones != k || tail != 0)
    user_error("%s %s: damaged mask (%llu bits set%s, the header says %llu kept), expected one bit per kept "
               "parameter; %s", flag, p, (unsigned long long)ones, tail ? ", some past the last parameter" : "",
               (unsigned long long)k, hint);
  keep->assign(n, 0);
  params->assign(n, 0.0f);
  uint64_t j = 0;
  for (uint64_t i = 0; i < n; i++)
    if ((bits[i / 8] >> (i % 8)) & 1) (*keep)[i] = 1, (*params)[i] = kept[j++];
  const Layout L = make_layout(*c, 1);  // units back to back, as in the file
  for (int u = 0; u < L.num_units(); u++)
    for (const TensorSpec& t : L.units[u].tensors)
      for (size_t e = 0; e < t.numel && !prunable(t); e++)
        if (!(*keep)[L.units[u].offset + t.offset + e])
          user_error("%s %s: damaged mask: %s is marked pruned, expected only the blocks' matrices pruned (the "
                     "embeddings, biases and layernorms are always kept); %s", flag, p,
                     element_name(L, u, t.offset + e).c_str(), hint);
  const size_t bad = first_non_finite(params->data(), n);
  if (bad < n)
    user_error("%s %s: weight %zu is %g, expected finite weights; prune a model from before the divergence", flag,
               p, bad, double((*params)[bad]));
}

}  // namespace nz
