// Internal: the steps of the multi-place sort (csj/sort.hpp), one file each. sort.cpp
// composes them for the radix sorts (keys alone, or keys carrying values: sort_by_key); the
// other sorting algorithms (merge sorts with a comparator) reuse them through SortOrder, the
// order's two parts the exchange needs (the cut search, the merge of two pieces):
//   sort_local.cpp         1. each place's radix sort of its shard, replayed from a CUDA
//                             graph once the same sort repeats;
//   sort_splitters.cpp     2. the exact splitter search over the sorted runs (co-ranking: one
//                             digit of the ordered keys per round, ties in place order);
//   sort_sampled_cuts.cpp     bounds of every cut from samples taken during the local sorts,
//                             and the environment's A/B switches for them;
//   sort_exchange.cpp      3. the chunk layout and the chunked exchange between places, and
//                          4. the runs' lifetime;
//   sort_merge.cpp            the merge of one chunk's pieces, and the radix sorts' order.
// Each step takes what it needs explicitly: the order, the element's lanes (key bytes and
// the bytes of the value it carries, if any), and per place (in group order) its buffers and
// key count. A place without keys takes part in no launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "cuda_check.hpp"
#include "sort_common.hpp"

namespace csj {
class PlaceGroup;
}

namespace csj::kernels {
struct SortEngine;
struct PairsEngine;
}

namespace csj::detail {

// The bytes of an element's two lanes: its key, and the value it carries (0: none). Every
// buffer below that holds keys has a twin for the values (null without them), indexed alike.
struct Lanes {
  std::size_t key = 0;
  std::size_t value = 0;
};

// Everything one place holds during a sort (sort.cpp lays out its memory; the steps record
// its events). The scratch allocation is stream-ordered (from the group's pool) and goes back
// on the place's stream when the sort ends, also when it ends by an exception.
struct SortPlace {
  int device = 0;
  cudaStream_t stream = nullptr;
  long long n = 0;
  unsigned char* shard = nullptr;     // the output shard: sorted in place, or merged into
  unsigned char* shard_values = nullptr;
  StreamScratch scratch;              // one allocation carved into the buffers below
  unsigned char* run = nullptr;       // several places: the sorted run, which other places
                                      // read (once `ready`); one: the radix sort's second buffer
  unsigned char* run_values = nullptr;
  unsigned char* temp = nullptr;      // CUB's temporary storage; once the sort is done, the
  std::size_t temp_bytes = 0;         // merges' and the two buffers below
  std::size_t merge_temp_bytes = 0;   // the merges' part of `temp`
  unsigned char* receive = nullptr;   // in `temp`: pieces copied from other devices
  unsigned char* receive_values = nullptr;
  long long receive_keys = 0;         // its capacity
  unsigned char* between = nullptr;   // in `temp`: merge levels (three or more pieces)
  unsigned char* between_values = nullptr;
  const unsigned char* input = nullptr;    // the keys the radix sort reads (final once `unsorted`)
  const unsigned char* input_values = nullptr;
  std::optional<Event> unsorted;  // only when the keys are sampled (SampledCuts)
  std::optional<Event> ready;     // the run is sorted
  std::optional<Event> merged;    // this place's merges (and reads of others) are done
};

// ---- 1. local sorts (sort_local.cpp) ----

// Queues what comes before a place's radix sort (current device: the place's) and returns
// the keys the sort reads, `input` being the place's input shard: the output shard, after a
// copy of `input` when the output is a distinct array and NaNs must be rewritten or the
// place sorts alone (in place); `input` itself otherwise (the output shard when the arrays
// are one; else integer keys over several places, which the run's sort reads and leaves as
// they were). Floating keys: every NaN in the output shard is rewritten as the positive
// quiet NaN.
const unsigned char* queue_sort_input(const kernels::SortEngine& engine, const SortPlace& place,
                                      const unsigned char* input, bool distinct_output, bool several,
                                      std::size_t item);
// The same for the values a place's keys carry (`pairs` non-null): copied into the output
// shard's values when they are another array's and the place sorts alone (in place); read
// where they are otherwise. Returns the values the radix sort reads.
const unsigned char* queue_values_input(const SortPlace& place, const unsigned char* input, bool distinct_output,
                                        bool several, std::size_t value_item);

// Several places: records `place.input` and, when `sampled`, `place.unsorted`; queues the
// radix sort of `input` (with `values`, the pairs engine's, when it is non-null) into
// `place.run` (and `place.run_values`; through `place.temp`; from a CUDA graph once the
// configuration repeats), then records `place.ready`.
void queue_run_sort(const kernels::SortEngine& engine, const kernels::PairsEngine* pairs, SortPlace& place,
                    const unsigned char* input, const unsigned char* values, bool sampled);

// One place: queues the radix sort of `place.shard` (and `place.shard_values` with `pairs`)
// in place (`place.run` and `place.run_values` the second buffers).
void sort_shard_in_place(const kernels::SortEngine& engine, const kernels::PairsEngine* pairs, SortPlace& place,
                         const Lanes& lanes);

// ---- cuts, their bounds ----

// For global ranks ranks[i]: lower[i][p] <= cuts[i][p] <= upper[i][p], where cuts[i][p] is
// how many of place p's sorted keys rank below ranks[i].
struct CutBounds {
  std::vector<std::vector<long long>> lower, upper;
};

// ---- 2. splitters (sort_splitters.cpp) ----

// A place's sorted run, as the splitter search reads it.
struct SortedRun {
  int device = 0;
  cudaStream_t stream = nullptr;  // the search's kernels queue here, behind the run's sort
  const unsigned char* keys = nullptr;
  long long n = 0;
};
std::vector<SortedRun> sorted_runs(const std::vector<SortPlace>& places);

// Step 2 as the exchange drives it, one round at a time, so that the copies certain after
// the first round can travel while the later rounds run. After each round, bounds() hold
// every cut of ranks[i] (ranks ascending, each in [0, total], total the runs' key count);
// lower and upper are equal once boundary i is settled. Ties are given out in place order,
// so that the split is deterministic and the sort stable.
class CutSearch {
 public:
  virtual ~CutSearch() = default;
  virtual bool settled() const = 0;
  virtual const CutBounds& bounds() const = 0;
  const std::vector<std::vector<long long>>& cuts() const { return bounds().lower; }  // once settled
  virtual void round() = 0;
};

// The radix sorts' search: each round queues a counting kernel on every non-empty run's
// stream and waits for them.
class Splitters final : public CutSearch {
 public:
  Splitters(const kernels::SortEngine& engine, std::vector<SortedRun> runs, const PlaceGroup& group,
            const std::vector<long long>& ranks, long long total);

