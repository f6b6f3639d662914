// RMS normalization and the gated MLP's activation, batch invariant by construction: each row
// is computed from that row alone, in one fixed order.
//
// rms_norm:    ss = hsum(eight-lane fma chain of x * x); r = 1 / sqrt(ss / N + eps);
//              y = (x * r) * weight
// act_and_mul: y = act(gate) * up with silu(g) = g / (1 + exp(-g)) and the tanh-approximated
//              GELU written the same way, g / (1 + exp(-2u)), u = sqrt(2/pi) (g + 0.044715 g^3)
#pragma once

#include <cmath>

#include "kernels.h"
#include "vec.h"

namespace dpgate {

template <class V, class T>
inline void rms_norm_rows(const NormArgs& g, int64_t row_begin, int64_t row_end) {
  using reg = typename V::reg;
  constexpr int L = V::L;
  const int64_t N = g.N;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const T* x = static_cast<const T*>(g.x) + row * N;
    T* out = static_cast<T*>(g.out) + row * N;
    reg acc = V::zero();
    for (int64_t c = 0; c < N; c += L) {
      const reg v = V::load(x + c);
      acc = V::fma(v, v, acc);
    }
    const float r = 1.0f / std::sqrt(V::hsum(acc) / float(N) + g.eps);
    const reg scale = V::set1(r);
    for (int64_t c = 0; c < N; c += L) {
      V::store(out + c, V::mul(V::mul(V::load(x + c), scale), V::load(g.weight + c)));
    }
  }
}

// sqrt(2 / pi) times 2: the tanh GELU is g * sigmoid(2u).
constexpr float kGeluTwoSqrtTwoOverPi = 1.5957691216057308f;
constexpr float kGeluCubic = 0.044715f;

template <class V, class T>
inline void act_and_mul_rows(const ActArgs& g, int64_t row_begin, int64_t row_end) {
  using reg = typename V::reg;
  constexpr int L = V::L;
  const int64_t I = g.I;
  const reg one = V::set1(1.0f), zero = V::zero();
  for (int64_t row = row_begin; row < row_end; ++row) {
    const T* gate = static_cast<const T*>(g.x) + row * 2 * I;
    const T* up = gate + I;
    T* out = static_cast<T*>(g.out) + row * I;
    for (int64_t c = 0; c < I; c += L) {
      const reg x = V::load(gate + c);
      reg z = x;
      if (g.activation == Activation::kGeluTanh) {
        const reg cube = V::mul(V::mul(x, x), x);
        z = V::mul(V::set1(kGeluTwoSqrtTwoOverPi), V::fma(V::set1(kGeluCubic), cube, x));
      }
      const reg activated = V::div(x, V::add(one, exp<V>(V::sub(zero, z))));
      V::store(out + c, V::mul(activated, V::load(up + c)));
    }
  }
}

template <class V>
inline void rms_norm_dispatch(const NormArgs& g, int64_t row_begin, int64_t row_end) {
  if (g.type == DType::kFloat32) rms_norm_rows<V, float>(g, row_begin, row_end);
  else rms_norm_rows<V, bf16_t>(g, row_begin, row_end);
}

template <class V>
inline void act_and_mul_dispatch(const ActArgs& g, int64_t row_begin, int64_t row_end) {
  if (g.type == DType::kFloat32) act_and_mul_rows<V, float>(g, row_begin, row_end);
  else act_and_mul_rows<V, bf16_t>(g, row_begin, row_end);
}

}  // namespace dpgate
