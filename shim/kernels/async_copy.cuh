// Asynchronous copies from global to shared memory (cp.async, LDGSTS on sm_80 and later): the
// copies hold no registers while in flight, so a block can have a whole tile on its way while
// it works. One home for the instructions that the single-pass scan's staged tile
// (reduce.cuh) and the by-key engine's prefetch (by_key_jit.cu) both issue.
#pragma once

namespace csj::kernels {

[[maybe_unused]] __device__ __forceinline__ unsigned shared_address(const void* at) {
  return static_cast<unsigned>(__cvta_generic_to_shared(at));
}
// 16 bytes through L2 only (.cg). kOffset: bytes added to both addresses, as the instruction's
// immediate, so that a lane's copies share one pair of address registers.
template <int kOffset = 0>
__device__ __forceinline__ void copy_async_16(void* to, const void* from) {
  asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%2], 16;" ::"r"(shared_address(to)), "l"(from), "n"(kOffset)
               : "memory");
}
template <int kBytes, int kOffset = 0>
__device__ __forceinline__ void copy_async(void* to, const void* from) {
  static_assert(kBytes == 4 || kBytes == 8, "cp.async.ca copies 4, 8 or 16 bytes");
  asm volatile("cp.async.ca.shared.global [%0+%3], [%1+%3], %2;" ::"r"(shared_address(to)), "l"(from), "n"(kBytes),
               "n"(kOffset)
               : "memory");
}
template <int kBytes, int kStart, int kCount, int kStride>  // kCount copies at kStart, kStart + kStride, ...
__device__ __forceinline__ void copies_async(void* to, const void* from) {
  if constexpr (kCount > 0) {
    if constexpr (kBytes == 16) {
      copy_async_16<kStart>(to, from);
    } else {
      copy_async<kBytes, kStart>(to, from);
    }
    copies_async<kBytes, kStart + kStride, kCount - 1, kStride>(to, from);
  }
}
[[maybe_unused]] __device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
[[maybe_unused]] __device__ __forceinline__ void copy_async_wait() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
// Every copy this thread issued, committed or not, has landed.
[[maybe_unused]] __device__ __forceinline__ void copy_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

}  // namespace csj::kernels
