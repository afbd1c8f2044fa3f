// Element types the shim stores and moves. CUDA-free: the bindings include it.
#pragma once

#include <cstddef>
#include <string>

namespace csj {

// Six scalars, and `record`: an aligned C struct of scalar fields (a numpy structured dtype)
// that the shim moves as raw bytes. Its size travels beside it (ShardedArray::itemsize);
// its fields are known only to Python and to the operators linked for it.
enum class DType : int { float32, float64, int32, int64, uint32, uint64, record };

// Records are 4 to kMaxRecordSize bytes, a multiple of 4 (aligned structs of up to four
// 4- or 8-byte fields).
constexpr std::size_t kMaxRecordSize = 32;

// The size of a scalar dtype; std::invalid_argument for `record` (its size is its own).
std::size_t itemsize(DType dtype);
const char* dtype_name(DType dtype);
// Parses a numpy dtype name ("float32", ...) or "record"; std::invalid_argument otherwise.
DType dtype_from_name(const std::string& name);
// The element size of `dtype`: a scalar's own (`record_size` must be 0 or equal), or a
// record's `record_size`, checked; std::invalid_argument naming `what` otherwise.
std::size_t element_size(DType dtype, std::size_t record_size, const char* what = "dtype");

}  // namespace csj
