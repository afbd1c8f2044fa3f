// Built-in reductions and scans ("sum", "min", "max"): the kernels of reduce.cuh instantiated
// at build time with C++ operators, one set per dtype, so they run without JIT.
#include <cstdint>

#include "builtin_kernels.hpp"
#include "reduce.cuh"

namespace csj::kernels {
namespace {

template <class T>
struct Identity {
  __device__ __forceinline__ void operator()(const void* value, long long, void* out) const {
    *static_cast<T*>(out) = *static_cast<const T*>(value);
  }
};

template <class T>
struct Sum {
  __device__ __forceinline__ void operator()(const void* a, const void* b, void* out) const {
    *static_cast<T*>(out) = static_cast<T>(*static_cast<const T*>(a) + *static_cast<const T*>(b));
  }
};

// NaN propagates, as in numpy's min and max.
template <class T>
struct Min {
  __device__ __forceinline__ void operator()(const void* a, const void* b, void* out) const {
    const T x = *static_cast<const T*>(a), y = *static_cast<const T*>(b);
    *static_cast<T*>(out) = (x < y || x != x) ? x : y;
  }
};

template <class T>
struct Max {
  __device__ __forceinline__ void operator()(const void* a, const void* b, void* out) const {
    const T x = *static_cast<const T*>(a), y = *static_cast<const T*>(b);
    *static_cast<T*>(out) = (x > y || x != x) ? x : y;
  }
};

// count: 1 where the element equals the launch's value, else 0, as int64.
template <class T>
struct Equals {
  static constexpr bool kUsesValue = true;
  __device__ __forceinline__ void operator()(const void* value, long long, void* out,
                                             const unsigned char* target) const {
    *static_cast<long long*>(out) =
        *static_cast<const T*>(value) == *reinterpret_cast<const T*>(target) ? 1 : 0;
  }
};

template <class T>
__global__ void __launch_bounds__(kReduceBlock) count_kernel(const __grid_constant__ ReduceParams p) {
  Reduction<Equals<T>, Sum<long long>, sizeof(T), 8>::run(p);
}

template <template <class> class Op, class T>
__global__ void __launch_bounds__(kReduceBlock) reduce_kernel(const __grid_constant__ ReduceParams p) {
  Reduction<Identity<T>, Op<T>, sizeof(T), sizeof(T)>::run(p);
}

template <template <class> class Op, class T>
__global__ void fold_kernel(const __grid_constant__ FoldParams p) {
  fold<Op<T>, sizeof(T)>(p);
}

template <template <class> class Op, class T>
__global__ void __launch_bounds__(kScanBlock) scan_kernel(const __grid_constant__ ScanParams p) {
  Scan<Identity<T>, Op<T>, sizeof(T), sizeof(T)>::run(p);
}

template <template <class> class Op, class T>
__global__ void __launch_bounds__(one_pass_block(sizeof(T), sizeof(T)), one_pass_blocks(sizeof(T), sizeof(T)))
    scan_one_pass_kernel(const __grid_constant__ OnePassScanParams p) {
  OnePassScan<Identity<T>, Op<T>, sizeof(T), sizeof(T)>::run(p);
}

template <template <class> class Op, class T>
BuiltinReduceKernels kernels_for() {
  return {reinterpret_cast<const void*>(&reduce_kernel<Op, T>),
          reinterpret_cast<const void*>(&fold_kernel<Op, T>),
          reinterpret_cast<const void*>(&scan_kernel<Op, T>),
          reinterpret_cast<const void*>(&scan_one_pass_kernel<Op, T>)};
}

template <class T>
BuiltinReduceKernels kernels_for(BuiltinReduction op) {
  switch (op) {
    case BuiltinReduction::sum: return kernels_for<Sum, T>();
    case BuiltinReduction::min: return kernels_for<Min, T>();
    case BuiltinReduction::max: return kernels_for<Max, T>();
  }
  return {};
}

template <class T>
BuiltinReduceKernels count_kernels_for() {
  return {reinterpret_cast<const void*>(&count_kernel<T>),
          reinterpret_cast<const void*>(&fold_kernel<Sum, long long>), nullptr, nullptr};
}

// segmented_reduce's check of device positions where no fold runs (PositionsCheckParams):
// a part a block.
__global__ void __launch_bounds__(kPositionsCheckBlock)
    positions_check_kernel(const __grid_constant__ PositionsCheckParams p) {
  check_positions_part(p.offsets, p.count, p.size, static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x),
                       p.verdicts);
}

}  // namespace

const void* builtin_positions_check_kernel() { return reinterpret_cast<const void*>(&positions_check_kernel); }

BuiltinReduceKernels builtin_count_kernels(int dtype) {
  return with_dtype(dtype, [](auto tag) { return count_kernels_for<decltype(tag)>(); });
}

BuiltinReduceKernels builtin_reduce_kernels(BuiltinReduction op, int dtype) {
  return with_dtype(dtype, [op](auto tag) { return kernels_for<decltype(tag)>(op); });
}

}  // namespace csj::kernels
