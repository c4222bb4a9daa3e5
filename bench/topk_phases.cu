// Where the DSA indexer's top-k spends its time, phase by phase: the
// template's KFORGE_TOPK_PHASE marks (templates/kforge/dsa_indexer/topk.cuh,
// empty in a module) record thread 0's %globaltimer in every CTA, here, for
// the 64-head / top-k 2048 traits on random-normal logits. Prints, per
// phase, the median over the runs of CTA 0's microseconds from its start
// (and the slowest CTA's), then the kernel's own time (CUDA events around
// one launch). Every row's output is compared with the host's top-k of
// the same logits (a variant under test must be exact); the GPU check of
// the modules is tests/gpu/check_dsa_indexer.py. bench/topk_phases_ab.py
// builds it against several template trees and tabulates the phases.
//
// Build and run on the GPU machine:
//   nvcc -std=c++17 -O3 -arch=sm_90a -I templates -o /tmp/topk_phases \
//       bench/topk_phases.cu && /tmp/topk_phases ROWS LEN [cluster|one] [RUNS]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

constexpr int kMaxCtas = 4096;
constexpr int kMarks = 32;
__device__ unsigned long long g_marks[kMaxCtas * kMarks];

__device__ __forceinline__ void MarkPhase(int id) {
  if (threadIdx.x == 0 && blockIdx.x < kMaxCtas) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    g_marks[blockIdx.x * kMarks + id] = t;
  }
}
#define KFORGE_TOPK_PHASE(id) MarkPhase(id)

#include "kforge/dsa_indexer/topk.cuh"

namespace kdi = kforge::dsa_indexer;
using Traits = kdi::IndexerTraits<64, 2048, true>;

__global__ void __cluster_dims__(kdi::kTopkClusterCtas, 1, 1)
    __launch_bounds__(Traits::kTopkThreads, 1) TopkCluster(const kdi::TopkParams p) {
  kdi::TopkMain<Traits, kdi::kTopkClusterCtas>(p);
}
__global__ void __launch_bounds__(Traits::kTopkThreads, 1) TopkOne(const kdi::TopkParams p) {
  kdi::TopkMain<Traits>(p);
}

