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
//
// The "deep" table (what bounds a gather at the register pipeline's 8
// warps an SM): at 2 CTAs an SM, the same reads with more bytes in flight
// per thread: 16 or 32 register loads outstanding, 8 with ld's .L2::256B
// prefetch-size hint, or a ring of cp.async copies into the thread's own
// shared memory (16 or 32 chunks, 256 or 512 bytes a thread: 64 or 128 KB
// an SM in flight), read back as they land. At 16 CTAs an SM the plain
// 8-deep loads reached 3.4-3.7 TB/s; whichever of these reaches that at 2
// is how a 16-head kernel has to keep its records in flight.
// Build and run (nvcc, on the GPU machine):
//   nvcc -O3 -arch=sm_90a -o /tmp/rgb bench/record_gather_bw.cu && /tmp/rgb [batch topk [deep]]
// ("deep": only the deep table).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
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

// Where chunk i (c = i % kC of the token in `slot`) lies, and its size
// (16, or the 8-byte tail).
template <int kChunks, int kTailBytes, bool kPageBlocked>
__device__ __forceinline__ const unsigned char* ChunkAddr(const unsigned char* cache,
                                                          long long page_stride, int slot, int i,
                                                          int& bytes) {
  constexpr int kC = kChunks + (kTailBytes > 0 ? 1 : 0);
  const int c = i % kC;
  bytes = c < kChunks ? 16 : kTailBytes;
  if (kPageBlocked) {
    const unsigned char* page = cache + (slot / kPageBlock) * page_stride;
    return c < kChunks ? page + (slot % kPageBlock) * (16 * kChunks) + 16 * c
                       : page + kPageBlock * (16 * kChunks) + (slot % kPageBlock) * kTailBytes;
  }
  return cache + static_cast<long long>(slot) * (16 * kChunks + kTailBytes) + 16 * c;
}

// The deep kernels read the CTA's slots into shared memory first (as a
// decode kernel holds a tile's slots before its gather). Gather reads each
// chunk's slot from global memory right before the chunk (nvdisasm: slot
// load, record load, next slot load, ...), so its batch of loads goes out
// one slot load's latency apart.
constexpr int kMaxTokens = 2048;

__device__ __forceinline__ const int* StageSlots(const int* row, int tokens, int* slots) {
  for (int t = threadIdx.x; t < tokens; t += 128) slots[t] = __ldg(row + t);
  __syncthreads();
  return slots;
}

// A 16- or 8-byte load, with ld's .L2::256B hint when kHint. Plain ld.global,
// not the read-only path's ld.global.nc: ptxas moves .nc loads across a CTA
// barrier (nvdisasm), which would undo FoldChunksInOrder's.
template <bool kHint>
__device__ __forceinline__ uint4 LoadChunk(const unsigned char* p, int bytes) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (bytes == 16) {
    if (kHint) {
      asm("ld.global.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
          : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
          : "l"(p));
    } else {
      asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
          : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
          : "l"(p));
    }
  } else {
    asm("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  }
  return v;
}

// FoldChunks with every load of a batch issued before any fold. FoldChunks
// leaves the order to the compiler, which issues a load, folds it a few
// loads later and only then issues the next (nvdisasm: with 41 chunks a
// token, 32 "in flight" were about 4 loads, their folds, the next 4), and a
// warp's in-order issue stops at the first fold whose load has not landed.
// Here the fold starts from a word of shared memory read after a CTA
// barrier that follows the batch's loads (as a decode kernel's barrier sits
// between a tile's loads and their use), in multiply-add chains, which no
// compiler reassociates: no part of the fold can move above the loads. So
// every thread runs the same number of batches.
template <int kInFlight, class Load>
__device__ __forceinline__ unsigned FoldChunksInOrder(int n, Load load, const unsigned* zero) {
  constexpr unsigned kMul = 0x9E3779B1u;
  unsigned acc = 0;
  for (int base = 0; base < n; base += 128 * kInFlight) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int i = base + u * 128 + threadIdx.x;
      v[u] = i < n ? load(i) : make_uint4(0, 0, 0, 0);
    }
    __syncthreads();
    const unsigned seed = *reinterpret_cast<const volatile unsigned*>(zero);
    unsigned c[4] = {seed, seed + 1, seed + 2, seed + 3};  // four chains: a quarter the latency
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      c[0] = c[0] * kMul + v[u].x;
      c[1] = c[1] * kMul + v[u].y;
      c[2] = c[2] * kMul + v[u].z;
      c[3] = c[3] * kMul + v[u].w;
    }
    acc ^= c[0] ^ c[1] ^ c[2] ^ c[3];
  }
  return acc;
}

