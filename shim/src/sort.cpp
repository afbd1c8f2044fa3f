// The multi-place sort (csj/sort.hpp):
//   1. each place radix-sorts its shard (into the shard or a scratch buffer, CUB decides);
//   2. exact splitters: for every shard boundary (a global rank R) and every place, how many
//      of that place's sorted keys go before R. A digit-by-digit search over the ordered-key
//      space: each round, every place counts its keys below 2^12 candidates per boundary
//      (binary searches), the host sums the counts over places and keeps the candidate
//      interval that holds rank R. Ties at the final key are given out in place order, so
//      the split is deterministic and each output shard gets exactly its size;
//   3. every place pulls its pieces from all places into one buffer (peer copies, all
//      places at once, so both directions of each link are busy);
//   4. once no place still reads it, each shard is written by merging its pieces (a tree
//      of two-way merges).
#include "csj/sort.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../kernels/sort_engine.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"

namespace csj {
namespace {

using detail::check;
using detail::DeviceGuard;
namespace k = kernels;

constexpr int kDigitBits = 12;  // candidates per boundary and round: 2^12
constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Pinned host memory for the splitter rounds, reused across calls (cudaMallocHost costs far
// more than a sort's splitter rounds): buffers go back to a process-wide free list, behind a
// lock, and are kept until exit.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      auto& free_list = spare();
      for (auto it = free_list.begin(); it != free_list.end(); ++it) {
        if (it->second >= bytes) {
          data = it->first, capacity_ = it->second;
          free_list.erase(it);
          return;
        }
      }
    }
    check(cudaMallocHost(reinterpret_cast<void**>(&data), bytes), "cudaMallocHost (sort splitters)");
    capacity_ = bytes;
  }
  ~PinnedBuffer() {
    std::lock_guard<std::mutex> lock(mutex());
    spare().emplace_back(data, capacity_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  unsigned char* data = nullptr;

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<std::pair<unsigned char*, std::size_t>>& spare() {  // (buffer, capacity)
    static std::vector<std::pair<unsigned char*, std::size_t>> buffers;
    return buffers;
  }

  std::size_t capacity_ = 0;
};

// Everything one place holds during a sort. The scratch allocation is stream-ordered (from
// the group's pool) and goes back on the place's stream when the sort ends, also when it
// ends by an exception.
struct Place {
  int device = 0;
  cudaStream_t stream = nullptr;
  long long n = 0;
  unsigned char* shard = nullptr;     // the output shard: sorted in place, then merged into
  detail::StreamScratch scratch;      // one allocation carved into the buffers below
  unsigned char* alternate = nullptr; // the radix sort's second buffer
  unsigned char* spare = nullptr;     // a third buffer (several places only)
  unsigned char* temp = nullptr;      // CUB's temporary storage
  std::size_t temp_bytes = 0;
  unsigned long long* bases = nullptr;   // splitter candidates' bases, per boundary
  unsigned long long* counts = nullptr;  // splitter counts, per (boundary, candidate)
  const unsigned char* sorted = nullptr; // where the sorted run is: shard or alternate
  std::optional<detail::Event> copied;   // this place has pulled all its pieces

  // Where the pieces land: a buffer the merge does not write and no other place reads (the
  // alternate buffer when the sorted run is in the shard, the spare one otherwise).
  unsigned char* receive() const { return sorted == shard ? alternate : spare; }
  // The merges' other buffer: written only once every reader of the sorted run is done.
  unsigned char* merge_spare() const { return sorted == shard ? spare : alternate; }
};

// A boundary between output shards: the global rank where output shard `shard` starts,
// and the state of its digit search (per place: keys below `base` and below the top of
// the interval still searched).
struct Boundary {
  std::size_t shard;
  long long rank;
  unsigned long long base = 0;
  int known_bits = 0;
  std::vector<long long> below_base;
  std::vector<long long> below_top;
};

void copy_piece(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                cudaStream_t stream) {
  if (bytes == 0) return;
  if (dst_device == src_device) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync (sort piece)");
  } else {
    check(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, stream), "cudaMemcpyPeerAsync (sort piece)");
  }
}

