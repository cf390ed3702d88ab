// compression_setup.h — the compression a run trains with, on any rung: --qat (the model computes with
// fake-quantized weights, qat.h) and --prune-mask (a pruned model fine-tuned under its mask,
// prune.h). The Trainer holds one and calls it where a run changes; no rung sees it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compression/prune.h"  // UnitMasks
#include "compression/qat.h"    // QatConfig
#include "layout.h"

namespace nz {

struct Args;              // input/cli.h
struct AdamWConfig;       // optim.h
class Buffer;             // ledger.h
class GPT;                // model.h
class OptimizerState;     // optim.h
struct CheckpointConfig;  // io/checkpoint.h

class Compression {
 public:
  explicit Compression(const Args& args);  // --qat's config
  QatConfig qat;                           // off: bits 0

  // Before the device is chosen: --prune-mask's file read and checked (a rung that does not take
  // it, a device that cannot apply it, a bad file, a wrong shape: one line each). takers: the rungs
  // that take it (stages.txt), for that line. Its identity, and --qat's, go into the checkpoints.
  void read(const Args& args, const char* rung, bool takes_mask, const std::string& takers, CheckpointConfig* ckpt);
  // Once the layout and the model exist: the model's fake quantization, and the mask on the model
  // (the gradient) and on AdamW (the update, the decay, the moments). print: say so (rank 0).
  void set_up(const Layout& L, GPT& model, AdamWConfig& adamw, bool print);
  // Unit u's initial weights (fp32, unpadded at the start of unit) from the pruned file; false
  // without one (the seed's then).
  bool initial_unit(const Layout& L, int u, float* unit) const;
  bool pruning() const { return masks_ != nullptr; }  // --prune-mask, once set up
  // After --resume: the pruned weights the rank holds set to 0 (a dense checkpoint fine-tuned
  // pruned from here on), in params (all units, or my slices) and the optimizer's master copy.
  void zero_pruned_held(const Layout& L, bool own_slices, int rank, const Buffer& params, size_t elem_bytes,
                        OptimizerState& opt) const;

 private:
  std::string mask_path_;
  std::vector<uint8_t> keep_;            // the pruned file's mask, model file order, until set_up
  std::shared_ptr<const UnitMasks> masks_;
  std::vector<float> pruned_params_;     // the pruned file's Ψ weights, model file order
};

}  // namespace nz
