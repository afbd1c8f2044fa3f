// Internal: the steps of the multi-place sort (csj/sort.hpp), one file each. sort.cpp
// composes them; the sorting algorithms still to come (sort_by_key, merge sorts with a
// comparator, searchsorted, top_k) are meant to reuse them rather than grow copies:
//   sort_local.cpp         1. each place's radix sort of its shard, replayed from a CUDA
//                             graph once the same sort repeats;
//   sort_splitters.cpp     2. the exact splitter search over the sorted runs (co-ranking: one
//                             digit of the ordered keys per round, ties in place order);
//   sort_sampled_cuts.cpp     bounds of every cut from samples taken during the local sorts,
//                             and the environment's A/B switches for them;
//   sort_exchange.cpp      3. the chunk layout and the chunked exchange between places, and
//                          4. the runs' lifetime;
//   sort_merge.cpp            the merge of one chunk's pieces.
// Each step takes what it needs explicitly: the key type through its kernels::SortEngine
// (ordered-key width, kernels, CUB calls), the element size, and per place (in group order)
// its buffers and key count. A place without keys takes part in no launch.
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
}

namespace csj::detail {

// Everything one place holds during a sort (sort.cpp lays out its memory; the steps record
// its events). The scratch allocation is stream-ordered (from the group's pool) and goes back
// on the place's stream when the sort ends, also when it ends by an exception.
struct SortPlace {
  int device = 0;
  cudaStream_t stream = nullptr;
  long long n = 0;
  unsigned char* shard = nullptr;     // the output shard: sorted in place, or merged into
  StreamScratch scratch;              // one allocation carved into the buffers below
  unsigned char* run = nullptr;       // several places: the sorted run, which other places
                                      // read (once `ready`); one: the radix sort's second buffer
  unsigned char* temp = nullptr;      // CUB's temporary storage; once the sort is done, the
  std::size_t temp_bytes = 0;         // merges' and the two buffers below
  std::size_t merge_temp_bytes = 0;   // the merges' part of `temp`
  unsigned char* receive = nullptr;   // in `temp`: pieces copied from other devices
  long long receive_keys = 0;         // its capacity
  unsigned char* between = nullptr;   // in `temp`: merge levels (three or more pieces)
  const unsigned char* input = nullptr;    // the keys the radix sort reads (final once `unsorted`)
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

// Several places: records `place.input` and, when `sampled`, `place.unsorted`; queues the
// radix sort of `input` into `place.run` (through `place.temp`; from a CUDA graph once the
// configuration repeats), then records `place.ready`.
void queue_run_sort(const kernels::SortEngine& engine, SortPlace& place, const unsigned char* input, bool sampled);

// One place: queues the radix sort of `place.shard` in place (`place.run` the second buffer).
void sort_shard_in_place(const kernels::SortEngine& engine, SortPlace& place, std::size_t item);

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

// Step 2, one round at a time, so that the copies certain after the first round can travel
// while the later rounds run. After each round, bounds() hold every cut of ranks[i] (ranks
// ascending, each in [0, total], total the runs' key count); lower and upper are equal once
// boundary i is settled. Each round queues a counting kernel on every non-empty run's stream
// and waits for them.
class Splitters {
 public:
  Splitters(const kernels::SortEngine& engine, std::vector<SortedRun> runs, const PlaceGroup& group,
            const std::vector<long long>& ranks, long long total);

  bool settled() const { return open_.empty(); }
  const CutBounds& bounds() const { return bounds_; }
  const std::vector<std::vector<long long>>& cuts() const { return bounds_.lower; }  // once settled

  // One digit of every open boundary: every place counts its keys below 2^digit candidates
  // per boundary; the host waits, sums the counts over places and keeps, per boundary, the
  // candidate interval that holds its rank.
  void round();

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

// One sorted piece a merge reads: on `device`, possibly a peer's.
struct RunPiece {
  const unsigned char* data;
  long long n;
  int device;
};

// Where and with what a place merges.
struct MergeTarget {
  int device = 0;
  cudaStream_t stream = nullptr;
  unsigned char* shard = nullptr;    // written from element `offset` on
  unsigned char* between = nullptr;  // as large as the shard: merge levels of three or more pieces
  unsigned char* temp = nullptr;     // CUB's merge storage, of temp_bytes
  std::size_t temp_bytes = 0;
};
MergeTarget merge_target(const SortPlace& place);

// Queues on target.stream (current device: target.device) the merge of `pieces` (each
// sorted, in place order; stable: ties keep that order) into target.shard from element
// `offset` on; elements of `item` bytes.
void merge_pieces(const kernels::SortEngine& engine, const MergeTarget& target, std::vector<RunPiece> pieces,
                  long long offset, std::size_t item);

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
// when sampled): the splitter search (the host waits for the sorts there), the exchange and
// the merges into every shard, queued on the places' streams; records every place's `merged`
// and makes every run outlive its readers. `sampled`: queued samples, or null.
void exchange_and_merge(const kernels::SortEngine& engine, std::vector<SortPlace>& places, const PlaceGroup& group,
                        std::size_t item, const SortChunks& chunks, SampledCuts* sampled);

}  // namespace csj::detail
