// Standalone C++ harness: the order-preserving reduce's lane layouts against CUB, 2^28 float32
// on one GPU, kernels only (no host round trip). Layouts: "striped" (each 16-byte vector
// folded across the warp, the library's choice for 4/8-byte accumulators), "direct-runs"
// (each lane loads a contiguous run: uncoalesced), "transposed-runs" (coalesced loads, runs
// through padded shared memory: the library's choice for tuple accumulators). Operators:
// sum, argmin (16-byte (value, index)), min-max. Blocks per multiprocessor 2..8.
//   nvcc -O3 -std=c++17 -arch=sm_90 benchmarks/probes/reduce_layouts.cu -o /tmp/reduce_layouts
//   /tmp/reduce_layouts
#include <cub/cub.cuh>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>
#include <cmath>
#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { fprintf(stderr, "line %d: %s: %s\n", __LINE__, #x, cudaGetErrorString(err_)); fflush(stderr); exit(2);} } while (0)
constexpr int kBlock = 256, kWarps = 8, kV = 4, kItems = 4;   // 4 floats per uint4
constexpr long long kWarpTile = 32LL * kV * kItems, kBlockTile = kWarps * kWarpTile;
constexpr int kWindow = 16, kPad = 144;

struct alignas(8) ArgAcc { float v; int pad; long long i; };
struct alignas(8) MinMax { float lo, hi; };
struct SumMap { __host__ __device__ float operator()(float x, long long) const { return x; } };
struct SumOp { __host__ __device__ float operator()(float a, float b) const { return a + b; } };
struct ArgMap { __host__ __device__ ArgAcc operator()(float x, long long i) const { return {x, 0, i}; } };
struct ArgOp { __host__ __device__ ArgAcc operator()(const ArgAcc& a, const ArgAcc& b) const { return b.v < a.v ? b : a; } };
struct MMMap { __host__ __device__ MinMax operator()(float x, long long) const { return {x, x}; } };
struct MMOp { __host__ __device__ MinMax operator()(const MinMax& a, const MinMax& b) const { return {fminf(a.lo, b.lo), fmaxf(a.hi, b.hi)}; } };

template <class T> __device__ __forceinline__ T shfl_down(const T& v, int off) {
  constexpr int W = sizeof(T) / 4; unsigned w[W]; memcpy(w, &v, sizeof(T));
#pragma unroll
  for (int k = 0; k < W; ++k) w[k] = __shfl_down_sync(0xffffffffu, w[k], off);
  T out; memcpy(&out, w, sizeof(T)); return out;
}
template <class Op, class Acc> __device__ __forceinline__ Acc warp_fold(Acc value, int valid) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const Acc other = shfl_down(value, off);
    if ((lane & (2 * off - 1)) == 0 && lane + off < valid) value = Op()(value, other);
  }
  return value;
}
__device__ __forceinline__ int slot(int v) { return v + (v >> 3); }

template <class Map, class Op, class Acc, int Layout>
__global__ void __launch_bounds__(kBlock) reduce_kernel(const float* in, long long n, long long chunk, Acc* partials) {
  __shared__ Acc parts[kWindow * kWarps];
  __shared__ uint4 xbuf[Layout == 2 ? kWarps * kPad : 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const long long begin = blockIdx.x * chunk, end = min(begin + chunk, n);
  Acc acc{}; bool have = false; int count = 0;
  auto load = [&](long long tile, uint4 (&v)[kV]) {
    const uint4* part = reinterpret_cast<const uint4*>(in + tile + warp * kWarpTile);
#pragma unroll
    for (int j = 0; j < kV; ++j) v[j] = Layout == 1 ? part[lane * kV + j] : part[j * 32 + lane];
  };
  uint4 next[kV];
  if (begin + kBlockTile <= end) load(begin, next);
  for (long long tile = begin; tile + kBlockTile <= end; tile += kBlockTile) {
    uint4 cur[kV];
#pragma unroll
    for (int j = 0; j < kV; ++j) cur[j] = next[j];
    if (tile + 2 * kBlockTile <= end) load(tile + kBlockTile, next);
    const long long base = tile + warp * kWarpTile;
    Acc part;
    if (Layout == 0) {
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        const float* f = reinterpret_cast<const float*>(&cur[j]);
        const long long idx = base + (j * 32 + lane) * kItems;
        Acc l = Map()(f[0], idx);
#pragma unroll
        for (int i = 1; i < kItems; ++i) l = Op()(l, Map()(f[i], idx + i));
        const Acc w = warp_fold<Op>(l, 32);
        part = j == 0 ? w : Op()(part, w);
      }
    } else {
      if (Layout == 2) {
        uint4* x = xbuf + warp * kPad;
#pragma unroll
        for (int j = 0; j < kV; ++j) x[slot(j * 32 + lane)] = cur[j];
        __syncwarp();
#pragma unroll
        for (int j = 0; j < kV; ++j) cur[j] = x[slot(lane * kV + j)];
        __syncwarp();
      }
      const long long idx = base + lane * kV * kItems;
      Acc l{};
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        const float* f = reinterpret_cast<const float*>(&cur[j]);
#pragma unroll
        for (int i = 0; i < kItems; ++i) {
          const Acc m = Map()(f[i], idx + j * kItems + i);
          l = (j == 0 && i == 0) ? m : Op()(l, m);
        }
      }
      part = warp_fold<Op>(l, 32);
    }
    if (lane == 0) parts[count * kWarps + warp] = part;
    if (++count == kWindow) {
      __syncthreads();
      if (warp == 0) {
        const int per = kWindow * kWarps / 32;
        Acc v = parts[lane * per];
        for (int k = 1; k < per; ++k) v = Op()(v, parts[lane * per + k]);
        v = warp_fold<Op>(v, 32);
        if (lane == 0) { acc = have ? Op()(acc, v) : v; have = true; }
      }
      __syncthreads();
      count = 0;
    }
  }
  if (count > 0) {
    __syncthreads();
    if (threadIdx.x == 0) for (int k = 0; k < count * kWarps; ++k) { acc = have ? Op()(acc, parts[k]) : parts[k]; have = true; }
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void fill(float* d, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)i * 2654435761u; x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15;
    d[i] = (x & 0xffffff) / 16777216.0f;
  }
}

