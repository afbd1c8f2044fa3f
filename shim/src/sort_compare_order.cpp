// The comparator sort's order for the multi-place exchange (sort_compare_order.hpp): the
// co-ranking cut search by the comparator and the JIT two-array merge.
#include "sort_compare_order.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "../kernels/merge_sort.hpp"
#include "csj/place_group.hpp"

namespace csj::detail {
namespace {

namespace k = kernels;

constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

CompareCuts::CompareCuts(std::vector<MergeSortKernels> kernels, std::vector<SortedRun> runs, const PlaceGroup& group,
                         const std::vector<long long>& ranks, long long total)
    : kernels_(std::move(kernels)), runs_(std::move(runs)) {
  const std::size_t count = runs_.size();
  if (kernels_.size() != count) throw std::invalid_argument("CompareCuts: one merge sort module per run");
  item_ = kernels_.empty() ? 0 : kernels_.front().element_size;
  bounds_.lower.assign(ranks.size(), std::vector<long long>(count, 0));
  bounds_.upper.assign(ranks.size(), std::vector<long long>(count, 0));
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    for (std::size_t p = 0; p < count; ++p) bounds_.upper[i][p] = runs_[p].n;
    if (ranks[i] == 0) {
      bounds_.upper[i].assign(count, 0);
    } else if (ranks[i] == total) {
      bounds_.lower[i] = bounds_.upper[i];
    } else {
      open_.push_back({i, ranks[i]});
    }
  }
  if (open_.empty()) return;
  direct_.assign(count, std::vector<bool>(count, true));
  bool gathers = false;
  for (std::size_t reader = 0; reader < count; ++reader) {
    for (std::size_t source = 0; source < count; ++source) {
      if (runs_[reader].n == 0 || runs_[source].n == 0 || reader == source) continue;
      direct_[reader][source] = group.can_access_peer(runs_[reader].device, runs_[source].device);
      gathers = gathers || !direct_[reader][source];
    }
  }
  max_probes_ = open_.size() * count;
  segments_at_ = aligned(max_probes_ * sizeof(k::MergeSearchSegment));
  counts_at_ = aligned(max_probes_ * static_cast<std::size_t>(kPivots) * sizeof(long long));
  gathered_at_ = gathers ? aligned(max_probes_ * static_cast<std::size_t>(kPivots) * item_) : 0;
  host_ = std::make_unique<PinnedBuffer>(count * (segments_at_ + counts_at_) + gathered_at_);
  // on a throw, the searches and gathers already queued end before the pinned buffer goes
  settle_.emplace(group);
}

std::vector<CompareCuts::Probe> CompareCuts::probes() const {
  std::vector<Probe> probes;
  for (std::size_t b = 0; b < open_.size(); ++b) {
    const std::size_t i = open_[b].index;
    for (std::size_t p = 0; p < runs_.size(); ++p) {
      const long long low = bounds_.lower[i][p], high = bounds_.upper[i][p];
      if (low == high) continue;
      const long long step = (high - low + kPivots - 1) / kPivots;
      probes.push_back({b, p, low, step, (high - low + step - 1) / step});
    }
  }
  return probes;
}

std::vector<std::unique_ptr<Event>> CompareCuts::gather(const std::vector<Probe>& probes) {
  const std::size_t count = runs_.size();
  std::vector<std::unique_ptr<Event>> gathered(count);
  if (!gathered_at_) return gathered;
  unsigned char* area = host_->data + count * (segments_at_ + counts_at_);
  for (std::size_t q = 0; q < probes.size(); ++q) {
    const Probe& probe = probes[q];
    const SortedRun& source = runs_[probe.run];
    bool wanted = false;
    for (std::size_t reader = 0; reader < count; ++reader) wanted = wanted || !direct_[reader][probe.run];
    if (!wanted) continue;
    DeviceGuard guard(source.device);
    check(cudaMemcpy2DAsync(area + q * static_cast<std::size_t>(kPivots) * item_, item_,
                            source.keys + probe.first * item_, static_cast<std::size_t>(probe.step) * item_, item_,
                            static_cast<std::size_t>(probe.count), cudaMemcpyDeviceToHost, source.stream),
          "cudaMemcpy2DAsync (sort pivots)");
    if (!gathered[probe.run]) gathered[probe.run] = std::make_unique<Event>(source.device);
  }
  for (std::size_t p = 0; p < count; ++p) {
    if (!gathered[p]) continue;
    DeviceGuard guard(runs_[p].device);
    gathered[p]->record(runs_[p].stream);
  }
  return gathered;
}

void CompareCuts::round() {
  const std::size_t count = runs_.size();
  if (!sorts_waited_) {  // a search reads every other run: every sort must be done
    for (const SortedRun& run : runs_) {
      if (run.n == 0) continue;
      DeviceGuard guard(run.device);
      check(cudaStreamSynchronize(run.stream), "cudaStreamSynchronize");
    }
    sorts_waited_ = true;
  }
  const std::vector<Probe> probes = this->probes();
  const std::vector<std::unique_ptr<Event>> gathered = gather(probes);
  const unsigned char* area = host_->data + count * (segments_at_ + counts_at_);
  // per reader: the table of the other runs' probes, in probe order
  std::vector<std::vector<int>> segment_of(count, std::vector<int>(probes.size(), -1));
  for (std::size_t reader = 0; reader < count; ++reader) {
    const SortedRun& run = runs_[reader];
    if (run.n == 0) continue;
    auto* table = reinterpret_cast<k::MergeSearchSegment*>(host_->data + reader * (segments_at_ + counts_at_));
    auto* counts = reinterpret_cast<long long*>(host_->data + reader * (segments_at_ + counts_at_) + segments_at_);
    int segments = 0;
    std::vector<bool> waits(count, false);
    for (std::size_t q = 0; q < probes.size(); ++q) {
      const Probe& probe = probes[q];
      if (probe.run == reader) continue;
      k::MergeSearchSegment& segment = table[segments];
      if (direct_[reader][probe.run]) {
        segment.pivots = runs_[probe.run].keys + probe.first * item_;
        segment.pivot_stride = probe.step * static_cast<long long>(item_);
      } else {
        segment.pivots = area + q * static_cast<std::size_t>(kPivots) * item_;
        segment.pivot_stride = static_cast<long long>(item_);
        waits[probe.run] = true;
      }
      segment.count = probe.count;
      segment.upper = probe.run > reader ? 1 : 0;  // this run's place comes first: its equal elements go before
      segment_of[reader][q] = segments++;
    }
    DeviceGuard guard(run.device);
    for (std::size_t source = 0; source < count; ++source) {
      if (waits[source]) gathered[source]->wait(run.stream);
    }
    queue_search_segments(kernels_[reader], run.keys, run.n, table, segments, kPivotShift, counts, run.stream);
  }
  for (std::size_t reader = 0; reader < count; ++reader) {
    if (runs_[reader].n == 0) continue;
    DeviceGuard guard(runs_[reader].device);
    check(cudaStreamSynchronize(runs_[reader].stream), "cudaStreamSynchronize");
  }
  narrow(probes, segment_of);
}

void CompareCuts::narrow(const std::vector<Probe>& probes, const std::vector<std::vector<int>>& segment_of) {
  const std::size_t count = runs_.size();
  for (std::size_t q = 0; q < probes.size(); ++q) {
    const Probe& probe = probes[q];
    const Open& open = open_[probe.open];
    // the global rank of the probe's pivot j: its index in its run, and what goes before it
    // in every other run
    auto rank_of = [&](long long j) {
      long long rank = probe.first + j * probe.step;
      for (std::size_t reader = 0; reader < count; ++reader) {
        const int segment = segment_of[reader][q];
        if (segment < 0) continue;
        const auto* counts =
            reinterpret_cast<const long long*>(host_->data + reader * (segments_at_ + counts_at_) + segments_at_);
        rank += counts[(static_cast<long long>(segment) << kPivotShift) + j];
      }
      return rank;
    };
    // the first pivot not ranked below the cut's rank (ranks grow with j)
    long long low = 0, high = probe.count;
    while (low < high) {
      const long long middle = low + (high - low) / 2;
      if (rank_of(middle) < open.rank) {
        low = middle + 1;
      } else {
        high = middle;
      }
    }
    long long& lower = bounds_.lower[open.index][probe.run];
    long long& upper = bounds_.upper[open.index][probe.run];
    if (low > 0) lower = probe.first + (low - 1) * probe.step + 1;
    if (low < probe.count) upper = probe.first + low * probe.step;
  }
  std::vector<Open> still_open;
  for (const Open& open : open_) {
    if (bounds_.lower[open.index] != bounds_.upper[open.index]) still_open.push_back(open);
  }
  open_ = std::move(still_open);
}

std::unique_ptr<CutSearch> CompareOrder::search(std::vector<SortedRun> runs, const PlaceGroup& group,
                                                const std::vector<long long>& ranks, long long total) const {
  return std::make_unique<CompareCuts>(kernels_, std::move(runs), group, ranks, total);
}

void CompareOrder::merge(void* temp, std::size_t& temp_bytes, const RunPiece& first, const RunPiece& second,
                         unsigned char* out, unsigned char* out_values, cudaStream_t stream) const {
  if (out_values || first.values || second.values) {
    throw std::invalid_argument("a sort with a comparator moves its elements alone");
  }
  const std::size_t item = kernels_.empty() ? 0 : kernels_.front().element_size;
  if (!temp) {
    temp_bytes = merge_temp_bytes(first.n + second.n, item);
    return;
  }
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  for (std::size_t p = 0; p < devices_.size(); ++p) {
    if (devices_[p] != device) continue;
    queue_merge(kernels_[p], first.data, first.n, second.data, second.n, out, temp, stream);
    return;
  }
  throw std::invalid_argument("a sort with a comparator has no merge module for device " + std::to_string(device));
}

}  // namespace csj::detail
