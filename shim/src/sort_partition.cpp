// The partition-first multi-place sort. Output shard q owns a range of the key space; sampled
// splitters cut each range into a few sub-ranges and put a small bucket around every shard
// boundary. Every key moves once, by a partition pass on its own place, into its bucket;
// each place then receives its sub-ranges' keys from the others (peer copies, sub-range by
// sub-range) and radix-sorts each sub-range, own and received keys together, straight into
// its output shard while the next sub-range travels. There is no merge: the sub-ranges are
// disjoint key ranges. Each boundary bucket is gathered and sorted on the place below it and
// split so that every shard gets exactly its size.
//   1. samples: every place reads its share of kSamples keys at hashed positions (as ordered
//      keys), every place sorts all the samples (the same array everywhere, hence the same
//      splitters) and picks the splitters at fixed sample ranks, and counts its own samples
//      per bucket: the host sizes each bucket's run from those counts;
//   2. partition: each key to its bucket's run (a place's own sub-ranges straight into its
//      receive buffer, every other bucket into its send buffer); the host reads the counts;
//   3. exchange and sort, as above. Should a bucket outgrow its run (keys crowded on a few
//      values, samples that missed a skew) or a boundary bucket not cover its boundary,
//      nothing has been written yet and the caller sorts by its other path.
// Experimental (csj::sort takes this path only under CSJ_SORT_PARTITION=1): on 2x H200, 2^28
// int32 keys, it takes 4.1-4.3 ms against 3.76 for sort-then-merge. Measured limits: the
// first peer transfer after idle costs ~0.17-0.2 ms in the sample step (a 512 KB copy, or
// the peer reads of the samples), the partition pass 0.58 ms (~1.8 TB/s, latency-bound),
// and four CUB sorts of the sub-ranges cost ~0.2 ms more than one sort of all keys.
#include "sort_partition.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "../kernels/sort_engine.hpp"
#include "csj/dtype.hpp"
#include "csj/place_group.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"
#include "sort_common.hpp"

