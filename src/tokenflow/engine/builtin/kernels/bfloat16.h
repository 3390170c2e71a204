// float32 <-> bfloat16 (held as uint16_t), shared by the kernels; float32 passes through.
#pragma once
#include <cstdint>
#include <cstring>

namespace tf {

inline float widen(float x) { return x; }
inline float widen(uint16_t x) {  // bfloat16 is float32's upper half
  const uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename T> inline T narrow(float x);
template <> inline float narrow<float>(float x) { return x; }
template <> inline uint16_t narrow<uint16_t>(float x) {  // round to nearest even, NaN kept quiet
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace tf
