// kernels_loss.cu — the fused softmax + cross-entropy at the end of the model, and the sum of
// squares that the global gradient norm (clipping) is built from.
#include "cuda_common.cuh"  // load/store, block_sum, block_max, scratch_buffer, NZ_CUDA_CHECK

namespace nz {
namespace cuda {
namespace {

// ---- softmax + cross-entropy ----
// One block per row of logits (BT,V): V is large (50257 for GPT-2), so 512 threads share a row.
// Three passes over the row: maximum, sum of exp(x - max), then probabilities.
//   loss = -log softmax(x)[target] = log(sum) - (x[target] - max)   (no log of a tiny probability)
constexpr int kSoftmaxBlock = 512;

template <class T>
__global__ void softmax_xent_forward_kernel(float* losses, T* probs, const T* logits,
                                            const int* targets, int V) {
  const size_t row = blockIdx.x;
  const T* x = logits + row * V;
  T* p = probs + row * V;
  // Read the target's logit first: when probs aliases logits, pass 3 overwrites it.
  const int target = targets[row];
  const float x_target = load(x[target]);

  float m = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, load(x[i]));
  const float row_max = block_max(m);

  float s = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) s += expf(load(x[i]) - row_max);
  const float sum = block_sum(s);  // its __syncthreads: every thread has read all of x by now

  const float inv_sum = 1.0f / sum;
  for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] = store<T>(expf(load(x[i]) - row_max) * inv_sum);
  if (threadIdx.x == 0) losses[row] = logf(sum) - (x_target - row_max);
}

// dlogits (BT,V) = (probs - onehot(target)) * dloss; dlogits may alias probs (same element, same thread)
template <class T>
__global__ void softmax_xent_backward_kernel(T* dlogits, const T* probs, const int* targets,
                                             float dloss, int V, size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / V;
    const int v = int(i % V);
    const float indicator = v == targets[row] ? 1.0f : 0.0f;
    dlogits[i] = store<T>((load(probs[i]) - indicator) * dloss);
  }
}

// ---- the vocabulary-parallel cross-entropy (tensor/tp_model.cpp): logits (N,ld), the first V columns
// of each row real. One block per row, as softmax_xent_forward_kernel: the max is exact in any order
// (the CPU's bits); the sum of exponentials is the block's fixed tree, not the CPU's serial order ----
template <class T>
__global__ void vocab_xent_max_kernel(float* row_max, const T* logits, int V, int ld) {
  const T* z = logits + size_t(blockIdx.x) * ld;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, load(z[j]));
  m = block_max(m);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <class T>
__global__ void vocab_xent_sums_kernel(float* row_max, float* sums, float* target, const float* maxes, int T_,
                                       int R, const T* logits, const int* targets, int lo, int V, int ld) {
  const size_t i = blockIdx.x;
  float M = -INFINITY;  // the global max: every thread takes it over the T ranks' maxima
  for (int r = 0; r < T_; r++) M = fmaxf(M, maxes[size_t(r) * R + i]);
  const T* z = logits + i * ld;
  float s = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(load(z[j]) - M);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const int tj = targets[i] - lo;
    row_max[i] = M, sums[i] = s, target[i] = tj >= 0 && tj < V ? load(z[tj]) : 0.0f;
  }
}

template <class T>
__global__ void vocab_xent_finish_kernel(float* losses, T* logits, const float* row_max, const float* sums,
                                         const float* target, int V, int ld) {
  const size_t i = blockIdx.x;
  const float M = row_max[i], S = sums[i];
  T* z = logits + i * ld;
  for (int j = threadIdx.x; j < ld; j += blockDim.x) z[j] = store<T>(j < V ? expf(load(z[j]) - M) / S : 0.0f);
  if (threadIdx.x == 0) losses[i] = logf(S) + M - target[i];
}

// d (N,ld) = (p - onehot(targets - lo)) * dloss, in place: a target another rank holds matches no column
template <class T>
__global__ void vocab_xent_backward_kernel(T* d, const int* targets, int lo, float dloss, int ld, size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const float indicator = targets[i / ld] - lo == int(i % ld) ? 1.0f : 0.0f;
    d[i] = store<T>((load(d[i]) - indicator) * dloss);
  }
}

// ---- sum of squares, in double, deterministically ----
// Pass 1: a FIXED grid (kSumBlocks x kSumThreads, whatever n is) — thread j adds x[j],
// x[j + 65536], ... in order, then each block sums its threads in a fixed tree.
// Pass 2: one block adds the kSumBlocks partial sums in a fixed tree.
// The order of every addition depends only on n, so the result has the same bits every run.
constexpr int kSumBlocks = 256;
constexpr int kSumThreads = 256;

