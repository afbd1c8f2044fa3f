// The multi-place sort (csj/sort.hpp):
//   1. each place radix-sorts its shard into a run buffer of its own (one place alone sorts
//      in place: CUB decides between the shard and a scratch buffer), replayed from a CUDA
//      graph once the same sort repeats (SortGraphs);
//   2. exact splitters: for every shard boundary (a global rank R) and every place, how many
//      of that place's sorted keys go before R. A digit-by-digit search over the ordered-key
//      space: each round, every place counts its keys below 2^12 candidates per boundary
//      (binary searches, written straight into pinned host memory: no copy engine is busy
//      with them while the first keys travel), the host sums the counts over places and
//      keeps the candidate interval that holds rank R. Ties at the final key are given out
//      in place order, so the split is deterministic and each output shard gets exactly its
//      size;
//   3. the same search cuts each output shard into chunks; each shard is written chunk by
//      chunk by merging its pieces of every place's run (a tree of two-way merges). Pieces
//      on another device are copied into a receive buffer on a transfer stream (every place
//      at once, so both directions of each link are busy), and a chunk is merged as soon as
//      its pieces are in, while the next chunk's travel; pieces on the same device are
//      merged where they lie. Bounds of every cut are known before the search ends, so the
//      keys of the first chunk's pieces that lie between those bounds travel while it runs
//      (into windows of the receive buffer that hold every possible cut): for shards of
//      2^25 keys and more, bounds from samples of the keys taken during the local sorts
//      (SampledCuts), queued to go the moment the sorts end; else those of its first round;
//   4. a run buffer goes only once every place that reads it has finished.
#include "csj/sort.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../kernels/sort_engine.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"
#include "sort_common.hpp"