// Splitters: cuts[q][p] = how many of place p's sorted keys go to output shards before q.
std::vector<std::vector<long long>> find_splitters(const k::SortEngine& engine, std::vector<Place>& places,
                                                   const ShardedArray& out) {
  const std::size_t count = places.size();
  const long long total = out.size();
  std::vector<std::vector<long long>> cuts(count + 1, std::vector<long long>(count, 0));
  for (std::size_t p = 0; p < count; ++p) cuts[count][p] = places[p].n;

  std::vector<Boundary> open;
  for (std::size_t q = 1; q < count; ++q) {
    const long long rank = out.shard_offset(q);
    if (rank == 0) continue;  // all zeros
    if (rank == total) {
      for (std::size_t p = 0; p < count; ++p) cuts[q][p] = places[p].n;
      continue;
    }
    Boundary boundary{q, rank};
    boundary.below_base.assign(count, 0);
    for (const Place& place : places) boundary.below_top.push_back(place.n);
    open.push_back(std::move(boundary));
  }
  if (open.empty()) return cuts;

  const int key_bits = engine.key_bits;
  const std::size_t max_slots = open.size() << kDigitBits;
  PinnedBuffer host(open.size() * sizeof(unsigned long long) + count * max_slots * sizeof(unsigned long long));
  // on a throw, the copies already queued into `host` land before it goes back to the pool
  const detail::SyncOnUnwind settle(*out.group());
  auto* bases = reinterpret_cast<unsigned long long*>(host.data);
  auto* counts = bases + open.size();

  while (!open.empty()) {
    const int digit = std::min(kDigitBits, key_bits - open.front().known_bits);
    const int shift = key_bits - open.front().known_bits - digit;
    const int candidates = 1 << digit;
    const std::size_t slots = open.size() * static_cast<std::size_t>(candidates);
    for (std::size_t b = 0; b < open.size(); ++b) bases[b] = open[b].base;
    for (std::size_t p = 0; p < count; ++p) {
      Place& place = places[p];
      if (place.n == 0) continue;
      DeviceGuard guard(place.device);
      check(cudaMemcpyAsync(place.bases, bases, open.size() * sizeof(unsigned long long),
                            cudaMemcpyHostToDevice, place.stream),
            "cudaMemcpyAsync (splitter bases)");
      k::SplitterParams params{};
      params.keys = place.sorted;
      params.n = place.n;
      params.bases = place.bases;
      params.counts = place.counts;
      params.boundaries = static_cast<int>(open.size());
      params.candidates = candidates;
      params.shift = shift;
      const auto grid = static_cast<unsigned>((slots + k::kSplitterBlock - 1) / k::kSplitterBlock);
      detail::launch(detail::KernelHandle::builtin(engine.splitter_kernel), grid, k::kSplitterBlock,
                     place.stream, params, "launching sort splitters");
      check(cudaMemcpyAsync(counts + p * max_slots, place.counts, slots * sizeof(unsigned long long),
                            cudaMemcpyDeviceToHost, place.stream),
            "cudaMemcpyAsync (splitter counts)");
    }
    for (const Place& place : places) {
      if (place.n == 0) continue;
      DeviceGuard guard(place.device);
      check(cudaStreamSynchronize(place.stream), "cudaStreamSynchronize");
    }
    // the bases buffer is rewritten by the next round: the copies above have completed

    std::vector<Boundary> still_open;
    for (std::size_t b = 0; b < open.size(); ++b) {
      Boundary& boundary = open[b];
      auto below = [&](std::size_t p, int j) -> long long {
        return places[p].n == 0 ? 0 : static_cast<long long>(counts[p * max_slots + b * candidates + j]);
      };
      // the last candidate with at most `rank` keys below it (candidate 0 is the base: true)
      int chosen = 0;
      for (int j = candidates - 1; j > 0; --j) {
        long long sum = 0;
        for (std::size_t p = 0; p < count; ++p) sum += below(p, j);
        if (sum <= boundary.rank) {
          chosen = j;
          break;
        }
      }
      long long below_sum = 0;
      for (std::size_t p = 0; p < count; ++p) {
        boundary.below_base[p] = below(p, chosen);
        if (chosen + 1 < candidates) boundary.below_top[p] = below(p, chosen + 1);
        below_sum += boundary.below_base[p];
      }
      boundary.base += static_cast<unsigned long long>(chosen) << shift;
      boundary.known_bits += digit;
      if (below_sum == boundary.rank) {  // an exact cut between two distinct keys
        cuts[boundary.shard] = boundary.below_base;
      } else if (boundary.known_bits == key_bits) {
        // rank falls among the keys equal to `base`: hand them out in place order
        long long needed = boundary.rank - below_sum;
        for (std::size_t p = 0; p < count; ++p) {
          const long long take = std::min(needed, boundary.below_top[p] - boundary.below_base[p]);
          cuts[boundary.shard][p] = boundary.below_base[p] + take;
          needed -= take;
        }
      } else {
        still_open.push_back(std::move(boundary));
      }
    }
    open = std::move(still_open);
  }
  return cuts;
}

