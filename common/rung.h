// rung.h — what a rung hands the Trainer: where this rank stands (topology), and its hooks.
//
// The Trainer is the ladder's protocol (set-up, the step's bookkeeping, validation, the reports) and
// names no rung. A rung whose ranks are not simply N data-parallel replicas of the whole model (the
// pipeline: P stages x D replicas) hands it a Topology; a rung whose validation, memory formulas or
// report differ from the stage's fills the hooks it needs. Every other rung leaves both empty.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "model.h"          // SeqSlices
#include "zero_formulas.h"  // StateBytes

namespace nz {

struct Args;  // input/cli.h

// Where this rank stands. The default: every rank a data-parallel replica of the whole model, one
// micro-batch's activations at a time.
struct Topology {
  int dp_world = 0, dp_rank = 0;      // the replicas that split the data, and mine (0: N, my rank)
  int first_unit = 0, end_unit = -1;  // the units this rank runs: [first, end) (-1: to the last)
  // the micro-batches whose activations the model keeps at once, for K micro-steps (empty: 1)
  std::function<int(int accum)> activation_slots;
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
  // One more object in the JSON report (--log-json): its key and its JSON text ("" for none).
  std::string report_key, report_json;
};

}  // namespace nz