namespace csj {
namespace {

using detail::check;
using detail::DeviceGuard;
using detail::copy_keys;
using detail::PinnedBuffer;
namespace k = kernels;

constexpr int kDigitBits = 12;  // candidates per boundary and round: 2^12
constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Everything one place holds during a sort. The scratch allocation is stream-ordered (from
// the group's pool) and goes back on the place's stream when the sort ends, also when it
// ends by an exception.
struct Place {
  int device = 0;
  cudaStream_t stream = nullptr;
  long long n = 0;
  unsigned char* shard = nullptr;     // the output shard: sorted in place, or merged into
  detail::StreamScratch scratch;      // one allocation carved into the buffers below
  unsigned char* alternate = nullptr; // one place: the radix sort's second buffer; several:
                                      // the sorted run, which other places read (once `ready`)
  unsigned char* temp = nullptr;      // CUB's temporary storage; once the sort is done, the
  std::size_t temp_bytes = 0;         // merges' and the two buffers below
  std::size_t merge_temp_bytes = 0;   // the merges' part of `temp`
  unsigned char* receive = nullptr;   // in `temp`: pieces copied from other devices
  long long receive_keys = 0;         // its capacity
  unsigned char* between = nullptr;   // in `temp`: merge levels (three or more pieces)
  const unsigned char* input = nullptr;    // the keys the radix sort reads (final once `unsorted`)
  std::optional<detail::Event> unsorted;  // only when the keys are sampled (SampledCuts)
  std::optional<detail::Event> ready;    // the run is sorted
  std::optional<detail::Event> merged;   // this place's merges (and reads of others) are done
};

// One sorted piece a merge reads: on `device`, possibly a peer's.
struct Piece {
  const unsigned char* data;
  long long n;
  int device;
};

// Step 2, one round at a time, so that the copies certain after the first round can travel
// while the later rounds run. After each round, lower(i, p) <= cuts[i][p] <= upper(i, p),
// where cuts[i][p] = how many of place p's sorted keys rank below global rank ranks[i]
// (ranks ascending, each in [0, total]); both are equal once boundary i is settled.
class Splitters {
 public:
  Splitters(const k::SortEngine& engine, std::vector<Place>& places, const PlaceGroup& group,
            const std::vector<long long>& ranks, long long total)
      : engine_(engine), places_(places) {
    const std::size_t count = places.size();
    lower_.assign(ranks.size(), std::vector<long long>(count, 0));
    upper_.assign(ranks.size(), std::vector<long long>(count, 0));
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      for (std::size_t p = 0; p < count; ++p) upper_[i][p] = places[p].n;
      if (ranks[i] == 0) {
        upper_[i].assign(count, 0);
      } else if (ranks[i] == total) {
        lower_[i] = upper_[i];
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

  bool settled() const { return open_.empty(); }
  const std::vector<std::vector<long long>>& lowers() const { return lower_; }
  const std::vector<std::vector<long long>>& uppers() const { return upper_; }
  const std::vector<std::vector<long long>>& cuts() const { return lower_; }  // once settled

  // One digit of every open boundary: every place counts its keys below 2^digit candidates
  // per boundary; the host waits, sums the counts over places and keeps, per boundary, the
  // candidate interval that holds its rank.
  void round() {
    const std::size_t count = places_.size();
    auto* bases = reinterpret_cast<unsigned long long*>(host_->data);
    auto* counts = bases + open_.size();
    const int key_bits = engine_.key_bits;
    const int digit = std::min(kDigitBits, key_bits - known_bits_);
    const int shift = key_bits - known_bits_ - digit;
    const int candidates = 1 << digit;
    const std::size_t slots = open_.size() * static_cast<std::size_t>(candidates);
    for (std::size_t b = 0; b < open_.size(); ++b) bases[b] = open_[b].base;
    for (std::size_t p = 0; p < count; ++p) {
      Place& place = places_[p];
      if (place.n == 0) continue;
      DeviceGuard guard(place.device);
      k::SplitterParams params{};
      params.keys = place.alternate;
      params.n = place.n;
      params.bases = bases;  // read and written where they lie, in pinned host memory
      params.counts = counts + p * max_slots_;
      params.boundaries = static_cast<int>(open_.size());
      params.candidates = candidates;
      params.shift = shift;
      const auto grid = static_cast<unsigned>((slots + k::kSplitterBlock - 1) / k::kSplitterBlock);
      detail::launch(detail::KernelHandle::builtin(engine_.splitter_kernel), grid, k::kSplitterBlock, place.stream,
                     params, "launching sort splitters");
    }
    for (const Place& place : places_) {
      if (place.n == 0) continue;
      DeviceGuard guard(place.device);
      check(cudaStreamSynchronize(place.stream), "cudaStreamSynchronize");
    }
    // (the bases buffer is rewritten by the next round: the kernels above have completed)
    known_bits_ += digit;

    std::vector<Open> still_open;
    for (std::size_t b = 0; b < open_.size(); ++b) {
      Open& boundary = open_[b];
      auto below = [&](std::size_t p, int j) -> long long {
        return places_[p].n == 0 ? 0 : static_cast<long long>(counts[p * max_slots_ + b * candidates + j]);
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
      std::vector<long long>& lower = lower_[boundary.index];
      std::vector<long long>& upper = upper_[boundary.index];
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

 private:
  // a boundary still searched: every key of the interval left starts with `base`'s top bits
  struct Open {
    std::size_t index;  // in the list of ranks
    long long rank;
    unsigned long long base = 0;
  };

  const k::SortEngine& engine_;
  std::vector<Place>& places_;
  std::vector<std::vector<long long>> lower_, upper_;
  std::vector<Open> open_;
  int known_bits_ = 0;  // the same for every open boundary
  std::size_t max_slots_ = 0;
  std::unique_ptr<PinnedBuffer> host_;
  std::optional<detail::SyncOnUnwind> settle_;  // after host_: runs before it goes
};

// The counts come from binary searches over runs sorted a moment ago: they only disagree
// when something else wrote the input meanwhile. Nothing moves then.
void check_cuts(const std::vector<std::vector<long long>>& cuts, const std::vector<Place>& places,
                const std::vector<long long>& ranks) {
  const std::size_t count = places.size();
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    long long sum = 0;
    for (std::size_t p = 0; p < count; ++p) {
      const long long below = i == 0 ? 0 : cuts[i - 1][p];
      if (cuts[i][p] < below || cuts[i][p] > places[p].n) {
        throw std::runtime_error("sort: inconsistent splitters; was the array written by other work "
                                 "while it was being sorted?");
      }
      sum += cuts[i][p];
    }
    if (sum != ranks[i]) throw std::runtime_error("sort: splitters do not add up to the shard boundaries");
  }
}

// sort_path_counts()
std::atomic<unsigned long long> sampled_sorts{0}, missed_sorts{0}, first_round_sorts{0};

// Likely bounds of every cut, from a sample of each place's keys taken while the local sorts
// run, so that the first chunk's keys are queued to travel the moment the sorts end (the
// search's first round reads the sorted runs, and its round trip through the host held them
// back ~0.05 ms). Each place samples its keys at spread positions (one per stratum) into
// pinned host memory; the host counts the samples per bucket of the ordered keys' top
// kBucketBits bits. At a bucket's start, place p's s samples below it stand for
// s * n_p / S_p keys, within sigmas() standard deviations (each at most
// (n_p / S_p) * sqrt(S_p) / 2) of the true count: the bounds hold with overwhelming
// probability, not surely. The search then runs as before, and a place whose exact cuts fall
// outside them drops the early copies' layout.
class SampledCuts {
 public:
  static constexpr long long kSamples = 1LL << 16;  // per place
  static constexpr int kBucketBits = 16;
  // The bounds' margin in standard deviations; CSJ_SORT_SAMPLE_SIGMAS sets another (tests
  // narrow it to 0 so that the bounds miss and the places fall back), or "off" (no samples:
  // the bounds of the search's first round, as for smaller shards).
  static double sigmas() {
    const char* text = std::getenv("CSJ_SORT_SAMPLE_SIGMAS");
    if (!text || !*text) return 6.0;
    if (std::string(text) == "off") return -1.0;
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    return end && *end == '\0' && value >= 0.0 ? value : 6.0;
  }
  // Below this many keys in a non-empty shard, sampling costs more than it saves (the
  // samples' kernel and the host's count are not hidden by short local sorts): 2x H200, int32
  // keys over two places, sampled against the first round's bounds (same runs): 2^23 keys
  // 0.546 against 0.423 ms, 2^24 0.807 against 0.633, 2^25 0.726 against 0.742, 2^26 1.109
  // against 1.123, 2^28 3.560 against 3.601. CSJ_SORT_SAMPLE_MIN_KEYS sets another (tests
  // lower it).
  static long long min_keys() {
    const char* text = std::getenv("CSJ_SORT_SAMPLE_MIN_KEYS");
    if (!text || !*text) return 1LL << 25;
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    return end && *end == '\0' && value >= 0 ? value : 1LL << 25;
  }

  // Whether to sample, with `sigmas` from sigmas() (read once per sort: the environment may
  // change meanwhile).
  static bool wanted(const std::vector<Place>& places, double sigmas) {
    if (sigmas < 0.0) return false;
    const long long least = min_keys();
    for (const Place& place : places) {
      if (place.n > 0 && place.n < least) return false;
    }
    return true;
  }

  // Queues the sampling of every non-empty place's keys (`input`, once `unsorted`) on a side
  // stream of its device, into pinned host memory.
  SampledCuts(const k::SortEngine& engine, const std::vector<Place>& places, double sigmas)
      : places_(places), key_bits_(engine.key_bits), key_bytes_(engine.key_bits == 32 ? 4 : 8), sigmas_(sigmas) {
    std::size_t total = 0;
    for (const Place& place : places) {
      offsets_.push_back(total);
      total += static_cast<std::size_t>(samples_of(place)) * key_bytes_;
    }
    host_ = std::make_unique<PinnedBuffer>(total);
    sides_.resize(places.size());
    for (std::size_t p = 0; p < places.size(); ++p) {
      const Place& place = places[p];
      const long long samples = samples_of(place);
      if (samples == 0) continue;
      DeviceGuard guard(place.device);
      sides_[p] = std::make_unique<detail::CopyStream>(place.device);
      place.unsorted->wait(sides_[p]->get());
      k::SampleParams params{};
      params.keys = place.input;
      params.n = place.n;
      params.count = samples;
      params.ordered = host_->data + offsets_[p];  // written where it lies, in pinned host memory
      detail::launch(detail::KernelHandle::builtin(engine.sample_kernel), static_cast<unsigned>((samples + 255) / 256),
                     256, sides_[p]->get(), params, "launching sort samples");
    }
  }
  ~SampledCuts() { wait(true); }
  SampledCuts(const SampledCuts&) = delete;
  SampledCuts& operator=(const SampledCuts&) = delete;

  // Waits for the samples; then lower[i][p] <= cuts[i][p] <= upper[i][p] (almost surely),
  // where cuts[i][p] = how many of place p's keys rank below global rank ranks[i].
  void bounds(const std::vector<long long>& ranks, long long total, std::vector<std::vector<long long>>& lower,
              std::vector<std::vector<long long>>& upper) {
    wait(false);
    const std::size_t count = places_.size();
    constexpr std::size_t kBuckets = std::size_t(1) << kBucketBits;
    const int shift = std::max(0, key_bits_ - kBucketBits);  // narrower keys: a bucket per key
    // below[p * (kBuckets + 1) + b]: place p's samples in buckets before b (b = kBuckets: all
    // of them). Kept per thread: a fresh half megabyte per call costs more in page faults
    // than the counting.
    thread_local std::vector<std::uint32_t> below;
    below.assign(count * (kBuckets + 1), 0);
    auto below_of = [&](std::size_t p, std::size_t b) { return below[p * (kBuckets + 1) + b]; };
    std::vector<double> weight(count, 0.0), margin(count, 0.0);
    double margins = 0.0;
    for (std::size_t p = 0; p < count; ++p) {
      const long long samples = samples_of(places_[p]);
      if (samples == 0) continue;
      std::uint32_t* counts = below.data() + p * (kBuckets + 1);
      const unsigned char* keys = host_->data + offsets_[p];
      if (key_bytes_ == 4) {
        const auto* ordered = reinterpret_cast<const std::uint32_t*>(keys);
        for (long long j = 0; j < samples; ++j) ++counts[(ordered[j] >> shift) + 1];
      } else {
        const auto* ordered = reinterpret_cast<const unsigned long long*>(keys);
        for (long long j = 0; j < samples; ++j) ++counts[static_cast<std::size_t>(ordered[j] >> shift) + 1];
      }
      for (std::size_t b = 1; b <= kBuckets; ++b) counts[b] += counts[b - 1];
      weight[p] = static_cast<double>(places_[p].n) / static_cast<double>(samples);
      margin[p] = sigmas_ * weight[p] * std::sqrt(static_cast<double>(samples)) / 2.0;
      margins += margin[p];
    }
    // the estimated count of all places' keys below bucket b: nondecreasing in b
    auto estimate = [&](std::size_t b) {
      double sum = 0.0;
      for (std::size_t p = 0; p < count; ++p) sum += weight[p] * below_of(p, b);
      return sum;
    };
    // the first bucket start in [1, kBuckets) whose estimate passes `keys` (strictly, or not)
    auto first_past = [&](double keys, bool strictly) {
      std::size_t low = 1, high = kBuckets;
      while (low < high) {
        const std::size_t middle = low + (high - low) / 2;
        const double at = estimate(middle);
        if (strictly ? at > keys : at >= keys) {
          high = middle;
        } else {
          low = middle + 1;
        }
      }
      return low;
    };
    lower.assign(ranks.size(), std::vector<long long>(count, 0));
    upper.assign(ranks.size(), std::vector<long long>(count, 0));
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      const auto rank = static_cast<double>(ranks[i]);
      // the last bucket start surely at or below the rank (bucket 0's start has no key below
      // it), and the first surely at or above it (past the last bucket, every key is below)
      const std::size_t low = first_past(rank - margins, true) - 1;
      const std::size_t high = first_past(rank + margins, false);
      for (std::size_t p = 0; p < count; ++p) {
        const long long n = places_[p].n;
        if (ranks[i] == 0 || n == 0) continue;
        if (ranks[i] == total) {
          lower[i][p] = upper[i][p] = n;
          continue;
        }
        lower[i][p] = low == 0 ? 0 : clamp(std::floor(weight[p] * below_of(p, low) - margin[p]), n);
        upper[i][p] = high == kBuckets ? n : clamp(std::ceil(weight[p] * below_of(p, high) + margin[p]), n);
      }
    }
  }

 private:
  static long long samples_of(const Place& place) { return place.n > 0 ? std::min(place.n, kSamples) : 0; }
  static long long clamp(double keys, long long n) {
    return keys <= 0.0 ? 0 : keys >= static_cast<double>(n) ? n : static_cast<long long>(keys);
  }
  // The kernels write host_: they end before it goes back (quietly when unwinding).
  void wait(bool quiet) {
    for (std::size_t p = 0; p < sides_.size(); ++p) {
      if (!sides_[p]) continue;
      if (quiet) {
        detail::synchronize_quietly(sides_[p]->device(), sides_[p]->get());
      } else {
        DeviceGuard guard(sides_[p]->device());
        check(cudaStreamSynchronize(sides_[p]->get()), "cudaStreamSynchronize (sort samples)");
      }
      sides_[p].reset();
    }
  }

  const std::vector<Place>& places_;
  int key_bits_;
  std::size_t key_bytes_;  // of an ordered key as the sampling kernel writes it
  double sigmas_;
  std::vector<std::size_t> offsets_;  // of each place's samples in host_
  std::unique_ptr<PinnedBuffer> host_;
  std::vector<std::unique_ptr<detail::CopyStream>> sides_;  // after host_: they go first
};

// Writes the merge of `pieces` (each sorted, in place order) to place.shard from element
// `offset` on: two-way merges level by level (stable, so ties keep place order), the levels
// alternating between the shard and `between` (at the same offset) so that the last one
// writes the shard.
void merge_pieces(const k::SortEngine& engine, Place& place, std::vector<Piece> pieces, long long offset,
                  std::size_t item) {
  if (pieces.empty()) return;
  unsigned char* shard = place.shard + offset * item;
  int levels = 0;
  for (std::size_t width = 1; width < pieces.size(); width <<= 1) ++levels;
  if (levels == 0) {
    copy_keys(shard, place.device, pieces[0].data, pieces[0].device, static_cast<std::size_t>(pieces[0].n) * item,
              place.stream);
    return;
  }
  for (int level = 1; level <= levels; ++level) {
    unsigned char* target = (levels - level) % 2 == 0 ? shard : place.between + offset * item;
    std::vector<Piece> merged;
    long long at = 0;
    for (std::size_t r = 0; r < pieces.size(); r += 2) {
      const Piece& first = pieces[r];
      if (r + 1 == pieces.size()) {
        copy_keys(target + at * item, place.device, first.data, first.device, static_cast<std::size_t>(first.n) * item,
                  place.stream);
        merged.push_back({target + at * item, first.n, place.device});
        at += first.n;
        continue;
      }
      const Piece& second = pieces[r + 1];
      std::size_t bytes = place.merge_temp_bytes;
      check(engine.merge(place.temp, bytes, first.data, first.n, second.data, second.n, target + at * item,
                         place.stream),
            "cub::DeviceMerge");
      merged.push_back({target + at * item, first.n + second.n, place.device});
      at += first.n + second.n;
    }
    pieces = std::move(merged);
  }
}

// A stream of its own for copies into a place's receive buffer, so that they run while the
// place merges what has already arrived. Before its first copy from a run, it waits for that
// run's sort and for the place's own (the receive buffer is CUB's storage until then). Left
// by an exception, it waits for its copies before the buffers they write go.
class TransferStream {
 public:
  TransferStream(int device, std::size_t places) : stream_(device), waited_(places, false) {}

  // Copies keys [from, to) of place p's run into `place`'s receive buffer at element `at`.
  void copy(Place& place, const Place& source, std::size_t p, long long from, long long to, long long at,
            std::size_t item) {
    if (from >= to) return;
    if (!landed_) place.ready->wait(stream_.get()), landed_ = true;
    if (!waited_[p]) source.ready->wait(stream_.get()), waited_[p] = true;
    copy_keys(place.receive + at * item, place.device, source.alternate + from * item, source.device,
              static_cast<std::size_t>(to - from) * item, stream_.get());
    used_ = true;
  }
  // An event for the copies queued since the last call (null when none were).
  detail::Event* arrivals(std::deque<detail::Event>& events) {
    if (!used_) return nullptr;
    used_ = false;
    detail::Event* event = &events.emplace_back(stream_.device());
    event->record(stream_.get());
    return event;
  }

 private:
  detail::CopyStream stream_;
  bool landed_ = false;
  std::vector<bool> waited_;
  bool used_ = false;
};

// Queues the radix sort of a place's shard into its run. CUB queues one sort as a dozen
// launches and memsets, and the places' sorts are queued one after another, so the last place
// would start its sort that much host time after the first (and every place waits for the
// last). A sort seen before with the same buffers, size and engine is replayed instead from a
// CUDA graph, one launch: the graph is made on the second sighting of a configuration (the
// first would pay for capture and instantiation, and most configurations repeat only in
// loops), and the last kSortGraphs configurations are kept. A graph records the kernels'
// arguments (pointers, sizes) and nothing else, so replaying it with the same ones is the
// same work; launches of one graph are ordered by CUDA, whatever the stream.
class SortGraphs {
 public:
  static void queue(const k::SortEngine& engine, void* temp, std::size_t temp_bytes, const void* in, void* out,
                    long long n, cudaStream_t stream) {
    const detail::ContextStamp context = detail::ContextStamp::current();
    const Key key{context.id, &engine, in, out, temp, temp_bytes, n};
    bool seen = false;
    {
      // launched under the lock: another thread's remember() may destroy a graph it evicts
      std::lock_guard<std::mutex> lock(mutex());
      auto& list = entries();
      for (auto it = list.begin(); it != list.end(); ++it) {
        if (!(it->key == key)) continue;
        seen = true;
        if (it->exec) {
          if (cudaGraphLaunch(it->exec, stream) == cudaSuccess) {
            list.splice(list.begin(), list, it);  // most recent first
            return;
          }
          cudaGetLastError();  // a graph that no longer launches goes; the sort is queued as usual
          cudaGraphExecDestroy(it->exec);
          list.erase(it);
          seen = false;
        }
        break;
      }
      if (!seen) remember(key, context, nullptr);
    }
    cudaGraphExec_t exec = seen ? capture(engine, temp, temp_bytes, in, out, n) : nullptr;
    if (exec && cudaGraphLaunch(exec, stream) != cudaSuccess) {
      cudaGetLastError();
      cudaGraphExecDestroy(exec);
      exec = nullptr;
    }
    if (!exec) {
      check(engine.sort_into(temp, temp_bytes, in, out, n, stream), "cub::DeviceRadixSort");
      return;
    }
    std::lock_guard<std::mutex> lock(mutex());
    remember(key, context, exec);
  }

 private:
  static constexpr std::size_t kSortGraphs = 16;
  struct Key {
    unsigned long long context;
    const void* engine;
    const void* in;
    void* out;
    void* temp;
    std::size_t temp_bytes;
    long long n;
    bool operator==(const Key& other) const {
      return context == other.context && engine == other.engine && in == other.in && out == other.out &&
             temp == other.temp && temp_bytes == other.temp_bytes && n == other.n;
    }
  };
  struct Entry {
    Key key;
    detail::ContextStamp context;
    cudaGraphExec_t exec;  // null until the second sighting
  };
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::list<Entry>& entries() {
    static std::list<Entry> list;  // kept until exit, like the driver's own state
    return list;
  }

  // The sort as a graph, or null when capture fails. It is captured on a stream of its own
  // (the current device's): work that other threads queue on the place's stream meanwhile
  // must run, not join the graph.
  static cudaGraphExec_t capture(const k::SortEngine& engine, void* temp, std::size_t temp_bytes, const void* in,
                                 void* out, long long n) {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    const detail::CopyStream side(device);
    const cudaStream_t stream = side.get();
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    const cudaError_t queued = engine.sort_into(temp, temp_bytes, in, out, n, stream);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    cudaGraphExec_t exec = nullptr;
    if (queued == cudaSuccess && ended == cudaSuccess && graph &&
        cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
      exec = nullptr;
    }
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    return exec;
  }

  // Under the lock: `key` first, with `exec` (a graph already there is kept and `exec`, if
  // another, goes); the oldest configurations beyond kSortGraphs go, as do those of contexts
  // a device reset destroyed (their graphs went with them).
  static void remember(const Key& key, const detail::ContextStamp& context, cudaGraphExec_t exec) {
    auto& list = entries();
    for (auto it = list.begin(); it != list.end(); ++it) {
      if (!(it->key == key)) continue;
      if (!it->exec) {
        it->exec = exec;
      } else if (exec && exec != it->exec) {
        cudaGraphExecDestroy(exec);  // freed once its launch completes
      }
      list.splice(list.begin(), list, it);
      return;
    }
    list.push_front({key, context, exec});
    for (auto it = list.begin(); it != list.end();) {
      if (it->context.alive()) {
        ++it;
      } else {
        it = list.erase(it);
      }
    }
    while (list.size() > kSortGraphs) {
      if (list.back().exec) cudaGraphExecDestroy(list.back().exec);
      list.pop_back();
    }
  }
};

// Each output shard (of at least kChunkMin keys) is cut into chunks in these proportions: the
// first chunk's pieces go while the later splitter rounds run, and each chunk is merged as
// soon as its pieces are in while the next ones travel, so the last chunk's merge is the tail
// after the last copy: a smaller last chunk shortens it. (2x H200, 2^28 int32 keys over two
// places: 3.664 ms with these against 3.694 ms with four equal chunks, same run.)
constexpr long long kChunkWeights[] = {5, 5, 4, 2};
constexpr long long kChunkMin = 4096;

long long chunks_of(long long n) { return n >= kChunkMin ? static_cast<long long>(std::size(kChunkWeights)) : 1; }
// Where chunk j of a shard of n keys starts.
long long chunk_start(long long n, long long j) {
  if (chunks_of(n) == 1) return 0;
  long long before = 0, total = 0;
  for (long long i = 0; i < chunks_of(n); ++i) {
    total += kChunkWeights[i];
    if (i < j) before += kChunkWeights[i];
  }
  return n * before / total;
}

void exchange_and_merge(const k::SortEngine& engine, std::vector<Place>& places, const ShardedArray& out,
                        std::size_t item, const std::vector<long long>& ranks,
                        const std::vector<std::size_t>& first_chunk, SampledCuts* sampled);

}  // namespace

void sort(const ShardedArray& in, ShardedArray& out, bool descending) {
  const ArrayLeases leases({{&in, "a"}, {&out, "out"}});
  if (in.group() != out.group()) throw std::invalid_argument("out: belongs to another PlaceGroup");
  if (in.shard_sizes() != out.shard_sizes()) throw std::invalid_argument("out: shard sizes differ from a's");
  in.check_scalar("a", "sort");
  if (in.dtype() != out.dtype()) throw std::invalid_argument("out: dtype differs from a's");
  const k::SortEngine* engine = k::sort_engine(static_cast<int>(in.dtype()), descending);
  if (!engine) throw std::invalid_argument(std::string("a: cannot sort dtype ") + dtype_name(in.dtype()));

  const PlaceGroup& group = *in.group();
  const std::size_t count = group.size();
  const std::size_t item = in.itemsize();
  std::size_t non_empty = 0;
  for (std::size_t p = 0; p < count; ++p) non_empty += in.shard_size(p) > 0 ? 1 : 0;
  if (non_empty == 0) return;
  const bool several = non_empty > 1;

  // The global ranks the runs are cut at: where each output shard, and each chunk of one,
  // starts, then the end. Place q's chunk j spans ranks[first_chunk[q] + j] up to the next.
  std::vector<long long> ranks;
  std::vector<std::size_t> first_chunk(count, 0);
  for (std::size_t q = 0; q < count && several; ++q) {
    first_chunk[q] = ranks.size();
    const long long n = out.shard_size(q), start = out.shard_offset(q);
    for (long long j = 0; n > 0 && j < chunks_of(n); ++j) ranks.push_back(start + chunk_start(n, j));
  }
  if (several) ranks.push_back(out.size());

  // Pieces on another device are copied into a receive buffer (chunk by chunk, while earlier
  // chunks merge); pieces on the place's own device are merged where they lie.
  bool needs_receive = false;
  for (std::size_t q = 0; q < count && several; ++q) {
    for (std::size_t p = 0; p < count; ++p) {
      if (in.shard_size(q) > 0 && in.shard_size(p) > 0 && group.device(q) != group.device(p)) needs_receive = true;
    }
  }
  // Merge levels (three or more pieces) go through a buffer of one shard.
  const bool deep_merges = non_empty > 2;
  // Once a place's run is sorted, its CUB storage (which holds a buffer of the shard's keys
  // besides) takes the merges' storage, the receive buffer and the merge levels' buffer: a
  // sort over several places needs about two shards of scratch per place (three with merge
  // levels).

  // 1. local sorts: every place's memory first, then the sorts queued back to back, so that
  //    the places start together
  std::vector<Place> places(count);
  for (std::size_t p = 0; p < count; ++p) places[p].n = in.shard_size(p);
  const double sigmas = SampledCuts::sigmas();
  const bool sample = several && needs_receive && SampledCuts::wanted(places, sigmas);
  for (std::size_t p = 0; p < count; ++p) {
    Place& place = places[p];
    place.device = group.device(p);
    place.stream = reinterpret_cast<cudaStream_t>(group.stream(p));
    if (place.n == 0) continue;
    place.shard = reinterpret_cast<unsigned char*>(out.shard_pointer(p));
    DeviceGuard guard(place.device);
    const std::size_t keys = aligned(static_cast<std::size_t>(place.n) * item);
    std::size_t sort_temp = 0;
    if (several) {
      check(engine->sort_into(nullptr, sort_temp, nullptr, nullptr, place.n, place.stream), "cub::DeviceRadixSort");
      check(engine->merge(nullptr, place.merge_temp_bytes, nullptr, place.n - place.n / 2, nullptr, place.n / 2,
                          nullptr, place.stream),
            "cub::DeviceMerge");
      // the receive buffer holds the shard's keys and room for the uncertain ends of the
      // windows that bounds of the cuts leave (see exchange_and_merge)
      place.receive_keys = needs_receive ? place.n + place.n / 64 : 0;
      const std::size_t receive = aligned(static_cast<std::size_t>(place.receive_keys) * item);
      place.temp_bytes = std::max(sort_temp, aligned(place.merge_temp_bytes) + receive + (deep_merges ? keys : 0));
    } else {
      check(engine->sort(nullptr, sort_temp, nullptr, nullptr, place.n, nullptr, place.stream),
            "cub::DeviceRadixSort");
      place.temp_bytes = sort_temp;
    }
    place.scratch = detail::StreamScratch(keys + aligned(place.temp_bytes), place.stream,
                                          reinterpret_cast<cudaMemPool_t>(group.memory_pool(p)));
    place.alternate = place.scratch.bytes();
    place.temp = place.alternate + keys;
    if (several) {
      unsigned char* after_merge_temp = place.temp + aligned(place.merge_temp_bytes);
      if (needs_receive) {
        place.receive = after_merge_temp;
        after_merge_temp += aligned(static_cast<std::size_t>(place.receive_keys) * item);
      }
      if (deep_merges) place.between = after_merge_temp;
    }
  }
  for (std::size_t p = 0; p < count; ++p) {
    Place& place = places[p];
    if (place.n == 0) continue;
    DeviceGuard guard(place.device);
    // The keys the radix sort reads: the output shard, after a copy of the input when they
    // differ and NaNs must be rewritten; the input shard itself otherwise (it is left as is).
    const auto* input = reinterpret_cast<const unsigned char*>(in.shard_pointer(p));
    const bool rewrite = engine->canonicalize_kernel != nullptr;
    if (&in != &out && (rewrite || !several)) {
      check(cudaMemcpyAsync(place.shard, input, place.n * item, cudaMemcpyDeviceToDevice, place.stream),
            "cudaMemcpyAsync (sort input)");
      input = place.shard;
    }
    if (rewrite) {
      k::KeysParams params{place.shard, place.n};
      const long long blocks = (place.n + 255) / 256;
      const auto grid = static_cast<unsigned>(std::min<long long>(blocks, detail::multiprocessors(place.device) * 8LL));
      detail::launch(detail::KernelHandle::builtin(engine->canonicalize_kernel), grid, 256, place.stream, params,
                     "launching NaN canonicalisation");
    }
    std::size_t temp_bytes = place.temp_bytes;
    place.input = input;
    if (sample) {
      place.unsorted.emplace(place.device);
      place.unsorted->record(place.stream);
    }
    if (several) {
      SortGraphs::queue(*engine, place.temp, temp_bytes, input, place.alternate, place.n, place.stream);
      place.ready.emplace(place.device);
      place.ready->record(place.stream);
    } else {
      bool in_alternate = false;
      check(engine->sort(place.temp, temp_bytes, place.shard, place.alternate, place.n, &in_alternate, place.stream),
            "cub::DeviceRadixSort");
      if (in_alternate) {
        check(cudaMemcpyAsync(place.shard, place.alternate, place.n * item, cudaMemcpyDeviceToDevice, place.stream),
              "cudaMemcpyAsync (sorted shard)");
      }
    }
  }
  if (!several) return;  // one shard holds every key: sorted in place

  // copies and merges may read across places when something throws: they end before any
  // place's scratch goes
  const detail::SyncOnUnwind settle(group);
  std::optional<SampledCuts> sampled;
  if (sample) sampled.emplace(*engine, places, sigmas);
  exchange_and_merge(*engine, places, out, item, ranks, first_chunk, sampled ? &*sampled : nullptr);
}

namespace {

void exchange_and_merge(const k::SortEngine& engine, std::vector<Place>& places, const ShardedArray& out,
                        std::size_t item, const std::vector<long long>& ranks,
                        const std::vector<std::size_t>& first_chunk, SampledCuts* sampled) {
  const PlaceGroup& group = *out.group();
  const std::size_t count = places.size();
  auto remote = [&](std::size_t q, std::size_t p) {
    return p != q && places[p].n > 0 && places[p].device != places[q].device;
  };
  // place q's chunks start at ranks[first_chunk[q]] and end at ranks[end_of(q)]
  auto end_of = [&](std::size_t q) { return first_chunk[q] + static_cast<std::size_t>(chunks_of(places[q].n)); };
  // made while the local sorts run: a stream per place that receives
  std::vector<std::unique_ptr<TransferStream>> transfers(count);
  for (std::size_t q = 0; q < count; ++q) {
    if (places[q].receive && places[q].n > 0) transfers[q] = std::make_unique<TransferStream>(places[q].device, count);
  }
  // 3a. Given bounds lower(i, p) <= cuts[i][p] <= upper(i, p) for every boundary, the keys of a
  //     piece between the upper bound of its start and the lower bound of its end are certain
  //     to go: those of each place's first chunk travel while the search goes on. The place's
  //     receive buffer then mirrors each source run from the lowest possible start of its
  //     first piece to the highest possible end of its last (a window per source), so that
  //     whatever the exact cuts, every key lands where its piece will read it. Where those
  //     windows do not fit (keys crowded around a cut), the pieces travel once the cuts are
  //     exact, one after another. The bounds come from the samples (queued before the sorts
  //     end) or else from the search's first round.
  std::vector<std::vector<long long>> sent_low, sent_high;
  // per (place, source): where key 0 of the source run would land in the place's receive
  // buffer (empty for a place without windows)
  std::vector<std::vector<long long>> landing(count);
  auto plan_windows = [&] {
    bool all = true;
    for (std::size_t q = 0; q < count; ++q) {
      landing[q].clear();
      if (!transfers[q]) continue;
      const std::size_t first = first_chunk[q], last = end_of(q);
      long long needed = 0;
      for (std::size_t p = 0; p < count; ++p) {
        if (remote(q, p)) needed += sent_high[last][p] - sent_low[first][p];
      }
      if (needed > places[q].receive_keys) {
        all = false;
        continue;
      }
      landing[q].assign(count, 0);
      long long at = 0;  // the windows lie one after another
      for (std::size_t p = 0; p < count; ++p) {
        if (!remote(q, p)) continue;
        landing[q][p] = at - sent_low[first][p];
        at += sent_high[last][p] - sent_low[first][p];
      }
    }
    return all;
  };
  // early[q][p]: place q's early copies read place p's run (step 4 must wait for them even
  // where q's exact cuts take nothing from p)
  std::vector<std::vector<bool>> early(count, std::vector<bool>(count, false));
  auto send_first_chunks = [&] {
    for (std::size_t q = 0; q < count; ++q) {
      if (landing[q].empty()) continue;
      DeviceGuard guard(places[q].device);
      const std::size_t first = first_chunk[q];
      for (std::size_t p = 0; p < count; ++p) {
        if (!remote(q, p)) continue;
        const long long from = sent_high[first][p], to = sent_low[first + 1][p];
        transfers[q]->copy(places[q], places[p], p, from, to, landing[q][p] + from, item);
        if (from < to) early[q][p] = true;
      }
    }
  };
  // the samples' bounds only when every place's windows fit: the copies they queue go
  // behind the sorts at once
  bool guessed = false;
  if (sampled) {
    sampled->bounds(ranks, out.size(), sent_low, sent_high);
    guessed = plan_windows();
    if (guessed) send_first_chunks();
  }

  // 2. splitters (the host waits for the local sorts here)
  Splitters splitters(engine, places, group, ranks, out.size());
  if (!splitters.settled()) splitters.round();
  if (guessed) {
    ++sampled_sorts;
  } else {
    sent_low = splitters.lowers(), sent_high = splitters.uppers();
    for (auto& windows : landing) windows.clear();
    if (!splitters.settled()) {
      plan_windows();
      send_first_chunks();
      ++first_round_sorts;
    }
  }
  while (!splitters.settled()) splitters.round();
  const std::vector<std::vector<long long>>& cuts = splitters.cuts();
  check_cuts(cuts, places, ranks);
  // Bounds from the first round hold surely: cuts outside them mean that the keys changed.
  // Those from the samples hold almost surely: a place whose cuts fall outside them receives
  // its pieces one after another, after (and over) what its early copies wrote. (Keys that
  // other work changes meanwhile are then caught by check_cuts alone.)
  bool missed = false;
  for (std::size_t q = 0; q < count; ++q) {
    if (landing[q].empty()) continue;
    bool inside = true;
    for (std::size_t i = first_chunk[q]; i <= end_of(q); ++i) {
      for (std::size_t p = 0; p < count; ++p) {
        if (remote(q, p) && (cuts[i][p] < sent_low[i][p] || cuts[i][p] > sent_high[i][p])) inside = false;
      }
    }
    if (inside) continue;
    if (!guessed) {
      throw std::runtime_error("sort: splitters moved between rounds; was the array written by other work "
                               "while it was being sorted?");
    }
    landing[q].clear();
    missed = true;
  }
  if (missed) ++missed_sorts;

  // 3b. chunk by chunk, each place receives the rest of its pieces from other devices (after
  //     the first chunk's bulk, on the same stream) and merges them with the pieces on its own
  //     device as soon as they are in (on its stream). Every place's copies are queued first,
  //     so that every link is busy at once, then the merges.
  struct Chunk {
    std::vector<Piece> pieces;
    detail::Event* arrived = nullptr;  // its copies are in
    long long offset = 0;              // in the output shard
  };
  std::vector<std::vector<Chunk>> plans(count);
  std::deque<detail::Event> events;
  for (std::size_t q = 0; q < count; ++q) {
    Place& place = places[q];
    if (place.n == 0) continue;
    DeviceGuard guard(place.device);
    const bool windowed = !landing[q].empty();
    long long received = 0;  // without windows, pieces land one after another
    for (long long j = 0; j < chunks_of(place.n); ++j) {
      const std::size_t begin = first_chunk[q] + static_cast<std::size_t>(j);
      Chunk chunk;
      chunk.offset = ranks[begin] - ranks[first_chunk[q]];
      for (std::size_t p = 0; p < count; ++p) {
        const long long from = cuts[begin][p], to = cuts[begin + 1][p];
        if (from == to) continue;
        const Place& source = places[p];
        if (!remote(q, p)) {
          chunk.pieces.push_back({source.alternate + from * item, to - from, source.device});
          continue;
        }
        if (!windowed) {
          transfers[q]->copy(place, source, p, from, to, received, item);
          chunk.pieces.push_back({place.receive + received * item, to - from, place.device});
          received += to - from;
          continue;
        }
        const long long at = landing[q][p];  // + a run index
        chunk.pieces.push_back({place.receive + (at + from) * item, to - from, place.device});
        const long long sent_from = sent_high[begin][p], sent_to = sent_low[begin + 1][p];
        if (j == 0 && sent_from < sent_to) {  // the bulk went: its ends remain
          transfers[q]->copy(place, source, p, from, sent_from, at + from, item);
          transfers[q]->copy(place, source, p, sent_to, to, at + sent_to, item);
        } else {
          transfers[q]->copy(place, source, p, from, to, at + from, item);
        }
      }
      if (transfers[q]) chunk.arrived = transfers[q]->arrivals(events);
      plans[q].push_back(std::move(chunk));
    }
  }
  for (std::size_t q = 0; q < count; ++q) {
    Place& place = places[q];
    if (place.n == 0) continue;
    DeviceGuard guard(place.device);
    for (std::size_t p = 0; p < count; ++p) {  // runs on this device read in place
      if (p != q && places[p].n > 0 && places[p].device == place.device) places[p].ready->wait(place.stream);
    }
    for (Chunk& chunk : plans[q]) {
      if (chunk.arrived) chunk.arrived->wait(place.stream);
      merge_pieces(engine, place, std::move(chunk.pieces), chunk.offset, item);
    }
    place.merged.emplace(place.device);
    place.merged->record(place.stream);
  }

  // 4. a place's run (in its scratch, freed on its stream when `places` goes) outlives every
  //    place that reads it
  for (std::size_t p = 0; p < count; ++p) {
    Place& place = places[p];
    if (place.n == 0) continue;
    DeviceGuard guard(place.device);
    for (std::size_t reader = 0; reader < count; ++reader) {
      if (reader == p || places[reader].n == 0) continue;
      if (cuts[first_chunk[reader]][p] == cuts[end_of(reader)][p] && !early[reader][p]) continue;
      places[reader].merged->wait(place.stream);
    }
  }
}

}  // namespace

SortPathCounts sort_path_counts() {
  SortPathCounts counts;
  counts.sampled = sampled_sorts.load();
  counts.missed = missed_sorts.load();
  counts.first_round = first_round_sorts.load();
  return counts;
}

}  // namespace csj
