// The ordered key of a number: an unsigned integer of the element's width whose unsigned
// order is the order the sort, top_k and searchsorted put numbers in. Unsigned values as
// they are, signed ones with the sign bit flipped, floats with the usual sign twiddle, -0.0
// mapped onto +0.0 (equal keys, as numpy compares them) and every NaN onto the largest key
// (NaNs last, as numpy sorts them). Descending order complements the key. One copy, included
// by every kernel file that orders numbers (sort.cu, sort_pairs.cuh, top_k.cu, search.cu).
#pragma once

#include <cuda/std/bit>
#include <cuda/std/type_traits>

namespace csj::kernels {

template <class T>
using Bits = cuda::std::conditional_t<sizeof(T) == 4, unsigned int, unsigned long long>;

template <class T, bool Descending>
__device__ __forceinline__ Bits<T> ordered_key(T value) {
  using U = Bits<T>;
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

// Strict weak order of numbers through their ordered keys.
template <class T, bool Descending>
struct OrderedLess {
  __device__ __forceinline__ bool operator()(T a, T b) const {
    return ordered_key<T, Descending>(a) < ordered_key<T, Descending>(b);
  }
};

}  // namespace csj::kernels
