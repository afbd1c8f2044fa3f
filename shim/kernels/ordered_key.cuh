// The sort's ordered key (see sort_engine.hpp), shared by every kernel that orders numbers as
// the sort does: the radix sorts and merges (sort.cu, sort_pairs.cuh) and the searches and
// selections that must agree with them.
#pragma once

#include <cuda/std/bit>
#include <cuda/std/type_traits>

namespace csj::kernels {

template <class T>
using OrderedBits = cuda::std::conditional_t<sizeof(T) == 4, unsigned int, unsigned long long>;

// Monotone in the order CUB's radix sort sorts by: unsigned values as they are, signed ones
// with the sign bit flipped, floats with the usual sign twiddle, -0.0 onto +0.0 and every NaN
// onto the largest key (NaNs last, as numpy). Descending order complements the key.
template <class T, bool Descending>
__device__ __forceinline__ OrderedBits<T> ordered_key(T value) {
  using U = OrderedBits<T>;
  constexpr U sign = U(1) << (sizeof(T) * 8 - 1);
  U key;
  if constexpr (cuda::std::is_floating_point_v<T>) {
    if (value != value) {
      key = ~U(0);
    } else if (value == T(0)) {
      key = sign;
    } else {
      const U bits = cuda::std::bit_cast<U>(value);
      key = (bits & sign) ? ~bits : (bits | sign);
    }
  } else if constexpr (cuda::std::is_signed_v<T>) {
    key = static_cast<U>(value) ^ sign;
  } else {
    key = static_cast<U>(value);
  }
  return Descending ? ~key : key;
}

template <class T, bool Descending>
struct OrderedLess {
  __device__ __forceinline__ bool operator()(T a, T b) const {
    return ordered_key<T, Descending>(a) < ordered_key<T, Descending>(b);
  }
};

}  // namespace csj::kernels
