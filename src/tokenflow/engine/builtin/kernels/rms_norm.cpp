// RMSNorm of a decode step's rows, optionally after the residual add, for the built-in engine on
// the CPU: one pass where PyTorch runs a cast, a square, a mean, an add, a reciprocal square
// root, two products and a cast back (each its own kernel on a few rows).
//
// The roundings are transformers' (LlamaRMSNorm): the residual sum rounded to the model's
// dtype; the row normalised in float32 and rounded to the dtype; then scaled by the weight and
// rounded again (bfloat16: to nearest even).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "bfloat16.h"

namespace {

template <typename T> inline float round_to(float x) { return tf::widen(tf::narrow<T>(x)); }

template <typename T>
void run(const T* x, const T* residual, const T* weight, T* sum_out, T* out, int64_t rows, int64_t hidden,
         float eps, int threads) {
  const bool parallel = rows * hidden >= (1 << 16);
#pragma omp parallel for num_threads(threads) if (parallel)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * hidden;
    T* orow = out + r * hidden;
    const T* src = xr;
    if (residual != nullptr) {  // h = x + residual, rounded to T, kept as the new residual stream
      const T* rr = residual + r * hidden;
      T* sr = sum_out + r * hidden;
#pragma omp simd
      for (int64_t i = 0; i < hidden; ++i) sr[i] = tf::narrow<T>(tf::widen(xr[i]) + tf::widen(rr[i]));
      src = sr;
    }
    float squares = 0.f;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < hidden; ++i) { const float v = tf::widen(src[i]); squares += v * v; }
    const float scale = 1.f / std::sqrt(squares / static_cast<float>(hidden) + eps);
#pragma omp simd
    for (int64_t i = 0; i < hidden; ++i)
      orow[i] = tf::narrow<T>(tf::widen(weight[i]) * round_to<T>(tf::widen(src[i]) * scale));
  }
}

}  // namespace

// x, residual (may be null), sum_out (written where residual is given), out: [rows, hidden]
// contiguous; weight: [hidden]. bfloat16: 1 for bfloat16 tensors, 0 for float32.
extern "C" void tf_rms_norm(int bfloat16, const void* x, const void* residual, const void* weight, void* sum_out,
                            void* out, int64_t rows, int64_t hidden, float eps, int threads) {
  if (bfloat16)
    run(static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(residual), static_cast<const uint16_t*>(weight),
        static_cast<uint16_t*>(sum_out), static_cast<uint16_t*>(out), rows, hidden, eps, threads);
  else
    run(static_cast<const float*>(x), static_cast<const float*>(residual), static_cast<const float*>(weight),
        static_cast<float*>(sum_out), static_cast<float*>(out), rows, hidden, eps, threads);
}
