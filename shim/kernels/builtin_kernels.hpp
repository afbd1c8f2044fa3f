// Host-visible handles of the kernels compiled into the shim at build time.
#pragma once

namespace csj::kernels {

// Same order as csj::BuiltinOp.
enum class BuiltinKernel { negate, scale, add_scalar, add, mul, axpy };

// The __global__ function for (op, dtype) where dtype is csj::DType's integer value;
// launch with cudaLaunchKernel and one TransformParams argument.
const void* builtin_transform_kernel(BuiltinKernel op, int dtype);

// Same order as csj::BuiltinReduction.
enum class BuiltinReduction { sum, min, max };

// The reduce / fold / scan __global__ functions of one built-in operator and
// dtype (accumulator = input dtype).
struct BuiltinReduceKernels {
  const void* reduce;
  const void* fold;
  const void* scan;
};
BuiltinReduceKernels builtin_reduce_kernels(BuiltinReduction op, int dtype);

}  // namespace csj::kernels
