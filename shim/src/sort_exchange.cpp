// Steps 3 and 4 of the multi-place sort (sort_steps.hpp), with the order's cut search (step
// 2) run in their midst. Each output shard is cut into chunks at exact global ranks (the search
// finds the chunks' cuts with the shards'), and written chunk by chunk by merging its pieces
// of every place's run. Pieces on another device are copied into the place's receive buffer
// on a transfer stream of its own (every place at once, so both directions of each link are
// busy), and a chunk is merged as soon as its pieces are in, while the next chunks travel;
// pieces on the same device are merged where they lie. Bounds of every cut are known before
// the search ends, so the keys of the first chunk's pieces that lie between those bounds
// travel while it runs, into windows of the receive buffer that hold every possible cut: the
// bounds from samples of the keys (sort_sampled_cuts.cpp), queued to go the moment the sorts
// end, or else those of the search's first round. Last (step 4), a run buffer goes only once
// every place that reads it has finished. Values that the keys carry travel and merge with
// them, in twin buffers indexed alike.
//
// Also the counts of which bounds the sorts used (csj::sort_path_counts, for tests/probes).
#include <atomic>
#include <deque>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "csj/sort.hpp"
#include "sort_steps.hpp"

namespace csj::detail {
namespace {

namespace k = kernels;

// sort_path_counts()
std::atomic<unsigned long long> sampled_sorts{0}, missed_sorts{0}, first_round_sorts{0};

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

// A stream of its own for copies into a place's receive buffer, so that they run while the
// place merges what has already arrived. Before its first copy from a run, it waits for that
// run's sort and for the place's own (the receive buffer is CUB's storage until then). Left
// by an exception, it waits for its copies before the buffers they write go.
class TransferStream {
 public:
  TransferStream(int device, std::size_t places) : stream_(device), waited_(places, false) {}

  // Copies keys [from, to) of place p's run (`source`), and their values, into `place`'s
  // receive buffers at element `at`.
  void copy(const SortPlace& place, const SortPlace& source, std::size_t p, long long from, long long to, long long at,
            const Lanes& lanes) {
    if (from >= to) return;
    if (!landed_) place.ready->wait(stream_.get()), landed_ = true;
    if (!waited_[p]) source.ready->wait(stream_.get()), waited_[p] = true;
    const RunPiece piece{source.run + from * lanes.key,
                         lanes.value ? source.run_values + from * lanes.value : nullptr, to - from, source.device};
    copy_piece(piece, place.receive + at * lanes.key, lanes.value ? place.receive_values + at * lanes.value : nullptr,
               place.device, lanes, stream_.get());
    used_ = true;
  }
  // An event for the copies queued since the last call (null when none were).
  Event* arrivals(std::deque<Event>& events) {
    if (!used_) return nullptr;
    used_ = false;
    Event* event = &events.emplace_back(stream_.device());
    event->record(stream_.get());
    return event;
  }

