// Sampled bounds of the cuts (sort_steps.hpp), for the exchange's early copies: likely bounds
// of every cut, from a sample of each place's keys taken while the local sorts run, so that
// the first chunk's keys are queued to travel the moment the sorts end (the splitter search's
// first round reads the sorted runs, and its round trip through the host held them back
// ~0.05 ms). Each place samples its keys at spread positions (one per stratum) into pinned
// host memory; the host counts the samples per bucket of the ordered keys' top kBucketBits
// bits. At a bucket's start, place p's s samples below it stand for s * n_p / S_p keys,
// within `sigmas` standard deviations (each at most (n_p / S_p) * sqrt(S_p) / 2) of the true
// count: the bounds hold with overwhelming probability, not surely. The search then runs as
// before, and a place whose exact cuts fall outside them drops the early copies' layout
// (sort_exchange.cpp).
//
// Also the one place where the environment's switches for these bounds are read.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "../kernels/sort_engine.hpp"
#include "launch.hpp"
#include "sort_steps.hpp"

namespace csj::detail {

namespace k = kernels;

// The switches, for A/B runs and tests (benchmarks/probes/sort_samples_ab.py,
// tests/test_sort.py), read once per sort, before its local sorts are queued: the
// environment may change between sorts, never within one. A value that does not parse
// whole leaves the default.
//   CSJ_SORT_SAMPLE_SIGMAS    the bounds' margin in standard deviations, a number >= 0
//                             (default 6); "off": no samples, the bounds of the search's
//                             first round, as for smaller shards. Tests narrow it to 0 so
//                             that the bounds miss and the places fall back.
//   CSJ_SORT_SAMPLE_MIN_KEYS  samples only when every non-empty shard has at least this many
//                             keys, an integer >= 0 (default 2^25; tests lower it). Below
//                             2^25 keys, sampling costs more than it saves (the samples'
//                             kernel and the host's count are not hidden by short local
//                             sorts): 2x H200, int32 keys over two places, sampled against
//                             the first round's bounds (same runs): 2^23 keys 0.546 against
//                             0.423 ms, 2^24 0.807 against 0.633, 2^25 0.726 against 0.742,
//                             2^26 1.109 against 1.123, 2^28 3.560 against 3.601.
SampleSwitches SampleSwitches::from_environment() {
  SampleSwitches switches;
  if (const char* text = std::getenv("CSJ_SORT_SAMPLE_SIGMAS"); text && *text) {
    if (std::string(text) == "off") {
      switches.sigmas = -1.0;
    } else {
      char* end = nullptr;
      const double value = std::strtod(text, &end);
      if (end && *end == '\0' && value >= 0.0) switches.sigmas = value;
    }
  }
  if (const char* text = std::getenv("CSJ_SORT_SAMPLE_MIN_KEYS"); text && *text) {
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    if (end && *end == '\0' && value >= 0) switches.min_keys = value;
  }
  return switches;
}

bool SampleSwitches::wanted(const std::vector<std::int64_t>& shard_sizes) const {
  if (sigmas < 0.0) return false;
  for (const std::int64_t n : shard_sizes) {
    if (n > 0 && n < min_keys) return false;
  }
  return true;
}

std::vector<SampleSource> sample_sources(const std::vector<SortPlace>& places) {
  std::vector<SampleSource> sources(places.size());
  for (std::size_t p = 0; p < places.size(); ++p) {
    const SortPlace& place = places[p];
    sources[p] = {place.device, place.input, place.n, place.unsorted ? &*place.unsorted : nullptr};
  }
  return sources;
}

SampledCuts::SampledCuts(const k::SortEngine& engine, std::vector<SampleSource> sources, double sigmas)
    : sources_(std::move(sources)),
      key_bits_(engine.key_bits),
      key_bytes_(engine.key_bits == 32 ? 4 : 8),
      sigmas_(sigmas) {
  std::size_t total = 0;
  for (const SampleSource& source : sources_) {
    offsets_.push_back(total);
    total += static_cast<std::size_t>(samples_of(source)) * key_bytes_;
  }
  host_ = std::make_unique<PinnedBuffer>(total);
  sides_.resize(sources_.size());
  for (std::size_t p = 0; p < sources_.size(); ++p) {
    const SampleSource& source = sources_[p];
    const long long samples = samples_of(source);
    if (samples == 0) continue;
    DeviceGuard guard(source.device);
    sides_[p] = std::make_unique<CopyStream>(source.device);
    source.unsorted->wait(sides_[p]->get());
    k::SampleParams params{};
    params.keys = source.keys;
    params.n = source.n;
    params.count = samples;
    params.ordered = host_->data + offsets_[p];  // written where it lies, in pinned host memory
    launch(KernelHandle::builtin(engine.sample_kernel), static_cast<unsigned>((samples + 255) / 256), 256,
           sides_[p]->get(), params, "launching sort samples");
  }
}

SampledCuts::~SampledCuts() { wait(true); }

CutBounds SampledCuts::bounds(const std::vector<long long>& ranks, long long total) {
  wait(false);
  const std::size_t count = sources_.size();
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
    const long long samples = samples_of(sources_[p]);
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
    weight[p] = static_cast<double>(sources_[p].n) / static_cast<double>(samples);
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
  CutBounds sampled;
  std::vector<std::vector<long long>>& lower = sampled.lower;
  std::vector<std::vector<long long>>& upper = sampled.upper;
  lower.assign(ranks.size(), std::vector<long long>(count, 0));
  upper.assign(ranks.size(), std::vector<long long>(count, 0));
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const auto rank = static_cast<double>(ranks[i]);
    // the last bucket start surely at or below the rank (bucket 0's start has no key below
    // it), and the first surely at or above it (past the last bucket, every key is below)
    const std::size_t low = first_past(rank - margins, true) - 1;
    const std::size_t high = first_past(rank + margins, false);
    for (std::size_t p = 0; p < count; ++p) {
      const long long n = sources_[p].n;
      if (ranks[i] == 0 || n == 0) continue;
      if (ranks[i] == total) {
        lower[i][p] = upper[i][p] = n;
        continue;
      }
      lower[i][p] = low == 0 ? 0 : clamp(std::floor(weight[p] * below_of(p, low) - margin[p]), n);
      upper[i][p] = high == kBuckets ? n : clamp(std::ceil(weight[p] * below_of(p, high) + margin[p]), n);
    }
  }
  return sampled;
}

long long SampledCuts::samples_of(const SampleSource& source) {
  return source.n > 0 ? std::min(source.n, kSamples) : 0;
}

long long SampledCuts::clamp(double keys, long long n) {
  return keys <= 0.0 ? 0 : keys >= static_cast<double>(n) ? n : static_cast<long long>(keys);
}

// The kernels write host_: they end before it goes back (quietly when unwinding).
void SampledCuts::wait(bool quiet) {
  for (std::size_t p = 0; p < sides_.size(); ++p) {
    if (!sides_[p]) continue;
    if (quiet) {
      synchronize_quietly(sides_[p]->device(), sides_[p]->get());
    } else {
      DeviceGuard guard(sides_[p]->device());
      check(cudaStreamSynchronize(sides_[p]->get()), "cudaStreamSynchronize (sort samples)");
    }
    sides_[p].reset();
  }
}

}  // namespace csj::detail
