// Host-visible handles of the kernels compiled into the shim at build time.
#pragma once

namespace csj::kernels {

// Same order as csj::BuiltinOp.
enum class BuiltinKernel { negate, scale, add_scalar, add, mul, axpy };

// The __global__ function for (op, dtype) where dtype is csj::DType's integer value;
// launch with cudaLaunchKernel and one TransformParams argument.
const void* builtin_transform_kernel(BuiltinKernel op, int dtype);

}  // namespace csj::kernels
