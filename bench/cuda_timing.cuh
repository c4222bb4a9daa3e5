// What the standalone bandwidth benches (paged_read_bw.cu,
// record_gather_bw.cu; nvcc on the GPU machine) share: CUDA error checks,
// the median time of a launch over 21 timed runs after 5 warm-ups, and
// the read loop of a 128-thread CTA.
#ifndef KFORGE_BENCH_CUDA_TIMING_CUH_
#define KFORGE_BENCH_CUDA_TIMING_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                             \
  do {                                                                                       \
    cudaError_t e = (x);                                                                     \
    if (e != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

template <class F>
float MedianUs(F launch) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) launch();
  std::vector<float> t;
  for (int i = 0; i < 21; ++i) {
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.f);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Thread threadIdx.x of a 128-thread CTA reads 16-byte chunks i =
// threadIdx.x, + 128, ... below n (load(i) returns chunk i), kInFlight
// loads outstanding at a time, folded into one word the caller keeps.
template <int kInFlight, class Load>
__device__ __forceinline__ unsigned FoldChunks(int n, Load load) {
  unsigned acc = 0;
  for (int base = threadIdx.x; base < n; base += 128 * kInFlight) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int i = base + u * 128;
      v[u] = i < n ? load(i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  return acc;
}

#endif  // KFORGE_BENCH_CUDA_TIMING_CUH_
