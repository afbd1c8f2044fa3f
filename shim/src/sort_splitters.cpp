// Step 2 of the multi-place sort (sort_steps.hpp): exact splitters. For every cut (a global
// rank R: a shard boundary or a chunk boundary) and every place, how many of that place's
// sorted keys go before R, without moving any key: a co-ranking of the sorted runs by a
// digit-by-digit search over the ordered-key space. Each round, every place counts its keys
// below 2^12 candidates per open cut (binary searches in its run, the counts written straight
// into pinned host memory: no copy engine is busy with them while the first keys travel); the
// host sums the counts over places and keeps the candidate interval that holds rank R. Ties
// at the final key are given out in place order, so the split is deterministic and each
// output shard gets exactly its size; 32-bit keys take three rounds.
//
// The search runs one round at a time, so that the copies certain after the first round
// (see sort_exchange.cpp) can travel while the later rounds run.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "../kernels/sort_engine.hpp"
#include "launch.hpp"
#include "sort_steps.hpp"

namespace csj::detail {
namespace {

namespace k = kernels;

constexpr int kDigitBits = 12;  // candidates per boundary and round: 2^12

}  // namespace

std::vector<SortedRun> sorted_runs(const std::vector<SortPlace>& places) {
  std::vector<SortedRun> runs(places.size());
  for (std::size_t p = 0; p < places.size(); ++p) {
    runs[p] = {places[p].device, places[p].stream, places[p].run, places[p].n};
  }
  return runs;
}

Splitters::Splitters(const k::SortEngine& engine, std::vector<SortedRun> runs, const PlaceGroup& group,
                     const std::vector<long long>& ranks, long long total)
    : engine_(engine), runs_(std::move(runs)) {
  const std::size_t count = runs_.size();
  std::vector<std::vector<long long>>& lower = bounds_.lower;
  std::vector<std::vector<long long>>& upper = bounds_.upper;
  lower.assign(ranks.size(), std::vector<long long>(count, 0));
  upper.assign(ranks.size(), std::vector<long long>(count, 0));
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    for (std::size_t p = 0; p < count; ++p) upper[i][p] = runs_[p].n;
    if (ranks[i] == 0) {
      upper[i].assign(count, 0);
    } else if (ranks[i] == total) {
      lower[i] = upper[i];
    } else {
      open_.push_back({i, ranks[i]});
    }
  }
  if (open_.empty()) return;
  max_slots_ = open_.size() << kDigitBits;
  host_ = std::make_unique<PinnedBuffer>(open_.size() * sizeof(unsigned long long) +
                                         count * max_slots_ * sizeof(unsigned long long));
  // on a throw, the copies already queued into the pinned buffer land before it goes back
  settle_.emplace(group);
}

void Splitters::round() {
  const std::size_t count = runs_.size();
  auto* bases = reinterpret_cast<unsigned long long*>(host_->data);
  auto* counts = bases + open_.size();
  const int key_bits = engine_.key_bits;
  const int digit = std::min(kDigitBits, key_bits - known_bits_);
  const int shift = key_bits - known_bits_ - digit;
  const int candidates = 1 << digit;
  const std::size_t slots = open_.size() * static_cast<std::size_t>(candidates);
  for (std::size_t b = 0; b < open_.size(); ++b) bases[b] = open_[b].base;
  for (std::size_t p = 0; p < count; ++p) {
    const SortedRun& run = runs_[p];
    if (run.n == 0) continue;
    DeviceGuard guard(run.device);
    k::SplitterParams params{};
    params.keys = run.keys;
    params.n = run.n;
    params.bases = bases;  // read and written where they lie, in pinned host memory
    params.counts = counts + p * max_slots_;
    params.boundaries = static_cast<int>(open_.size());
    params.candidates = candidates;
    params.shift = shift;
    const auto grid = static_cast<unsigned>((slots + k::kSplitterBlock - 1) / k::kSplitterBlock);
    launch(KernelHandle::builtin(engine_.splitter_kernel), grid, k::kSplitterBlock, run.stream, params,
           "launching sort splitters");
  }
  for (const SortedRun& run : runs_) {
    if (run.n == 0) continue;
    DeviceGuard guard(run.device);
    check(cudaStreamSynchronize(run.stream), "cudaStreamSynchronize");
  }
  // (the bases buffer is rewritten by the next round: the kernels above have completed)
  known_bits_ += digit;

  std::vector<Open> still_open;
  for (std::size_t b = 0; b < open_.size(); ++b) {
    Open& boundary = open_[b];
    auto below = [&](std::size_t p, int j) -> long long {
      return runs_[p].n == 0 ? 0 : static_cast<long long>(counts[p * max_slots_ + b * candidates + j]);
    };
    auto below_all = [&](int j) {
      long long sum = 0;
      for (std::size_t p = 0; p < count; ++p) sum += below(p, j);
      return sum;
    };
    // the last candidate with at most `rank` keys below it (candidate 0, the base, has):
    // the counts grow with the candidate
    int chosen = 0;
    for (int top = candidates - 1; chosen < top;) {
      const int middle = chosen + (top - chosen + 1) / 2;
      if (below_all(middle) <= boundary.rank) {
        chosen = middle;
      } else {
        top = middle - 1;
      }
    }
    std::vector<long long>& lower = bounds_.lower[boundary.index];
    std::vector<long long>& upper = bounds_.upper[boundary.index];
    long long below_sum = 0;
    for (std::size_t p = 0; p < count; ++p) {
      lower[p] = below(p, chosen);
      if (chosen + 1 < candidates) upper[p] = below(p, chosen + 1);
      below_sum += lower[p];
    }
    boundary.base += static_cast<unsigned long long>(chosen) << shift;
    if (below_sum == boundary.rank) {  // an exact cut between two distinct keys
      upper = lower;
    } else if (known_bits_ == key_bits) {
      // rank falls among the keys equal to `base`: hand them out in place order
      long long needed = boundary.rank - below_sum;
      for (std::size_t p = 0; p < count; ++p) {
        const long long take = std::min(needed, upper[p] - lower[p]);
        lower[p] += take;
        needed -= take;
      }
      upper = lower;
    } else {
      still_open.push_back(boundary);
    }
  }
  open_ = std::move(still_open);
}

// The counts come from binary searches over runs sorted a moment ago: they only disagree
// when something else wrote the input meanwhile. Nothing moves then.
void check_cuts(const std::vector<std::vector<long long>>& cuts, const std::vector<SortedRun>& runs,
                const std::vector<long long>& ranks) {
  const std::size_t count = runs.size();
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    long long sum = 0;
    for (std::size_t p = 0; p < count; ++p) {
      const long long below = i == 0 ? 0 : cuts[i - 1][p];
      if (cuts[i][p] < below || cuts[i][p] > runs[p].n) {
        throw std::runtime_error("sort: inconsistent splitters; was the array written by other work "
                                 "while it was being sorted?");
      }
      sum += cuts[i][p];
    }
    if (sum != ranks[i]) throw std::runtime_error("sort: splitters do not add up to the shard boundaries");
  }
}

}  // namespace csj::detail
