// Internal: how error messages write addresses and amounts of memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace csj::detail {

// "0x7f0813e00200": addresses as Python's hex() writes them, so a message matches what the
// caller's own objects print.
inline std::string hex_address(std::uintptr_t address) {
  char text[2 + 2 * sizeof(address) + 1];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(address));
  return text;
}

// "16.0 GiB", "512.0 MiB": one decimal, in the largest unit that keeps it at least 1.
inline std::string memory_amount(std::uint64_t bytes) {
  constexpr double kMiB = 1024.0 * 1024.0, kGiB = kMiB * 1024.0;
  char text[32];
  if (bytes >= (std::uint64_t{1} << 30)) {
    std::snprintf(text, sizeof(text), "%.1f GiB", static_cast<double>(bytes) / kGiB);
  } else {
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / kMiB);
  }
  return text;
}

}  // namespace csj::detail