namespace csj::detail {
namespace {

namespace k = kernels;

constexpr long long kSamples = 1LL << 18;
// A boundary bucket spans this many standard deviations of the boundary's sample rank on
// each side (a sample rank at fraction f of S samples deviates by sqrt(S f (1 - f))).
constexpr double kSigmas = 5.0;
constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// A bucket's run: the keys expected from the sample counts plus 6 standard deviations (a
// count of c samples standing for r keys each is off by about sqrt(c) r keys) and a margin.
long long capacity(double expected, double variance) {
  const long long keys = static_cast<long long>(expected + 6.0 * std::sqrt(variance)) + 4096;
  return (keys + 63) / 64 * 64;
}

// How each place's key range is cut: a small first sub-range, so that a place starts
// sorting as soon as little has travelled, then larger ones (places * shares + boundaries
// must stay within kMaxBuckets).
std::vector<double> sub_range_shares(std::size_t places) {
  const long long fit = (k::kMaxBuckets - static_cast<long long>(places) + 1) / static_cast<long long>(places);
  if (fit >= 4) return {0.125, 0.125, 0.25, 0.5};
  if (fit == 3) return {0.25, 0.25, 0.5};
  if (fit == 2) return {0.25, 0.75};
  if (fit == 1) return {1.0};
  return {};
}

struct Place {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  long long n = 0;
  const unsigned char* input = nullptr;
  unsigned char* output = nullptr;
  long long samples = 0;        // this place's share of the samples
  long long sample_offset = 0;  // where they go in the sample array
  StreamScratch scratch;        // the buffers below
  unsigned char* all_samples = nullptr;
  unsigned char* sorted_samples = nullptr;
  unsigned char* sample_temp = nullptr;
  std::size_t sample_temp_bytes = 0;
  unsigned char* splitters = nullptr;
  unsigned long long* counters = nullptr;  // kMaxBuckets sample counts, then kMaxBuckets cursors
  int* overflow = nullptr;
  unsigned char* receive = nullptr;  // own sub-ranges: own keys, then the keys received
  long long receive_keys = 0;
  unsigned char* send = nullptr;     // every other bucket
  long long send_keys = 0;
  // per bucket: the run's buffer, its start (elements) and capacity
  std::vector<unsigned char*> run;
  std::vector<long long> start, room;
  unsigned char* gather = nullptr;  // the boundary bucket above this place, then it sorted
  long long gather_keys = 0;
  unsigned char* sort_temp = nullptr;  // CUB's storage for the sorts of step 3
  std::size_t sort_temp_bytes = 0;
  std::optional<Event> entered;  // the work queued on the place before the sort
};

}  // namespace

bool partition_sort(const ShardedArray& in, ShardedArray& out, const k::SortEngine& engine) {
  const PlaceGroup& group = *in.group();
  const std::size_t count = group.size();
  const long long n = in.size();
  const std::vector<double> shares = sub_range_shares(count);
  if (count < 2 || count > static_cast<std::size_t>(k::kMaxSortPlaces) || shares.empty() || n < kPartitionMinKeys) {
    return false;
  }
  for (std::size_t p = 0; p < count; ++p) {
    if (in.shard_size(p) < n / static_cast<long long>(4 * count)) return false;
  }
  const std::size_t item = in.itemsize();
  const k::SortEngine* sample_engine =
      k::sort_engine(static_cast<int>(item == 4 ? DType::uint32 : DType::uint64), false);
  if (!sample_engine) return false;

  // Buckets in key order: place q's sub-ranges j < k at q * (k + 1) + j, then (below the
  // last place) the boundary bucket between q and q + 1 at q * (k + 1) + k.
  const int k_sub = static_cast<int>(shares.size());
  const int buckets = static_cast<int>(count) * (k_sub + 1) - 1;
  auto owner = [&](int b) { return static_cast<std::size_t>(b / (k_sub + 1)); };
  auto is_boundary = [&](int b) { return b % (k_sub + 1) == k_sub; };

  // The sample ranks where buckets 1.. start (a splitter is the sorted sample there).
  const long long samples = std::min(kSamples, n / 16);
  const long long half_width =
      static_cast<long long>(std::ceil(kSigmas * 0.5 * std::sqrt(static_cast<double>(samples)))) + 1;
  std::vector<long long> edges;
  {
    long long low = 0;
    for (std::size_t q = 0; q < count; ++q) {
      const long long centre =
          q + 1 < count ? static_cast<long long>(static_cast<double>(samples) * out.shard_offset(q + 1) / n) : 0;
      const long long high = q + 1 < count ? centre - half_width : samples;
      if (high - low < k_sub) return false;
      double share = 0;
      for (int j = 0; j + 1 < k_sub; ++j) {
        share += shares[static_cast<std::size_t>(j)];
        edges.push_back(low + static_cast<long long>(static_cast<double>(high - low) * share));
      }
      if (q + 1 < count) {
        edges.push_back(high);
        low = centre + half_width;
        edges.push_back(low);
      }
    }
  }

  // 1. samples, splitters, sample counts per bucket
  std::vector<Place> places(count);
  for (std::size_t p = 0; p < count; ++p) {
    Place& place = places[p];
    place.device = group.device(p);
    place.stream = reinterpret_cast<cudaStream_t>(group.stream(p));
    place.pool = reinterpret_cast<cudaMemPool_t>(group.memory_pool(p));
    place.n = in.shard_size(p);
    place.input = reinterpret_cast<const unsigned char*>(in.shard_pointer(p));
    place.output = reinterpret_cast<unsigned char*>(out.shard_pointer(p));
    const long long before = out.shard_offset(p);
    place.sample_offset = samples * before / n;
    place.samples = samples * (before + place.n) / n - place.sample_offset;
    DeviceGuard guard(place.device);
    check(sample_engine->sort_into(nullptr, place.sample_temp_bytes, nullptr, nullptr, samples, place.stream),
          "cub::DeviceRadixSort (samples)");
    const long long spare = place.n / 16 + static_cast<long long>(buckets) * 8192;
    place.receive_keys = place.n + spare;
    place.send_keys = place.n + spare;
    // a boundary bucket holds about 2 half_width samples' worth of keys: room for twice that
    place.gather_keys = p + 1 < count ? 4 * (half_width + 1) * ((n + samples - 1) / samples) + 65536 : 0;
    check(engine.sort_into(nullptr, place.sort_temp_bytes, nullptr, nullptr, std::max(place.n, place.gather_keys),
                           place.stream),
          "cub::DeviceRadixSort");
    const std::size_t sample_bytes = aligned(static_cast<std::size_t>(samples) * item);
    const std::size_t gather_bytes = aligned(static_cast<std::size_t>(place.gather_keys) * item);
    const std::size_t bytes = 2 * sample_bytes + aligned(place.sample_temp_bytes) + aligned(k::kMaxBuckets * item) +
                              aligned(2 * k::kMaxBuckets * sizeof(unsigned long long) + sizeof(int)) +
                              aligned(static_cast<std::size_t>(place.receive_keys) * item) +
                              aligned(static_cast<std::size_t>(place.send_keys) * item) + 2 * gather_bytes +
                              aligned(place.sort_temp_bytes);
    place.scratch = StreamScratch(bytes, place.stream, place.pool);
    unsigned char* cursor = place.scratch.bytes();
    place.all_samples = cursor, cursor += sample_bytes;
    place.sorted_samples = cursor, cursor += sample_bytes;
    place.sample_temp = cursor, cursor += aligned(place.sample_temp_bytes);
    place.splitters = cursor, cursor += aligned(k::kMaxBuckets * item);
    place.counters = reinterpret_cast<unsigned long long*>(cursor);
    place.overflow = reinterpret_cast<int*>(place.counters + 2 * k::kMaxBuckets);
    cursor += aligned(2 * k::kMaxBuckets * sizeof(unsigned long long) + sizeof(int));
    place.receive = cursor, cursor += aligned(static_cast<std::size_t>(place.receive_keys) * item);
    place.gather = cursor, cursor += 2 * gather_bytes;
    place.sort_temp = cursor, cursor += aligned(place.sort_temp_bytes);
    place.send = cursor;
  }
  PinnedBuffer host(count * (2 * k::kMaxBuckets + 1) * sizeof(unsigned long long));
  // work queued on one place reads another's scratch (and copies land in `host`) from here on
  const SyncOnUnwind settle(group);
  // every place reads every shard's samples where they lie: after the work queued on it
  k::SampleParams sampling{};
  sampling.places = static_cast<int>(count);
  sampling.count = samples;
  for (std::size_t p = 0; p < count; ++p) {
    Place& place = places[p];
    DeviceGuard guard(place.device);
    place.entered.emplace(place.device);
    place.entered->record(place.stream);
    sampling.shards[p] = place.input;
    sampling.sizes[p] = place.n;
    sampling.firsts[p] = place.sample_offset;
  }
  sampling.firsts[count] = samples;
  std::vector<std::unique_ptr<CopyStream>> lanes(count);  // made now: the host is busy later
  for (std::size_t q = 0; q < count; ++q) {
    Place& place = places[q];
    DeviceGuard guard(place.device);
    lanes[q] = std::make_unique<CopyStream>(place.device);
    for (std::size_t p = 0; p < count; ++p) {
      if (p != q) places[p].entered->wait(place.stream);
    }
    k::SampleParams params = sampling;
    params.ordered = place.all_samples;
    detail::launch(KernelHandle::builtin(engine.sample_kernel), static_cast<unsigned>((samples + 255) / 256), 256,
                   place.stream, params, "launching sort samples");
  }
  auto* host_counts = reinterpret_cast<unsigned long long*>(host.data);
  auto sample_counts = [&](std::size_t p) { return host_counts + p * (2 * k::kMaxBuckets + 1); };
  auto cursors = [&](std::size_t p) { return sample_counts(p) + k::kMaxBuckets; };
  auto overflowed = [&](std::size_t p) { return reinterpret_cast<int*>(cursors(p) + k::kMaxBuckets); };
  auto synchronize = [&] {
    for (const Place& place : places) {
      DeviceGuard guard(place.device);
      check(cudaStreamSynchronize(place.stream), "cudaStreamSynchronize");
    }
  };
  for (std::size_t q = 0; q < count; ++q) {
    Place& place = places[q];
    DeviceGuard guard(place.device);
    std::size_t temp_bytes = place.sample_temp_bytes;
    check(sample_engine->sort_into(place.sample_temp, temp_bytes, place.all_samples, place.sorted_samples, samples,
                                   place.stream),
          "cub::DeviceRadixSort (samples)");
    k::PickParams pick{};
    pick.sorted = place.sorted_samples;
    pick.splitters = place.splitters;
    pick.count = buckets - 1;
    std::copy(edges.begin(), edges.end(), pick.ranks);
    detail::launch(KernelHandle::builtin(k::pick_kernel(static_cast<int>(item))), 1, k::kMaxBuckets, place.stream,
                   pick, "launching sort splitters");
    check(cudaMemsetAsync(place.counters, 0, 2 * k::kMaxBuckets * sizeof(unsigned long long) + sizeof(int),
                          place.stream),
          "cudaMemsetAsync (sort counters)");
    k::BucketCountParams tally{place.all_samples + place.sample_offset * static_cast<long long>(item), place.samples,
                               place.splitters, buckets - 1, place.counters};
    detail::launch(KernelHandle::builtin(engine.bucket_count_kernel),
                   static_cast<unsigned>(std::min<long long>((place.samples + 255) / 256, 64)), 256, place.stream,
                   tally, "launching sort sample counts");
    check(cudaMemcpyAsync(sample_counts(q), place.counters, k::kMaxBuckets * sizeof(unsigned long long),
                          cudaMemcpyDeviceToHost, place.stream),
          "cudaMemcpyAsync (sort sample counts)");
  }
  synchronize();

  // 2. runs sized from the samples, then the partition
  auto per_sample = [&](std::size_t p) {
    return static_cast<double>(places[p].n) / static_cast<double>(places[p].samples);
  };
  auto expected = [&](std::size_t p, int b) { return static_cast<double>(sample_counts(p)[b]) * per_sample(p); };
  auto variance = [&](std::size_t p, int b) {
    return (static_cast<double>(sample_counts(p)[b]) + 1.0) * per_sample(p) * per_sample(p);
  };
  for (std::size_t q = 0; q < count; ++q) {
    Place& place = places[q];
    place.run.assign(static_cast<std::size_t>(buckets), nullptr);
    place.start.assign(static_cast<std::size_t>(buckets), 0);
    place.room.assign(static_cast<std::size_t>(buckets), 0);
    long long received = 0, sent = 0;
    for (int b = 0; b < buckets; ++b) {
      const std::size_t at = static_cast<std::size_t>(b);
      if (owner(b) == q && !is_boundary(b)) {  // a region for every place's keys of it
        double total = 0, spread = 0;
        for (std::size_t p = 0; p < count; ++p) total += expected(p, b), spread += variance(p, b);
        place.run[at] = place.receive, place.start[at] = received, place.room[at] = capacity(total, spread);
        received += place.room[at];
      } else {
        place.run[at] = place.send, place.start[at] = sent, place.room[at] = capacity(expected(q, b), variance(q, b));
        sent += place.room[at];
      }
    }
    if (received > place.receive_keys || sent > place.send_keys) return false;
  }
  for (std::size_t q = 0; q < count; ++q) {
    Place& place = places[q];
    DeviceGuard guard(place.device);
    k::PartitionParams params{};
    params.keys = place.input;
    params.n = place.n;
    params.splitters = place.splitters;
    params.nsplit = buckets - 1;
    params.cursors = place.counters + k::kMaxBuckets;
    params.overflow = place.overflow;
    for (int b = 0; b < buckets; ++b) {
      const std::size_t at = static_cast<std::size_t>(b);
      params.dests[b] = place.run[at] + place.start[at] * static_cast<long long>(item);
      params.caps[b] = place.room[at];
    }
    constexpr long long tile = k::kPartitionBlock * k::kPartitionItems;
    detail::launch(KernelHandle::builtin(engine.partition_kernel), static_cast<unsigned>((place.n + tile - 1) / tile),
                   k::kPartitionBlock, place.stream, params, "launching sort partition");
    check(cudaMemcpyAsync(cursors(q), place.counters + k::kMaxBuckets,
                          k::kMaxBuckets * sizeof(unsigned long long) + sizeof(int), cudaMemcpyDeviceToHost,
                          place.stream),
          "cudaMemcpyAsync (sort bucket counts)");
  }
  synchronize();

  // The exact sizes: place q's sub-range j holds total(q, j) keys; boundary bucket q holds
  // boundary[q], of which the first head[q] end shard q and the rest start shard q + 1.
  auto keys_of = [&](std::size_t p, int b) { return static_cast<long long>(cursors(p)[b]); };
  for (std::size_t p = 0; p < count; ++p) {
    if (*overflowed(p) != 0) return false;
  }
  std::vector<std::vector<long long>> total(count, std::vector<long long>(static_cast<std::size_t>(k_sub), 0));
  std::vector<long long> boundary(count, 0), head(count, 0), tail(count, 0);
  long long all = 0;
  for (int b = 0; b < buckets; ++b) {
    long long sum = 0;
    for (std::size_t p = 0; p < count; ++p) sum += keys_of(p, b);
    all += sum;
    const std::size_t q = owner(b);
    if (is_boundary(b)) {
      boundary[q] = sum;
    } else {
      if (sum > places[q].room[static_cast<std::size_t>(b)]) return false;
      total[q][static_cast<std::size_t>(b % (k_sub + 1))] = sum;
    }
  }
  if (all != n) {
    throw std::runtime_error("sort: bucket counts do not add up to the keys; was the array written by other work "
                             "while it was being sorted?");
  }
  for (std::size_t q = 0; q + 1 < count; ++q) {
    long long own = 0;
    for (long long t : total[q]) own += t;
    head[q] = places[q].n - (q > 0 ? tail[q - 1] : 0) - own;
    if (head[q] < 0 || head[q] > boundary[q]) return false;  // the boundary fell outside its bucket
    tail[q] = boundary[q] - head[q];
  }

  // 3. exchange and sort. Nothing is written to an output shard before this point.
  for (std::size_t q = 0; q + 1 < count; ++q) {
    if (boundary[q] > places[q].gather_keys) return false;
  }
  std::deque<Event> events;
  std::vector<Event*> gathered(count, nullptr), split(count, nullptr), lane_done(count, nullptr);
  std::vector<std::vector<Event*>> arrived(count, std::vector<Event*>(static_cast<std::size_t>(k_sub), nullptr));
  for (std::size_t q = 0; q < count; ++q) {  // every copy first, so that every link is busy at once
    Place& place = places[q];
    DeviceGuard guard(place.device);
    const cudaStream_t lane = lanes[q]->get();
    events.emplace_back(place.device).record(place.stream);  // after the partition, on a stream of its own
    events.back().wait(lane);
    if (q + 1 < count) {  // the boundary bucket above this place, from every place
      const int b = static_cast<int>(q) * (k_sub + 1) + k_sub;
      long long at = 0;
      for (std::size_t p = 0; p < count; ++p) {
        const Place& source = places[p];
        const std::size_t bb = static_cast<std::size_t>(b);
        copy_keys(place.gather + at * static_cast<long long>(item), place.device,
                  source.run[bb] + source.start[bb] * static_cast<long long>(item), source.device,
                  static_cast<std::size_t>(keys_of(p, b)) * item, lane);
        at += keys_of(p, b);
      }
      gathered[q] = &events.emplace_back(place.device);
      gathered[q]->record(lane);
    }
    for (int j = 0; j < k_sub; ++j) {
      const int b = static_cast<int>(q) * (k_sub + 1) + j;
      const std::size_t bb = static_cast<std::size_t>(b);
      long long at = place.start[bb] + keys_of(q, b);  // after the place's own keys
      for (std::size_t p = 0; p < count; ++p) {
        if (p == q) continue;
        const Place& source = places[p];
        copy_keys(place.receive + at * static_cast<long long>(item), place.device,
                  source.run[bb] + source.start[bb] * static_cast<long long>(item), source.device,
                  static_cast<std::size_t>(keys_of(p, b)) * item, lane);
        at += keys_of(p, b);
      }
      arrived[q][static_cast<std::size_t>(j)] = &events.emplace_back(place.device);
      arrived[q][static_cast<std::size_t>(j)]->record(lane);
    }
    lane_done[q] = arrived[q].back();
  }
  for (std::size_t q = 0; q < count; ++q) {
    Place& place = places[q];
    DeviceGuard guard(place.device);
    if (q + 1 < count && boundary[q] > 0) {  // sorted, then split between shards q and q + 1
      gathered[q]->wait(place.stream);
      unsigned char* sorted = place.gather + aligned(static_cast<std::size_t>(place.gather_keys) * item);
      std::size_t bytes = place.sort_temp_bytes;
      check(engine.sort_into(place.sort_temp, bytes, place.gather, sorted, boundary[q], place.stream),
            "cub::DeviceRadixSort (boundary)");
      copy_keys(place.output + (place.n - head[q]) * static_cast<long long>(item), place.device, sorted, place.device,
                static_cast<std::size_t>(head[q]) * item, place.stream);
      const Place& next = places[q + 1];
      copy_keys(next.output, next.device, sorted + head[q] * static_cast<long long>(item), place.device,
                static_cast<std::size_t>(tail[q]) * item, place.stream);
      split[q] = &events.emplace_back(place.device);
      split[q]->record(place.stream);
    }
    long long at = q > 0 ? tail[q - 1] : 0;
    for (int j = 0; j < k_sub; ++j) {
      const std::size_t bb = static_cast<std::size_t>(static_cast<int>(q) * (k_sub + 1) + j);
      const long long keys = total[q][static_cast<std::size_t>(j)];
      arrived[q][static_cast<std::size_t>(j)]->wait(place.stream);
      if (keys == 0) continue;
      std::size_t bytes = place.sort_temp_bytes;
      check(engine.sort_into(place.sort_temp, bytes, place.receive + place.start[bb] * static_cast<long long>(item),
                             place.output + at * static_cast<long long>(item), keys, place.stream),
            "cub::DeviceRadixSort");
      at += keys;
    }
    if (q > 0 && split[q - 1]) split[q - 1]->wait(place.stream);  // the head of this shard is in
  }
  // a place's send buffer (in its scratch, freed on its stream) outlives every copy from it
  for (std::size_t p = 0; p < count; ++p) {
    DeviceGuard guard(places[p].device);
    for (std::size_t q = 0; q < count; ++q) {
      if (q != p) lane_done[q]->wait(places[p].stream);
    }
  }
  return true;
}

}  // namespace csj::detail