#define CHECK(x)                                                                     \
  do {                                                                               \
    cudaError_t e = (x);                                                             \
    if (e != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

struct Phase {
  int id;
  const char* name;
};
constexpr Phase kPhases[] = {
    {1, "prior-grid wait done"},
    {2, "row located"},
    {10, "digit 0 counted (the row read)"},
    {11, "digit 0 boundary (cluster merge, scan)"},
    {20, "row's position-ordered pass (keys above kept, candidates sent)"},
    {21, "cluster barrier: every CTA has every candidate"},
    {12, "digit 1 counted (candidates)"},
    {13, "digit 1 boundary"},
    {14, "digit 2 counted"},
    {15, "digit 2 boundary"},
    {22, "candidates' survivors listed (position-ordered pass)"},
    {23, "indices written"},
    {30, "end"},
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ROWS LEN [cluster|one] [RUNS]\n", argv[0]);
    return 2;
  }
  const int rows = std::atoi(argv[1]), len = std::atoi(argv[2]);
  const bool cluster = argc < 4 || std::string(argv[3]) != "one";
  const int runs = argc > 4 ? std::atoi(argv[4]) : 20;
  const int ctas = cluster ? rows * kdi::kTopkClusterCtas : rows;
  constexpr int kK = Traits::kTopk;
  if (rows < 1 || len < 1 || ctas > kMaxCtas) {
    std::fprintf(stderr, "rows 1.. and at most %d CTAs, len >= 1\n", kMaxCtas);
    return 2;
  }
  std::vector<float> h_logits(static_cast<size_t>(rows) * len);
  std::mt19937 gen(47);
  std::normal_distribution<float> normal;
  for (float& x : h_logits) x = normal(gen);
  float* logits;
  int *ctx, *idx;
  CHECK(cudaMalloc(&logits, h_logits.size() * sizeof(float)));
  CHECK(cudaMalloc(&ctx, rows * sizeof(int)));
  CHECK(cudaMalloc(&idx, static_cast<size_t>(rows) * kK * sizeof(int)));
  CHECK(
      cudaMemcpy(logits, h_logits.data(), h_logits.size() * sizeof(float), cudaMemcpyHostToDevice));
  std::vector<int> h_ctx(rows, len);
  CHECK(cudaMemcpy(ctx, h_ctx.data(), rows * sizeof(int), cudaMemcpyHostToDevice));

  kdi::TopkParams p{};
  p.logits = logits;
  p.context_lens = ctx;
  p.indices = idx;
  p.logits_stride = len;
  p.indices_stride = kK;
  p.batch = rows;
  p.s_q = 1;
  p.rows = rows;
  p.slot_page_size = 64;
  p.max_context = len;
  const int smem = cluster ? kdi::TopkClusterSmemBytes(kK) : kdi::TopkSmemBytes(kK);
  void (*kernel)(const kdi::TopkParams) = cluster ? TopkCluster : TopkOne;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // A cluster past the portable 8 CTAs (a template tree under test) needs
  // the opt-in, as the loaders give the 16-CTA decode entries.
  if (cluster && kdi::kTopkClusterCtas > 8) {
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }

  std::vector<unsigned long long> marks(static_cast<size_t>(ctas) * kMarks);
  std::vector<unsigned long long> zeros(marks.size(), 0);
  std::vector<std::vector<double>> cta0(kMarks), slowest(kMarks);
  std::vector<double> kernel_us;
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int r = -3; r < runs; ++r) {  // three warm-up runs
    CHECK(cudaMemcpyToSymbol(g_marks, zeros.data(), zeros.size() * sizeof(unsigned long long)));
    CHECK(cudaEventRecord(start));
    kernel<<<ctas, Traits::kTopkThreads, smem>>>(p);
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaGetLastError());
    if (r < 0) continue;
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    kernel_us.push_back(ms * 1e3);
    CHECK(cudaMemcpyFromSymbol(marks.data(), g_marks, marks.size() * sizeof(unsigned long long)));
    for (const Phase& ph : kPhases) {
      double worst = 0;
      for (int c = 0; c < ctas; ++c) {
        const unsigned long long t0 = marks[c * kMarks], t = marks[c * kMarks + ph.id];
        if (t0 == 0 || t == 0) continue;
        const double us = (t - t0) * 1e-3;
        if (c == 0) cta0[ph.id].push_back(us);
        worst = std::max(worst, us);
      }
      if (worst > 0) slowest[ph.id].push_back(worst);
    }
  }

  // Every row's output against the host's top-k of the same logits: the k
  // largest (ties: the smallest positions), in increasing position order.
  std::vector<int> got(static_cast<size_t>(rows) * kK);
  CHECK(cudaMemcpy(got.data(), idx, got.size() * sizeof(int), cudaMemcpyDeviceToHost));
  int wrong_rows = 0;
  std::vector<int> order(len), want(kK);
  for (int r = 0; r < rows; ++r) {
    const float* row = h_logits.data() + static_cast<size_t>(r) * len;
    for (int j = 0; j < len; ++j) order[j] = j;
    const int n = std::min(len, kK);
    const auto key = [&](int j) {  // the kernel's order-preserving key
      unsigned bits;
      std::memcpy(&bits, &row[j], 4);
      return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    };
    std::partial_sort(order.begin(), order.begin() + n, order.end(),
                      [&](int a, int b) { return key(a) > key(b) || (key(a) == key(b) && a < b); });
    std::sort(order.begin(), order.begin() + n);
    for (int j = 0; j < kK; ++j) want[j] = j < n ? order[j] : -1;
    if (!std::equal(want.begin(), want.end(), got.begin() + static_cast<size_t>(r) * kK)) {
      ++wrong_rows;
    }
  }
  const bool ok = wrong_rows == 0;

  std::printf("top-k phases, %d x %d, %s (%d CTAs), %d runs: us from the CTA's start (median)\n",
              rows, len, cluster ? "cluster" : "one CTA a row", ctas, runs);
  std::printf("| phase | CTA 0 | slowest CTA |\n|---|---:|---:|\n");
  for (const Phase& ph : kPhases) {
    if (cta0[ph.id].empty() && slowest[ph.id].empty()) continue;
    std::printf("| %d %s | %.2f | %.2f |\n", ph.id, ph.name, Median(cta0[ph.id]),
                Median(slowest[ph.id]));
  }
  std::printf("kernel (events around one launch): %.2f us; output %s (%d of %d rows wrong)\n",
              Median(kernel_us), ok ? "ok" : "WRONG", wrong_rows, rows);
  return ok ? 0 : 1;
}
