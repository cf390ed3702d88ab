// emu_catalogue.cu — broken kernels that give the right answer on the emulator unless its checks
// (NZ_EMU_CHECK, dev/emu/check.h) are on: each is a real bug on a GPU. tests/cuda/emu_sanitizer.sh
// runs every case twice: with its check on it must be reported ("emu-check: KIND:"), with every
// other check on it must give the right answer and no finding (so the check is what catches it).
//   emu_catalogue <case>    prints "ok: ..." and exits 0 when the answer is right
// Built by dev/emu.mk like dev/emu/selftest.cu; also a learner's example for `make emu-check`:
//   make emu-check CU=tests/cuda/emu_catalogue.cu ARGS=counter
//
//   case                  kind        the bug
//   counter               race        256 threads `*counter += 1` without an atomic
//   first_phase           race        thread 0 writes shared memory, the others read it, no barrier
//   across_blocks         race        block 1 reads what block 0 wrote in the same launch
//   async_double_buffer   race        a two-stage cp.async pipeline issues the next copy into the buffer
//                                     other threads still read (no barrier between)
//   wmma_no_syncwarp      race        lanes write a tile that load_matrix_sync reads, no __syncwarp
//   static_accumulator    uninit      a __shared__ accumulator never set to zero
//   fmaxf_hides_nan       uninit      a maximum over a buffer whose tail was never written
//   before_start          bounds      x[i - 1] read for i = 0
//   in_padding            bounds      x[n] read, inside the allocation's padding
//   misaligned_uint4      misaligned  a 16-byte store 8 bytes into a buffer
//   misaligned_float      misaligned  a float loaded from a 2-byte offset
//   copy_no_event         stream      a copy on stream 2 reads what a kernel on stream 1 writes, no event
//   pinned_no_sync        stream      the host reads a pinned buffer after cudaMemcpyAsync into it, no sync
//   pinned_reuse          stream      the host refills a pinned buffer a queued copy still reads from
//   comm_no_wait          stream      the comm-stream pattern of comm_nccl.cu with its cudaStreamWaitEvent
//                                     left out: the "collective" reads a gradient before the kernel
//                                     writing it is ordered before it
// and correct kernels that every check must pass silently:
//   atomic_counter        counter's fix: atomicAdd
//   streams_ordered       the four stream cases above, each with its event or synchronisation
//   warp_api              __shfl_sync, __shfl_up_sync, __shfl_down_sync (width 8), __ballot_sync,
//                         __any_sync, __all_sync, __activemask against their definitions
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

namespace wmma = nvcuda::wmma;

template <class T>
T* device(size_t n) {
  void* p = nullptr;
  if (cudaMalloc(&p, n * sizeof(T)) != cudaSuccess) {
    fprintf(stderr, "emu_catalogue: cudaMalloc failed\n");
    exit(1);
  }
  return static_cast<T*>(p);
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}
template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = device<T>(h.size());
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}
int verdict(bool right, const char* what) {
  printf("%s: %s\n", right ? "ok" : "wrong", what);
  return right ? 0 : 1;
}

// ---- races ----
__global__ void count(int* counter) { *counter += 1; }  // BUG: not atomic

__global__ void first_phase(float* out) {
  __shared__ float value[1];
  if (threadIdx.x == 0) value[0] = 42.0f;  // BUG: no __syncthreads before the others read it
  out[threadIdx.x] = value[0];
}

__global__ void across_blocks(float* buf) {
  if (blockIdx.x == 0) buf[threadIdx.x] = float(threadIdx.x);
  else buf[blockDim.x + threadIdx.x] = buf[threadIdx.x] * 2.0f;  // BUG: blocks are never ordered
}

// out[t] = sum over tiles k of in[k][n - 1 - t]: tile k is copied (cp.async, 4 bytes a thread) into
// buffer k % 2 while tile k - 1 is summed from the other one.
__global__ void async_double_buffer(float* out, const float* in, int tiles) {
  extern __shared__ float buf[];  // 2 buffers of blockDim.x floats
  const int t = threadIdx.x, n = blockDim.x;
  float sum = 0.0f;
  __pipeline_memcpy_async(buf + t, in + t, 4);
  __pipeline_commit();
  for (int k = 0; k < tiles; k++) {
    if (k + 1 < tiles) __pipeline_memcpy_async(buf + ((k + 1) % 2) * n + t, in + (k + 1) * n + t, 4);
    __pipeline_commit();
    __pipeline_wait_prior(1);  // tile k has landed (this thread's part)
    __syncthreads();
    sum += buf[(k % 2) * n + (n - 1 - t)];
    // BUG: no __syncthreads here: the next iteration's copy overwrites the buffer another thread
    // may still be reading
  }
  out[t] = sum;
}

