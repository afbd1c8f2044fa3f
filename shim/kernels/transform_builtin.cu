// Descriptor operators (sharded.ops.*): the transform kernel of transform.cuh instantiated at
// build time with C++ operators, one per dtype, so they run without JIT.
#include <cstdint>

#include "builtin_kernels.hpp"
#include "transform.cuh"

#include <cuda/std/type_traits>

namespace csj::kernels {
namespace {

template <class T>
__device__ __forceinline__ T scalar(const ScalarPack& scalars, int slot) {
  return *static_cast<const T*>(scalar_address(scalars, slot));
}

template <class T>
struct Negate {
  __device__ void operator()(const void* a, void* out, const ScalarPack&) const {
    *static_cast<T*>(out) = static_cast<T>(-*static_cast<const T*>(a));
  }
};
template <class T>
struct Scale {
  __device__ void operator()(const void* a, void* out, const ScalarPack& s) const {
    *static_cast<T*>(out) = static_cast<T>(scalar<T>(s, 0) * *static_cast<const T*>(a));
  }
};
template <class T>
struct AddScalar {
  __device__ void operator()(const void* a, void* out, const ScalarPack& s) const {
    *static_cast<T*>(out) = static_cast<T>(*static_cast<const T*>(a) + scalar<T>(s, 0));
  }
};
template <class T>
struct Add {
  __device__ void operator()(const void* a, const void* b, void* out, const ScalarPack&) const {
    *static_cast<T*>(out) = static_cast<T>(*static_cast<const T*>(a) + *static_cast<const T*>(b));
  }
};
template <class T>
struct Mul {
  __device__ void operator()(const void* a, const void* b, void* out, const ScalarPack&) const {
    *static_cast<T*>(out) = static_cast<T>(*static_cast<const T*>(a) * *static_cast<const T*>(b));
  }
};
template <class T>
struct Axpy {
  __device__ void operator()(const void* x, const void* y, void* out, const ScalarPack& s) const {
    *static_cast<T*>(out) =
        static_cast<T>(scalar<T>(s, 0) * *static_cast<const T*>(x) + *static_cast<const T*>(y));
  }
};

// fill: out = value (slot 0). sequence: out = start + step * index, computed in the widest
// type of the kind (double, int64, uint64; slots 0 and 1) so large indices stay exact.
template <class T>
using Wide = cuda::std::conditional_t<cuda::std::is_floating_point_v<T>, double,
                                      cuda::std::conditional_t<cuda::std::is_signed_v<T>, long long,
                                                               unsigned long long>>;

template <class T>
struct Fill {
  __device__ void operator()(void* out, const ScalarPack& s) const {
    *static_cast<T*>(out) = scalar<T>(s, 0);
  }
};
template <class T>
struct Sequence {
  static constexpr bool kWantsIndex = true;
  __device__ void operator()(void* out, const ScalarPack& s, long long index) const {
    *static_cast<T*>(out) =
        static_cast<T>(scalar<Wide<T>>(s, 0) + scalar<Wide<T>>(s, 1) * static_cast<Wide<T>>(index));
  }
};

template <template <class> class Op, class T>
__global__ void __launch_bounds__(kTransformBlock)
    nullary_kernel(const __grid_constant__ TransformParams params) {
  transform<Op<T>, sizeof(T)>(params);
}

template <template <class> class Op, class T>
__global__ void __launch_bounds__(kTransformBlock)
    unary_kernel(const __grid_constant__ TransformParams params) {
  transform<Op<T>, sizeof(T), sizeof(T)>(params);
}

template <template <class> class Op, class T>
__global__ void __launch_bounds__(kTransformBlock)
    binary_kernel(const __grid_constant__ TransformParams params) {
  transform<Op<T>, sizeof(T), sizeof(T), sizeof(T)>(params);
}

template <class T>
const void* kernel_for(BuiltinKernel op) {
  switch (op) {
    case BuiltinKernel::negate: return reinterpret_cast<const void*>(&unary_kernel<Negate, T>);
    case BuiltinKernel::scale: return reinterpret_cast<const void*>(&unary_kernel<Scale, T>);
    case BuiltinKernel::add_scalar: return reinterpret_cast<const void*>(&unary_kernel<AddScalar, T>);
    case BuiltinKernel::add: return reinterpret_cast<const void*>(&binary_kernel<Add, T>);
    case BuiltinKernel::mul: return reinterpret_cast<const void*>(&binary_kernel<Mul, T>);
    case BuiltinKernel::axpy: return reinterpret_cast<const void*>(&binary_kernel<Axpy, T>);
    case BuiltinKernel::fill: return reinterpret_cast<const void*>(&nullary_kernel<Fill, T>);
    case BuiltinKernel::sequence: return reinterpret_cast<const void*>(&nullary_kernel<Sequence, T>);
  }
  return nullptr;
}

}  // namespace

const void* builtin_transform_kernel(BuiltinKernel op, int dtype) {
  return with_dtype(dtype, [op](auto tag) { return kernel_for<decltype(tag)>(op); });
}

}  // namespace csj::kernels