  bool settled() const override { return open_.empty(); }
  const CutBounds& bounds() const override { return bounds_; }

  // One digit of every open boundary: every place counts its keys below 2^digit candidates
  // per boundary; the host waits, sums the counts over places and keeps, per boundary, the
  // candidate interval that holds its rank.
  void round() override;

 private:
  // a boundary still searched: every key of the interval left starts with `base`'s top bits
  struct Open {
    std::size_t index;  // in the list of ranks
    long long rank;
    unsigned long long base = 0;
  };

  const kernels::SortEngine& engine_;
  std::vector<SortedRun> runs_;
  CutBounds bounds_;
  std::vector<Open> open_;
  int known_bits_ = 0;  // the same for every open boundary
  std::size_t max_slots_ = 0;
  std::unique_ptr<PinnedBuffer> host_;
  std::optional<SyncOnUnwind> settle_;  // after host_: runs before it goes
};

// Throws unless the settled `cuts` are consistent: nondecreasing in i, within every run, and
// adding up to ranks[i] over places (they only disagree when other work wrote the keys).
void check_cuts(const std::vector<std::vector<long long>>& cuts, const std::vector<SortedRun>& runs,
                const std::vector<long long>& ranks);

// ---- sampled bounds (sort_sampled_cuts.cpp) ----

// The sampled bounds' switches, read from the environment in one place (see
// SampleSwitches::from_environment for each variable, its default and its use).
struct SampleSwitches {
  double sigmas = 6.0;             // the bounds' margin in standard deviations; < 0: no samples
  long long min_keys = 1LL << 25;  // samples only when every non-empty shard has this many keys
  static SampleSwitches from_environment();
  // Whether a sort over shards of these sizes samples its keys (its caller decides whether
  // anything travels at all).
  bool wanted(const std::vector<std::int64_t>& shard_sizes) const;
};

// A place's keys as the sampling reads them: `keys` once `unsorted` (null for n == 0).
struct SampleSource {
  int device = 0;
  const unsigned char* keys = nullptr;
  long long n = 0;
  const Event* unsorted = nullptr;
};
std::vector<SampleSource> sample_sources(const std::vector<SortPlace>& places);

// Likely bounds of every cut from samples of each place's keys taken while the local sorts
// run (details in sort_sampled_cuts.cpp): they hold almost surely, not surely.
class SampledCuts {
 public:
  static constexpr long long kSamples = 1LL << 16;  // per place
  static constexpr int kBucketBits = 16;

  // Queues the sampling of every non-empty source's keys on a side stream of its device,
  // into pinned host memory. `sigmas` >= 0 (SampleSwitches::sigmas, read once per sort).
  SampledCuts(const kernels::SortEngine& engine, std::vector<SampleSource> sources, double sigmas);
  ~SampledCuts();
  SampledCuts(const SampledCuts&) = delete;
  SampledCuts& operator=(const SampledCuts&) = delete;

  // Waits for the samples; then the bounds of the cuts of `ranks` over keys `total` (almost
  // surely).
  CutBounds bounds(const std::vector<long long>& ranks, long long total);

