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
// Newton–Schulz's work space (ledger: scratch, device): for the largest Muon matrix, every rank.
uint64_t muon_work_bytes(const Layout& L);
// Elements rank r sends per step point to point: its part of each cut matrix it owns part of, to
// each other owner. 0 in stage0_ddp.
uint64_t muon_p2p_elems(Stage stage, const Layout& L, int rank);
// Newton–Schulz's FLOPs (2 per multiply-add) for one rows x cols matrix, `steps` steps: its three products
uint64_t ns_flops(int rows, int cols, int steps = 5);

// "zero_estimate --optimizer muon": which matrices the slices cut, per rank memory and bytes sent.
std::string muon_estimate_text(const Layout& L, DType dt);

}  // namespace nz
