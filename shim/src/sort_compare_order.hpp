// Internal: the order of the sort with a user comparator, as the multi-place sort's exchange
// takes it (SortOrder, sort_steps.hpp): the cut search is a co-ranking of the sorted runs by
// the comparator (CompareCuts), and the merge of two pieces the JIT merge (merge_sort.hpp).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "merge_sort.hpp"
#include "sort_steps.hpp"

namespace csj::detail {

// The exact cuts of `ranks` (ascending, in [0, total]) over the runs, found with the
// comparator alone. A run's cut of rank R is how many of its elements have a global rank
// below R, where an element's global rank counts, in every other run, the elements that go
// before it: in the runs of earlier places those that do not go after it (!less(e, x)), in
// the runs of later places those that go strictly before it (less(x, e)), and in its own run
// those at lower indices; ties are so given out in place order, as the stable sort needs.
// Per cut and run a bracket [lower, upper] holds the cut; each round evaluates up to
// kPivots evenly spaced elements of every open bracket, their global ranks summed from one
// search launch per run (a table of pivot segments: each searching run reads the pivots of
// the others where they lie, on its device or a peer's, or else from pinned host memory
// where they were gathered), and keeps the stretch between the last pivot ranked below R and
// the first one not: brackets shrink kPivots-fold a round, and one of at most kPivots
// elements is settled exactly (three rounds for 2^30 elements).
class CompareCuts final : public CutSearch {
 public:
  static constexpr int kPivotShift = 10;
  static constexpr long long kPivots = 1LL << kPivotShift;

  // `kernels`: the merge sort module of each run's place (runs in place order).
  CompareCuts(std::vector<MergeSortKernels> kernels, std::vector<SortedRun> runs, const PlaceGroup& group,
              const std::vector<long long>& ranks, long long total);

  bool settled() const override { return open_.empty(); }
  const CutBounds& bounds() const override { return bounds_; }
  // Waits for every run's sort first (the searches read each other's runs); returns once the
  // round's counts are in.
  void round() override;

 private:
  struct Open {
    std::size_t index;  // in the list of ranks
    long long rank;
  };
  // The pivots of one open cut in one run's bracket: first + j * step for j < count.
  struct Probe {
    std::size_t open;
    std::size_t run;
    long long first, step, count;
  };

  std::vector<Probe> probes() const;
  // Queues the gathers of the pivots that some run cannot read where they lie into pinned
  // host memory, on their runs' streams; returns, per run, an event recorded after its
  // gathers (null where there were none).
  std::vector<std::unique_ptr<Event>> gather(const std::vector<Probe>& probes);
  // Narrows the brackets of every probed cut from the round's counts.
  void narrow(const std::vector<Probe>& probes, const std::vector<std::vector<int>>& segment_of);

  std::vector<MergeSortKernels> kernels_;
  std::vector<SortedRun> runs_;
  std::size_t item_;
  CutBounds bounds_;
  std::vector<Open> open_;
  std::vector<std::vector<bool>> direct_;  // [reader][source]: reads the source's run where it lies
  bool sorts_waited_ = false;
  std::size_t max_probes_ = 0;  // the first round's: rounds only close cuts
  std::size_t segments_at_ = 0, counts_at_ = 0, gathered_at_ = 0;  // in host_, per run after the first
  std::unique_ptr<PinnedBuffer> host_;
  std::optional<SyncOnUnwind> settle_;  // after host_: runs before it goes
};

// The comparator's order: its merge sort module per place (in place order, all of one
// element size), the search above and the JIT merge of two pieces on the current device.
class CompareOrder final : public SortOrder {
 public:
  explicit CompareOrder(std::vector<MergeSortKernels> kernels, std::vector<int> devices)
      : kernels_(std::move(kernels)), devices_(std::move(devices)) {}
  std::unique_ptr<CutSearch> search(std::vector<SortedRun> runs, const PlaceGroup& group,
                                    const std::vector<long long>& ranks, long long total) const override;
  void merge(void* temp, std::size_t& temp_bytes, const RunPiece& first, const RunPiece& second, unsigned char* out,
             unsigned char* out_values, cudaStream_t stream) const override;

 private:
  std::vector<MergeSortKernels> kernels_;
  std::vector<int> devices_;
};

}  // namespace csj::detail