// The counts come from binary searches over runs sorted a moment ago: they only disagree
// when something else wrote the input meanwhile. Nothing moves then.
void check_splitters(const std::vector<std::vector<long long>>& cuts, const std::vector<Place>& places,
                     const ShardedArray& out) {
  const std::size_t count = places.size();
  for (std::size_t q = 1; q <= count; ++q) {
    long long sum = 0;
    for (std::size_t p = 0; p < count; ++p) {
      if (cuts[q][p] < cuts[q - 1][p] || cuts[q][p] > places[p].n) {
        throw std::runtime_error("sort: inconsistent splitters; was the array written by other work "
                                 "while it was being sorted?");
      }
      sum += cuts[q][p];
    }
    if (sum != (q == count ? out.size() : out.shard_offset(q))) {
      throw std::runtime_error("sort: splitters do not add up to the shard boundaries");
    }
  }
}

// Merges the sorted runs (offset, length) of `runs` in `source` into `out`, pairwise, level by
// level, through `spare`; the last level writes `out`.
void merge_runs(const k::SortEngine& engine, Place& place, std::vector<std::pair<long long, long long>> runs,
                unsigned char* source, unsigned char* spare, std::size_t item) {
  if (runs.empty()) return;
  unsigned char* current = source;
  unsigned char* other = spare;
  if (runs.size() == 1) {
    check(cudaMemcpyAsync(place.shard, current + runs[0].first * item, runs[0].second * item,
                          cudaMemcpyDeviceToDevice, place.stream),
          "cudaMemcpyAsync (sort run)");
    return;
  }
  while (runs.size() > 1) {
    unsigned char* target = runs.size() <= 2 ? place.shard : other;
    std::vector<std::pair<long long, long long>> merged;
    long long offset = 0;
    for (std::size_t r = 0; r < runs.size(); r += 2) {
      const auto [first, first_n] = runs[r];
      if (r + 1 == runs.size()) {
        check(cudaMemcpyAsync(target + offset * item, current + first * item, first_n * item,
                              cudaMemcpyDeviceToDevice, place.stream),
              "cudaMemcpyAsync (sort run)");
        merged.emplace_back(offset, first_n);
        offset += first_n;
        continue;
      }
      const auto [second, second_n] = runs[r + 1];
      std::size_t bytes = place.temp_bytes;
      check(engine.merge(place.temp, bytes, current + first * item, first_n, current + second * item, second_n,
                         target + offset * item, place.stream),
            "cub::DeviceMerge");
      merged.emplace_back(offset, first_n + second_n);
      offset += first_n + second_n;
    }
    runs = std::move(merged);
    std::swap(current, other);
  }
}

