// The host's floor under host time per call: what queueing one kernel costs the CPU, with
// nothing else around it (no Python, no checks), on the machine at hand. A transform's host
// time cannot fall below this, so docs/performance.md quotes it beside the host-time target.
//
//     nvcc -O2 -arch=sm_90 -o /tmp/launch_floor benchmarks/launch_floor.cu -lcuda
//     /tmp/launch_floor        # µs per launch: median and best of 7 batches of 20000
//
// Two paths, as the shim has them: the runtime API on a kernel compiled in (built-in
// operators) and the driver API on a CUkernel (cuLaunchKernel, linked user operators). The
// kernel takes a 136-byte parameter block, the size of the transform's. Then the floor under a
// reduce to a host value: a launch whose kernel stores a word to mapped host memory and the
// host's spin until it sees it, the same with a value stored first and a system fence between
// the two (what a separate value and ticket cost, which the reduce's words carrying both
// avoid), and the same launch waited for with cudaStreamSynchronize. Last, the floor under a call
// on 4 places of one GPU.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

struct Params {
  unsigned char bytes[136];
};

__global__ void empty_kernel(Params) {}

// One thread stores `ticket` to a word of mapped host memory, as the reduce's last block
// hands its value over.
__global__ void store_kernel(volatile unsigned long long* word, unsigned long long ticket) { *word = ticket; }

// A value to one word, a system fence, then the ticket to another.
__global__ void fenced_store_kernel(volatile unsigned long long* word, unsigned long long ticket) {
  word[1] = ticket;
  __threadfence_system();
  word[0] = ticket;
}

static void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

static void check(CUresult status, const char* what) {
  if (status != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s: error %d\n", what, static_cast<int>(status));
    std::exit(1);
  }
}

// `run(calls)` makes `calls` calls and waits for them: µs a call, median and best of 7 batches.
template <class Run>
static void report_batches(const char* label, Run&& run) {
  constexpr int kCalls = 20000;
  run(kCalls / 10);  // warm-up
  std::vector<double> batches;
  for (int batch = 0; batch < 7; ++batch) {
    const auto start = std::chrono::steady_clock::now();
    run(kCalls);
    const std::chrono::duration<double, std::micro> spent = std::chrono::steady_clock::now() - start;
    batches.push_back(spent.count() / kCalls);
  }
  std::sort(batches.begin(), batches.end());
  std::printf("%-44s %.2f µs (best %.2f)\n", label, batches[3], batches[0]);
}

template <class Launch>
static void report(const char* label, Launch&& launch, cudaStream_t stream) {
  report_batches(label, [&](int calls) {
    for (int i = 0; i < calls; ++i) launch();
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  });
}

int main() {
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  Params params{};
  void* args[] = {&params};
  report("cudaLaunchKernel (runtime API)", [&] {
    check(cudaLaunchKernel(reinterpret_cast<const void*>(&empty_kernel), dim3(1), dim3(256), args, 0, stream),
          "cudaLaunchKernel");
  }, stream);
  cudaFunction_t function = nullptr;
  check(cudaGetFuncBySymbol(&function, reinterpret_cast<const void*>(&empty_kernel)), "cudaGetFuncBySymbol");
  report("cuLaunchKernel (driver API)", [&] {
    check(cuLaunchKernel(reinterpret_cast<CUfunction>(function), 1, 1, 1, 256, 1, 1, 0,
                         reinterpret_cast<CUstream>(stream), args, nullptr),
          "cuLaunchKernel");
  }, stream);
  int device = 0;
  report("cudaGetDevice + cudaSetDevice + launch", [&] {
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaLaunchKernel(reinterpret_cast<const void*>(&empty_kernel), dim3(1), dim3(256), args, 0, stream),
          "cudaLaunchKernel");
  }, stream);
  unsigned long long* host_word = nullptr;
  check(cudaHostAlloc(reinterpret_cast<void**>(&host_word), 64, cudaHostAllocMapped), "cudaHostAlloc");
  unsigned long long* device_word = nullptr;
  check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_word), host_word, 0), "cudaHostGetDevicePointer");
  *host_word = 0;
  unsigned long long ticket = 0;
  report("launch + spin on a mapped word", [&] {
    store_kernel<<<1, 1, 0, stream>>>(device_word, ++ticket);
    while (*static_cast<volatile unsigned long long*>(host_word) != ticket) {
    }
  }, stream);
  report("launch + spin, a value, a fence, the word", [&] {
    fenced_store_kernel<<<1, 1, 0, stream>>>(device_word, ++ticket);
    while (*static_cast<volatile unsigned long long*>(host_word) != ticket) {
    }
  }, stream);
  report("launch + cudaStreamSynchronize", [&] {
    store_kernel<<<1, 1, 0, stream>>>(device_word, ++ticket);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }, stream);
  check(cudaFreeHost(host_word), "cudaFreeHost");
  // The floor under a call on 4 places of one GPU, a launch on each place's stream: from one
  // thread, as the shim launches, and from 4 threads at once (a call = a launch from each),
  // which the driver largely serialises within the one context.
  constexpr int kPlaces = 4;
  cudaStream_t streams[kPlaces];
  for (auto& place : streams) check(cudaStreamCreateWithFlags(&place, cudaStreamNonBlocking), "cudaStreamCreate");
  auto launch_on = [&](cudaStream_t place) {
    check(cuLaunchKernel(reinterpret_cast<CUfunction>(function), 1, 1, 1, 256, 1, 1, 0,
                         reinterpret_cast<CUstream>(place), args, nullptr),
          "cuLaunchKernel");
  };
  report_batches("4 streams, a launch on each, one thread", [&](int calls) {
    for (int i = 0; i < calls; ++i) {
      for (auto place : streams) launch_on(place);
    }
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  });
  CUcontext context = nullptr;
  check(cuCtxGetCurrent(&context), "cuCtxGetCurrent");
  report_batches("4 streams, a launch on each, 4 threads", [&](int calls) {
    std::vector<std::thread> threads;
    for (auto place : streams) {
      threads.emplace_back([&, place] {
        check(cuCtxSetCurrent(context), "cuCtxSetCurrent");
        for (int i = 0; i < calls; ++i) launch_on(place);
      });
    }
    for (auto& thread : threads) thread.join();
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  });
  for (auto place : streams) check(cudaStreamDestroy(place), "cudaStreamDestroy");
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return 0;
}