template <class Map, class Op, class Acc, int Layout>
void measure(const char* name, const float* d, long long n, int sms, int bps, std::vector<float>& host, int check) {
  const int grid = sms * bps;
  long long tiles = n / kBlockTile, per = (tiles + grid - 1) / grid, chunk = per * kBlockTile;
  Acc* partials; CK(cudaMalloc(&partials, grid * sizeof(Acc)));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int w = 0; w < 3; ++w) reduce_kernel<Map, Op, Acc, Layout><<<grid, kBlock>>>(d, n, chunk, partials);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> times;
  for (int r = 0; r < 20; ++r) {
    cudaEventRecord(a); reduce_kernel<Map, Op, Acc, Layout><<<grid, kBlock>>>(d, n, chunk, partials); cudaEventRecord(b);
    cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  std::vector<Acc> ph(grid); CK(cudaMemcpy(ph.data(), partials, grid * sizeof(Acc), cudaMemcpyDeviceToHost));
  const int used = (int)((tiles + per - 1) / per);
  Acc t = ph[0]; for (int k = 1; k < used; ++k) t = Op()(t, ph[k]);
  const char* ok = "?";
  if (check == 0) { double s = 0; for (float v : host) s += v; ok = fabs(((float*)&t)[0] - s) < 1e-3 * s ? "ok" : "BAD"; }
  if (check == 1) { long long bi = 0; for (long long i = 1; i < n; ++i) if (host[i] < host[bi]) bi = i; ok = ((ArgAcc*)&t)->i == bi ? "ok" : "BAD"; }
  if (check == 2) ok = "-";
  printf("%-28s bps=%d  %.1f us  %.0f GB/s  %s\n", name, bps, times[10] * 1e3, n * 4.0 / (times[10] * 1e-3) / 1e9, ok);
  cudaFree(partials);
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  const long long n = 1LL << 28;
  float* d; CK(cudaMalloc(&d, n * 4)); fill<<<1024, 256>>>(d, n); CK(cudaDeviceSynchronize());
  std::vector<float> host(n); CK(cudaMemcpy(host.data(), d, n * 4, cudaMemcpyDeviceToHost));
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  // CUB references
  {
    float* o; CK(cudaMalloc(&o, 64)); long long* oi; CK(cudaMalloc(&oi, 8)); void* tmp = nullptr; size_t bytes = 0, b2 = 0;
    cub::DeviceReduce::Sum(nullptr, bytes, d, o, n); cub::DeviceReduce::ArgMin(nullptr, b2, d, o + 1, oi, n);
    CK(cudaMalloc(&tmp, std::max(bytes, b2)));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    for (int which = 0; which < 2; ++which) {
      std::vector<float> times;
      for (int r = 0; r < 23; ++r) {
        cudaEventRecord(a);
        if (which == 0) cub::DeviceReduce::Sum(tmp, bytes, d, o, n); else cub::DeviceReduce::ArgMin(tmp, b2, d, o + 1, oi, n);
        cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); if (r >= 3) times.push_back(ms);
      }
      std::sort(times.begin(), times.end());
      printf("%-28s        %.1f us  %.0f GB/s\n", which ? "cub ArgMin" : "cub Sum", times[10] * 1e3, n * 4.0 / (times[10] * 1e-3) / 1e9);
    }
    CK(cudaGetLastError());
  }
  for (int bps : {2, 3, 4, 6, 8}) {
    measure<SumMap, SumOp, float, 0>("sum striped", d, n, sms, bps, host, 0);
    measure<SumMap, SumOp, float, 1>("sum direct-runs", d, n, sms, bps, host, 0);
    measure<SumMap, SumOp, float, 2>("sum transposed-runs", d, n, sms, bps, host, 0);
    measure<ArgMap, ArgOp, ArgAcc, 0>("argmin striped", d, n, sms, bps, host, 1);
    measure<ArgMap, ArgOp, ArgAcc, 1>("argmin direct-runs", d, n, sms, bps, host, 1);
    measure<ArgMap, ArgOp, ArgAcc, 2>("argmin transposed-runs", d, n, sms, bps, host, 1);
    measure<MMMap, MMOp, MinMax, 0>("minmax striped", d, n, sms, bps, host, 2);
    measure<MMMap, MMOp, MinMax, 1>("minmax direct-runs", d, n, sms, bps, host, 2);
    measure<MMMap, MMOp, MinMax, 2>("minmax transposed-runs", d, n, sms, bps, host, 2);
  }
  return 0;
}
