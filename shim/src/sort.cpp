// The multi-place sort (csj/sort.hpp):
//   1. each place radix-sorts its shard into a run buffer of its own (one place alone sorts
//      in place: CUB decides between the shard and a scratch buffer);
//   2. exact splitters: for every shard boundary (a global rank R) and every place, how many
//      of that place's sorted keys go before R. A digit-by-digit search over the ordered-key
//      space: each round, every place counts its keys below 2^12 candidates per boundary
//      (binary searches), the host sums the counts over places and keeps the candidate
//      interval that holds rank R. Ties at the final key are given out in place order, so
//      the split is deterministic and each output shard gets exactly its size;
//   3. the same search cuts each output shard into chunks; each shard is written chunk by
//      chunk by merging its pieces of every place's run (a tree of two-way merges). Pieces
//      on another device are copied into a receive buffer on a transfer stream (every place
//      at once, so both directions of each link are busy), and a chunk is merged as soon as
//      its pieces are in, while the next chunk's travel; pieces on the same device are
//      merged where they lie;
//   4. a run buffer goes only once every place that reads it has finished.
#include "csj/sort.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <deque>
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
// lock, and are kept until exit. Pinned memory belongs to the context it was made in: a
// buffer whose context a device reset destroyed is forgotten, never handed out again.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      auto& free_list = spare();
      for (auto it = free_list.begin(); it != free_list.end();) {
        if (!it->context.alive()) {
          it = free_list.erase(it);
          continue;
        }
        if (it->capacity >= bytes) {
          data = it->data, capacity_ = it->capacity, context_ = it->context;
          free_list.erase(it);
          return;
        }
        ++it;
      }
    }
    context_ = detail::ContextStamp::current();
    check(cudaMallocHost(reinterpret_cast<void**>(&data), bytes), "cudaMallocHost (sort splitters)");
    capacity_ = bytes;
  }
  ~PinnedBuffer() {
    std::lock_guard<std::mutex> lock(mutex());
    spare().push_back({data, capacity_, context_});
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  unsigned char* data = nullptr;

 private:
  struct Spare {
    unsigned char* data;
    std::size_t capacity;
    detail::ContextStamp context;
  };
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<Spare>& spare() {
    static std::vector<Spare> buffers;
    return buffers;
  }

  std::size_t capacity_ = 0;
  detail::ContextStamp context_;
};

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
                                      // the sorted run, which other places read
  unsigned char* temp = nullptr;      // CUB's temporary storage; once the sort is done, the
  std::size_t temp_bytes = 0;         // merges' and the two buffers below
  std::size_t merge_temp_bytes = 0;   // the merges' part of `temp`
  unsigned char* receive = nullptr;   // in `temp`: pieces copied from other devices
  unsigned char* between = nullptr;   // in `temp`: merge levels (three or more pieces)
  unsigned long long* bases = nullptr;   // splitter candidates' bases, per boundary
  unsigned long long* counts = nullptr;  // splitter counts, per (boundary, candidate)
  const unsigned char* sorted = nullptr; // where the sorted run is
  std::optional<detail::Event> ready;    // the run is sorted
  std::optional<detail::Event> merged;   // this place's merges (and reads of others) are done
};

// One sorted piece a merge reads: on `device`, possibly a peer's.
struct Piece {
  const unsigned char* data;
  long long n;
  int device;
};

// A global rank to cut every run at (where an output shard, or a chunk of one, starts),
// and the state of its digit search (per place: keys below `base` and below the top of
// the interval still searched).
struct Boundary {
  std::size_t index;  // in the list of ranks searched
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

// Cuts: cuts[i][p] = how many of place p's sorted keys rank below global rank ranks[i]
// (ranks ascending, each in [0, total]).
std::vector<std::vector<long long>> find_cuts(const k::SortEngine& engine, std::vector<Place>& places,
                                              const PlaceGroup& group, const std::vector<long long>& ranks,
                                              long long total) {
  const std::size_t count = places.size();
  std::vector<std::vector<long long>> cuts(ranks.size(), std::vector<long long>(count, 0));
  std::vector<Boundary> open;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const long long rank = ranks[i];
    if (rank == 0) continue;  // all zeros
    if (rank == total) {
      for (std::size_t p = 0; p < count; ++p) cuts[i][p] = places[p].n;
      continue;
    }
    Boundary boundary{i, rank};
    boundary.below_base.assign(count, 0);
    for (const Place& place : places) boundary.below_top.push_back(place.n);
    open.push_back(std::move(boundary));
  }
  if (open.empty()) return cuts;