 private:
  static long long samples_of(const SampleSource& source);
  static long long clamp(double keys, long long n);
  void wait(bool quiet);

  std::vector<SampleSource> sources_;
  int key_bits_;
  std::size_t key_bytes_;  // of an ordered key as the sampling kernel writes it
  double sigmas_;
  std::vector<std::size_t> offsets_;  // of each place's samples in host_
  std::unique_ptr<PinnedBuffer> host_;
  std::vector<std::unique_ptr<CopyStream>> sides_;  // after host_: they go first
};

// ---- merge (sort_merge.cpp) ----

// One sorted piece a merge reads: on `device`, possibly a peer's; `values` null when the
// keys carry none.
struct RunPiece {
  const unsigned char* data;
  const unsigned char* values;
  long long n;
  int device;
};

// The order a multi-place sort follows, as the exchange needs it: the search of the cuts
// (step 2) and the stable merge of two sorted pieces (step 3).
class SortOrder {
 public:
  virtual ~SortOrder() = default;
  virtual std::unique_ptr<CutSearch> search(std::vector<SortedRun> runs, const PlaceGroup& group,
                                            const std::vector<long long>& ranks, long long total) const = 0;
  // Queues on `stream` (current device: the stream's) the merge of `first` and `second` into
  // `out` (and `out_values` when the pieces carry values); ties from `first` come first. A
  // null `temp` only sets `temp_bytes` (the pieces' pointers may then be null).
  virtual void merge(void* temp, std::size_t& temp_bytes, const RunPiece& first, const RunPiece& second,
                     unsigned char* out, unsigned char* out_values, cudaStream_t stream) const = 0;
};

// The radix sorts' order: the ordered keys of `engine`, the values moved by `pairs` (null:
// keys alone).
class RadixOrder final : public SortOrder {
 public:
  RadixOrder(const kernels::SortEngine& engine, const kernels::PairsEngine* pairs) : engine_(engine), pairs_(pairs) {}
  std::unique_ptr<CutSearch> search(std::vector<SortedRun> runs, const PlaceGroup& group,
                                    const std::vector<long long>& ranks, long long total) const override;
  void merge(void* temp, std::size_t& temp_bytes, const RunPiece& first, const RunPiece& second, unsigned char* out,
             unsigned char* out_values, cudaStream_t stream) const override;

 private:
  const kernels::SortEngine& engine_;
  const kernels::PairsEngine* pairs_;
};

// Where and with what a place merges.
struct MergeTarget {
  int device = 0;
  cudaStream_t stream = nullptr;
  unsigned char* shard = nullptr;    // written from element `offset` on
  unsigned char* shard_values = nullptr;
  unsigned char* between = nullptr;  // as large as the shard: merge levels of three or more pieces
  unsigned char* between_values = nullptr;
  unsigned char* temp = nullptr;     // the merge's storage, of temp_bytes
  std::size_t temp_bytes = 0;
};
MergeTarget merge_target(const SortPlace& place);

// Queues on target.stream (current device: target.device) the merge of `pieces` (each
// sorted, in place order; stable: ties keep that order) into target.shard (and its values)
// from element `offset` on.
void merge_pieces(const SortOrder& order, const MergeTarget& target, std::vector<RunPiece> pieces, long long offset,
                  const Lanes& lanes);

// Copies a piece's keys (and values) to `keys` (and `values`) on `device`.
void copy_piece(const RunPiece& piece, unsigned char* keys, unsigned char* values, int device, const Lanes& lanes,
                cudaStream_t stream);

// ---- 3. chunks and exchange, 4. run lifetime (sort_exchange.cpp) ----

// The global ranks the runs are cut at: where each output shard, and each chunk of one,
// starts, then the total. Place q's chunks start at ranks[first[q]], ranks[first[q] + 1], ...
// and its last one ends at ranks[end[q]] (for a shard without keys: one empty chunk).
struct SortChunks {
  std::vector<long long> ranks;
  std::vector<std::size_t> first, end;
};
SortChunks chunk_layout(const std::vector<std::int64_t>& shard_sizes, const std::vector<std::int64_t>& shard_offsets,
                        long long total);

// The receive buffer a place of n keys needs: its keys and room for the uncertain ends of
// the windows that bounds of the cuts leave.
inline long long receive_capacity(long long n) { return n + n / 64; }

// Steps 2 to 4 once the local sorts are queued (every non-empty place's `ready`, `unsorted`
// when sampled): the cut search of `order` (the host waits for the sorts there), the
// exchange and the merges into every shard, queued on the places' streams; records every
// place's `merged` and makes every run outlive its readers. `sampled`: queued samples, or
// null.
void exchange_and_merge(const SortOrder& order, std::vector<SortPlace>& places, const PlaceGroup& group,
                        const Lanes& lanes, const SortChunks& chunks, SampledCuts* sampled);

}  // namespace csj::detail
