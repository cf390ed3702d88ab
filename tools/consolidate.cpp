// consolidate — merge a sharded checkpoint into one model file (docs/checkpoints.md).
//
//   build/bin/consolidate --ckpt DIR --out model.bin [--with-optimizer]
//
// DIR is one checkpoint (DIR/step-N) or a --ckpt-dir, whose newest valid checkpoint is taken. The
// checkpoint is verified (every shard's size and CRC-32C), then each unit's parameters are read
// from whichever shards hold them, whatever stage and world size wrote it, widened to fp32 and
// written as the model file every trainer's --save-model writes: the same bytes stage0_ddp saves
// at that step. --with-optimizer also writes OUT.adam_m, OUT.adam_v (and OUT.master in bf16) in
// the same format: Adam's moments and the fp32 master, unsharded, unpadded.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/check.h"       // user_error
#include "io/model_file.h"  // save_model: the model file
#include "io/checkpoint.h"        // find_checkpoint, CheckpointReader
#include "input/cli.h"         // check_output_file
#include "input/tool_flags.h"  // ToolFlags: the loop over argv
#include "kernels/kernels.h"     // cpu::cast (bf16 -> fp32)

using namespace nz;

const char* const kUsage =
    "usage: consolidate --ckpt DIR --out model.bin [--with-optimizer]\n"
    "  --ckpt            a checkpoint (DIR/step-N), or a --ckpt-dir: its newest valid checkpoint\n"
    "  --out             the model file to write (format: docs/files.md, 'Model file')\n"
    "  --with-optimizer  also OUT.adam_m, OUT.adam_v (and OUT.master in bf16), in the same format\n";

int main(int argc, char** argv) {
  std::string ckpt, out;
  bool with_optimizer = false;
  for (ToolFlags f(argc, argv, "consolidate", kUsage); f.next();) {
    if (f.is("--ckpt")) ckpt = f.value();
    else if (f.is("--out")) out = f.value();
    else if (f.is("--with-optimizer")) with_optimizer = true;
    else f.unknown();
  }
  if (ckpt.empty() || out.empty()) user_error("--ckpt DIR and --out FILE are required; see consolidate --help");
  // Every file it writes, checked before anything is read: none may land inside the checkpoint it reads.
  std::vector<std::string> outputs = {out};
  if (with_optimizer)
    for (const char* suffix : {".master", ".adam_m", ".adam_v"}) outputs.push_back(out + suffix);
  for (const std::string& o : outputs) {
    check_output_file("--out", o);
    check_not_inside("--out", o, "--ckpt", ckpt);
  }

  std::vector<std::string> notes;
  std::string why;
  const std::string dir = find_checkpoint(ckpt, &notes, &why);
  for (const std::string& n : notes) fprintf(stderr, "note: %s\n", n.c_str());
  if (dir.empty())
    user_error("--ckpt %s: %s. HINT: give a checkpoint (DIR/step-N) or a --ckpt-dir holding one", ckpt.c_str(),
               why.c_str());
  Manifest m;
  read_manifest(dir, &m, &why);
  CheckpointReader in(dir, m);
  const Layout& L = in.layout();

  std::vector<float> all(L.num_params);  // one array at a time: the params, then master, m, v
  // A diverged run's checkpoint (NaN, Inf under valid checksums) is no model: the first such value, named.
  auto check_finite = [&](const char* what) {
    const size_t bad = first_non_finite(all.data(), all.size());
    if (bad == all.size()) return;
    int u = 0;
    size_t at = 0;
    while (bad >= at + L.units[u].numel) at += L.units[u++].numel;
    user_error("--ckpt %s: %s %s is %g; expected finite values (the run diverged before this checkpoint). HINT: "
               "consolidate an earlier checkpoint (DIR/step-N)",
               dir.c_str(), what, element_name(L, u, bad - at).c_str(), double(all[bad]));
  };
  // Each unit's numel parameters (its padding left out), in layout order, as fp32.
  std::vector<char> raw;
  size_t at = 0;
  for (int u = 0; u < L.num_units(); u++) {
    const size_t n = L.units[u].numel;
    raw.resize(n * dtype_bytes(in.dtype()));
    in.params(u, 0, n, raw.data());
    NZ_DISPATCH_TRAIN_DTYPE(in.dtype(), cpu::cast<float, T>(all.data() + at, (const T*)raw.data(), n));
    at += n;
  }
  check_finite("parameter");
  save_model(out, m.cfg, all, "--out");
  printf("%s: step %d of a %s run on %d rank%s -> %s (%zu parameters, fp32)\n", dir.c_str(), m.step, m.stage.c_str(),
         m.world, m.world == 1 ? "" : "s", out.c_str(), all.size());
  if (!with_optimizer) return 0;
  struct Part {
    OptArray which;
    const char* suffix;
  };
  for (Part p : {Part{OptArray::Master, ".master"}, Part{OptArray::M, ".adam_m"}, Part{OptArray::V, ".adam_v"}}) {
    if (p.which == OptArray::Master && !in.has_master()) continue;  // fp32: the parameters are the master
    at = 0;
    for (int u = 0; u < L.num_units(); u++) {
      in.array(p.which, u, 0, L.units[u].numel, all.data() + at);
      at += L.units[u].numel;
    }
    check_finite(p.suffix + 1);
    save_model(out + p.suffix, m.cfg, all, "--out");
    printf("  and %s%s\n", out.c_str(), p.suffix);
  }
  return 0;
}
