// The merge of one chunk of an output shard (sort_steps.hpp): the chunk's sorted pieces, one
// from every place's run that has keys in it (peers' pieces already copied into the place's
// receive buffer, its own device's read where they lie), are merged into the shard by a tree
// of two-way merges of the sort's order (stable, so ties keep place order and the sort stays
// deterministic), the values the keys carry merged with them. A tree rather than one k-way
// merge: two-way merges are CUB's, and with two places, the common case, the tree is one
// merge straight into the shard.
//
// Also the radix sorts' order (RadixOrder): the splitter search and CUB's merges.
#include <cuda_runtime.h>

#include <utility>

#include "../kernels/sort_engine.hpp"
#include "sort_steps.hpp"

namespace csj::detail {

MergeTarget merge_target(const SortPlace& place) {
  return {place.device, place.stream, place.shard, place.shard_values, place.between, place.between_values,
          place.temp, place.merge_temp_bytes};
}

void copy_piece(const RunPiece& piece, unsigned char* keys, unsigned char* values, int device, const Lanes& lanes,
                cudaStream_t stream) {
  copy_keys(keys, device, piece.data, piece.device, static_cast<std::size_t>(piece.n) * lanes.key, stream);
  if (lanes.value) {
    copy_keys(values, device, piece.values, piece.device, static_cast<std::size_t>(piece.n) * lanes.value, stream);
  }
}

// Two-way merges level by level, the levels alternating between the shard and `between` (at
// the same offset) so that the last one writes the shard; a piece without a partner at its
// level is copied across.
void merge_pieces(const SortOrder& order, const MergeTarget& target, std::vector<RunPiece> pieces, long long offset,
                  const Lanes& lanes) {
  if (pieces.empty()) return;
  auto at_element = [&](unsigned char* keys, unsigned char* values, long long index) {
    return std::pair<unsigned char*, unsigned char*>{keys + index * lanes.key,
                                                     values ? values + index * lanes.value : nullptr};
  };
  const auto [shard, shard_values] = at_element(target.shard, target.shard_values, offset);
  int levels = 0;
  for (std::size_t width = 1; width < pieces.size(); width <<= 1) ++levels;
  if (levels == 0) {
    copy_piece(pieces[0], shard, shard_values, target.device, lanes, target.stream);
    return;
  }
  const auto [between, between_values] = at_element(target.between, target.between_values, offset);
  for (int level = 1; level <= levels; ++level) {
    const bool last = (levels - level) % 2 == 0;
    unsigned char* into = last ? shard : between;
    unsigned char* into_values = last ? shard_values : between_values;
    std::vector<RunPiece> merged;
    long long at = 0;
    for (std::size_t r = 0; r < pieces.size(); r += 2) {
      const auto [keys, values] = at_element(into, into_values, at);
      const RunPiece& first = pieces[r];
      if (r + 1 == pieces.size()) {
        copy_piece(first, keys, values, target.device, lanes, target.stream);
        merged.push_back({keys, values, first.n, target.device});
        at += first.n;
        continue;
      }
      const RunPiece& second = pieces[r + 1];
      std::size_t bytes = target.temp_bytes;
      order.merge(target.temp, bytes, first, second, keys, values, target.stream);
      merged.push_back({keys, values, first.n + second.n, target.device});
      at += first.n + second.n;
    }
    pieces = std::move(merged);
  }
}

std::unique_ptr<CutSearch> RadixOrder::search(std::vector<SortedRun> runs, const PlaceGroup& group,
                                              const std::vector<long long>& ranks, long long total) const {
  return std::make_unique<Splitters>(engine_, std::move(runs), group, ranks, total);
}

void RadixOrder::merge(void* temp, std::size_t& temp_bytes, const RunPiece& first, const RunPiece& second,
                       unsigned char* out, unsigned char* out_values, cudaStream_t stream) const {
  if (pairs_) {
    check(pairs_->merge(temp, temp_bytes, first.data, first.values, first.n, second.data, second.values, second.n,
                        out, out_values, stream),
          "cub::DeviceMerge::MergePairs");
  } else {
    check(engine_.merge(temp, temp_bytes, first.data, first.n, second.data, second.n, out, stream),
          "cub::DeviceMerge");
  }
}

}  // namespace csj::detail