__global__ void wmma_no_syncwarp(float* out) {
  extern __shared__ float tile[];  // 16 x 16 floats
  for (int e = threadIdx.x; e < 256; e += 32) tile[e] = float(e % 5);
  // BUG: no __syncwarp(): load_matrix_sync reads every lane's elements
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  wmma::load_matrix_sync(f, tile, 16, wmma::mem_row_major);
  wmma::store_matrix_sync(out, f, 16, wmma::mem_row_major);
}

__global__ void count_atomic(int* counter) { atomicAdd(counter, 1); }

// out[lane * 8 + i]: the warp functions' results for lane `lane` (one warp)
__global__ void warp_api(int* out) {
  const int lane = threadIdx.x;
  int* o = out + lane * 8;
  o[0] = __shfl_sync(0xffffffffu, lane * 10, 3);          // lane 3's value
  o[1] = __shfl_up_sync(0xffffffffu, lane, 1, 8);         // lane - 1 within groups of 8, else own
  o[2] = __shfl_down_sync(0xffffffffu, lane, 2, 8);       // lane + 2 within groups of 8, else own
  o[3] = int(__ballot_sync(0xffffffffu, lane % 3 == 0));  // lanes 0, 3, 6, ...
  o[4] = __any_sync(0xffffffffu, lane == 17);
  o[5] = __all_sync(0xffffffffu, lane < 31);
  o[6] = int(__activemask());
  o[7] = __shfl_xor_sync(0xffffffffu, lane, 5, 16);
}

// ---- stream order ----
__global__ void fill(float* x, float v, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = v + float(i);
}
__global__ void add_into(float* y, const float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

// ---- uninitialised ----
__global__ void static_accumulator(float* out, const float* x, int n) {
  __shared__ float total[1];  // BUG: never set to zero
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 0; i < n; i++) total[0] += x[i];
    out[0] = total[0];
  }
}

__global__ void max_of(float* out, const float* x, int n) {
  float m = -INFINITY;
  for (int i = 0; i < n; i++) m = fmaxf(m, x[i]);
  out[0] = m;
}

// ---- bounds ----
__global__ void differences(float* out, const float* x, int n) {
  const int i = threadIdx.x;
  const float prev = x[i - 1];  // BUG: i = 0 reads before the buffer
  if (i < n) out[i] = i == 0 ? x[0] : x[i] - prev;
}

__global__ void max_through(float* out, const float* x, int n) {
  float m = -INFINITY;
  for (int i = 0; i <= n; i++) m = fmaxf(m, x[i]);  // BUG: i == n is one past the end
  out[0] = m;
}

// ---- misaligned ----
__global__ void store_uint4(float* x) {
  char* p = reinterpret_cast<char*>(x) + 8;  // BUG: 8 bytes in, not 16-byte aligned
  *reinterpret_cast<uint4*>(p) = make_uint4(1u, 2u, 3u, 4u);
}

__global__ void load_float(float* out, const unsigned short* halves) {
  out[0] = *reinterpret_cast<const float*>(halves + 1);  // BUG: a float at a 2-byte offset
}