void exchange_and_merge(const k::SortEngine& engine, std::vector<Place>& places, const ShardedArray& out,
                        std::size_t item);

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
  const std::size_t boundaries = count - 1;

  // 1. local sorts
  std::vector<Place> places(count);
  for (std::size_t p = 0; p < count; ++p) {
    Place& place = places[p];
    place.device = group.device(p);
    place.stream = reinterpret_cast<cudaStream_t>(group.stream(p));
    place.n = in.shard_size(p);
    if (place.n == 0) continue;
    place.shard = reinterpret_cast<unsigned char*>(out.shard_pointer(p));
    DeviceGuard guard(place.device);
    std::size_t sort_temp = 0, merge_temp = 0;
    check(engine->sort(nullptr, sort_temp, nullptr, nullptr, place.n, nullptr, place.stream), "cub::DeviceRadixSort");
    if (several) {
      check(engine->merge(nullptr, merge_temp, nullptr, place.n - place.n / 2, nullptr, place.n / 2, nullptr,
                          place.stream),
            "cub::DeviceMerge");
    }
    place.temp_bytes = std::max(sort_temp, merge_temp);
    const std::size_t keys = aligned(static_cast<std::size_t>(place.n) * item);
    const std::size_t slots = boundaries << kDigitBits;
    const std::size_t bytes = keys * (several ? 2 : 1) + aligned(place.temp_bytes) +
                              (several ? aligned(boundaries * 8) + aligned(slots * 8) : 0);
    place.scratch = detail::StreamScratch(bytes, place.stream, reinterpret_cast<cudaMemPool_t>(group.memory_pool(p)));
    unsigned char* cursor = place.scratch.bytes();
    place.alternate = cursor, cursor += keys;
    if (several) place.spare = cursor, cursor += keys;
    place.temp = cursor, cursor += aligned(place.temp_bytes);
    if (several) {
      place.bases = reinterpret_cast<unsigned long long*>(cursor), cursor += aligned(boundaries * 8);
      place.counts = reinterpret_cast<unsigned long long*>(cursor);
    }

    if (&in != &out) {
      check(cudaMemcpyAsync(place.shard, reinterpret_cast<const void*>(in.shard_pointer(p)), place.n * item,
                            cudaMemcpyDeviceToDevice, place.stream),
            "cudaMemcpyAsync (sort input)");
    }
    if (engine->canonicalize_kernel) {
      k::KeysParams params{place.shard, place.n};
      const long long blocks = (place.n + 255) / 256;
      const auto grid = static_cast<unsigned>(std::min<long long>(blocks, detail::multiprocessors(place.device) * 8LL));
      detail::launch(detail::KernelHandle::builtin(engine->canonicalize_kernel), grid, 256, place.stream, params,
                     "launching NaN canonicalisation");
    }
    bool in_alternate = false;
    std::size_t temp_bytes = place.temp_bytes;
    check(engine->sort(place.temp, temp_bytes, place.shard, place.alternate, place.n, &in_alternate, place.stream),
          "cub::DeviceRadixSort");
    place.sorted = in_alternate ? place.alternate : place.shard;
    if (!several && in_alternate) {
      check(cudaMemcpyAsync(place.shard, place.alternate, place.n * item, cudaMemcpyDeviceToDevice, place.stream),
            "cudaMemcpyAsync (sorted shard)");
    }
  }
  if (!several) return;  // one shard holds every key: sorted in place

  // pieces may be in flight between places when something throws: they land before any
  // place's scratch goes
  const detail::SyncOnUnwind settle(group);
  exchange_and_merge(*engine, places, out, item);
}

namespace {

void exchange_and_merge(const k::SortEngine& engine, std::vector<Place>& places, const ShardedArray& out,
                        std::size_t item) {
  const std::size_t count = places.size();
  // 2. splitters (the host waits for the local sorts here)
  const std::vector<std::vector<long long>> cuts = find_splitters(engine, places, out);
  check_splitters(cuts, places, out);

  // 3. every place pulls its pieces, in place order, into its receive buffer
  std::vector<std::vector<std::pair<long long, long long>>> runs(count);
  for (std::size_t q = 0; q < count; ++q) {
    Place& place = places[q];
    if (place.n == 0) continue;
    DeviceGuard guard(place.device);
    long long offset = 0;
    for (std::size_t p = 0; p < count; ++p) {
      const long long length = cuts[q + 1][p] - cuts[q][p];
      if (length == 0) continue;
      copy_piece(place.receive() + offset * item, place.device, places[p].sorted + cuts[q][p] * item, places[p].device,
                 static_cast<std::size_t>(length) * item, place.stream);
      runs[q].emplace_back(offset, length);
      offset += length;
    }
    place.copied.emplace(place.device);
    place.copied->record(place.stream);
  }

  // 4. merges, each after every place that reads this place's sorted run has its copy
  for (std::size_t q = 0; q < count; ++q) {
    Place& place = places[q];
    if (place.n == 0) continue;
    DeviceGuard guard(place.device);
    for (std::size_t reader = 0; reader < count; ++reader) {
      if (reader == q || places[reader].n == 0) continue;
      if (cuts[reader + 1][q] == cuts[reader][q]) continue;  // reads nothing of ours
      places[reader].copied->wait(place.stream);
    }
    merge_runs(engine, place, runs[q], place.receive(), place.merge_spare(), item);
  }
  // each place's scratch goes back on its own stream (Place's destructor), after its merge,
  // which came after every read of it
}

}  // namespace
}  // namespace csj
