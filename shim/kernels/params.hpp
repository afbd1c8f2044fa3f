// Kernel parameter blocks shared by the device code and the host launch driver.
// Plain C++ (no CUDA types) so both sides agree on the layout.
#pragma once

namespace csj::kernels {

constexpr int kTransformBlock = 256;
constexpr int kTransformItems = 4;
constexpr int kMaxInputs = 4;
constexpr int kMaxScalars = 8;
constexpr int kScalarSlot = 8;  // bytes per runtime scalar

struct ScalarPack {
  alignas(8) unsigned char bytes[kMaxScalars * kScalarSlot];
};

struct TransformParams {
  const void* inputs[kMaxInputs];
  void* out;
  long long n;
  ScalarPack scalars;
};

}  // namespace csj::kernels