template <class T>
__global__ void sum_squares_partial_kernel(double* partials, const T* x, size_t n) {
  double acc = 0.0;
  for (size_t i = blockIdx.x * size_t(kSumThreads) + threadIdx.x; i < n; i += size_t(kSumBlocks) * kSumThreads) {
    const double v = load(x[i]);
    acc += v * v;
  }
  const double block_total = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = block_total;
}

__global__ void sum_partials_kernel(double* result, const double* partials) {
  const double total = block_sum(partials[threadIdx.x]);  // blockDim.x == kSumBlocks
  if (threadIdx.x == 0) *result = total;
}

// ---- a batch's token losses added to a running total, in double, on the device ----
// One block: thread j adds x[j], x[j + kAddThreads], ... in order, then the block's fixed tree.
// (A few thousand numbers: one block is plenty, and the total never leaves the GPU until the host
// asks for it once per step.) Not the CPU's order, so the last bits of the loss differ from a CPU run.
constexpr int kAddThreads = 1024;

// (__launch_bounds__: 1024 threads a block, so at most 64 registers a thread; column_sum.cuh says why)
template <class A>
__global__ void __launch_bounds__(kAddThreads) add_sum_kernel(double* total, const A* x, size_t n, bool first) {
  double acc = 0.0;
  for (size_t i = threadIdx.x; i < n; i += kAddThreads) acc += double(x[i]);
  const double sum = block_sum(acc);
  if (threadIdx.x == 0) *total = first ? sum : *total + sum;
}

}  // namespace

template <class T>
void softmax_xent_forward(acc_t<T>* losses, T* probs, const T* logits, const int* targets, int BT,
                          int V) {
  if (BT == 0) return;
  softmax_xent_forward_kernel<T><<<BT, kSoftmaxBlock>>>(losses, probs, logits, targets, V);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void softmax_xent_backward(T* dlogits, const T* probs, const int* targets, float dloss, int BT, int V) {
  const size_t total = size_t(BT) * V;
  if (total == 0) return;
  softmax_xent_backward_kernel<T><<<grid_for(total, 256), 256>>>(dlogits, probs, targets, dloss, V, total);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void vocab_xent_max(float* row_max, const T* logits, int N, int V, int ld) {
  if (N == 0) return;
  vocab_xent_max_kernel<T><<<N, kSoftmaxBlock>>>(row_max, logits, V, ld);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void vocab_xent_sums(float* row_max, float* sums, float* target, const float* maxes, int T_, int R, const T* logits,
                     const int* targets, int lo, int N, int V, int ld) {
  if (N == 0) return;
  vocab_xent_sums_kernel<T><<<N, kSoftmaxBlock>>>(row_max, sums, target, maxes, T_, R, logits, targets, lo, V, ld);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void vocab_xent_finish(float* losses, T* logits, const float* row_max, const float* sums, const float* target, int N,
                       int V, int ld) {
  if (N == 0) return;
  vocab_xent_finish_kernel<T><<<N, kSoftmaxBlock>>>(losses, logits, row_max, sums, target, V, ld);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void vocab_xent_backward(T* d, const int* targets, int lo, float dloss, int N, int ld) {
  const size_t total = size_t(N) * ld;
  if (total == 0) return;
  vocab_xent_backward_kernel<T><<<grid_for(total, 256), 256>>>(d, targets, lo, dloss, ld, total);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
void sum_squares_to(double* result, const T* x, size_t n) {
  // (n = 0 too: the kernels then write 0) the kSumBlocks partial sums in the kernels' scratch buffer
  double* partials = static_cast<double*>(scratch_buffer(kSumBlocks * sizeof(double)));
  sum_squares_partial_kernel<T><<<kSumBlocks, kSumThreads>>>(partials, x, n);
  NZ_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kSumBlocks>>>(result, partials);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class A>
void add_sum_to(double* total, const A* x, size_t n, bool first) {
  add_sum_kernel<A><<<1, kAddThreads>>>(total, x, n, first);
  NZ_CUDA_CHECK_LAUNCH();
}

template <class T>
double sum_squares(const T* x, size_t n) {
  if (n == 0) return 0.0;
  // (kSumBlocks partial sums, then the result) in the kernels' scratch buffer
  double* partials = static_cast<double*>(scratch_buffer((kSumBlocks + 1) * sizeof(double)));
  double* result = partials + kSumBlocks;
  sum_squares_partial_kernel<T><<<kSumBlocks, kSumThreads>>>(partials, x, n);
  NZ_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kSumBlocks>>>(result, partials);
  NZ_CUDA_CHECK_LAUNCH();
  double host_result = 0.0;
  NZ_CUDA_CHECK(cudaMemcpy(&host_result, result, sizeof(double), cudaMemcpyDeviceToHost));  // waits
  return host_result;
}

// explicit instantiations: kernel_table.inc's entries with cuda file loss (float, bf16, fp16)
#define NZ_INSTANTIATE_CUDA_loss
#include "kernels/kernel_instantiate.inc"

}  // namespace cuda
}  // namespace nz
