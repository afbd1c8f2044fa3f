// The elementwise transform kernel, one source for both ways it is instantiated:
//  - with an operator linked at run time (LTO-IR from numba, see transform_jit.cu), and
//  - with a built-in C++ operator at build time (descriptor ops, see transform_builtin.cu).
// Values reach the operator by pointer (`op(in0, ..., out, scalar0, ...)`), the convention
// that also carries records; after inlining the pointers are registers.
#pragma once

#include <cuda/std/cstdint>
#include <cuda/std/type_traits>
#include <cuda/std/utility>

#include "params.hpp"

namespace csj::kernels {

// Wider values (tuple accumulators: aligned records of up to four fields) as raw words.
template <int Size>
struct alignas(element_alignment(Size)) Blob {
  unsigned int words[Size / 4];
};

// The type that moves a value of `Size` bytes: a machine word, else a blob.
template <int Size>
struct Word {
  using type = Blob<Size>;
};
template <>
struct Word<4> {
  using type = unsigned int;
};
template <>
struct Word<8> {
  using type = unsigned long long;
};

// Moves that builtins do only for machine words, word by word for blobs.
template <class T>
__device__ __forceinline__ T shuffle_down(const T& value, int offset) {
  if constexpr (cuda::std::is_arithmetic_v<T>) {
    return __shfl_down_sync(0xffffffffu, value, offset);
  } else {
    T out;
#pragma unroll
    for (int w = 0; w < int(sizeof(T) / 4); ++w) out.words[w] = __shfl_down_sync(0xffffffffu, value.words[w], offset);
    return out;
  }
}

template <class T>
__device__ __forceinline__ T load_cg(const T* pointer) {  // L2 only: written by other blocks
  if constexpr (cuda::std::is_arithmetic_v<T>) {
    return __ldcg(pointer);
  } else {
    T out;
#pragma unroll
    for (int w = 0; w < int(sizeof(T) / 4); ++w) out.words[w] = __ldcg(pointer->words + w);
    return out;
  }
}

template <class T>
__device__ __forceinline__ T load_volatile(const void* pointer) {
  if constexpr (cuda::std::is_arithmetic_v<T>) {
    return *static_cast<const volatile T*>(pointer);
  } else {
    T out;
#pragma unroll
    for (int w = 0; w < int(sizeof(T) / 4); ++w) out.words[w] = static_cast<const volatile unsigned int*>(pointer)[w];
    return out;
  }
}

template <class T>
__device__ __forceinline__ void store_volatile(void* pointer, const T& value) {
  if constexpr (cuda::std::is_arithmetic_v<T>) {
    *static_cast<volatile T*>(pointer) = value;
  } else {
#pragma unroll
    for (int w = 0; w < int(sizeof(T) / 4); ++w) static_cast<volatile unsigned int*>(pointer)[w] = value.words[w];
  }
}

// 16-byte aligned: the vector path moves whole lanes as uint4.
template <int Size>
struct alignas(16) Lane {
  typename Word<Size>::type value[kTransformItems];
};

// Loads this thread's items of one input: 16-byte vectors when the whole tile is in range
// and aligned, single words otherwise.
template <int Size>
__device__ __forceinline__ void load_lane(Lane<Size>& lane, const void* base, long long first,
                                          long long n, bool vector_path) {
  using W = typename Word<Size>::type;
  const W* data = static_cast<const W*>(base) + first;
  if (vector_path) {
    constexpr int kVectors = kTransformItems * Size / 16;
    const uint4* vectors = reinterpret_cast<const uint4*>(data);
    uint4* out = reinterpret_cast<uint4*>(lane.value);
#pragma unroll
    for (int v = 0; v < kVectors; ++v) out[v] = vectors[v];
  } else {
#pragma unroll
    for (int item = 0; item < kTransformItems; ++item) {
      if (first + item < n) lane.value[item] = data[item];
    }
  }
}

template <int Size>
__device__ __forceinline__ void store_lane(const Lane<Size>& lane, void* base, long long first,
                                           long long n, bool vector_path) {
  using W = typename Word<Size>::type;
  W* data = static_cast<W*>(base) + first;
  if (vector_path) {
    constexpr int kVectors = kTransformItems * Size / 16;
    uint4* vectors = reinterpret_cast<uint4*>(data);
    const uint4* in = reinterpret_cast<const uint4*>(lane.value);
#pragma unroll
    for (int v = 0; v < kVectors; ++v) vectors[v] = in[v];
  } else {
#pragma unroll
    for (int item = 0; item < kTransformItems; ++item) {
      if (first + item < n) data[item] = lane.value[item];
    }
  }
}

template <int... Sizes>
struct Lanes;
template <>
struct Lanes<> {};
template <int Head, int... Tail>
struct Lanes<Head, Tail...> {
  Lane<Head> head;
  Lanes<Tail...> tail;
};

template <int I, int Head, int... Tail>
__device__ __forceinline__ auto& lane_at(Lanes<Head, Tail...>& lanes) {
  if constexpr (I == 0) {
    return lanes.head;
  } else {
    return lane_at<I - 1>(lanes.tail);
  }
}

// Operators that declare `static constexpr bool kWantsIndex = true` also receive the global
// index of the element they produce.
template <class Op, class = void>
struct WantsIndex : cuda::std::false_type {};
template <class Op>
struct WantsIndex<Op, cuda::std::void_t<decltype(Op::kWantsIndex)>>
    : cuda::std::bool_constant<Op::kWantsIndex> {};

__device__ __forceinline__ bool aligned16(const void* pointer) {
  return (reinterpret_cast<cuda::std::uintptr_t>(pointer) & 15u) == 0;
}

// Op: a callable `op(const void* in_0, ..., void* out, const ScalarPack& scalars)`.
template <class Op, int OutSize, int... InSizes, cuda::std::size_t... I>
__device__ __forceinline__ void transform_tile(const TransformParams& params,
                                               cuda::std::index_sequence<I...>) {
  const long long first =
      (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * kTransformItems;
  const long long n = params.n;
  if (first >= n) return;
  const bool vector_path = first + kTransformItems <= n && aligned16(params.out) &&
                           (aligned16(params.inputs[I]) && ...);
  Lanes<InSizes...> in;
  (load_lane(lane_at<I>(in), params.inputs[I], first, n, vector_path), ...);
  Lane<OutSize> out;
  Op op;
#pragma unroll
  for (int item = 0; item < kTransformItems; ++item) {
    if (vector_path || first + item < n) {
      if constexpr (WantsIndex<Op>::value) {
        op(static_cast<const void*>(&lane_at<I>(in).value[item])..., &out.value[item],
           params.scalars, params.index_base + first + item);
      } else {
        op(static_cast<const void*>(&lane_at<I>(in).value[item])..., &out.value[item],
           params.scalars);
      }
    }
  }
  store_lane(out, params.out, first, n, vector_path);
}

template <class Op, int OutSize, int... InSizes>
__device__ __forceinline__ void transform(const TransformParams& params) {
  transform_tile<Op, OutSize, InSizes...>(params,
                                          cuda::std::make_index_sequence<sizeof...(InSizes)>{});
}

}  // namespace csj::kernels
