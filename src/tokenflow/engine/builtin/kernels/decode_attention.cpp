// One decode step's attention over the slot KV cache, for the built-in engine on the CPU.
//
// Row b writes this step's key and value at position ends[b] - 1 of its slot, then attends its
// query heads to positions [starts[b], ends[b]) of the slot, reading the cache in place
// (strided, no gather); the G query heads that share a kv head (grouped-query
// attention) read each key and value row once. Scores, softmax and the weighted sum are in
// float32 whatever the cache's dtype (bfloat16 rows are widened as they are read); the output
// is rounded once, to nearest even. Rows run in parallel over (row, kv head) pairs on OpenMP's
// threads (the same runtime as PyTorch's, which has already loaded it).
//
// Plain C ABI (called through ctypes): no PyTorch headers, and one instantiation per build.
// Why a kernel of our own: PyTorch's fused kernel and two batched products around a softmax
// both pay per (row, kv head) small product at a decode step's shapes (docs/performance.md).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "bfloat16.h"

namespace {

// Vectors of W float32 lanes (16: 64 bytes, 8: 32 bytes), and the bfloat16 and integer
// vectors of the same lane count; a head dim that is a multiple of 16 uses 16 lanes, else 8.
template <int W> struct Vec;
template <> struct Vec<16> {
  typedef float f __attribute__((vector_size(64)));
  typedef uint16_t h __attribute__((vector_size(32)));
  typedef uint32_t u __attribute__((vector_size(64)));
};
template <> struct Vec<8> {
  typedef float f __attribute__((vector_size(32)));
  typedef uint16_t h __attribute__((vector_size(16)));
  typedef uint32_t u __attribute__((vector_size(32)));
};

template <int W>
inline typename Vec<W>::f load(const float* p) {
  typename Vec<W>::f v; std::memcpy(&v, p, sizeof v); return v;
}
template <int W>
inline typename Vec<W>::f load(const uint16_t* p) {
  typename Vec<W>::h h; std::memcpy(&h, p, sizeof h);
  typename Vec<W>::u w = __builtin_convertvector(h, typename Vec<W>::u) << 16;  // bfloat16 is float32's upper half
  typename Vec<W>::f v; std::memcpy(&v, &w, sizeof v); return v;
}
template <int W>
inline float hsum(typename Vec<W>::f v) {
  float s = 0.f;
  for (int i = 0; i < W; ++i) s += v[i];
  return s;
}
struct Args {
  const void* q; void* k; void* v; void* out;
  int64_t ks0, ks1, ks2, vs0, vs1, vs2;
  const void* k_new; const void* v_new;  // this step's keys/values, [batch, kv_heads, dim]
  int64_t kn0, kn1, vn0, vn1;
  const int64_t* starts; const int64_t* ends;
  int64_t batch, kv_heads;
  float scale;
  int threads;
};

template <typename T, int G, int D>
void run(const Args& a) {
  constexpr int W = D % 16 == 0 ? 16 : 8;
  constexpr int C = D / W;
  typedef typename Vec<W>::f vf;
  const T* qp = static_cast<const T*>(a.q);
  T* kp = static_cast<T*>(a.k);
  T* vp = static_cast<T*>(a.v);
  const T* knp = static_cast<const T*>(a.k_new);
  const T* vnp = static_cast<const T*>(a.v_new);
  T* op = static_cast<T*>(a.out);
  const int64_t pairs = a.batch * a.kv_heads;
#pragma omp parallel num_threads(a.threads)
  {
    std::vector<float> scores;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < pairs; ++bh) {
      const int64_t b = bh / a.kv_heads, h = bh % a.kv_heads;
      const int64_t s = a.starts[b], n = a.ends[b] - s;
      T* ob = op + bh * G * D;
      // This step's key and value go in at the row's last position first (this pair's own
      // cache row: no other thread touches it).
      const int64_t last = a.ends[b] - 1;
      std::memcpy(kp + b * a.ks0 + h * a.ks1 + last * a.ks2, knp + b * a.kn0 + h * a.kn1, D * sizeof(T));
      std::memcpy(vp + b * a.vs0 + h * a.vs1 + last * a.vs2, vnp + b * a.vn0 + h * a.vn1, D * sizeof(T));
      if (n <= 0) {
        for (int i = 0; i < G * D; ++i) ob[i] = tf::narrow<T>(0.f);
        continue;
      }
      vf qv[G][C];
      const T* qb = qp + bh * G * D;
      for (int g = 0; g < G; ++g)
        for (int c = 0; c < C; ++c) qv[g][c] = load<W>(qb + g * D + c * W) * a.scale;
      scores.resize(static_cast<size_t>(G) * n);
      float top[G];
      for (int g = 0; g < G; ++g) top[g] = -INFINITY;
      const T* kb = kp + b * a.ks0 + h * a.ks1 + s * a.ks2;
      for (int64_t l = 0; l < n; ++l) {
        vf kr[C];
        for (int c = 0; c < C; ++c) kr[c] = load<W>(kb + l * a.ks2 + c * W);
        for (int g = 0; g < G; ++g) {
          vf acc = qv[g][0] * kr[0];
          for (int c = 1; c < C; ++c) acc += qv[g][c] * kr[c];
          const float x = hsum<W>(acc);
          scores[g * n + l] = x;
          top[g] = x > top[g] ? x : top[g];
        }
      }
      float inv[G];
      for (int g = 0; g < G; ++g) {
        float* sg = scores.data() + g * n;
        const float m = top[g];
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t l = 0; l < n; ++l) {
          const float e = std::exp(sg[l] - m);
          sg[l] = e;
          sum += e;
        }
        inv[g] = 1.f / sum;
      }
      vf acc[G][C];
      for (int g = 0; g < G; ++g)
        for (int c = 0; c < C; ++c) acc[g][c] = vf{};
      const T* vb = vp + b * a.vs0 + h * a.vs1 + s * a.vs2;
      for (int64_t l = 0; l < n; ++l) {
        vf vr[C];
        for (int c = 0; c < C; ++c) vr[c] = load<W>(vb + l * a.vs2 + c * W);
        for (int g = 0; g < G; ++g) {
          const float p = scores[g * n + l];
          for (int c = 0; c < C; ++c) acc[g][c] += p * vr[c];
        }
      }
      for (int g = 0; g < G; ++g)
        for (int c = 0; c < C; ++c)
          for (int i = 0; i < W; ++i) ob[g * D + c * W + i] = tf::narrow<T>(acc[g][c][i] * inv[g]);
    }
  }
}

}  // namespace