// Register loads, kInFlight outstanding a thread (FoldChunks), optionally
// hinted.
template <int kChunks, int kTailBytes, bool kPageBlocked, int kInFlight, bool kHint>
__global__ void __launch_bounds__(128)
    GatherDeep(const unsigned char* cache, long long page_stride, const int* idx, int topk,
               int per_cta, unsigned* sink) {
  extern __shared__ unsigned char occupancy_limiter[];
  constexpr int kC = kChunks + (kTailBytes > 0 ? 1 : 0);
  const int t0 = blockIdx.x * per_cta;
  const int n = min(per_cta, topk - t0) * kC;
  const int* row = idx + static_cast<long long>(blockIdx.y) * topk + t0;
  __shared__ int slot_buf[kMaxTokens];
  __shared__ unsigned zero;
  if (threadIdx.x == 0) zero = 0;
  const int* slots = StageSlots(row, min(per_cta, topk - t0), slot_buf);
  const unsigned acc = FoldChunksInOrder<kInFlight>(
      n,
      [&](int i) {
        int bytes;
        const unsigned char* p = ChunkAddr<kChunks, kTailBytes, kPageBlocked>(
            cache, page_stride, slots[i / kC], i, bytes);
        return LoadChunk<kHint>(p, bytes);
      },
      &zero);
  if (acc == 0x9e3779b9u) sink[0] = acc + occupancy_limiter[0];
}

// cp.async copies into this thread's own ring of kGroups groups of 4
// 16-byte slots (dynamic shared memory: 128 threads x kGroups x 64 bytes,
// then the occupancy limiter's share), one commit group each; the oldest
// group is read back (and refilled) once it has landed. No barrier: each
// thread reads only the slots it filled.
template <int kChunks, int kTailBytes, bool kPageBlocked, int kGroups>
__global__ void __launch_bounds__(128)
    GatherAsync(const unsigned char* cache, long long page_stride, const int* idx, int topk,
                int per_cta, unsigned* sink) {
  extern __shared__ __align__(16) unsigned char ring[];
  constexpr int kC = kChunks + (kTailBytes > 0 ? 1 : 0);
  const int t0 = blockIdx.x * per_cta;
  const int n = min(per_cta, topk - t0) * kC;
  const int* row = idx + static_cast<long long>(blockIdx.y) * topk + t0;
  __shared__ int slot_buf[kMaxTokens];
  const int* slots = StageSlots(row, min(per_cta, topk - t0), slot_buf);
  const int mine = n > static_cast<int>(threadIdx.x) ? (n - threadIdx.x + 127) / 128 : 0;
  const unsigned base =
      static_cast<unsigned>(__cvta_generic_to_shared(ring)) + threadIdx.x * kGroups * 64;
  auto issue = [&](int g) {  // this thread's chunks 4 g .. 4 g + 3
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int k = 4 * g + u;
      if (k < mine) {
        const int i = threadIdx.x + 128 * k;
        int bytes;
        const unsigned char* p = ChunkAddr<kChunks, kTailBytes, kPageBlocked>(
            cache, page_stride, slots[i / kC], i, bytes);
        const unsigned dst = base + ((g % kGroups) * 4 + u) * 16;
        if (bytes == 16) {
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(p));
        } else {
          asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(p));
        }
      }
    }
    asm volatile("cp.async.commit_group;");
  };
