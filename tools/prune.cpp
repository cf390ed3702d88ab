// prune — magnitude pruning of a trained model, written as a pruned model file (docs/compression.md).
//
//   build/bin/prune --model IN --out OUT --sparsity S [--method magnitude] [--scope per-matrix|global]
//
// IN is a model file (--save-model, consolidate) or a pruned file (pruned again: its pruned weights
// are 0, the smallest there are). The blocks' matrices lose the fraction S of their weights with
// the smallest |w| (prune.h: what is prunable and why); OUT holds the mask and the kept weights
// (io/pruned_file.h), and every tool that takes --model reads it. A trainer fine-tunes it with
// --prune-mask OUT, keeping the pruned weights at exactly 0. OUT is written atomically: on any
// error it is left as it was.
#include <sys/stat.h>  // stat: --out is not --model

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "io/model_file.h"   // load_model (either kind of file)
#include "io/pruned_file.h"  // write_pruned_file, pruned_file_bytes
#include "compression/prune.h"        // magnitude_prune
#include "runtime/check.h"   // user_error
#include "input/cli.h"     // check_output_file
#include "input/tool_flags.h"  // ToolFlags: the loop over argv

using namespace nz;

const char* const kUsage =
    "usage: prune --model IN --out OUT --sparsity S [--method magnitude] [--scope per-matrix|global]\n"
    "  --model     a model file, or a pruned model file\n"
    "  --out       the pruned model file to write: a bitmask and the kept weights (docs/files.md)\n"
    "  --sparsity  the fraction of the blocks' matrices to remove, 0 <= S < 1\n"
    "  --method    magnitude (the smallest |w|; the only one)\n"
    "  --scope     per-matrix (S of each matrix, default) or global (S of all of them together)\n";

int main(int argc, char** argv) {
  std::string model, out, method = "magnitude", scope = "per-matrix", sparsity_text;
  bool sparsity_given = false;
  for (ToolFlags f(argc, argv, "prune", kUsage); f.next();) {
    if (f.is("--model")) model = f.value();
    else if (f.is("--out")) out = f.value();
    else if (f.is("--sparsity")) sparsity_text = f.value(), sparsity_given = true;
    else if (f.is("--method")) method = f.value();
    else if (f.is("--scope")) scope = f.value();
    else f.unknown();
  }
  if (model.empty() || out.empty() || !sparsity_given)
    user_error("--model IN, --out OUT and --sparsity S are required; see prune --help");
  char* end = nullptr;
  errno = 0;
  const double sparsity = strtod(sparsity_text.c_str(), &end);
  if (end == sparsity_text.c_str() || *end || errno || !std::isfinite(sparsity) || sparsity < 0 || sparsity >= 1)
    user_error("--sparsity %s: expected a fraction 0 <= S < 1 (0.5 removes half of each matrix); give e.g. "
               "--sparsity 0.5", sparsity_text.c_str());
  if (method != "magnitude")
    user_error("--method %s: expected magnitude (the only method); drop --method", method.c_str());
  if (scope != "per-matrix" && scope != "global")
    user_error("--scope %s: expected per-matrix or global; give --scope per-matrix", scope.c_str());
  check_output_file("--out", out);
  struct stat in_st, out_st;  // one file under two spellings: the same device and inode
  if (stat(model.c_str(), &in_st) == 0 && stat(out.c_str(), &out_st) == 0 && in_st.st_dev == out_st.st_dev &&
      in_st.st_ino == out_st.st_ino)
    user_error("--out %s: the same file as --model, expected another path; the input is never overwritten",
               out.c_str());

  GPTConfig cfg;
  std::vector<float> params;
  load_model(model, &cfg, &params);
  const std::vector<uint8_t> keep =
      magnitude_prune(cfg, &params, sparsity, scope == "global" ? PruneScope::Global : PruneScope::PerMatrix);
  std::string why;
  if (!write_pruned_file(out, cfg, params, keep, &why))
    user_error("--out %s: %s; nothing was replaced. HINT: choose a writable path with free space", out.c_str(),
               why.c_str());
  size_t kept = 0;
  for (uint8_t k : keep) kept += k;
  const size_t n = params.size(), prunable = prunable_count(cfg);
  const uint64_t dense_bytes = kModelHeaderBytes + 4 * uint64_t(n) + 4;
  printf("%s -> %s: %zu of %zu prunable weights pruned (%.4f, %s), %zu of %zu parameters kept | %llu bytes "
         "(model file: %llu, %.3fx)\n",
         model.c_str(), out.c_str(), n - kept, prunable, double(n - kept) / double(prunable), scope.c_str(), kept, n,
         (unsigned long long)pruned_file_bytes(n, kept), (unsigned long long)dense_bytes,
         double(dense_bytes) / double(pruned_file_bytes(n, kept)));
  return 0;
}
