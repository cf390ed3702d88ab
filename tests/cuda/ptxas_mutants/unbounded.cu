// unbounded.cu — a mutant for tests/cuda/ptxas_check.sh: the project's matrix-multiply kernels with
// every __launch_bounds__ taken away (as they were before the gate). matmul_tiled_kernel then uses
// more than 64 registers a thread with no bound, which the gate must refuse.
#undef __launch_bounds__
#define __launch_bounds__(...)
#include "common/kernels/cuda/kernels_matmul.cu"