int run(const std::string& c) {
  if (c == "counter") {
    int* d = device<int>(1);
    cudaMemset(d, 0, sizeof(int));
    count<<<1, 256>>>(d);
    const int h = to_host(d, 1)[0];
    return verdict(h == 256, ("counter " + std::to_string(h) + " after 256 increments").c_str());
  }
  if (c == "first_phase") {
    float* d = device<float>(64);
    first_phase<<<1, 64>>>(d);
    int right = 0;
    for (float v : to_host(d, 64)) right += v == 42.0f;
    return verdict(right == 64, (std::to_string(right) + " of 64 threads read 42").c_str());
  }
  if (c == "across_blocks") {
    float* d = device<float>(64);
    across_blocks<<<2, 32>>>(d);
    const std::vector<float> h = to_host(d, 64);
    int right = 0;
    for (int t = 0; t < 32; t++) right += h[32 + t] == 2.0f * t;
    return verdict(right == 32, (std::to_string(right) + " of 32 values block 1 read from block 0").c_str());
  }
  if (c == "async_double_buffer") {
    const int n = 64, tiles = 4;
    std::vector<float> in(n * tiles);
    for (size_t i = 0; i < in.size(); i++) in[i] = float(i % 13);
    float *d_in = to_device(in), *d_out = device<float>(n);
    async_double_buffer<<<1, n, 2 * n * sizeof(float)>>>(d_out, d_in, tiles);
    const std::vector<float> out = to_host(d_out, n);
    int right = 0;
    for (int t = 0; t < n; t++) {
      float want = 0.0f;
      for (int k = 0; k < tiles; k++) want += in[k * n + (n - 1 - t)];
      right += out[t] == want;
    }
    return verdict(right == n, (std::to_string(right) + " of 64 sums right").c_str());
  }
  if (c == "wmma_no_syncwarp") {
    float* d = device<float>(256);
    wmma_no_syncwarp<<<1, 32, 256 * sizeof(float)>>>(d);
    int right = 0;
    const std::vector<float> h = to_host(d, 256);
    for (int e = 0; e < 256; e++) right += h[e] == float(e % 5);
    return verdict(right == 256, (std::to_string(right) + " of 256 tile elements right").c_str());
  }
  if (c == "static_accumulator") {
    const std::vector<float> x = {1, 2, 3, 4};
    float *d_x = to_device(x), *d_out = device<float>(1);
    static_accumulator<<<1, 32>>>(d_out, d_x, 4);
    const float h = to_host(d_out, 1)[0];
    return verdict(h == 10.0f, ("sum " + std::to_string(h) + ", want 10").c_str());
  }
  if (c == "fmaxf_hides_nan") {
    const int n = 8;
    float *d_x = device<float>(n), *d_out = device<float>(1);
    const std::vector<float> x = {3, 1, 4, 1, 5, 9};  // BUG: 6 of 8 elements written
    cudaMemcpy(d_x, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice);
    max_of<<<1, 1>>>(d_out, d_x, n);
    const float h = to_host(d_out, 1)[0];
    return verdict(h == 9.0f, ("maximum " + std::to_string(h) + ", want 9").c_str());
  }
  if (c == "before_start") {
    const std::vector<float> x = {1, 4, 9, 16};
    float *d_x = to_device(x), *d_out = device<float>(4);
    differences<<<1, 4>>>(d_out, d_x, 4);
    const std::vector<float> h = to_host(d_out, 4);
    return verdict(h[0] == 1 && h[1] == 3 && h[2] == 5 && h[3] == 7, "differences 1 3 5 7");
  }
  if (c == "in_padding") {
    const std::vector<float> x = {3, 1, 4, 1, 5};  // 20 bytes: the allocation is padded to 32
    float *d_x = to_device(x), *d_out = device<float>(1);
    max_through<<<1, 1>>>(d_out, d_x, 5);
    const float h = to_host(d_out, 1)[0];
    return verdict(h == 5.0f, ("maximum " + std::to_string(h) + ", want 5").c_str());
  }
  if (c == "misaligned_uint4") {
    float* d = device<float>(8);
    cudaMemset(d, 0, 8 * sizeof(float));
    store_uint4<<<1, 1>>>(d);
    unsigned h[8];
    cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
    return verdict(h[2] == 1 && h[5] == 4, "the 16 bytes stored at byte 8");
  }
  if (c == "misaligned_float") {
    const float one = 1.0f;
    std::vector<unsigned short> halves(4, 0);
    memcpy(&halves[1], &one, 4);
    unsigned short* d_h = to_device(halves);
    float* d_out = device<float>(1);
    load_float<<<1, 1>>>(d_out, d_h);
    return verdict(to_host(d_out, 1)[0] == 1.0f, "the float at byte 2 read back");
  }
  // Stream order: the buggy version, or with `ordered` the same with the event or sync it lacks.
  const bool ordered = c == "streams_ordered";
  bool all_right = true;  // streams_ordered: every case's answer
  if (c == "copy_no_event" || ordered) {
    const int n = 256;
    float *d_x = device<float>(n), *d_y = device<float>(n);
    cudaStream_t s1, s2;
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    cudaEvent_t written;
    cudaEventCreateWithFlags(&written, cudaEventDisableTiming);
    fill<<<1, n, 0, s1>>>(d_x, 1.0f, n);
    cudaEventRecord(written, s1);
    if (ordered) cudaStreamWaitEvent(s2, written, 0);  // BUG when left out: the copy may run first
    cudaMemcpyAsync(d_y, d_x, n * sizeof(float), cudaMemcpyDeviceToDevice, s2);
    cudaStreamSynchronize(s2);
    cudaStreamSynchronize(s1);
    const std::vector<float> h = to_host(d_y, n);
    const bool right = h[0] == 1.0f && h[n - 1] == float(n);
    if (!ordered) return verdict(right, "the copy holds what the kernel wrote");
    all_right &= right;
  }
  if (c == "pinned_no_sync" || ordered) {
    const int n = 1024;  // 4 KiB: a page of its own
    float* d_x = device<float>(n);
    float* h_x = nullptr;
    cudaMallocHost(reinterpret_cast<void**>(&h_x), n * sizeof(float));
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    fill<<<4, 256, 0, s>>>(d_x, 2.0f, n);
    cudaMemcpyAsync(h_x, d_x, n * sizeof(float), cudaMemcpyDeviceToHost, s);
    if (ordered) cudaStreamSynchronize(s);  // BUG when left out: the host reads before the copy is done
    const bool right = h_x[0] == 2.0f && h_x[n - 1] == float(n + 1);
    cudaStreamSynchronize(s);
    cudaFreeHost(h_x);
    if (!ordered) return verdict(right, "the host read the copied values");
    all_right &= right;
  }
  if (c == "pinned_reuse" || ordered) {
    const int n = 1024;
    float *d_a = device<float>(n), *d_b = device<float>(n);
    float* h_stage = nullptr;
    cudaMallocHost(reinterpret_cast<void**>(&h_stage), n * sizeof(float));
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (int i = 0; i < n; i++) h_stage[i] = 1.0f;
    cudaMemcpyAsync(d_a, h_stage, n * sizeof(float), cudaMemcpyHostToDevice, s);
    if (ordered) cudaStreamSynchronize(s);  // BUG when left out: the refill may land before the copy
    for (int i = 0; i < n; i++) h_stage[i] = 3.0f;
    cudaMemcpyAsync(d_b, h_stage, n * sizeof(float), cudaMemcpyHostToDevice, s);
    cudaStreamSynchronize(s);
    const float a = to_host(d_a, n)[n - 1], b = to_host(d_b, n)[n - 1];
    cudaFreeHost(h_stage);
    if (!ordered) return verdict(a == 1.0f && b == 3.0f, "each copy took the buffer's contents at its call");
    all_right &= a == 1.0f && b == 3.0f;
  }
  if (c == "comm_no_wait" || ordered) {
    // comm_nccl.cu's pattern: the compute stream (the default one) writes a gradient, the comm stream
    // waits for it (cudaEventRecord + cudaStreamWaitEvent), reduces it (a copy stands in for the
    // collective), and the compute stream waits for the comm stream before reading the result.
    const int n = 512;
    float *d_grad = device<float>(n), *d_sum = device<float>(n), *d_param = device<float>(n);
    cudaStream_t comm;
    cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking);
    cudaEvent_t inputs_ready, outputs_ready;
    cudaEventCreateWithFlags(&inputs_ready, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&outputs_ready, cudaEventDisableTiming);
    fill<<<2, 256>>>(d_param, 0.0f, n);
    fill<<<2, 256>>>(d_grad, 5.0f, n);
    cudaEventRecord(inputs_ready, 0);
    if (ordered) cudaStreamWaitEvent(comm, inputs_ready, 0);  // BUG when left out
    cudaMemcpyAsync(d_sum, d_grad, n * sizeof(float), cudaMemcpyDeviceToDevice, comm);
    cudaEventRecord(outputs_ready, comm);
    cudaStreamWaitEvent(0, outputs_ready, 0);
    add_into<<<2, 256>>>(d_param, d_sum, n);
    const std::vector<float> h = to_host(d_param, n);
    const bool right = h[0] == 5.0f && h[n - 1] == float(2 * n + 3);  // i + (5 + i)
    if (!ordered) return verdict(right, "the parameters took the reduced gradient");
    return verdict(all_right && right, "the four stream patterns, each ordered, right");
  }
  if (c == "atomic_counter") {
    int* d = device<int>(1);
    cudaMemset(d, 0, sizeof(int));
    count_atomic<<<4, 256>>>(d);
    const int h = to_host(d, 1)[0];
    return verdict(h == 1024, ("counter " + std::to_string(h) + " after 1024 atomic increments").c_str());
  }
  if (c == "warp_api") {
    int* d = device<int>(256);
    warp_api<<<1, 32>>>(d);
    const std::vector<int> h = to_host(d, 256);
    unsigned thirds = 0;
    for (int l = 0; l < 32; l += 3) thirds |= 1u << l;
    int wrong = 0;
    for (int l = 0; l < 32; l++) {
      const int* o = &h[l * 8];
      wrong += o[0] != 30;
      wrong += o[1] != (l % 8 >= 1 ? l - 1 : l);
      wrong += o[2] != (l % 8 + 2 < 8 ? l + 2 : l);
      wrong += unsigned(o[3]) != thirds;
      wrong += o[4] != 1 || o[5] != 0 || unsigned(o[6]) != 0xffffffffu;
      wrong += o[7] != (l ^ 5);
    }
    return verdict(wrong == 0, (std::to_string(wrong) + " wrong results of the warp functions").c_str());
  }
  fprintf(stderr, "emu_catalogue: unknown case '%s'\n", c.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: emu_catalogue <case> (the cases are listed at the top of tests/cuda/emu_catalogue.cu)\n");
    return 2;
  }
  return run(argv[1]);
}
