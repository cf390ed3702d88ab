// rung.h — what a rung hands the Trainer: where this rank stands (topology), its hooks, and its
// columns of stages.txt.
//
// The Trainer is the ladder's protocol (set-up, the step's bookkeeping, validation, the reports) and
// names no rung. A rung whose ranks are not simply N data-parallel replicas of the whole model (the
// pipeline: P segments x D replicas) hands it a Topology; a rung whose flags, validation, memory
// formulas or report differ from the stage's fills the hooks it needs (at set-up: a RungSetUp).
// Every other rung leaves them empty. What every rung answers alike (does it run on the GPU, does it
// take --prune-mask) is a column of its line in stages.txt.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "model.h"          // SeqSlices
#include "zero_formulas.h"  // StateBytes

namespace nz {

struct Args;     // input/cli.h
class Trainer;   // trainer.h

// Where this rank stands. The default: every rank a data-parallel replica of the whole model, one
// micro-batch's activations at a time.
struct Topology {
  int dp_world = 0, dp_rank = 0;      // the replicas that split the data, and mine (0: N, my rank)
  int first_unit = 0, end_unit = -1;  // the units this rank runs: [first, end) (-1: to the last)
  // the micro-batches whose activations the model keeps at once, for K micro-steps (empty: 1)
  std::function<int(int accum)> activation_slots;
  // The rung computes with a model of its own (tensor/): the Trainer's model then holds only the
  // batch's first position (one position's buffers), which evaluation hands it.
  bool own_model = false;
  // sequence slices (ulysses): the model holds my slice of every sequence (model.h, SeqSlices), and
  // the layout is padded for all dp_world x seq.slices ranks, which shard the model states together
  SeqSlices seq;
};
// A rung's topology, from the command line and the world: called once the command line is read,
// before anything is sized (a split that cannot be made is one line there).
using TopologyOf = Topology (*)(const Args& args, int world, int rank);

// What a rung may put in place of the Trainer's defaults; each left empty keeps the default.
struct RungHooks {
  // The summed loss of the batch from a forward over every unit (validation). Default: the unit
  // loop over unit_access; a forward that crosses ranks returns 0 where the loss is not.
  std::function<double()> forward_loss;
  // The memory table's formulas for rank r. Default: the stage's, the same on every rank.
  std::function<StateBytes(int r)> state_formula;
  std::function<uint64_t(int r)> activation_formula;
  // One more object in the JSON report (--log-json): its key and its JSON text ("" for none), or,
  // where the text is known only at the end, report_of makes it then (on rank 0 alone: no collective).
  std::string report_key, report_json;
  std::function<std::string()> report_of;
  // The model-state bytes per rank of layout L, where the rung holds more than its stage (the fits
  // check, --batch auto, the memory table, the report). Default: expected_state_bytes(stage).
  std::function<StateBytes(const Layout& L, DType dt)> model_state_bytes;
  // An optimizer whose state and messages differ from rank to rank (Muon, common/muon.cpp): the
  // elements rank r sends per step beyond the stage's collectives, and its work space (ledger:
  // scratch, device). Set, the report's "formula" is rank 0's (state_formula(0) with these) and
  // "formula_ranks" holds every rank's; empty: the stage's formula, the same on every rank.
  std::function<uint64_t(int r)> optimizer_comm_elems, optimizer_work_bytes;
};
// A rung's set-up: called once the command line is read and the topology made, before anything is
// sized; its own flag checks (a bad one is one line) and the hooks the set-up needs already.
using RungSetUp = void (*)(Trainer& run);

// A rung's columns in stages.txt (its header says what each word means), compiled into the
// library: the facts the Trainer checks for every rung alike. A bare line, or none: the defaults.
struct RungColumns {
  bool prune_mask = false;  // "prune-mask": it fine-tunes a pruned model (takes --prune-mask)
  bool cpu_only = false;    // "cpu-only": it runs on the CPU backend only
};
RungColumns rung_columns(const std::string& rung);
// The rungs whose column is set, for a message: "stage0_ddp, stage1 or offload".
std::string rungs_with(bool RungColumns::*column);

}  // namespace nz
