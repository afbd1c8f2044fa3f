// The transform kernel for records and index-aware operators: one LTO-IR module per arity
// (CSJ_ARITY), blind to element sizes. The shim passes each array's global base
// (ShardedArray::global_base: element i at base + global index * itemsize) in
// TransformParams::inputs / out; every element's call gets the bases and its global index,
// and the operator's wrapper (numba, which knows the layouts) addresses its elements:
//   void csj_transform_indexed_op(const void* in0, ..., void* out, const void* scalar0, ...,
//                                 const void* scalar7, long long global_index)
// Threads take elements block-striped, so adjacent threads touch adjacent records. The
// 4- and 8-byte scalar transforms keep their vectorised modules (transform_jit.cu).
#include <cuda/std/utility>

#include "params.hpp"

#if !defined(CSJ_ARITY) || CSJ_ARITY < 1 || CSJ_ARITY > 4
#error "CSJ_ARITY must be 1..4"
#endif

using csj::kernels::kScalarSlot;
using csj::kernels::kTransformBlock;
using csj::kernels::kTransformItems;
using csj::kernels::TransformParams;

#define CSJ_SCALAR_PARAMS                                                                    \
  const void*, const void*, const void*, const void*, const void*, const void*, const void*, \
      const void*
#if CSJ_ARITY == 1
extern "C" __device__ void csj_transform_indexed_op(const void*, void*, CSJ_SCALAR_PARAMS, long long);
#elif CSJ_ARITY == 2
extern "C" __device__ void csj_transform_indexed_op(const void*, const void*, void*, CSJ_SCALAR_PARAMS,
                                                    long long);
#elif CSJ_ARITY == 3
extern "C" __device__ void csj_transform_indexed_op(const void*, const void*, const void*, void*,
                                                    CSJ_SCALAR_PARAMS, long long);
#else
extern "C" __device__ void csj_transform_indexed_op(const void*, const void*, const void*, const void*,
                                                    void*, CSJ_SCALAR_PARAMS, long long);
#endif

namespace {

template <int... I, int... S>
__device__ __forceinline__ void call(const TransformParams& params, long long index,
                                     cuda::std::integer_sequence<int, I...>,
                                     cuda::std::integer_sequence<int, S...>) {
  csj_transform_indexed_op(params.inputs[I]..., params.out,
                           csj::kernels::scalar_address(params.scalars, S)..., index);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kTransformBlock)
    csj_transform_indexed(const __grid_constant__ TransformParams params) {
  const long long tile = static_cast<long long>(blockIdx.x) * kTransformBlock * kTransformItems;
#pragma unroll
  for (int item = 0; item < kTransformItems; ++item) {
    const long long local = tile + item * kTransformBlock + threadIdx.x;
    if (local < params.n) {
      call(params, params.index_base + local, cuda::std::make_integer_sequence<int, CSJ_ARITY>{},
           cuda::std::make_integer_sequence<int, csj::kernels::kMaxScalars>{});
    }
  }
}