#if !defined(TF_GROUP) || !defined(TF_HEAD_DIM) || !defined(TF_BFLOAT16)
#error "build with -DTF_GROUP=<query heads per kv head> -DTF_HEAD_DIM=<dim> -DTF_BFLOAT16=<0|1>"
#endif

// Built for one model's shape (the defines above), so a build takes about a second.
// q: [batch, kv_heads, TF_GROUP, TF_HEAD_DIM] contiguous; k/v: the cache, element strides given
// for its slot, kv-head and position dims (its last dim contiguous), into which k_new/v_new
// ([batch, kv_heads, dim], strides given for the first two dims) are written at position
// ends[b] - 1 of slot b; out like q. slots and capacity are the cache's first and position dims.
// Returns 0; 1 where the call's dtype, group or head dim is not the build's; 2 where a row would
// read or write outside the cache (nothing is touched then).
extern "C" int tf_decode_attention(int bfloat16, const void* q, void* k, void* v, void* out,
                                   int64_t ks0, int64_t ks1, int64_t ks2, int64_t vs0, int64_t vs1,
                                   int64_t vs2, const void* k_new, const void* v_new, int64_t kn0,
                                   int64_t kn1, int64_t vn0, int64_t vn1, const int64_t* starts,
                                   const int64_t* ends, int64_t batch, int64_t kv_heads, int64_t group,
                                   int64_t dim, int64_t slots, int64_t capacity, float scale, int threads) {
  if (bfloat16 != TF_BFLOAT16 || group != TF_GROUP || dim != TF_HEAD_DIM) return 1;
  if (batch > slots) return 2;
  for (int64_t b = 0; b < batch; ++b)
    if (starts[b] < 0 || ends[b] < 1 || ends[b] > capacity) return 2;
  const Args a{q, k, v, out, ks0, ks1, ks2, vs0, vs1, vs2, k_new, v_new, kn0, kn1, vn0, vn1,
               starts, ends, batch, kv_heads, scale, threads};
  run<std::conditional_t<TF_BFLOAT16 == 1, uint16_t, float>, TF_GROUP, TF_HEAD_DIM>(a);
  return 0;
}
