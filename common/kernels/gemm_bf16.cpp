// gemm_bf16.cpp — bf16 products through oneDNN's matmul (see gemm_bf16.h for why).
#include "kernels/gemm_bf16.h"

#include <cstdlib>  // getenv
#include <cstring>  // strcmp, strstr
#include <map>      // the primitives made so far, one per shape
#include <string>
#include <tuple>

#include <omp.h>  // omp_in_parallel, omp_get_max_threads

#include "runtime/check.h"  // NZ_CHECK

#ifndef NZ_HAVE_DNNL  // built without oneDNN (make DNNL=0): bf16 products are always widened for sgemm
namespace nz::cpu {
bool bf16_gemm_available() { return false; }
const char* bf16_gemm_path() { return "widened to fp32 for sgemm (built without oneDNN)"; }
bool bf16_gemm(bool, bool, int, int, int, const bf16*, int, const bf16*, int, float*, int) { return false; }
}  // namespace nz::cpu
#else
#include <dnnl.hpp>  // dnnl::matmul (oneDNN, Debian's libdnnl-dev)

namespace nz::cpu {

namespace {

// A matmul primitive is built (its kernel chosen and generated for this shape) once, then run on
// new pointers every call: the training loop calls the same few shapes over and over.
struct Product {
  dnnl::matmul prim;
  dnnl::memory a, b, c;
  std::string impl;  // oneDNN's name for the kernel it chose, e.g. "brg:avx512_core_bf16"
};

using Shape = std::tuple<bool, bool, int, int, int, int, int, int, int>;  // ta tb M N K lda ldb ldc threads

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// A (rows, cols) matrix as oneDNN sees it: its element (i, j) at p[i * ld + j], or at p[j * ld + i]
// when it is stored transposed.
dnnl::memory::desc matrix(int rows, int cols, int ld, bool transposed, dnnl::memory::data_type dt) {
  using dims = dnnl::memory::dims;
  return dnnl::memory::desc(dims{rows, cols}, dt, transposed ? dims{1, ld} : dims{ld, 1});
}

// The primitive for one shape, or null when oneDNN has only its reference (plain loop) kernel for
// it here (then the widened sgemm is much faster) or none at all: oneDNN 2.x on a CPU without
// AVX512-BF16 (an AVX2 laptop, say) offers no bf16 matmul and throws instead of offering one.
// Every oneDNN error is caught here; none reaches the caller.
Product* product_for(const Shape& s) {
  static std::map<Shape, Product> made;
  static std::map<Shape, bool> refused;
  if (auto it = made.find(s); it != made.end()) return &it->second;
  if (refused.count(s)) return nullptr;
  const auto [ta, tb, M, N, K, lda, ldb, ldc, threads] = s;
  using dt = dnnl::memory::data_type;
  try {
    const auto a_md = matrix(M, K, lda, ta, dt::bf16), b_md = matrix(K, N, ldb, tb, dt::bf16);
    const auto c_md = matrix(M, N, ldc, false, dt::f32);
#if DNNL_VERSION_MAJOR >= 3
    dnnl::matmul::primitive_desc pd(engine(), a_md, b_md, c_md);
#else
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), engine());
#endif
    if (std::strstr(pd.impl_info_str(), "ref")) {
      refused[s] = true;
      return nullptr;
    }
    Product p{dnnl::matmul(pd), dnnl::memory(a_md, engine(), DNNL_MEMORY_NONE),
              dnnl::memory(b_md, engine(), DNNL_MEMORY_NONE), dnnl::memory(c_md, engine(), DNNL_MEMORY_NONE), pd.impl_info_str()};
    return &made.emplace(s, std::move(p)).first->second;
  } catch (const dnnl::error&) {  // no kernel for this shape on this CPU
    refused[s] = true;
    return nullptr;
  }
}

bool widen_requested() {
  const char* e = std::getenv("NZ_CPU_BF16_GEMM");
  return e && std::strcmp(e, "widen") == 0;
}

// Decided once per process, on a small product: does oneDNN have a real bf16 kernel on this CPU?
// "brg:avx512_core_bf16", "brg:avx512_core_amx", ... say yes; a reference kernel or an error says no.
// Either way every bf16 product of the run takes the same path (so a run never mixes the two
// summation orders), and bf16_gemm_path() says which.
struct Decision {
  bool hardware = false;
  std::string why;
};
const Decision& decision() {
  static const Decision d = [] {
    Decision r;
    if (widen_requested()) {
      r.why = "widened to fp32 for sgemm (NZ_CPU_BF16_GEMM=widen)";
      return r;
    }
    const Shape probe{false, false, 64, 64, 64, 64, 64, 64, omp_get_max_threads()};
    if (Product* p = product_for(probe)) {
      r.hardware = true;
      r.why = std::string("oneDNN on the CPU's bf16 instructions (") + p->impl + ")";
    } else {
      r.why = "widened to fp32 for sgemm (this CPU has no bf16 dot-product instructions oneDNN can use)";
    }
    return r;
  }();
  return d;
}

}  // namespace

bool bf16_gemm_available() { return decision().hardware; }

const char* bf16_gemm_path() { return decision().why.c_str(); }

bool bf16_gemm(bool ta, bool tb, int M, int N, int K, const bf16* a, int lda, const bf16* b, int ldb,
               float* c, int ldc) {
  NZ_CHECK(!omp_in_parallel(), "bf16_gemm: called from inside a parallel region");
  if (!decision().hardware || M == 0 || N == 0 || K == 0) return false;  // (the sgemm path handles empty shapes)
  // The thread count is part of the key: a primitive is built for the threads it will run on.
  Product* p = product_for(Shape{ta, tb, M, N, K, lda, ldb, ldc, omp_get_max_threads()});
  if (!p) return false;
  try {
    p->a.set_data_handle(const_cast<bf16*>(a));
    p->b.set_data_handle(const_cast<bf16*>(b));
    p->c.set_data_handle(c);
    static dnnl::stream stream(engine());
    p->prim.execute(stream, {{DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}});
    stream.wait();
  } catch (const dnnl::error& e) {  // a kernel that was made but cannot run: an internal error, said plainly
    NZ_CHECK(false, "bf16_gemm: oneDNN failed to run a %dx%dx%d product: %s (status %d); "
             "NZ_CPU_BF16_GEMM=widen avoids oneDNN", M, N, K, e.what(), int(e.status));
  }
  return true;
}

}  // namespace nz::cpu
#endif  // NZ_HAVE_DNNL
