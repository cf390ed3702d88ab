// decoder.cpp — one decode step of GPT with a KV cache (decoder.h).
#include "inference/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/check.h"
#include "kernels/ops.h"

namespace nz {

namespace {
// Byte offsets of one step's activations (rows of B): the same walk sizes the allocation and
// hands out the pointers. Nothing is kept from one layer to the next but the residual stream x.
struct StepLayout {
  size_t x, ln, mean, rstd, qkv, atty, res_att, fch, fchg, tmp, logits, probs, losses, total = 0;
  StepLayout(const GPTConfig& c, int B, DType dt) {
    const size_t C = c.dim, e = dtype_bytes(dt), a = dt == DType::F64 ? 8 : 4;
    auto take = [&](size_t bytes) {
      size_t off = total;
      total += (bytes + 63) / 64 * 64;
      return off;
    };
    x = take(B * C * e);  // the residual stream: embedding, then each block's output
    ln = take(B * C * e);
    mean = take(B * a);
    rstd = take(B * a);
    qkv = take(B * 3 * C * e);
    atty = take(B * C * e);
    res_att = take(B * C * e);
    fch = take(B * 4 * C * e);
    fchg = take(B * 4 * C * e);
    tmp = take(B * C * e);
    logits = take(size_t(B) * c.vocab * e);
    probs = take(size_t(B) * c.vocab * e);
    losses = take(B * a);
  }
};
enum BlockTensor { LN1W, LN1B, QKVW, QKVB, ATTPW, ATTPB, LN2W, LN2B, FCW, FCB, FCPW, FCPB };  // model.cpp's order
}  // namespace

Decoder::Decoder(const Layout& layout, DType dt, int B) : L_(layout), dt_(dt), B_(B) {
  NZ_CHECK(B >= 1, "decoder batch %d", B);
  kv_ = Buffer(Category::KVCache, Location::Device, kv_cache_bytes(layout.cfg, B, dt), "kv cache");
  acts_ = Buffer(Category::Activations, Location::Device, StepLayout(layout.cfg, B, dt).total, "decode step");
  tokens_ = Buffer(Category::Activations, Location::Device, (B * sizeof(int) + 63) / 64 * 64, "decode tokens");
  zeros_ = Buffer(Category::Activations, Location::Device, (B * sizeof(int) + 63) / 64 * 64, "decode targets");
  zeros_.zero();
}

void Decoder::set_step(const int* tokens, int pos, int b) {
  NZ_CHECK(b >= 1 && b <= B_, "decode step of %d rows, decoder allocated for %d", b, B_);
  NZ_CHECK(pos >= 0 && pos < L_.cfg.ctx, "position %d outside the context %d", pos, L_.cfg.ctx);
  b_ = b;
  pos_ = pos;
  copy_bytes(tokens_.data(), Location::Device, tokens, Location::Host, b * sizeof(int));
}

// dtype.h's NZ_DISPATCH_DTYPE less fp16: inference runs fp32, bf16 and fp64 (no loss to scale)
#define NZ_DECODER_DISPATCH(dt, ...)                                   \
  switch (dt) {                                                        \
    case DType::F32: { using T = float; __VA_ARGS__; break; }          \
    case DType::BF16: { using T = bf16; __VA_ARGS__; break; }          \
    case DType::F64: { using T = double; __VA_ARGS__; break; }         \
    default: fatal(__FILE__, __LINE__, "the decoder runs fp32, bf16 or fp64, not %s", dtype_name(dt)); \
  }

void Decoder::forward(int u, const void* p) { NZ_DECODER_DISPATCH(dt_, forward_t<T>(u, (const T*)p)); }
void Decoder::head_forward(const void* p) { NZ_DECODER_DISPATCH(dt_, head_forward_t<T>((const T*)p)); }

void Decoder::probs_row(int b, float* out) const {
  const StepLayout a(L_.cfg, B_, dt_);
  const int V = L_.cfg.vocab;
  const size_t e = dtype_bytes(dt_);
  std::vector<char> raw(V * e);
  copy_bytes(raw.data(), Location::Host, static_cast<const char*>(acts_.data()) + a.probs + size_t(b) * V * e,
             Location::Device, V * e);
  for (int i = 0; i < V; i++) {
    if (dt_ == DType::F32) out[i] = reinterpret_cast<const float*>(raw.data())[i];
    else if (dt_ == DType::BF16) out[i] = bf16_to_f32(reinterpret_cast<const bf16*>(raw.data())[i]);
    else out[i] = float(reinterpret_cast<const double*>(raw.data())[i]);
  }
}

void Decoder::fill_cache(int l, const void* qkv, int Tq, int T0, int b) {
  NZ_CHECK(T0 <= Tq && Tq <= L_.cfg.ctx && b <= B_, "prefill of %d positions of %d, %d rows", T0, Tq, b);
  const size_t e = dtype_bytes(dt_), C = L_.cfg.dim, Tc = L_.cfg.ctx;
  char* kcache = static_cast<char*>(kv_.data()) + size_t(l) * 2 * B_ * Tc * C * e;  // (B, Tc, C)
  char* vcache = kcache + size_t(B_) * Tc * C * e;
  for (int r = 0; r < b; r++)
    for (int t = 0; t < T0; t++) {
      const char* row = static_cast<const char*>(qkv) + (size_t(r) * Tq + t) * 3 * C * e;  // q | k | v
      copy_bytes(kcache + (r * Tc + t) * C * e, Location::Device, row + C * e, Location::Device, C * e);
      copy_bytes(vcache + (r * Tc + t) * C * e, Location::Device, row + 2 * C * e, Location::Device, C * e);
    }
}

#define ACT(T, off) reinterpret_cast<T*>(static_cast<char*>(acts_.data()) + (off))

// The decode-only ops, on this run's backend.
template <class T>
static void embedding_at(T* out, const int* tok, const T* wte, const T* wpe, int pos, int B, int C) {
#ifdef NZ_HAVE_CUDA
  if constexpr (!std::is_same_v<T, double>)
    if (current_device() == Device::CUDA) return decode_cuda::embedding_at<T>(out, tok, wte, wpe, pos, B, C);
#endif
  decode_cpu::embedding_at<T>(out, tok, wte, wpe, pos, B, C);
}
template <class T>
static void attention_at(T* out, const T* qkv, const T* k, const T* v, int pos, int B, int Tc, int C, int NH) {
#ifdef NZ_HAVE_CUDA
  if constexpr (!std::is_same_v<T, double>)
    if (current_device() == Device::CUDA) return decode_cuda::attention_at<T>(out, qkv, k, v, pos, B, Tc, C, NH);
#endif
  decode_cpu::attention_at<T>(out, qkv, k, v, pos, B, Tc, C, NH);
}

template <class T>
void Decoder::forward_t(int u, const T* p) {
  using A = acc_t<T>;
  const GPTConfig& c = L_.cfg;
  const int C = c.dim, B = b_, Tc = c.ctx;
  const StepLayout a(c, B_, dt_);
  T* x = ACT(T, a.x);  // (B,C)
  if (u == L_.embed_unit()) {
    // x (B,C) = wte[token] + wpe[pos]
    embedding_at<T>(x, tokens_.as<int>(), p, p + L_.units[u].tensors[1].offset, pos_, B, C);
    return;
  }
  if (u == L_.lnf_unit()) {
    ops::layernorm_forward<T>(ACT(T, a.ln), ACT(A, a.mean), ACT(A, a.rstd), x, p, p + C, B, C);
    return;
  }
  // block l, the row of position pos of every sequence (the same ops as GPT::forward, B rows)
  const int l = u - 1;
  const std::vector<TensorSpec>& t = L_.units[u].tensors;
  auto W = [&](int i) { return p + t[i].offset; };
  T* kcache = static_cast<T*>(kv_.data()) + size_t(l) * 2 * B_ * Tc * C;  // (B, Tc, C)
  T* vcache = kcache + size_t(B_) * Tc * C;
  T* qkv = ACT(T, a.qkv);
  T* res_att = ACT(T, a.res_att);
  ops::layernorm_forward<T>(ACT(T, a.ln), ACT(A, a.mean), ACT(A, a.rstd), x, W(LN1W), W(LN1B), B, C);
  ops::matmul_forward<T>(qkv, ACT(T, a.ln), W(QKVW), W(QKVB), B, C, 3 * C);
  // append this position's key and value: the only rows of K and V this step computes
  for (int b = 0; b < B; b++) {
    const size_t row = (size_t(b) * Tc + pos_) * C;
    copy_bytes(kcache + row, Location::Device, qkv + size_t(b) * 3 * C + C, Location::Device, C * sizeof(T));
    copy_bytes(vcache + row, Location::Device, qkv + size_t(b) * 3 * C + 2 * C, Location::Device, C * sizeof(T));
  }
  attention_at<T>(ACT(T, a.atty), qkv, kcache, vcache, pos_, B, Tc, C, c.heads);
  ops::matmul_forward<T>(res_att, ACT(T, a.atty), W(ATTPW), W(ATTPB), B, C, C);
  ops::residual_layernorm_forward<T>(res_att, ACT(T, a.ln), ACT(A, a.mean), ACT(A, a.rstd), x, res_att, W(LN2W),
                                     W(LN2B), B, C);
  ops::matmul_bias_gelu_forward<T>(ACT(T, a.fch), ACT(T, a.fchg), ACT(T, a.ln), W(FCW), W(FCB), B, C, 4 * C);
  ops::matmul_forward<T>(ACT(T, a.tmp), ACT(T, a.fchg), W(FCPW), W(FCPB), B, 4 * C, C);
  ops::residual_forward<T>(x, res_att, ACT(T, a.tmp), size_t(B) * C);  // the next block's input
}

template <class T>
void Decoder::head_forward_t(const T* wte) {
  using A = acc_t<T>;
  const GPTConfig& c = L_.cfg;
  const StepLayout a(c, B_, dt_);
  // logits (B,V) = lnf (B,C) @ wte^T, the tied head; then the same softmax as GPT::head_forward
  // (its loss, against byte 0, is not used)
  ops::matmul_forward<T>(ACT(T, a.logits), ACT(T, a.ln), wte, nullptr, b_, c.dim, c.vocab);
  ops::softmax_xent_forward<T>(ACT(A, a.losses), ACT(T, a.probs), ACT(T, a.logits), zeros_.as<int>(), b_,
                               c.vocab);
}

// ---------------------------------------------------------------- the CPU decode ops

namespace decode_cpu {

template <class T>
void embedding_at(T* out, const int* tokens, const T* wte, const T* wpe, int pos, int B, int C) {
  for (int b = 0; b < B; b++)
    for (int c = 0; c < C; c++)
      out[size_t(b) * C + c] = store<T>(load(wte[size_t(tokens[b]) * C + c]) + load(wpe[size_t(pos) * C + c]));
}

// Row pos of nz::ref::attention_forward, reading K and V from the cache: the same loops in the
// same order, so the same bits.
template <class T>
void attention_at(T* out, const T* qkv, const T* kcache, const T* vcache, int pos, int B, int Tc, int C, int NH) {
  using A = acc_t<T>;
  const int hs = C / NH;
  const A scale = A(1) / std::sqrt(A(hs));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      std::vector<A> p(pos + 1);
      const T* q = qkv + size_t(b) * 3 * C + size_t(h) * hs;
      const T* k = kcache + size_t(b) * Tc * C + size_t(h) * hs;  // row t2 at + t2 * C
      const T* v = vcache + size_t(b) * Tc * C + size_t(h) * hs;
      A maxval = A(-INFINITY);
      for (int t2 = 0; t2 <= pos; t2++) {
        A dot = A(0);
        for (int i = 0; i < hs; i++) dot += load(q[i]) * load(k[size_t(t2) * C + i]);
        p[t2] = dot * scale;
        maxval = std::max(maxval, p[t2]);
      }
      A sum = A(0);
      for (int t2 = 0; t2 <= pos; t2++) {
        p[t2] = std::exp(p[t2] - maxval);
        sum += p[t2];
      }
      const A inv_sum = A(1) / sum;
      for (int t2 = 0; t2 <= pos; t2++) p[t2] = p[t2] * inv_sum;
      for (int i = 0; i < hs; i++) {
        A y = A(0);
        for (int t2 = 0; t2 <= pos; t2++) y += p[t2] * load(v[size_t(t2) * C + i]);
        out[size_t(b) * C + size_t(h) * hs + i] = store<T>(y);
      }
    }
}

#define NZ_INSTANTIATE(T)                                                                 \
  template void embedding_at<T>(T*, const int*, const T*, const T*, int, int, int);       \
  template void attention_at<T>(T*, const T*, const T*, const T*, int, int, int, int, int);
NZ_INSTANTIATE(float)
NZ_INSTANTIATE(bf16)
NZ_INSTANTIATE(double)
#undef NZ_INSTANTIATE

}  // namespace decode_cpu
}  // namespace nz
