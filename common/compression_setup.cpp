// compression_setup.cpp — --qat's and --prune-mask's set-up for the Trainer (compression_setup.h).
#include "compression_setup.h"

#include <algorithm>  // std::copy
#include <cstdio>

#include "input/cli.h"         // Args
#include "io/checkpoint.h"     // CheckpointConfig: the identities
#include "io/crc32c.h"         // the mask's identity
#include "io/pruned_file.h"    // load_pruned
#include "model.h"             // GPT: set_qat, set_prune_mask
#include "optim.h"             // AdamWConfig, OptimizerState
#include "runtime/check.h"     // user_error
#include "runtime/device.h"    // current_device

namespace nz {

Compression::Compression(const Args& args) {
  qat = {args.qat_bits, size_t(args.qat_block), args.qat_skip_embed};
}

void Compression::read(const Args& args, const char* rung, bool takes_mask, const std::string& takers,
                       CheckpointConfig* ckpt) {
  // --qat: "none", or the bits, the block and the skip, e.g. int4/64/embedding-kept
  if (qat.on())
    ckpt->qat = "int" + std::to_string(qat.bits) + "/" + std::to_string(qat.block) +
                (qat.skip_embed ? "/embedding-kept" : "");
  if (args.prune_mask.empty()) return;
  mask_path_ = args.prune_mask;
  const char* p = mask_path_.c_str();
  if (!takes_mask)
    user_error("--prune-mask with %s: not built for this rung, expected %s; fine-tune the pruned model with one "
               "of those", rung, takers.c_str());
  if (args.device == "cuda")
    user_error("--prune-mask on cuda: the mask is applied by the CPU path only, expected --device cpu; run the "
               "fine-tuning with --device cpu");
  GPTConfig c;
  load_pruned(mask_path_, &c, &pruned_params_, &keep_, "--prune-mask");
  size_t pruned = 0;
  for (uint8_t k : keep_) pruned += !k;
  char id[48];  // the mask's identity in checkpoints: resuming drops or changes it only with --resume-changed
  snprintf(id, sizeof id, "%zu/%08x", pruned, crc32c(0, keep_.data(), keep_.size()));
  ckpt->prune = id;
  const GPTConfig& m = args.cfg;
  if (c.vocab != m.vocab || c.ctx != m.ctx || c.layers != m.layers || c.dim != m.dim || c.heads != m.heads)
    user_error("--prune-mask %s: a model of %d layers, width %d, %d heads, context %d; expected this run's %d "
               "layers, width %d, %d heads, context %d; give the --preset (and --layers, --dim, --heads) it was "
               "trained with", p, c.layers, c.dim, c.heads, c.ctx, m.layers, m.dim, m.heads, m.ctx);
}

void Compression::set_up(const Layout& L, GPT& model, AdamWConfig& adamw, bool print) {
  model.set_qat(qat);  // the same fake quantization in every trainer: no stage file sees it
  if (mask_path_.empty()) return;
  if (current_device() == Device::CUDA)  // --device auto found a GPU
    user_error("--prune-mask on cuda: the mask is applied by the CPU path only, expected --device cpu; run the "
               "fine-tuning with --device cpu");
  masks_ = unit_masks(L, keep_);
  keep_.clear();
  model.set_prune_mask(masks_);  // the gradient
  adamw.prune = masks_;          // the update, the decay, the moments
  if (print) {
    printf("pruned: %s, %zu of %zu weights pruned (%.4f of the prunable), starting from its weights\n",
           mask_path_.c_str(), masks_->pruned, L.num_params, double(masks_->pruned) / double(prunable_count(L.cfg)));
    fflush(stdout);
  }
}

bool Compression::initial_unit(const Layout& L, int u, float* unit) const {
  if (pruned_params_.empty()) return false;
  size_t first = 0;  // the pruned model's weights: file order, unpadded
  for (int k = 0; k < u; k++) first += L.units[k].numel;
  std::copy(pruned_params_.begin() + first, pruned_params_.begin() + first + L.units[u].numel, unit);
  return true;
}

void Compression::zero_pruned_held(const Layout& L, bool own_slices, int rank, const Buffer& params,
                                   size_t elem_bytes, OptimizerState& opt) const {
  const UnitMasks& masks = *masks_;
  for (int u = 0; u < L.num_units(); u++) {
    const Unit& unit = L.units[u];
    const Slice own = own_slices ? L.shard(u, rank) : L.full(u);
    const size_t at = own_slices ? unit.shard_offset : unit.offset;
    zero_pruned(masks, u, own.begin, own.size(), static_cast<char*>(params.data()) + at * elem_bytes, elem_bytes);
    if (!opt.has_master()) continue;  // the master copy too: bf16, and offload's in every precision
    const Slice os = opt.owned()[u];
    std::vector<float> master(os.size());
    opt.get(OptArray::Master, opt.state_offset(u), os.size(), master.data());
    zero_pruned(masks, u, os.begin, os.size(), master.data(), sizeof(float));
    opt.put(OptArray::Master, opt.state_offset(u), os.size(), master.data());
  }
}

}  // namespace nz