  const int key_bits = engine.key_bits;
  const std::size_t max_slots = open.size() << kDigitBits;
  PinnedBuffer host(open.size() * sizeof(unsigned long long) + count * max_slots * sizeof(unsigned long long));
  // on a throw, the copies already queued into `host` land before it goes back to the pool
  const detail::SyncOnUnwind settle(group);
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
        cuts[boundary.index] = boundary.below_base;
      } else if (boundary.known_bits == key_bits) {
        // rank falls among the keys equal to `base`: hand them out in place order
        long long needed = boundary.rank - below_sum;
        for (std::size_t p = 0; p < count; ++p) {
          const long long take = std::min(needed, boundary.below_top[p] - boundary.below_base[p]);
          cuts[boundary.index][p] = boundary.below_base[p] + take;
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
    copy_piece(shard, place.device, pieces[0].data, pieces[0].device, static_cast<std::size_t>(pieces[0].n) * item,
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
        copy_piece(target + at * item, place.device, first.data, first.device, static_cast<std::size_t>(first.n) * item,
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

// A stream of its own for a place's incoming copies, so that they run while the place merges
// what has already arrived. Left by an exception, it waits for its copies before the buffers
// they write go.
class TransferStream {
 public:
  explicit TransferStream(int device) : device_(device), exceptions_(std::uncaught_exceptions()) {
    DeviceGuard guard(device);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  ~TransferStream() {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device_);
    if (std::uncaught_exceptions() > exceptions_) cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);  // copies still queued complete first
    cudaSetDevice(previous);
    cudaGetLastError();
  }
  TransferStream(const TransferStream&) = delete;
  TransferStream& operator=(const TransferStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  int device_;
  int exceptions_;
  cudaStream_t stream_ = nullptr;
};

// Each output shard is cut into this many chunks (shards of at least kChunkMin keys each):
// chunk j is merged as soon as its pieces from other devices have arrived, while the copies
// of chunk j + 1 run.
constexpr long long kChunks = 4;
constexpr long long kChunkMin = 1024;

long long chunks_of(long long n) { return n >= kChunks * kChunkMin ? kChunks : 1; }

void exchange_and_merge(const k::SortEngine& engine, std::vector<Place>& places, const ShardedArray& out,
                        std::size_t item, const std::vector<long long>& ranks,
                        const std::vector<std::size_t>& first_chunk);

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
    for (long long j = 0; n > 0 && j < chunks_of(n); ++j) ranks.push_back(start + n * j / chunks_of(n));
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
  for (std::size_t p = 0; p < count; ++p) {
    Place& place = places[p];
    place.device = group.device(p);
    place.stream = reinterpret_cast<cudaStream_t>(group.stream(p));
    place.n = in.shard_size(p);
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
      place.temp_bytes = std::max(sort_temp, aligned(place.merge_temp_bytes) + (needs_receive ? keys : 0) +
                                                  (deep_merges ? keys : 0));
    } else {
      check(engine->sort(nullptr, sort_temp, nullptr, nullptr, place.n, nullptr, place.stream),
            "cub::DeviceRadixSort");
      place.temp_bytes = sort_temp;
    }
    const std::size_t slots = ranks.size() << kDigitBits;
    const std::size_t bytes = keys + aligned(place.temp_bytes) +
                              (several ? aligned(ranks.size() * 8) + aligned(slots * 8) : 0);
    place.scratch = detail::StreamScratch(bytes, place.stream, reinterpret_cast<cudaMemPool_t>(group.memory_pool(p)));
    unsigned char* cursor = place.scratch.bytes();
    place.alternate = cursor, cursor += keys;
    place.temp = cursor, cursor += aligned(place.temp_bytes);
    if (several) {
      unsigned char* after_merge_temp = place.temp + aligned(place.merge_temp_bytes);
      if (needs_receive) place.receive = after_merge_temp, after_merge_temp += keys;
      if (deep_merges) place.between = after_merge_temp;
      place.bases = reinterpret_cast<unsigned long long*>(cursor), cursor += aligned(ranks.size() * 8);
      place.counts = reinterpret_cast<unsigned long long*>(cursor);
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
    if (several) {
      check(engine->sort_into(place.temp, temp_bytes, input, place.alternate, place.n, place.stream),
            "cub::DeviceRadixSort");
      place.sorted = place.alternate;
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
  exchange_and_merge(*engine, places, out, item, ranks, first_chunk);
}

namespace {

void exchange_and_merge(const k::SortEngine& engine, std::vector<Place>& places, const ShardedArray& out,
                        std::size_t item, const std::vector<long long>& ranks,
                        const std::vector<std::size_t>& first_chunk) {
  const PlaceGroup& group = *out.group();
  const std::size_t count = places.size();
  // made while the local sorts run
  std::vector<std::unique_ptr<TransferStream>> transfers(count);
  for (std::size_t q = 0; q < count; ++q) {
    if (places[q].receive) transfers[q] = std::make_unique<TransferStream>(places[q].device);
  }
  // 2. splitters (the host waits for the local sorts here)
  const std::vector<std::vector<long long>> cuts = find_cuts(engine, places, group, ranks, out.size());
  check_cuts(cuts, places, ranks);

  // 3. chunk by chunk, each place copies the pieces on other devices into its receive buffer
  //    (on its transfer stream) and merges them with the pieces on its own device as soon
  //    as they are in (on its stream). Every place's copies are queued first, so that every
  //    link is busy at once, then the merges.
  struct Chunk {
    std::vector<Piece> pieces;
    detail::Event* arrived = nullptr;  // its copies are in
    long long offset = 0;              // in the output shard
  };
  std::vector<std::vector<Chunk>> plans(count);
  std::deque<detail::Event> arrivals;
  for (std::size_t q = 0; q < count; ++q) {
    Place& place = places[q];
    if (place.n == 0) continue;
    DeviceGuard guard(place.device);
    long long received = 0;
    std::vector<bool> waited(count, false);  // the transfer stream waits once per source run
    bool landed = false;                     // and once for this place's own sort
    for (long long j = 0; j < chunks_of(place.n); ++j) {
      const std::size_t begin = first_chunk[q] + static_cast<std::size_t>(j);
      Chunk chunk;
      chunk.offset = ranks[begin] - ranks[first_chunk[q]];
      for (std::size_t p = 0; p < count; ++p) {
        const long long length = cuts[begin + 1][p] - cuts[begin][p];
        if (length == 0) continue;
        const Place& source = places[p];
        const unsigned char* data = source.sorted + cuts[begin][p] * item;
        if (source.device == place.device) {
          chunk.pieces.push_back({data, length, source.device});
          continue;
        }
        const cudaStream_t transfer = transfers[q]->get();
        if (!landed) place.ready->wait(transfer), landed = true;  // the receive buffer is CUB's
        if (!waited[p]) source.ready->wait(transfer), waited[p] = true;  // storage until then
        unsigned char* landing = place.receive + received * item;
        copy_piece(landing, place.device, data, source.device, static_cast<std::size_t>(length) * item, transfer);
        chunk.pieces.push_back({landing, length, place.device});
        received += length;
        if (!chunk.arrived) chunk.arrived = &arrivals.emplace_back(place.device);
      }
      if (chunk.arrived) chunk.arrived->record(transfers[q]->get());
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
      if (cuts[first_chunk[reader]][p] == cuts[first_chunk[reader] + chunks_of(places[reader].n)][p]) continue;
      places[reader].merged->wait(place.stream);
    }
  }
}

}  // namespace
}  // namespace csj
