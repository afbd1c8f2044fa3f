// The pairs engines of 8-byte values (sort_pairs.cuh), in a translation unit of their own.
#include "sort_pairs.cuh"

namespace csj::kernels {

const PairsEngine* pairs_engine_8(int dtype, bool descending) {
  return pairs::engine_for<unsigned long long>(dtype, descending);
}

}  // namespace csj::kernels
