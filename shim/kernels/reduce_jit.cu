// Reduce (and, with CSJ_WITH_SCAN, scan) kernels with their operators left undefined: built
// to LTO-IR, one module per (CSJ_IN_SIZE, CSJ_ACC_SIZE), and linked at run time with the
// operator wrappers numba compiled:
//   void csj_map(const In* value, long long global_index, Acc* out)
//   void csj_op(const Acc* a, const Acc* b, Acc* out)
#include "reduce.cuh"

#if !defined(CSJ_IN_SIZE) || !defined(CSJ_ACC_SIZE)
#error "CSJ_IN_SIZE and CSJ_ACC_SIZE must be defined"
#endif

extern "C" __device__ void csj_map(const void*, long long, void*);
extern "C" __device__ void csj_op(const void*, const void*, void*);

namespace {

struct LinkedMap {
  __device__ __forceinline__ void operator()(const void* value, long long index, void* out) const {
    csj_map(value, index, out);
  }
};

struct LinkedOp {
  __device__ __forceinline__ void operator()(const void* a, const void* b, void* out) const {
    csj_op(a, b, out);
  }
};

using namespace csj::kernels;

}  // namespace

extern "C" __global__ void __launch_bounds__(kReduceBlock)
    csj_reduce(const __grid_constant__ ReduceParams params) {
  Reduction<LinkedMap, LinkedOp, CSJ_IN_SIZE, CSJ_ACC_SIZE>::run(params);
}

extern "C" __global__ void csj_fold(const __grid_constant__ FoldParams params) {
  fold<LinkedOp, CSJ_ACC_SIZE>(params);
}

#ifdef CSJ_WITH_SCAN
extern "C" __global__ void __launch_bounds__(kScanBlock)
    csj_scan(const __grid_constant__ ScanParams params) {
  Scan<LinkedMap, LinkedOp, CSJ_IN_SIZE, CSJ_ACC_SIZE>::run(params);
}
#endif
