// Exceptions of the shim beyond the standard ones the bindings map by themselves
// (std::invalid_argument -> ValueError, std::runtime_error -> RuntimeError,
// std::bad_alloc -> MemoryError). CUDA-free header.
#pragma once

#include <new>
#include <stdexcept>
#include <string>

namespace csj {

// A std::bad_alloc that says what did not fit and where: the bindings raise it as MemoryError
// with its message (a plain std::bad_alloc arrives as a bare MemoryError). Anything that
// catches std::bad_alloc catches it too.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(const std::string& message) : message_(message) {}
  // std::runtime_error's string is shared between copies: copying never throws
  const char* what() const noexcept override { return message_.what(); }

 private:
  std::runtime_error message_;
};

}  // namespace csj
