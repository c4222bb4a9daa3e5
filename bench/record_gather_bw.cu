// The read bandwidth sparse MLA decode's KV gather can reach on this GPU:
// batch x top-k records at random slots of a cache far larger than L2, in
// each KV format's layout (one record per token, or DeepSeek-V4 / V4.1's
// page of data rows then scale rows), read by kernels that do nothing else.
// One CTA of 128 threads per (query token, split), per-thread 16-byte loads
// unrolled 2 or 8 deep, at the decode kernel's occupancy (2 CTAs an SM, the
// register pipeline's) and at the GPU's (16). The roofline floor in
// BENCH.md divides the bytes by a streaming bandwidth; this says what
// random records of each size can reach, so a kernel's gap splits into
// what the access pattern costs and what the kernel costs.
// Build and run (nvcc, on the GPU machine):
//   nvcc -O3 -arch=sm_90a -o /tmp/rgb bench/record_gather_bw.cu && /tmp/rgb [batch topk]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda_timing.cuh"

namespace {

constexpr int kPageBlock = 64;

// A format's layout: kChunks 16-byte chunks of each token's data, then
// kTailBytes (0, 8 or 16) more: inline after the data, or (kPageBlocked,
// V4 and V4.1) its scale row among the page's scale rows, which follow all
// kPageBlock data rows.
struct Layout {
  const char* name;
  int record_bytes;  // per token, as the roofline floor counts them
  int chunks;
  long long PageStride() const {  // page-blocked: rounded up to whole data rows
    const long long raw = 1LL * kPageBlock * record_bytes, row = 16LL * chunks;
    return (raw + row - 1) / row * row;
  }
};

template <int kChunks, int kTailBytes, bool kPageBlocked, int kInFlight>
__global__ void __launch_bounds__(128)
    Gather(const unsigned char* cache, long long page_stride, const int* idx, int topk, int per_cta,
           unsigned* sink) {
  extern __shared__ unsigned char occupancy_limiter[];
  static_assert(kTailBytes == 0 || kTailBytes == 8 || kTailBytes == 16, "a tail of 8 or 16 bytes");
  constexpr int kC = kChunks + (kTailBytes > 0 ? 1 : 0);
  const int t0 = blockIdx.x * per_cta;
  const int n = min(per_cta, topk - t0) * kC;
  const int* row = idx + static_cast<long long>(blockIdx.y) * topk + t0;
  const unsigned acc = FoldChunks<kInFlight>(n, [&](int i) {
    const int slot = __ldg(row + i / kC), c = i % kC;
    const unsigned char* rec;
    const unsigned char* tail;
    if (kPageBlocked) {
      const unsigned char* page = cache + (slot / kPageBlock) * page_stride;
      rec = page + (slot % kPageBlock) * (16 * kChunks);
      tail = page + kPageBlock * (16 * kChunks) + (slot % kPageBlock) * kTailBytes;
    } else {
      rec = cache + static_cast<long long>(slot) * (16 * kChunks + kTailBytes);
      tail = rec + 16 * kChunks;
    }
    if (c < kChunks) return __ldg(reinterpret_cast<const uint4*>(rec) + c);
    if (kTailBytes == 16) return __ldg(reinterpret_cast<const uint4*>(tail));
    const uint2 t = __ldg(reinterpret_cast<const uint2*>(tail));
    return make_uint4(t.x, t.y, 0u, 0u);
  });
  if (acc == 0x9e3779b9u) sink[0] = acc + occupancy_limiter[0];  // keeps the loads
}

template <int kChunks, int kTailBytes, bool kPageBlocked>
void Run(const Layout& l, int batch, int topk, const int* idx, const unsigned char* cache,
         unsigned* sink) {
  const double bytes = 1.0 * batch * topk * l.record_bytes;
  std::printf("%s: %d B a token, %d x %d: %.1f MB\n", l.name, l.record_bytes, batch, topk,
              bytes / 1e6);
  const int limiter = 100 * 1024;  // 2 CTAs an SM, as the register pipeline
  auto one = [&](auto kernel, const char* depth) {
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limiter));
    for (int splits : {2, 4, 16}) {
      for (int smem : {limiter, 0}) {
        const int per = (topk + splits - 1) / splits;
        const float us = MedianUs([&] {
          kernel<<<dim3(splits, batch), 128, smem>>>(cache, l.PageStride(), idx, topk, per, sink);
        });
        std::printf("  %s in flight, %2d splits, %2d CTAs/SM  %8.1f us  %5.2f TB/s\n", depth,
                    splits, smem ? 2 : 16, us, bytes / us / 1e6);
      }
    }
  };
  one(Gather<kChunks, kTailBytes, kPageBlocked, 2>, "2");
  one(Gather<kChunks, kTailBytes, kPageBlocked, 8>, "8");
}

}  // namespace

int main(int argc, char** argv) {
  const int batch = argc > 2 ? std::atoi(argv[1]) : 128;
  const int topk = argc > 2 ? std::atoi(argv[2]) : 2048;
  const int slots = 1 << 20;  // 64 x 16384 pages: 0.3-1.2 GB, far past L2
  std::vector<int> h(static_cast<size_t>(batch) * topk);
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> pick(0, slots - 1);
  for (int& s : h) s = pick(rng);
  int* idx;
  unsigned char* cache;
  unsigned* sink;
  CHECK(cudaMalloc(&idx, h.size() * sizeof(int)));
  CHECK(cudaMemcpy(idx, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice));
  const size_t cache_bytes = static_cast<size_t>(slots) * 1184;  // bf16 1152 B + slack
  CHECK(cudaMalloc(&cache, cache_bytes));
  CHECK(cudaMemset(cache, 0x11, cache_bytes));
  CHECK(cudaMalloc(&sink, 4));
  Run<41, 0, false>({"fp8_ds_mla", 656, 41}, batch, topk, idx, cache, sink);
  Run<36, 8, true>({"fp8_ds_mla_v4 (page-blocked)", 584, 36}, batch, topk, idx, cache, sink);
  Run<32, 16, true>({"mxfp8_ds_mla_v41 (page-blocked)", 528, 32}, batch, topk, idx, cache, sink);
  Run<22, 0, false>({"nvfp4_ds_mla", 352, 22}, batch, topk, idx, cache, sink);
  Run<72, 0, false>({"bf16", 1152, 72}, batch, topk, idx, cache, sink);
  return 0;
}
