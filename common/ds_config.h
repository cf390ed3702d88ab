// ds_config.h — DeepSpeed's configuration file (--config ds_config.json), read as the command line.
//
// Each key that applies here becomes the flag it means (a table in ds_config.cpp, README "DeepSpeed
// config files"), and those flags are applied BEFORE the command line's: a flag given on the
// command line overrides the file. A key this project does not have (or does not have yet) is one
// line naming it, exit 2: nothing in a config is silently ignored. A file for another binary (its
// zero_optimization.stage, or an offload_optimizer given to a binary that does not offload) is one
// line naming the binary to run, exit 2.
//
// train_batch_size = micro-batch x accumulation x world size needs the world size, so it is kept
// here and checked (or used to derive the missing one) once the ranks are known: resolve_batch().
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace nz {

struct Args;

struct DsConfig {
  std::vector<std::pair<std::string, std::string>> flags;  // {"--batch", "4"}, in the file's order
  long train_batch_size = 0;                               // 0: not given
};

// Reads and checks `path` for the binary `program` (stage0_ddp, stage1, stage2, stage3, offload).
DsConfig read_ds_config(const std::string& path, const std::string& program);

// train_batch_size against the micro-batch and accumulation in force (from the file or the command
// line) and the world size: checks them when all three are given, else derives the missing one
// (DeepSpeed's rule); one line and exit 2 when they cannot agree. A no-op without train_batch_size.
void resolve_batch(Args& a, int world);

}  // namespace nz
