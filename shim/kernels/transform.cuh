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

// adjacent_difference's pass over one shard x of n elements: out[i] = op(x[i], x[i - 1]) for i
// in [1, n) (params.neighbour == -1), or op(x[i], x[i + 1]) for i in [0, n - 1) (+1); the one
// element whose neighbour lies in another shard is left to the caller, or, with
// params.copy_edge (the result has the input's element size), copied as it is. Each thread loads its
// own items as aligned vectors, as the transform does, and the one neighbour beyond them as a
// single word (the same cache line as the next thread's load), so no input is read shifted by
// an element, which would break every vector of both the loads and the stores.
template <class Op, int OutSize, int InSize>
__device__ __forceinline__ void adjacent_tile(const TransformParams& params) {
  using W = typename Word<InSize>::type;
  using Out = typename Word<OutSize>::type;
  const long long first =
      (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * kTransformItems;
  const long long n = params.n;
  if (first >= n) return;
  const bool backward = params.neighbour < 0;
  const long long lo = backward ? 1 : 0;      // the outputs this pass writes: [lo, hi)
  const long long hi = backward ? n : n - 1;
  const bool whole = first >= lo && first + kTransformItems <= hi;
  const bool vector_path = first + kTransformItems <= n && aligned16(params.inputs[0]) &&
                           aligned16(params.out);
  Lane<InSize> in;
  load_lane(in, params.inputs[0], first, n, vector_path);
  const W* x = static_cast<const W*>(params.inputs[0]);
  const long long beyond = backward ? first - 1 : first + kTransformItems;
  W edge{};
  if (beyond >= 0 && beyond < n) edge = x[beyond];
  Lane<OutSize> out;
  Op op;
#pragma unroll
  for (int item = 0; item < kTransformItems; ++item) {
    const long long i = first + item;
    if (whole || (i >= lo && i < hi)) {
      const W& beside = backward ? (item == 0 ? edge : in.value[item - 1])
                                 : (item == kTransformItems - 1 ? edge : in.value[item + 1]);
      op(static_cast<const void*>(&in.value[item]), static_cast<const void*>(&beside),
         &out.value[item], params.scalars);
    }
  }
  if (whole && vector_path) {
    store_lane(out, params.out, first, n, true);
  } else {
    Out* data = static_cast<Out*>(params.out) + first;
#pragma unroll
    for (int item = 0; item < kTransformItems; ++item) {
      if (first + item >= lo && first + item < hi) data[item] = out.value[item];
    }
  }
  if constexpr (OutSize == InSize) {
    const long long edge_index = backward ? 0 : n - 1;
    if (params.copy_edge) {
#pragma unroll
      for (int item = 0; item < kTransformItems; ++item) {
        if (first + item == edge_index) static_cast<Out*>(params.out)[edge_index] = in.value[item];
      }
    }
  }
}

template <class Op, int OutSize, int... InSizes>
__device__ __forceinline__ void transform(const TransformParams& params) {
  transform_tile<Op, OutSize, InSizes...>(params,
                                          cuda::std::make_index_sequence<sizeof...(InSizes)>{});
}

}  // namespace csj::kernels
