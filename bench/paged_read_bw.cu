// The read bandwidth the DSA indexer's logits can reach on this GPU: the
// same bytes in the same pattern (batch x context keys of the index-key
// cache, 8448-byte pages in a shuffled block table, one CTA per chunk of a
// row's pages, as the logits grid) read by kernels that do nothing else:
// per-thread 16-byte loads (1/2, 2 or 4 pages in flight a CTA) at the
// logits kernel's occupancy (4 CTAs of 128 threads an SM) and at the GPU's
// (16), whole-page bulk copies (TMA) into a ring of 2-5 stages, and the
// whole cache read linearly. The logits kernel's time against these, not
// against the data sheet's bandwidth, is what its own work costs.
// Build and run (nvcc, on the GPU machine):
//   nvcc -O3 -arch=sm_90a -Itemplates -o /tmp/prb bench/paged_read_bw.cu && /tmp/prb [batch ctx]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_timing.cuh"
#include "kforge/common/ptx.cuh"
#include "kforge/dsa_indexer/config.h"

namespace {

constexpr int kPageBytes = kforge::dsa_indexer::IndexKeyPage::kBytes;
constexpr int kChunks16 = kPageBytes / 16;  // 528 16-byte chunks a page

// One CTA = pages [chunk * pages_per_cta, ...) of row blockIdx.y; each thread
// keeps kInFlight 16-byte loads outstanding, folding them into one word.
template <int kInFlight>
__global__ void __launch_bounds__(128)
    PagedRead(const uint4* cache, const int* table, int pages_per_row, int pages_per_cta,
              unsigned* sink) {
  extern __shared__ unsigned char occupancy_limiter[];
  const int row = blockIdx.y;
  const int p0 = blockIdx.x * pages_per_cta;
  const int n = min(pages_per_cta, pages_per_row - p0) * kChunks16;
  const unsigned acc = FoldChunks<kInFlight>(n, [&](int i) {
    const int page = table[row * pages_per_row + p0 + i / kChunks16];
    return __ldg(cache + static_cast<long long>(page) * kChunks16 + i % kChunks16);
  });
  if (acc == 0x9e3779b9u) sink[0] = acc + occupancy_limiter[0];  // keeps the loads
}

// The same chunks, each page copied whole by one bulk copy (TMA,
// cp.async.bulk into a kStages-page ring of shared memory, completion on an
// mbarrier per stage: kforge's own ptx.cuh wrappers, as the logits kernel),
// every thread then reading its 64 bytes of the page (sm_90+).
template <int kStages>
__global__ void __launch_bounds__(128)
    PagedBulk(const unsigned char* cache, const int* table, int pages_per_row, int pages_per_cta,
              unsigned* sink) {
  extern __shared__ __align__(128) unsigned char ring[];
  const unsigned full = kforge::ptx::SmemAddr(ring + kStages * kPageBytes);  // kStages mbarriers
  const int row = blockIdx.y;
  const int p0 = blockIdx.x * pages_per_cta;
  const int n = min(pages_per_cta, pages_per_row - p0);
  const auto issue = [&](int i) {
    const int s = i % kStages;
    const unsigned bar = full + 8 * s;
    kforge::ptx::MbarArriveExpectTx(bar, kPageBytes);
    kforge::ptx::BulkCopyToShared(
        kforge::ptx::SmemAddr(ring + s * kPageBytes),
        cache + static_cast<long long>(table[row * pages_per_row + p0 + i]) * kPageBytes,
        kPageBytes, bar);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) kforge::ptx::MbarInit(full + 8 * s, 1);
    kforge::ptx::FenceMbarInit();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 0; i < min(kStages, n); ++i) issue(i);
  }
  unsigned acc = 0;
  for (int i = 0; i < n; ++i) {
    const int s = i % kStages;
    kforge::ptx::MbarWait(full + 8 * s, (i / kStages) & 1);
    const uint4* page = reinterpret_cast<const uint4*>(ring + s * kPageBytes);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint4 v = page[j * 128 + threadIdx.x];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    __syncthreads();  // stage s read by every thread
    if (threadIdx.x == 0 && i + kStages < n) issue(i + kStages);
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

__global__ void LinearRead(const uint4* p, long long n, unsigned* sink) {
  unsigned acc = 0;
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

}  // namespace

int main(int argc, char** argv) {
  const int batch = argc > 2 ? std::atoi(argv[1]) : 128;
  const int ctx = argc > 2 ? std::atoi(argv[2]) : 32768;
  const int pages_per_row = (ctx + 63) / 64;
  const long long pages = 1LL * batch * pages_per_row;
  const double bytes = static_cast<double>(pages) * kPageBytes;
  uint4* cache;
  int* table;
  unsigned* sink;
  CHECK(cudaMalloc(&cache, pages * kPageBytes));
  CHECK(cudaMemset(cache, 0x11, pages * kPageBytes));
  CHECK(cudaMalloc(&table, pages * sizeof(int)));
  CHECK(cudaMalloc(&sink, 4));
  std::vector<int> perm(pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(1));
  CHECK(cudaMemcpy(table, perm.data(), pages * sizeof(int), cudaMemcpyHostToDevice));
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("%d x %d: %.1f MB of pages\n", batch, ctx, bytes / 1e6);
  const auto report = [&](const char* what, float us) {
    std::printf("  %-44s %8.1f us  %5.2f TB/s\n", what, us, bytes / us / 1e6);
  };
  const int limiter = 50 * 1024;  // 4 CTAs an SM, as the logits' ~50 KB or registers
  CHECK(cudaFuncSetAttribute(PagedRead<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, limiter));
  CHECK(cudaFuncSetAttribute(PagedRead<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, limiter));
  CHECK(cudaFuncSetAttribute(PagedRead<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, limiter));
  for (int ppc : {32, 16, 8}) {
    const dim3 grid((pages_per_row + ppc - 1) / ppc, batch);
    char name[96];
    std::snprintf(name, sizeof name, "paged, %d pages a CTA, 4 CTAs/SM, 2 pages/CTA", ppc);
    report(name, MedianUs([&] {
             PagedRead<8><<<grid, 128, limiter>>>(cache, table, pages_per_row, ppc, sink);
           }));
    std::snprintf(name, sizeof name, "paged, %d pages a CTA, 16 CTAs/SM, 2 pages/CTA", ppc);
    report(name, MedianUs([&] {
             PagedRead<8><<<grid, 128, 0>>>(cache, table, pages_per_row, ppc, sink);
           }));
    std::snprintf(name, sizeof name, "paged, %d pages a CTA, 4 CTAs/SM, 4 pages/CTA", ppc);
    report(name, MedianUs([&] {
             PagedRead<16><<<grid, 128, limiter>>>(cache, table, pages_per_row, ppc, sink);
           }));
    std::snprintf(name, sizeof name, "paged, %d pages a CTA, 4 CTAs/SM, 1/2 page/CTA", ppc);
    report(name, MedianUs([&] {
             PagedRead<2><<<grid, 128, limiter>>>(cache, table, pages_per_row, ppc, sink);
           }));
  }
  const auto bulk = [&](auto kernel, int stages, int ppc, int smem) {
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid((pages_per_row + ppc - 1) / ppc, batch);
    char name[96];
    std::snprintf(name, sizeof name, "bulk copies, %d pages a CTA, %d CTAs/SM, %d stages", ppc,
                  smem > 40 * 1024 ? 4 : 8, stages);
    report(name, MedianUs([&] {
             kernel<<<grid, 128, smem>>>(reinterpret_cast<const unsigned char*>(cache), table,
                                         pages_per_row, ppc, sink);
           }));
  };
  for (int ppc : {32, 8}) {
    bulk(PagedBulk<2>, 2, ppc, limiter);
    bulk(PagedBulk<4>, 4, ppc, limiter);
    bulk(PagedBulk<5>, 5, ppc, limiter);
    bulk(PagedBulk<3>, 3, ppc, 3 * kPageBytes + 64);
  }
  report("linear, whole cache",
         MedianUs([&] { LinearRead<<<sms * 8, 256>>>(cache, pages * kChunks16, sink); }));
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  return 0;
}
