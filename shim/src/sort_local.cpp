// Step 1 of the multi-place sort (sort_steps.hpp): each place radix-sorts its shard. Over
// several places, into a run buffer of its own (CUB's sort from the input, which it leaves
// as it was), which the later steps read across places; one place alone sorts in place (CUB
// decides between the shard and a scratch buffer, and a copy brings the keys back when it
// ends in the scratch). Floating keys are first rewritten so that every NaN is the positive
// quiet NaN (NaNs then sort last, as numpy's, whatever their sign bit), in the output shard:
// the input is left as it was when the output is another array.
//
// Keys that carry values (sort_by_key) sort with them, through the pairs engine.
//
// The runs' sorts are replayed from CUDA graphs once the same sort repeats (SortGraphs).
#include <cuda_runtime.h>

#include <algorithm>
#include <list>
#include <mutex>

#include "../kernels/sort_engine.hpp"
#include "launch.hpp"
#include "sort_steps.hpp"

namespace csj::detail {
namespace {

namespace k = kernels;

// One run's radix sort from its input into its run buffers, as SortGraphs records it.
struct RunSort {
  const k::SortEngine* engine;
  const k::PairsEngine* pairs;  // null: keys alone
  void* temp;
  std::size_t temp_bytes;
  const void* in;
  void* out;
  const void* values_in;
  void* values_out;
  long long n;

  cudaError_t queue(cudaStream_t stream) const {
    std::size_t bytes = temp_bytes;
    if (pairs) return pairs->sort_into(temp, bytes, in, out, values_in, values_out, n, stream);
    return engine->sort_into(temp, bytes, in, out, n, stream);
  }
  bool operator==(const RunSort& other) const {
    return engine == other.engine && pairs == other.pairs && temp == other.temp && temp_bytes == other.temp_bytes &&
           in == other.in && out == other.out && values_in == other.values_in && values_out == other.values_out &&
           n == other.n;
  }
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
  static void queue(const RunSort& sort, cudaStream_t stream) {
    const ContextStamp context = ContextStamp::current();
    const Key key{context.id, sort};
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
    cudaGraphExec_t exec = seen ? capture(sort) : nullptr;
    if (exec && cudaGraphLaunch(exec, stream) != cudaSuccess) {
      cudaGetLastError();
      cudaGraphExecDestroy(exec);
      exec = nullptr;
    }
    if (!exec) {
      check(sort.queue(stream), "cub::DeviceRadixSort");
      return;
    }
    std::lock_guard<std::mutex> lock(mutex());
    remember(key, context, exec);
  }

 private:
  static constexpr std::size_t kSortGraphs = 16;
  struct Key {
    unsigned long long context;
    RunSort sort;
    bool operator==(const Key& other) const { return context == other.context && sort == other.sort; }
  };
  struct Entry {
    Key key;
    ContextStamp context;
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
  static cudaGraphExec_t capture(const RunSort& sort) {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    const CopyStream side(device);
    const cudaStream_t stream = side.get();
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    const cudaError_t queued = sort.queue(stream);
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
  static void remember(const Key& key, const ContextStamp& context, cudaGraphExec_t exec) {
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

}  // namespace

const unsigned char* queue_sort_input(const k::SortEngine& engine, const SortPlace& place,
                                      const unsigned char* input, bool distinct_output, bool several,
                                      std::size_t item) {
  const bool rewrite = engine.canonicalize_kernel != nullptr;
  const bool copy = distinct_output && (rewrite || !several);
  if (copy && !rewrite) {
    check(cudaMemcpyAsync(place.shard, input, place.n * item, cudaMemcpyDeviceToDevice, place.stream),
          "cudaMemcpyAsync (sort input)");
  }
  if (rewrite) {  // one pass: the copy into the output shard, if any, rewrites as it goes
    k::KeysParams params{place.shard, place.n, copy ? input : nullptr};
    const long long blocks = (place.n + 255) / 256;
    const auto grid = static_cast<unsigned>(std::min<long long>(blocks, multiprocessors(place.device) * 8LL));
    launch(KernelHandle::builtin(engine.canonicalize_kernel), grid, 256, place.stream, params,
           "launching NaN canonicalisation");
  }
  return copy ? place.shard : input;
}

const unsigned char* queue_values_input(const SortPlace& place, const unsigned char* input, bool distinct_output,
                                        bool several, std::size_t value_item) {
  if (!distinct_output || several) return input;
  check(cudaMemcpyAsync(place.shard_values, input, place.n * value_item, cudaMemcpyDeviceToDevice, place.stream),
        "cudaMemcpyAsync (sort values)");
  return place.shard_values;
}

void queue_run_sort(const k::SortEngine& engine, const k::PairsEngine* pairs, SortPlace& place,
                    const unsigned char* input, const unsigned char* values, bool sampled) {
  place.input = input;
  place.input_values = values;
  if (sampled) {
    place.unsorted.emplace(place.device);
    place.unsorted->record(place.stream);
  }
  SortGraphs::queue({&engine, pairs, place.temp, place.temp_bytes, input, place.run, values, place.run_values, place.n},
                    place.stream);
  place.ready.emplace(place.device);
  place.ready->record(place.stream);
}

void sort_shard_in_place(const k::SortEngine& engine, const k::PairsEngine* pairs, SortPlace& place,
                         const Lanes& lanes) {
  std::size_t temp_bytes = place.temp_bytes;
  bool in_alternate = false;
  if (pairs) {
    check(pairs->sort(place.temp, temp_bytes, place.shard, place.run, place.shard_values, place.run_values, place.n,
                      &in_alternate, place.stream),
          "cub::DeviceRadixSort::SortPairs");
  } else {
    check(engine.sort(place.temp, temp_bytes, place.shard, place.run, place.n, &in_alternate, place.stream),
          "cub::DeviceRadixSort");
  }
  if (!in_alternate) return;
  check(cudaMemcpyAsync(place.shard, place.run, place.n * lanes.key, cudaMemcpyDeviceToDevice, place.stream),
        "cudaMemcpyAsync (sorted shard)");
  if (pairs) {
    check(cudaMemcpyAsync(place.shard_values, place.run_values, place.n * lanes.value, cudaMemcpyDeviceToDevice,
                          place.stream),
          "cudaMemcpyAsync (sorted values)");
  }
}

}  // namespace csj::detail