 private:
  CopyStream stream_;
  bool landed_ = false;
  std::vector<bool> waited_;
  bool used_ = false;
};

// per receiving place: its transfer stream (null for a place that receives nothing)
using Transfers = std::vector<std::unique_ptr<TransferStream>>;
// per (place, source): where key 0 of the source run would land in the place's receive
// buffer (empty for a place without windows)
using Landing = std::vector<std::vector<long long>>;
// per (place, source): the place's early copies read the source's run
using EarlyReads = std::vector<std::vector<bool>>;

// Element `index` of a values buffer (null without values).
const unsigned char* element(const unsigned char* values, long long index, const Lanes& lanes) {
  return lanes.value ? values + index * lanes.value : nullptr;
}

// Whether place q's pieces of place p's run travel (they lie on another device).
bool remote(const std::vector<SortPlace>& places, std::size_t q, std::size_t p) {
  return p != q && places[p].n > 0 && places[p].device != places[q].device;
}

// 3a. Given bounds of every cut, the keys of a piece between the upper bound of its start and
//     the lower bound of its end are certain to go: those of each place's first chunk travel
//     while the search goes on. The place's receive buffer then mirrors each source run from
//     the lowest possible start of its first piece to the highest possible end of its last (a
//     window per source), so that whatever the exact cuts, every key lands where its piece
//     will read it. Where those windows do not fit (keys crowded around a cut), the pieces
//     travel once the cuts are exact, one after another. Lays out the windows of every place
//     that receives and returns whether they all fit.
bool plan_windows(const std::vector<SortPlace>& places, const SortChunks& chunks, const CutBounds& sent,
                  const Transfers& transfers, Landing& landing) {
  const std::size_t count = places.size();
  bool all = true;
  for (std::size_t q = 0; q < count; ++q) {
    landing[q].clear();
    if (!transfers[q]) continue;
    const std::size_t first = chunks.first[q], last = chunks.end[q];
    long long needed = 0;
    for (std::size_t p = 0; p < count; ++p) {
      if (remote(places, q, p)) needed += sent.upper[last][p] - sent.lower[first][p];
    }
    if (needed > places[q].receive_keys) {
      all = false;
      continue;
    }
    landing[q].assign(count, 0);
    long long at = 0;  // the windows lie one after another
    for (std::size_t p = 0; p < count; ++p) {
      if (!remote(places, q, p)) continue;
      landing[q][p] = at - sent.lower[first][p];
      at += sent.upper[last][p] - sent.lower[first][p];
    }
  }
  return all;
}

// Queues, for every place with windows, the certain keys of its first chunk's remote pieces
// and marks the runs they read in `early` (step 4 must wait for those readers even where the
// exact cuts take nothing from a run).
void send_first_chunks(const std::vector<SortPlace>& places, const SortChunks& chunks, const CutBounds& sent,
                       const Landing& landing, Transfers& transfers, const Lanes& lanes, EarlyReads& early) {
  const std::size_t count = places.size();
  for (std::size_t q = 0; q < count; ++q) {
    if (landing[q].empty()) continue;
    DeviceGuard guard(places[q].device);
    const std::size_t first = chunks.first[q];
    for (std::size_t p = 0; p < count; ++p) {
      if (!remote(places, q, p)) continue;
      const long long from = sent.upper[first][p], to = sent.lower[first + 1][p];
      transfers[q]->copy(places[q], places[p], p, from, to, landing[q][p] + from, lanes);
      if (from < to) early[q][p] = true;
    }
  }
}

// Bounds from the first round hold surely: cuts outside them mean that the keys changed.
// Those from the samples (`guessed`) hold almost surely: a place whose cuts fall outside them
// loses its windows and receives its pieces one after another, after (and over) what its
// early copies wrote. (Keys that other work changes meanwhile are then caught by check_cuts
// alone.) Returns whether some place's windows went.
bool drop_missed_windows(const std::vector<SortPlace>& places, const SortChunks& chunks,
                         const std::vector<std::vector<long long>>& cuts, const CutBounds& sent, bool guessed,
                         Landing& landing) {
  const std::size_t count = places.size();
  bool missed = false;
  for (std::size_t q = 0; q < count; ++q) {
    if (landing[q].empty()) continue;
    bool inside = true;
    for (std::size_t i = chunks.first[q]; i <= chunks.end[q]; ++i) {
      for (std::size_t p = 0; p < count; ++p) {
        if (remote(places, q, p) && (cuts[i][p] < sent.lower[i][p] || cuts[i][p] > sent.upper[i][p])) inside = false;
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
  return missed;
}

// One chunk of an output shard, as its merge reads it.
struct Chunk {
  std::vector<RunPiece> pieces;
  Event* arrived = nullptr;  // its copies are in
  long long offset = 0;      // in the output shard
};

// 3b. Chunk by chunk, each place receives the rest of its pieces from other devices (after
//     the first chunk's bulk, on the same stream), every place's copies queued before any
//     merge, so that every link is busy at once. Returns every place's chunks; the copies'
//     events go into `events`.
std::vector<std::vector<Chunk>> queue_chunk_copies(const std::vector<SortPlace>& places, const SortChunks& chunks,
                                                   const std::vector<std::vector<long long>>& cuts,
                                                   const CutBounds& sent, const Landing& landing,
                                                   Transfers& transfers, const Lanes& lanes,
                                                   std::deque<Event>& events) {
  const std::size_t count = places.size();
  const std::vector<long long>& ranks = chunks.ranks;
  std::vector<std::vector<Chunk>> plans(count);
  for (std::size_t q = 0; q < count; ++q) {
    const SortPlace& place = places[q];
    if (place.n == 0) continue;
    DeviceGuard guard(place.device);
    const bool windowed = !landing[q].empty();
    long long received = 0;  // without windows, pieces land one after another
    for (std::size_t begin = chunks.first[q]; begin < chunks.end[q]; ++begin) {
      Chunk chunk;
      chunk.offset = ranks[begin] - ranks[chunks.first[q]];
      for (std::size_t p = 0; p < count; ++p) {
        const long long from = cuts[begin][p], to = cuts[begin + 1][p];
        if (from == to) continue;
        const SortPlace& source = places[p];
        if (!remote(places, q, p)) {
          chunk.pieces.push_back({source.run + from * lanes.key, element(source.run_values, from, lanes), to - from,
                                  source.device});
          continue;
        }
        if (!windowed) {
          transfers[q]->copy(place, source, p, from, to, received, lanes);
          chunk.pieces.push_back({place.receive + received * lanes.key, element(place.receive_values, received, lanes),
                                  to - from, place.device});
          received += to - from;
          continue;
        }
        const long long at = landing[q][p];  // + a run index
        chunk.pieces.push_back({place.receive + (at + from) * lanes.key,
                                element(place.receive_values, at + from, lanes), to - from, place.device});
        const long long sent_from = sent.upper[begin][p], sent_to = sent.lower[begin + 1][p];
        if (begin == chunks.first[q] && sent_from < sent_to) {  // the bulk went: its ends remain
          transfers[q]->copy(place, source, p, from, sent_from, at + from, lanes);
          transfers[q]->copy(place, source, p, sent_to, to, at + sent_to, lanes);
        } else {
          transfers[q]->copy(place, source, p, from, to, at + from, lanes);
        }
      }
      if (transfers[q]) chunk.arrived = transfers[q]->arrivals(events);
      plans[q].push_back(std::move(chunk));
    }
  }
  return plans;
}

// Each place merges its chunks, on its stream, as soon as their pieces are in (those of runs
// on its own device once those are sorted); then records its `merged`.
void queue_merges(const SortOrder& order, std::vector<SortPlace>& places, std::vector<std::vector<Chunk>>& plans,
                  const Lanes& lanes) {
  const std::size_t count = places.size();
  for (std::size_t q = 0; q < count; ++q) {
    SortPlace& place = places[q];
    if (place.n == 0) continue;
    DeviceGuard guard(place.device);
    for (std::size_t p = 0; p < count; ++p) {  // runs on this device read in place
      if (p != q && places[p].n > 0 && places[p].device == place.device) places[p].ready->wait(place.stream);
    }
    for (Chunk& chunk : plans[q]) {
      if (chunk.arrived) chunk.arrived->wait(place.stream);
      merge_pieces(order, merge_target(place), std::move(chunk.pieces), chunk.offset, lanes);
    }
    place.merged.emplace(place.device);
    place.merged->record(place.stream);
  }
}

// 4. A place's run (in its scratch, freed on its stream when the places go) outlives every
//    place that reads it: its exact pieces, or its early copies.
void keep_runs_for_readers(const std::vector<SortPlace>& places, const SortChunks& chunks,
                           const std::vector<std::vector<long long>>& cuts, const EarlyReads& early) {
  const std::size_t count = places.size();
  for (std::size_t p = 0; p < count; ++p) {
    const SortPlace& place = places[p];
    if (place.n == 0) continue;
    DeviceGuard guard(place.device);
    for (std::size_t reader = 0; reader < count; ++reader) {
      if (reader == p || places[reader].n == 0) continue;
      if (cuts[chunks.first[reader]][p] == cuts[chunks.end[reader]][p] && !early[reader][p]) continue;
      places[reader].merged->wait(place.stream);
    }
  }
}

}  // namespace

SortChunks chunk_layout(const std::vector<std::int64_t>& shard_sizes, const std::vector<std::int64_t>& shard_offsets,
                        long long total) {
  const std::size_t count = shard_sizes.size();
  SortChunks chunks;
  chunks.first.assign(count, 0);
  chunks.end.assign(count, 0);
  for (std::size_t q = 0; q < count; ++q) {
    chunks.first[q] = chunks.ranks.size();
    const long long n = shard_sizes[q], start = shard_offsets[q];
    for (long long j = 0; n > 0 && j < chunks_of(n); ++j) chunks.ranks.push_back(start + chunk_start(n, j));
    chunks.end[q] = chunks.first[q] + static_cast<std::size_t>(chunks_of(n));
  }
  chunks.ranks.push_back(total);
  return chunks;
}

void exchange_and_merge(const SortOrder& order, std::vector<SortPlace>& places, const PlaceGroup& group,
                        const Lanes& lanes, const SortChunks& chunks, SampledCuts* sampled) {
  const std::size_t count = places.size();
  const std::vector<long long>& ranks = chunks.ranks;
  const long long total = ranks.back();
  // made while the local sorts run: a stream per place that receives
  Transfers transfers(count);
  for (std::size_t q = 0; q < count; ++q) {
    if (places[q].receive && places[q].n > 0) transfers[q] = std::make_unique<TransferStream>(places[q].device, count);
  }
  // 3a. the bounds the early copies go by, the windows they land in, the runs they read
  CutBounds sent;
  Landing landing(count);
  EarlyReads early(count, std::vector<bool>(count, false));
  // the samples' bounds only when every place's windows fit: the copies they queue go
  // behind the sorts at once
  bool guessed = false;
  if (sampled) {
    sent = sampled->bounds(ranks, total);
    guessed = plan_windows(places, chunks, sent, transfers, landing);
    if (guessed) send_first_chunks(places, chunks, sent, landing, transfers, lanes, early);
  }

  // 2. the cut search (the host waits for the local sorts here)
  const std::vector<SortedRun> runs = sorted_runs(places);
  const std::unique_ptr<CutSearch> search = order.search(runs, group, ranks, total);
  CutSearch& splitters = *search;
  if (!splitters.settled()) splitters.round();
  if (guessed) {
    ++sampled_sorts;
  } else {
    sent = splitters.bounds();
    for (auto& windows : landing) windows.clear();
    if (!splitters.settled()) {
      plan_windows(places, chunks, sent, transfers, landing);
      send_first_chunks(places, chunks, sent, landing, transfers, lanes, early);
      ++first_round_sorts;
    }
  }
  while (!splitters.settled()) splitters.round();
  const std::vector<std::vector<long long>>& cuts = splitters.cuts();
  check_cuts(cuts, runs, ranks);
  if (drop_missed_windows(places, chunks, cuts, sent, guessed, landing)) ++missed_sorts;

  // 3b. the rest of the pieces travel, chunk by chunk, and each place merges its chunks
  std::deque<Event> events;
  std::vector<std::vector<Chunk>> plans =
      queue_chunk_copies(places, chunks, cuts, sent, landing, transfers, lanes, events);
  queue_merges(order, places, plans, lanes);

  // 4.
  keep_runs_for_readers(places, chunks, cuts, early);
}

}  // namespace csj::detail

namespace csj {

SortPathCounts sort_path_counts() {
  SortPathCounts counts;
  counts.sampled = detail::sampled_sorts.load();
  counts.missed = detail::missed_sorts.load();
  counts.first_round = detail::first_round_sorts.load();
  return counts;
}

}  // namespace csj
