// host_adamw.h — AdamW on the CPU for ZeRO-Offload, its state in host memory or in files.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "optim.h"

namespace nz {

class Comm;  // comm.h

// Where offload's optimizer state lives beyond the device (offload_config fills it from the
// command line: --offload-dir, --offload-chunk).
struct OffloadConfig {  // from the command line: offload_config
  std::string dir;               // Location::Disk: the folder of the state files
  size_t chunk_elems = 1 << 20;  // Location::Disk: elements streamed per chunk
  const Comm* comm = nullptr;    // Location::Disk: the run's ranks, which agree on a failed reservation
};
struct Args;  // input/cli.h
OffloadConfig offload_config(const Args& a, const Comm& comm);  // --offload-dir, --offload-chunk

// The same AdamW for ZeRO-Offload, run by the CPU on state in host memory (or on disk): an fp32
// master of the owned slices (in fp32 mode too: the parameters themselves stay on the device), m
// and v, updated by the fast host kernel (cpu_adam.h, bitwise equal to the device's AdamW). The
// gradient slice is read from host memory, and the updated slice is written, in the storage type,
// to a host buffer for the trainer to copy up. Location::Disk: master, m and v live in files
// (offload_store.h), streamed through host buffers of offload.chunk_elems elements.
class DiskState;
class HostAdamW : public OptimizerState {
 public:
  HostAdamW(const Layout& L, std::vector<Slice> owned, DType param_dtype, Location where, const AdamWConfig& cfg,
            const OffloadConfig& offload);
  ~HostAdamW();
  // master = fp32(params) for unit u's owned slice; params_slice is in host memory.
  void init_master(int u, const void* params_slice);
  // One step on unit u's owned slice: grads_slice (host) in, updated params_out (host, storage
  // type) out. params_out may be grads_slice itself (each gradient is read before it is overwritten).
  void step(int u, const void* grads_slice, void* params_out, float lr, float grad_scale, int t);
  bool has_master() const override { return true; }  // the device's params cannot be updated in place
  void get(OptArray a, size_t at, size_t n, float* host) override;
  void put(OptArray a, size_t at, size_t n, const float* host) override;

 private:
  std::unique_ptr<DiskState> disk_;  // Location::Disk only
};

}  // namespace nz
