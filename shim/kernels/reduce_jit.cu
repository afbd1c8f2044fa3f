// Reduce, segmented reduce and scan kernels with their operators left undefined: built to
// LTO-IR, one module per (CSJ_IN_SIZE, CSJ_ACC_SIZE) and kind, and linked at run time with
// the operator wrappers numba compiled:
//   void csj_map(const In* value, long long global_index, Acc* out)
//   void csj_op(const Acc* a, const Acc* b, Acc* out)
//
// A module holds only the kernels one kind of call launches: nvJitLink compiles every kernel
// of a module for each new operator, so a kernel a call never launches only slows its first
// call (docs/performance.md, first call):
//  - reduce_*    (no kind define): csj_reduce, csj_fold
//  - segmented_* (CSJ_SEGMENTED): csj_segmented_reduce, csj_fold, csj_segmented_fold
//  - scan_*      (CSJ_WITH_SCAN): csj_reduce, csj_fold, csj_scan, the two passes
//  - scan1_*     (CSJ_ONE_PASS_SCAN): csj_scan_one_pass, which scans an array with at most one
//    non-empty shard; 4- and 8-byte inputs and accumulators only
//
// Record inputs (ReduceParams::map_value holds the shard's global base, element i at
// base + global index * itemsize):
//  - CSJ_IN_SIZE of 12, 24 or 32 bytes (a record array scanned as it is): the reduce pass
//    cannot tile 16-byte vectors with such records, so it walks 4-byte stand-ins of the
//    same count (in bounds: a record is at least 4 bytes) whose values go unused, and hands
//    csj_map the record's address; the scan pass loads whole records.
//  - CSJ_INPUT_BY_BASE (no CSJ_IN_SIZE; reductions of records of any size, one module per
//    accumulator): csj_map receives the global base itself and addresses the record from
//    the index: void csj_map(const void* global_base, long long global_index, Acc* out).
#include "reduce.cuh"

#if defined(CSJ_INPUT_BY_BASE)
#if defined(CSJ_IN_SIZE) || defined(CSJ_WITH_SCAN) || defined(CSJ_ONE_PASS_SCAN)
#error "CSJ_INPUT_BY_BASE modules are reductions without CSJ_IN_SIZE"
#endif
#elif !defined(CSJ_IN_SIZE)
#error "CSJ_IN_SIZE (or CSJ_INPUT_BY_BASE) must be defined"
#endif
#if !defined(CSJ_ACC_SIZE)
#error "CSJ_ACC_SIZE must be defined"
#endif
#if defined(CSJ_SEGMENTED) + defined(CSJ_WITH_SCAN) + defined(CSJ_ONE_PASS_SCAN) > 1
#error "one module kind at most: CSJ_SEGMENTED, CSJ_WITH_SCAN or CSJ_ONE_PASS_SCAN"
#endif

extern "C" __device__ void csj_map(const void*, long long, void*);
extern "C" __device__ void csj_op(const void*, const void*, void*);

namespace {

using namespace csj::kernels;

struct LinkedOp {
  __device__ __forceinline__ void operator()(const void* a, const void* b, void* out) const {
    csj_op(a, b, out);
  }
};

struct LinkedMap {
  __device__ __forceinline__ void operator()(const void* value, long long index, void* out) const {
    csj_map(value, index, out);
  }
};

#if defined(CSJ_INPUT_BY_BASE)
#define CSJ_RECORD_ADDRESSING 1
#elif 16 % CSJ_IN_SIZE != 0
#define CSJ_RECORD_ADDRESSING 1
#endif

#ifdef CSJ_RECORD_ADDRESSING
// Records reached from the shard's global base, which the shim passes in
// ReduceParams::map_value: the map receives base + index * kRecordStride, the record's address
// (a stride of 0 passes the base itself: CSJ_INPUT_BY_BASE maps address the record from the
// index). The element the kernel reads is a 4-byte stand-in whose value goes unused.
#if defined(CSJ_INPUT_BY_BASE)
constexpr unsigned long long kRecordStride = 0;
#else
constexpr unsigned long long kRecordStride = CSJ_IN_SIZE;
#endif
struct ReduceMap {
  static constexpr bool kUsesValue = true;
  __device__ __forceinline__ void operator()(const void*, long long index, void* out,
                                             const unsigned char* map_value) const {
    const auto base = *reinterpret_cast<const unsigned long long*>(map_value);
    csj_map(reinterpret_cast<const void*>(base + static_cast<unsigned long long>(index) * kRecordStride), index,
            out);
  }
};
constexpr int kReduceInSize = 4;
#else
using ReduceMap = LinkedMap;
constexpr int kReduceInSize = CSJ_IN_SIZE;
#endif

}  // namespace

#if defined(CSJ_ONE_PASS_SCAN)
extern "C" __global__ void __launch_bounds__(one_pass_block(CSJ_IN_SIZE, CSJ_ACC_SIZE), one_pass_blocks(CSJ_IN_SIZE, CSJ_ACC_SIZE))
    csj_scan_one_pass(const __grid_constant__ OnePassScanParams params) {
  OnePassScan<LinkedMap, LinkedOp, CSJ_IN_SIZE, CSJ_ACC_SIZE>::run(params);
}
#else
extern "C" __global__ void csj_fold(const __grid_constant__ FoldParams params) {
  fold<LinkedOp, CSJ_ACC_SIZE>(params);
}

#if defined(CSJ_SEGMENTED)
extern "C" __global__ void __launch_bounds__(kReduceBlock)
    csj_segmented_reduce(const __grid_constant__ SegmentedParams params) {
  SegmentedReduction<ReduceMap, LinkedOp, kReduceInSize, CSJ_ACC_SIZE>::run(params);
}

extern "C" __global__ void __launch_bounds__(kSegmentedFoldBlock)
    csj_segmented_fold(const __grid_constant__ SegmentedFoldParams params) {
  segmented_fold<LinkedOp, CSJ_ACC_SIZE>(params);
}
#else
extern "C" __global__ void __launch_bounds__(kReduceBlock)
    csj_reduce(const __grid_constant__ ReduceParams params) {
  Reduction<ReduceMap, LinkedOp, kReduceInSize, CSJ_ACC_SIZE>::run(params);
}
#endif

#if defined(CSJ_WITH_SCAN)
extern "C" __global__ void __launch_bounds__(kScanBlock)
    csj_scan(const __grid_constant__ ScanParams params) {
  Scan<LinkedMap, LinkedOp, CSJ_IN_SIZE, CSJ_ACC_SIZE>::run(params);
}
#endif
#endif
