// The merge of one chunk of an output shard (sort_steps.hpp): the chunk's sorted pieces, one
// from every place's run that has keys in it (peers' pieces already copied into the place's
// receive buffer, its own device's read where they lie), are merged into the shard by a tree
// of two-way merges (CUB's DeviceMerge, stable, so ties keep place order and the sort stays
// deterministic). A tree rather than one k-way merge: two-way merges are CUB's, and with two
// places, the common case, the tree is one merge straight into the shard.
#include <cuda_runtime.h>

#include <utility>

#include "../kernels/sort_engine.hpp"
#include "sort_steps.hpp"

namespace csj::detail {

MergeTarget merge_target(const SortPlace& place) {
  return {place.device, place.stream, place.shard, place.between, place.temp, place.merge_temp_bytes};
}

// Two-way merges level by level, the levels alternating between the shard and `between` (at
// the same offset) so that the last one writes the shard; a piece without a partner at its
// level is copied across.
void merge_pieces(const kernels::SortEngine& engine, const MergeTarget& target, std::vector<RunPiece> pieces,
                  long long offset, std::size_t item) {
  if (pieces.empty()) return;
  unsigned char* shard = target.shard + offset * item;
  int levels = 0;
  for (std::size_t width = 1; width < pieces.size(); width <<= 1) ++levels;
  if (levels == 0) {
    copy_keys(shard, target.device, pieces[0].data, pieces[0].device, static_cast<std::size_t>(pieces[0].n) * item,
              target.stream);
    return;
  }
  for (int level = 1; level <= levels; ++level) {
    unsigned char* into = (levels - level) % 2 == 0 ? shard : target.between + offset * item;
    std::vector<RunPiece> merged;
    long long at = 0;
    for (std::size_t r = 0; r < pieces.size(); r += 2) {
      const RunPiece& first = pieces[r];
      if (r + 1 == pieces.size()) {
        copy_keys(into + at * item, target.device, first.data, first.device, static_cast<std::size_t>(first.n) * item,
                  target.stream);
        merged.push_back({into + at * item, first.n, target.device});
        at += first.n;
        continue;
      }
      const RunPiece& second = pieces[r + 1];
      std::size_t bytes = target.temp_bytes;
      check(engine.merge(target.temp, bytes, first.data, first.n, second.data, second.n, into + at * item,
                         target.stream),
            "cub::DeviceMerge");
      merged.push_back({into + at * item, first.n + second.n, target.device});
      at += first.n + second.n;
    }
    pieces = std::move(merged);
  }
}

}  // namespace csj::detail
