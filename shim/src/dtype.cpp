#include "csj/dtype.hpp"

#include <stdexcept>

namespace csj {

std::size_t itemsize(DType dtype) {
  switch (dtype) {
    case DType::float32:
    case DType::int32:
    case DType::uint32:
      return 4;
    case DType::float64:
    case DType::int64:
    case DType::uint64:
      return 8;
  }
  throw std::invalid_argument("unknown dtype");
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::uint32: return "uint32";
    case DType::uint64: return "uint64";
  }
  throw std::invalid_argument("unknown dtype");
}

DType dtype_from_name(const std::string& name) {
  for (DType dtype : {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint32,
                      DType::uint64}) {
    if (name == dtype_name(dtype)) return dtype;
  }
  throw std::invalid_argument("dtype: unsupported dtype '" + name +
                              "' (expected float32, float64, int32, int64, uint32 or uint64)");
}

}  // namespace csj
