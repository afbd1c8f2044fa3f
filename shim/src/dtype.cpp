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
    case DType::record:
      throw std::invalid_argument("dtype: a record's size is the array's itemsize");
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
    case DType::record: return "record";
  }
  throw std::invalid_argument("unknown dtype");
}

DType dtype_from_name(const std::string& name) {
  for (DType dtype : {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint32,
                      DType::uint64, DType::record}) {
    if (name == dtype_name(dtype)) return dtype;
  }
  throw std::invalid_argument("dtype: unsupported dtype '" + name +
                              "' (expected float32, float64, int32, int64, uint32, uint64 or record)");
}

std::size_t element_size(DType dtype, std::size_t record_size, const char* what) {
  if (dtype != DType::record) {
    const std::size_t size = itemsize(dtype);
    if (record_size != 0 && record_size != size) {
      throw std::invalid_argument(std::string(what) + ": itemsize " + std::to_string(record_size) +
                                  " differs from " + dtype_name(dtype) + "'s " + std::to_string(size));
    }
    return size;
  }
  if (record_size < 4 || record_size > kMaxRecordSize || record_size % 4 != 0) {
    throw std::invalid_argument(std::string(what) + ": a record of " + std::to_string(record_size) +
                                " bytes is not supported (4 to " + std::to_string(kMaxRecordSize) +
                                " bytes, a multiple of 4)");
  }
  return record_size;
}

}  // namespace csj
