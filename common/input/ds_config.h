// ds_config.h — DeepSpeed's configuration file (--config ds_config.json), read as the command line.
//
// Each key that applies here becomes the flag it means (a table in ds_config.cpp,
// docs/deepspeed_config.md), and those flags are applied BEFORE the command line's: a flag given on the
// command line overrides the file. A config means what it means to DeepSpeed, as far as this
// project can do it:
//   - a key of DeepSpeed's that changes nothing here (a tuning knob such as overlap_comm, a
//     logging switch such as steps_per_print) is accepted with one note line saying what it does
//     in DeepSpeed and why nothing changes here;
//   - "auto" (the Hugging Face integration's placeholder) takes the value of the flag it stands
//     for from the command line; without that flag it is one line naming every flag to give;
//   - an absent section or key is DeepSpeed's default: no scheduler section is a constant
//     learning rate, no gradient_clipping is no clipping;
//   - a key this project cannot honour is one line naming it, exit 2; keys it does not know are
//     one line naming every one of them (ds_config.cpp's table of each section's keys);
//   - a file for another binary (its zero_optimization.stage, or an offload_optimizer given to a
//     binary that does not offload) is one line naming the binary to run, exit 2.
// The file itself is checked before it is opened (a regular file of at most 1 MiB: never a
// directory, a FIFO or a device) and may nest at most 32 levels deep; every value is checked for
// its type and range before it is used. An error from a value the file set names the key, never a
// flag the user did not type.
//
// train_batch_size = micro-batch x accumulation x world size needs the world size, so it is kept
// here and checked (or used to derive the missing one) once the ranks are known: resolve_batch()
// (cli.h; it sets the command line's batch and accumulation, so it lives with the command line).
#pragma once
#include <map>
#include <string>
#include <vector>

namespace nz {

// One flag a key of the file stands for.
struct ConfigFlag {
  std::string flag;   // "--batch"
  std::string value;  // "4"
  std::string key;    // where in the file: "train_micro_batch_size_per_gpu"
  std::string shown;  // the value as written in the file, for messages: "4"
};

struct DsConfig {
  std::vector<ConfigFlag> flags;    // in the file's order
  long long train_batch_size = 0;   // 0: not given, or "auto"
  std::vector<std::string> notes;   // one line per key that changes nothing here (printed by rank 0)
  // For zero_estimate --config: the binary the file is for, and zero_optimization's tuning knobs
  // as written ("reduce_bucket_size" -> "5e8", "auto", "true"); absent knobs are not listed.
  std::string binary;
  std::map<std::string, std::string> zero_knobs;
};

// Reads and checks `path` for the binary `program` (stage0_ddp, stage1, stage2, stage3, offload).
// command_line: the flags given on the command line (flag -> value), which "auto" takes its values
// from. program "": any binary (zero_estimate: the file says which; DsConfig::binary).
DsConfig read_ds_config(const std::string& path, const std::string& program,
                        const std::map<std::string, std::string>& command_line);


}  // namespace nz
