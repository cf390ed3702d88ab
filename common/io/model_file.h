// model_file.h — the model file: one self-describing file, written atomically, with a checksum.
// (The sharded training checkpoint, with optimizer state, is checkpoint.h.)
//
// Format (little-endian), documented in docs/files.md ("Model file"):
//   bytes 0..7    magic: the ASCII bytes "NZGPTMDL"
//   uint32        version (2; version 1 files, without the checksum, still load, with a note)
//   int32 x 5     vocab, ctx, layers, dim, heads
//   uint64        Ψ, the number of parameters
//   float32 x Ψ   every tensor, unpadded, in layout order: wte, wpe, then per block ln1_w, ln1_b,
//                 qkv_w, qkv_b, attproj_w, attproj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w,
//                 fcproj_b, then lnf_w, lnf_b (row-major, shapes as in model.h)
//   uint32        CRC-32C of every byte before it (version 2 only)
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "layout.h"

namespace nz {

class Comm;  // comm.h

constexpr char kModelMagic[8] = {'N', 'Z', 'G', 'P', 'T', 'M', 'D', 'L'};
constexpr uint32_t kModelVersion = 2;
constexpr size_t kModelHeaderBytes = 8 + 4 + 5 * 4 + 8;

// Writes a fresh temporary file, fsyncs it and renames it over PATH (atomic_file.h): a crash never
// leaves a half-written model file. params: Ψ floats in layout order. False and *why when it
// cannot be written (the disk full): PATH is then untouched and no temporary file is left.
bool write_model_file(const std::string& path, const GPTConfig& cfg, const std::vector<float>& params,
                      std::string* why);
// write_model_file, or one line (exit 2) naming `flag`, the option the path came from.
void save_model(const std::string& path, const GPTConfig& cfg, const std::vector<float>& params,
                const char* flag = "--save-model");
// The model file of a trained model whose parameters live unit by unit on the device, in storage
// type dt (what every stage holds). Collective: every rank calls it, because acquire(u) may gather
// unit u (stage3) and release(u) frees it again; only the writer (rank 0) widens each unit's
// numel elements to fp32, in layout order, and writes PATH with write_model_file. Returns Ψ, the
// number of parameters written (0 on the other ranks); *error is "" or, on every rank, why the
// writer could not write the file.
size_t save_model_from_units(Comm& comm, const std::string& path, const GPTConfig& cfg, const Layout& layout, DType dt,
                             bool writer, const std::function<const void*(int u)>& acquire,
                             const std::function<void(int u)>& release, std::string* error);
// Reads and checks a model file: the header against sane limits and against the file's size
// before anything is allocated, then the checksum, then that every weight is finite (a run that
// diverged saves NaN or Inf under a valid checksum). Anything wrong is one line with a HINT, exit 2.
// `flag` names the option the path came from. A pruned model file (pruned_file.h) is read too, its
// pruned weights 0.
void load_model(const std::string& path, GPTConfig* cfg, std::vector<float>* params, const char* flag = "--model");

// The first of n values that is NaN or infinite; n when every one is finite.
size_t first_non_finite(const float* p, size_t n);
// Element k of unit u, for messages: "unit block2, fc_w[17]".
std::string element_name(const Layout& L, int u, size_t k);

}  // namespace nz
