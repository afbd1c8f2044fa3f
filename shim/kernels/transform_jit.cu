// The transform kernel with its operator left undefined: built to LTO-IR, one module per
// element-size signature (CSJ_ARITY, CSJ_OUT_SIZE, CSJ_IN_SIZE_0..3), and linked at run time by
// nvJitLink with the operator's C-ABI wrapper that numba compiled:
//   void csj_transform_op(const T0* in0, ..., Tout* out, const S0* scalar0, ..., const S7* scalar7)
#include "transform.cuh"

#if !defined(CSJ_ARITY) || !defined(CSJ_OUT_SIZE) || !defined(CSJ_IN_SIZE_0)
#error "CSJ_ARITY, CSJ_OUT_SIZE and CSJ_IN_SIZE_0..CSJ_IN_SIZE_<arity-1> must be defined"
#endif

// (nvcc splits -D values at commas, so the size list is assembled here.)
#if CSJ_ARITY == 1
#define CSJ_IN_SIZES CSJ_IN_SIZE_0
#elif CSJ_ARITY == 2
#define CSJ_IN_SIZES CSJ_IN_SIZE_0, CSJ_IN_SIZE_1
#elif CSJ_ARITY == 3
#define CSJ_IN_SIZES CSJ_IN_SIZE_0, CSJ_IN_SIZE_1, CSJ_IN_SIZE_2
#else
#define CSJ_IN_SIZES CSJ_IN_SIZE_0, CSJ_IN_SIZE_1, CSJ_IN_SIZE_2, CSJ_IN_SIZE_3
#endif

using csj::kernels::kScalarSlot;
using csj::kernels::ScalarPack;

#define CSJ_SCALAR_PARAMS                                                                    \
  const void*, const void*, const void*, const void*, const void*, const void*, const void*, \
      const void*
#define CSJ_SCALAR(k) csj::kernels::scalar_address(scalars, (k))
#define CSJ_SCALAR_ARGS                                                                   \
  CSJ_SCALAR(0), CSJ_SCALAR(1), CSJ_SCALAR(2), CSJ_SCALAR(3), CSJ_SCALAR(4), CSJ_SCALAR(5), \
      CSJ_SCALAR(6), CSJ_SCALAR(7)

#if CSJ_ARITY == 1
extern "C" __device__ void csj_transform_op(const void*, void*, CSJ_SCALAR_PARAMS);
#elif CSJ_ARITY == 2
extern "C" __device__ void csj_transform_op(const void*, const void*, void*, CSJ_SCALAR_PARAMS);
#elif CSJ_ARITY == 3
extern "C" __device__ void csj_transform_op(const void*, const void*, const void*, void*,
                                            CSJ_SCALAR_PARAMS);
#elif CSJ_ARITY == 4
extern "C" __device__ void csj_transform_op(const void*, const void*, const void*, const void*,
                                            void*, CSJ_SCALAR_PARAMS);
#else
#error "CSJ_ARITY must be 1..4"
#endif

namespace {

struct Linked {
  template <class... Pointers>
  __device__ __forceinline__ void call(const ScalarPack& scalars, Pointers... pointers) const {
    csj_transform_op(pointers..., CSJ_SCALAR_ARGS);
  }
};

#if CSJ_ARITY == 1
struct Op : Linked {
  __device__ __forceinline__ void operator()(const void* a, void* out, const ScalarPack& s) const {
    call(s, a, out);
  }
};
#elif CSJ_ARITY == 2
struct Op : Linked {
  __device__ __forceinline__ void operator()(const void* a, const void* b, void* out,
                                             const ScalarPack& s) const {
    call(s, a, b, out);
  }
};
#elif CSJ_ARITY == 3
struct Op : Linked {
  __device__ __forceinline__ void operator()(const void* a, const void* b, const void* c,
                                             void* out, const ScalarPack& s) const {
    call(s, a, b, c, out);
  }
};
#else
struct Op : Linked {
  __device__ __forceinline__ void operator()(const void* a, const void* b, const void* c,
                                             const void* d, void* out,
                                             const ScalarPack& s) const {
    call(s, a, b, c, d, out);
  }
};
#endif

}  // namespace

extern "C" __global__ void __launch_bounds__(csj::kernels::kTransformBlock)
    csj_transform(const __grid_constant__ csj::kernels::TransformParams params) {
  csj::kernels::transform<Op, CSJ_OUT_SIZE, CSJ_IN_SIZES>(params);
}

#if CSJ_ARITY == 2 && CSJ_IN_SIZE_0 == CSJ_IN_SIZE_1
// adjacent_difference's pass (an operator of two values of one type): see adjacent_tile.
extern "C" __global__ void __launch_bounds__(csj::kernels::kTransformBlock)
    csj_adjacent(const __grid_constant__ csj::kernels::TransformParams params) {
  csj::kernels::adjacent_tile<Op, CSJ_OUT_SIZE, CSJ_IN_SIZE_0>(params);
}
#endif
