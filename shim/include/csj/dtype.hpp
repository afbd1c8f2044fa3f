// Element types the shim stores and moves. CUDA-free: the bindings include it.
#pragma once

#include <cstddef>
#include <string>

namespace csj {

enum class DType : int { float32, float64, int32, int64, uint32, uint64 };

std::size_t itemsize(DType dtype);
const char* dtype_name(DType dtype);
// Parses a numpy dtype name ("float32", ...); std::invalid_argument otherwise.
DType dtype_from_name(const std::string& name);

}  // namespace csj
