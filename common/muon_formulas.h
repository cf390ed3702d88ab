// muon_formulas.h — Muon (muon.h) counted without running it: which tensors are its matrices, which
// ranks' slices cut each one, and per rank what the optimizer holds and sends. The trainers' memory
// table and report, the tests and zero_estimate --optimizer muon use the same functions.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "layout.h"
#include "zero_formulas.h"  // Stage, StateBytes

namespace nz {

// Is tensor ts one of the blocks' 2-D hidden matrices Muon updates? (qkv_w, attproj_w, fc_w, fcproj_w)
bool is_muon_matrix(const TensorSpec& ts);
// Its shape (rows, cols), PyTorch's layout (outputs, inputs), for model width C.
std::pair<int, int> muon_matrix_shape(const TensorSpec& ts, int C);

// fp32 elements of Newton–Schulz's work space for a rows x cols matrix: X, X's next value, and three
// s x s matrices (s = min(rows, cols)).
uint64_t ns_work_elems(int rows, int cols);

// A Muon matrix and the ranks whose slices hold part of it (stages 1-3: slice r of unit u).
struct MuonMatrix {
  int unit = 0;
  std::string name;    // "block0.fc_w"
  int rows = 0, cols = 0;
  uint64_t begin = 0, end = 0;  // elements of the unit
  int first_rank = 0, last_rank = 0;  // its owners, first_rank..last_rank
  bool crosses() const { return last_rank > first_rank; }
};
std::vector<MuonMatrix> muon_matrices(const Layout& L);  // with L's world size's owners

// ---- the formulas (docs/muon.md), per rank r of layout L ----
// Muon elements in rank r's owned slices: all of them in stage0_ddp, else those of slice r.
uint64_t muon_owned_elems(Stage stage, const Layout& L, int rank);
// What a rank holds with Muon: the stage's AdamW formula with adam_v only for the AdamW elements
// (momentum and AdamW's m share adam_m: 4 bytes per owned element).
StateBytes muon_state_bytes(Stage stage, const Layout& L, DType dt, int rank);
// How stages 1-3 make a cut matrix whole (--muon-shard; docs/muon.md). Every design computes the same
// X and the same O: bit for bit stage0_ddp.
//   Owners         the owners of a cut matrix send each other their parts of X (point to point); each
//                  runs Newton–Schulz on the whole matrix (DeepSpeed's; the default);
//   GatherAll      one all-gather of X per block unit: every rank gets every matrix, and runs
//                  Newton–Schulz on those it owns part of (distributed Muon, the Moonlight report);
//   WholeMatrices  matrix k is orthogonalised by rank k mod N alone: its owners send it their parts
//                  of X, it sends each owner its part of O back (modded-nanoGPT's whole matrices).
enum class MuonShard { Owners, GatherAll, WholeMatrices };
bool parse_muon_shard(const std::string& s, MuonShard* out);
const char* muon_shard_name(MuonShard d);
// WholeMatrices: the rank that orthogonalises matrix k (k: its index in muon_matrices)
inline int muon_assignee(const Layout& L, int k) { return k % L.world; }
// GatherAll: the gathered unit of X (fp32), the largest unit that holds a Muon matrix
uint64_t muon_gathered_unit_elems(const Layout& L);
// Muon's work space (ledger: scratch, device), every rank: Newton–Schulz's for the largest matrix,
// and with GatherAll the gathered unit.
uint64_t muon_work_bytes(const Layout& L, MuonShard d = MuonShard::Owners);
// Elements rank r sends per step point to point (fp32). 0 in stage0_ddp.
//   Owners: its part of each cut matrix it owns part of, to each other owner;
//   WholeMatrices: its part of X of each matrix assigned to another rank, and, for each matrix
//   assigned to it, every other owner's part of O.
uint64_t muon_p2p_elems(Stage stage, const Layout& L, int rank, MuonShard d = MuonShard::Owners);
// GatherAll: elements each rank sends per step in the all-gathers of X: (N - 1) S_u per block unit.
uint64_t muon_gather_elems(Stage stage, const Layout& L, MuonShard d);
// Newton–Schulz FLOPs per step on rank r: every matrix in stage0_ddp; those it owns part of (Owners,
// GatherAll); those assigned to it (WholeMatrices).
uint64_t muon_ns_flops(Stage stage, const Layout& L, int rank, MuonShard d);
// Newton–Schulz's FLOPs (2 per multiply-add) for one rows x cols matrix, `steps` steps: its three products
uint64_t ns_flops(int rows, int cols, int steps = 5);

// "zero_estimate --optimizer muon": which matrices the slices cut, per rank memory and bytes sent.
std::string muon_estimate_text(const Layout& L, DType dt);
// The same as one JSON object (zero_estimate --optimizer muon --json, the explorer's Muon panel): the cut
// matrices, per stage adam_m and adam_v with AdamW and with Muon (lowest and highest rank), per design the
// elements sent, Newton–Schulz FLOPs (lowest and highest rank) and the work space.
std::string muon_estimate_json(const Layout& L, DType dt);

}  // namespace nz