#pragma unroll
  for (int g = 0; g < kGroups; ++g) issue(g);
  unsigned acc = 0;
  for (int g = 0; 4 * g < mine; ++g) {
    asm volatile("cp.async.wait_group %0;" ::"n"(kGroups - 1));
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      uint4 v;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(base + ((g % kGroups) * 4 + u) * 16));
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    issue(g + kGroups);
  }
  asm volatile("cp.async.wait_group 0;");
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

template <int kChunks, int kTailBytes, bool kPageBlocked>
void Run(const Layout& l, int batch, int topk, const int* idx, const unsigned char* cache,
         unsigned* sink, bool deep_only) {
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
  if (!deep_only) {
    one(Gather<kChunks, kTailBytes, kPageBlocked, 2>, "2");
    one(Gather<kChunks, kTailBytes, kPageBlocked, 8>, "8");
  }
  // The deep table: 2 CTAs an SM throughout (100 KB of dynamic shared
  // memory a CTA, which holds the ring, and 8 KB of slots).
  auto deep = [&](auto kernel, const char* what, int ring_bytes) {
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limiter));
    for (int splits : {2, 4, 16}) {
      const int per = (topk + splits - 1) / splits;
      const float us = MedianUs([&] {
        kernel<<<dim3(splits, batch), 128, limiter>>>(cache, l.PageStride(), idx, topk, per, sink);
      });
      std::printf("  deep: %-22s %2d splits, 2 CTAs/SM  %8.1f us  %5.2f TB/s  (%d KB an SM)\n",
                  what, splits, us, bytes / us / 1e6, ring_bytes);
    }
  };
  if ((topk + 1) / 2 > kMaxTokens) {
    std::printf("  deep: skipped (more than %d tokens a CTA at 2 splits)\n", kMaxTokens);
    return;
  }
  deep(GatherDeep<kChunks, kTailBytes, kPageBlocked, 8, false>, "ld x 8", 32);
  deep(GatherDeep<kChunks, kTailBytes, kPageBlocked, 16, false>, "ld x 16", 64);
  deep(GatherDeep<kChunks, kTailBytes, kPageBlocked, 32, false>, "ld x 32", 128);
  deep(GatherDeep<kChunks, kTailBytes, kPageBlocked, 8, true>, "ld.L2::256B x 8", 32);
  deep(GatherDeep<kChunks, kTailBytes, kPageBlocked, 16, true>, "ld.L2::256B x 16", 64);
  deep(GatherAsync<kChunks, kTailBytes, kPageBlocked, 4>, "cp.async ring 16", 64);
  deep(GatherAsync<kChunks, kTailBytes, kPageBlocked, 8>, "cp.async ring 32", 128);
}

}  // namespace

int main(int argc, char** argv) {
  const int batch = argc > 2 ? std::atoi(argv[1]) : 128;
  const int topk = argc > 2 ? std::atoi(argv[2]) : 2048;
  const bool deep_only = argc > 3 && std::string(argv[3]) == "deep";
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
  Run<41, 0, false>({"fp8_ds_mla", 656, 41}, batch, topk, idx, cache, sink, deep_only);
  Run<36, 8, true>({"fp8_ds_mla_v4 (page-blocked)", 584, 36}, batch, topk, idx, cache, sink,
                   deep_only);
  Run<32, 16, true>({"mxfp8_ds_mla_v41 (page-blocked)", 528, 32}, batch, topk, idx, cache, sink,
                    deep_only);
  Run<22, 0, false>({"nvfp4_ds_mla", 352, 22}, batch, topk, idx, cache, sink, deep_only);
  Run<72, 0, false>({"bf16", 1152, 72}, batch, topk, idx, cache, sink, deep_only);
  return 0;
}
