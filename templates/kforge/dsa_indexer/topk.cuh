// Top-k of the indexer logits per query row, and the positions' cache
// slots (config.h, TopkParams; docs/DESIGN.md "The DSA lightning indexer").
//
// One CTA = one query row, or (sm_90+, the cluster entry) a cluster of
// kTopkClusterCtas CTAs = one row, each CTA taking a contiguous part of it:
// their histograms are summed across the cluster in distributed shared
// memory after each pass, and the survivors gather in the rank-0 CTA,
// which sorts them. Each logit becomes an order-preserving 32-bit key
// (larger float, larger key). Rows of at most k valid positions skip the
// selection. Longer rows find the k-th largest key with a radix select of
// 11-, 11- and 10-bit digits (one 2048-bin shared-memory histogram per
// pass), reading the row twice: the first pass counts the top digit; the
// second sends every key above the boundary bin to the survivors and
// copies the bin's keys (the candidates) in position order into shared
// memory, where the later digits are counted. A CTA whose share of the bin
// exceeds kTopkCandidates reads the row again for each later pass instead.
// A pass whose bin is taken whole ends the select. The last step sends the
// candidates above the threshold and, of the keys equal to it, the ones
// with the smallest positions (a block-wide scan in position order, so the
// choice is deterministic). The survivors are sorted in shared memory by
// (key descending, position ascending) with a bitonic sort of 64-bit words
// key << 32 | ~position, so the output order is fully determined: by
// logit, descending, ties by the smaller position; -1 after the valid ones.
#ifndef KFORGE_DSA_INDEXER_TOPK_CUH_
#define KFORGE_DSA_INDEXER_TOPK_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/dsa_indexer/config.h"
#include "kforge/dsa_indexer/logits.cuh"
#include "kforge/dsa_indexer/traits.cuh"

namespace kforge {
namespace dsa_indexer {

// Larger float -> larger key (-inf < finite < +inf); 0 only for the NaN of
// all ones bits, so no real entry of the sort buffer is 0 (its low word,
// ~position, is never 0 either).
__device__ __forceinline__ u32 OrderedKey(float x) {
  const u32 bits = __float_as_uint(x);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ unsigned long long SortWord(u32 key, int pos) {
  return (static_cast<unsigned long long>(key) << 32) | static_cast<u32>(~pos);
}

// One compare-exchange step of the bitonic network on the words a thread
// holds: element i = kE * thread + k, partner i ^ stride (stride < kE, in
// the same thread); block of `size` descending when (i & size) == 0.
template <int kE, int kStride>
__device__ __forceinline__ void SortStepInThread(unsigned long long (&v)[kE], int first, int size) {
#pragma unroll
  for (int k = 0; k < kE; ++k) {
    if ((k & kStride) == 0) {
      const bool descending = ((first + k) & size) == 0;
      const unsigned long long a = v[k], b = v[k + kStride];
      if ((a < b) == descending) {
        v[k] = b;
        v[k + kStride] = a;
      }
    }
  }
}

// The element of a pair a thread keeps: the larger where it holds the lower
// index of a descending block or the upper of an ascending one.
__device__ __forceinline__ unsigned long long KeepOf(unsigned long long mine,
                                                     unsigned long long other, bool lower,
                                                     bool descending) {
  return (lower == descending) ? (mine > other ? mine : other) : (mine < other ? mine : other);
}

// Bitonic sort of n (a power of two, at least kTopkSortPerThread) words in
// shared memory, descending. Each thread holds kE consecutive elements in registers: pairs within a
// thread swap in place, pairs up to 32 kE apart are exchanged by warp
// shuffles, and only the wider ones (log2(n / (32 kE)) (log2(n / (32 kE)) + 1)
// / 2 steps of the network) go through shared memory and block barriers.
template <class T>
__device__ __forceinline__ void SortDescending(unsigned long long* w, int n) {
  constexpr int kE = T::kTopkSortPerThread;
  const int tid = threadIdx.x, lane = tid % 32;
  const int first = kE * tid;
  const bool active = first < n;  // threads past n hold no elements (their steps are idle)
  unsigned long long v[kE];
#pragma unroll
  for (int k = 0; k < kE; ++k) v[k] = active ? w[first + k] : 0ull;
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      if (stride < kE) {
        if (stride == 1) SortStepInThread<kE, 1>(v, first, size);
        if constexpr (kE > 2) {
          if (stride == 2) SortStepInThread<kE, 2>(v, first, size);
        }
        if constexpr (kE > 4) {
          if (stride == 4) SortStepInThread<kE, 4>(v, first, size);
        }
      } else if (stride < 32 * kE) {  // the partner is lane ^ (stride / kE)
        const int m = stride / kE;
        const bool lower = (lane & m) == 0;
#pragma unroll
        for (int k = 0; k < kE; ++k) {
          const unsigned long long other = __shfl_xor_sync(0xffffffffu, v[k], m);
          v[k] = KeepOf(v[k], other, lower, ((first + k) & size) == 0);
        }
      } else {  // the partner is another warp's thread
        const int m = stride / kE;
        __syncthreads();  // every read of the previous exchange is done
        if (active) {
#pragma unroll
          for (int k = 0; k < kE; ++k) w[first + k] = v[k];
        }
        __syncthreads();
        if (active) {
          const bool lower = (tid & m) == 0;
#pragma unroll
          for (int k = 0; k < kE; ++k) {
            v[k] = KeepOf(v[k], w[(tid ^ m) * kE + k], lower, ((first + k) & size) == 0);
          }
        }
      }
    }
  }
  __syncthreads();
  if (active) {
#pragma unroll
    for (int k = 0; k < kE; ++k) w[first + k] = v[k];
  }
  __syncthreads();
}

// The top-k kernel's shared memory (config.h, TopkSmemBytes).
template <class T>
struct TopkSmem {
  unsigned long long* words;  // [kTopkSort] sort words
  unsigned long long* cand;   // [kTopkCandidates] the boundary bin's sort words
  int* hist;                  // [kTopkBins] this CTA's counts
  int* counters;              // [kTopkUnroll * warps] per-(load, warp) counts, then 5 scalars
  int* hist_sum;              // cluster entry: [kTopkBins] the cluster's counts
  __device__ int& sel_bin() const { return counters[kTopkUnroll * (T::kTopkThreads / 32)]; }
  __device__ int& sel_rem() const { return counters[kTopkUnroll * (T::kTopkThreads / 32) + 1]; }
  __device__ int& gt_count() const { return counters[kTopkUnroll * (T::kTopkThreads / 32) + 2]; }
  __device__ int& sel_count() const { return counters[kTopkUnroll * (T::kTopkThreads / 32) + 3]; }
  __device__ int& round_total() const { return counters[kTopkUnroll * (T::kTopkThreads / 32) + 4]; }
};

// Inclusive sum of x over lanes 0..lane of the warp.
__device__ __forceinline__ int WarpInclusiveSum(int x, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, x, off);
    if (lane >= off) x += y;
  }
  return x;
}

// Logits [s, s + kV) of the row as floats (0 past len: never counted).
template <int kV>
__device__ __forceinline__ void LoadLogits(const float* logits, int s, int len, float (&v)[kV]) {
  if constexpr (kV == 4) {
    if (s + 3 < len) {
      const float4 f = *reinterpret_cast<const float4*>(logits + s);
      v[0] = f.x;
      v[1] = f.y;
      v[2] = f.z;
      v[3] = f.w;
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < kV; ++e) v[e] = s + e < len ? logits[s + e] : 0.f;
}

// The part of a row one CTA takes: positions [beg, end), and the CTA's rank
// in the row's cluster (0 with one CTA per row). Parts are contiguous in
// rank order, so position order is (rank, position within the part).
struct RowPart {
  int beg, end;
  u32 rank;
};

// The keys a CTA selects from, in position order: slots [Begin(), End())
// in rounds of kU * kTopkThreads * kV, thread t loading slots r0 + (u *
// threads + t) * kV + [0, kV) for each u < kU (slot order is position
// order). Load gives their keys, positions and whether they count (in the
// source and of its class).
// The row's logits of the part, those with (key & cmask) == cprefix.
template <int kV_>
struct RowSource {
  static constexpr int kU = kTopkUnroll;
  static constexpr int kV = kV_;
  const float* logits;
  int beg, end;
  u32 cmask, cprefix;
  __device__ __forceinline__ int Begin() const { return beg; }
  __device__ __forceinline__ int End() const { return end; }
  __device__ __forceinline__ void Load(int s, u32 (&key)[kV], int (&pos)[kV],
                                       bool (&in)[kV]) const {
    float v[kV];
    LoadLogits<kV>(logits, s, end, v);
#pragma unroll
    for (int e = 0; e < kV; ++e) {
      key[e] = OrderedKey(v[e]);
      pos[e] = s + e;
      in[e] = s + e < end && (key[e] & cmask) == cprefix;
    }
  }
};
// The candidates: n sort words in shared memory, in position order.
struct CandidateSource {
  static constexpr int kU = 1;
  static constexpr int kV = 1;
  const unsigned long long* cand;
  int n;
  __device__ __forceinline__ int Begin() const { return 0; }
  __device__ __forceinline__ int End() const { return n; }
  __device__ __forceinline__ void Load(int s, u32 (&key)[1], int (&pos)[1], bool (&in)[1]) const {
    const unsigned long long w = s < n ? cand[s] : 0ull;
    key[0] = static_cast<u32>(w >> 32);
    pos[0] = static_cast<int>(~static_cast<u32>(w));
    in[0] = s < n;
  }
};

// kC CTAs per row: the cluster's histogram, summed bin by bin into every
// CTA's hist_sum (CTA r sums bins [r, r + 1) * kTopkBins / kC of all kC
// histograms and writes the sums to all of them); the histogram to scan.
template <class T, int kC>
__device__ __forceinline__ const int* MergeHistogram(const TopkSmem<T>& sm, u32 rank) {
  if constexpr (kC == 1) {
    return sm.hist;
  } else {
    constexpr int kSlice = kTopkBins / kC;
    ptx::ClusterSync();  // every CTA's counts are in
    const u32 hist = ptx::SmemAddr(sm.hist), sum = ptx::SmemAddr(sm.hist_sum);
    for (int j = threadIdx.x; j < kSlice; j += T::kTopkThreads) {
      const u32 at = 4u * (rank * kSlice + j);
      u32 total = 0;
#pragma unroll
      for (int q = 0; q < kC; ++q) total += ptx::LdClusterU32(ptx::MapShared(hist + at, q));
#pragma unroll
      for (int q = 0; q < kC; ++q) ptx::StClusterU32(ptx::MapShared(sum + at, q), total);
    }
    ptx::ClusterSync();  // every sum is in; no CTA reads a histogram any more
    return sm.hist_sum;
  }
}

// Where the survivors go: the rank-0 CTA's sort buffer (this CTA's own
// with one CTA per row), the keys above the threshold in arrival order
// through its gt_count, the others at the index given.
template <class T, int kC>
struct Gather {
  const TopkSmem<T>* sm;
  __device__ __forceinline__ void Put(int i, unsigned long long w) const {
    if constexpr (kC == 1) {
      sm->words[i] = w;
    } else {
      ptx::StClusterU64(ptx::MapShared(ptx::SmemAddr(sm->words + i), 0), w);
    }
  }
  __device__ __forceinline__ int NextAbove() const {
    if constexpr (kC == 1) {
      return atomicAdd(&sm->gt_count(), 1);
    } else {
      return static_cast<int>(
          ptx::AtomAddClusterU32(ptx::MapShared(ptx::SmemAddr(&sm->gt_count()), 0), 1));
    }
  }
};

// This CTA's counts of digit (key >> shift) & digit over the keys of src
// with (key & mask) == prefix, into sm.hist (zeroed first).
template <class T, class Src>
__device__ __forceinline__ void CountDigit(const Src& src, u32 mask, u32 prefix, int shift,
                                           u32 digit, const TopkSmem<T>& sm) {
  constexpr int kU = Src::kU, kV = Src::kV, kThreads = T::kTopkThreads;
  for (int j = threadIdx.x; j < kTopkBins; j += kThreads) sm.hist[j] = 0;
  __syncthreads();
  for (int r0 = src.Begin(); r0 < src.End(); r0 += kU * kThreads * kV) {
    u32 key[kU][kV];
    int pos[kU][kV];
    bool in[kU][kV];
#pragma unroll
    for (int u = 0; u < kU; ++u)
      src.Load(r0 + (u * kThreads + threadIdx.x) * kV, key[u], pos[u], in[u]);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        if (in[u][e] && (key[u][e] & mask) == prefix) {
          atomicAdd(&sm.hist[(key[u][e] >> shift) & digit], 1);
        }
      }
    }
  }
  __syncthreads();
}

// counters[0, kN) (in position order) become their exclusive prefix sums
// and *total their sum: warp 0 scans, kN / 32 per lane.
template <int kN>
__device__ __forceinline__ void ExclusiveScanCounters(int* counters, int* total) {
  constexpr int kPer = (kN + 31) / 32;
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  int c[kPer];
  int sum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    c[j] = kPer * lane + j < kN ? counters[kPer * lane + j] : 0;
    sum += c[j];
  }
  int run = WarpInclusiveSum(sum, lane) - sum;
  if (lane == 31) *total = run + sum;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (kPer * lane + j < kN) counters[kPer * lane + j] = run;
    run += c[j];
  }
}

// The digit's boundary: merges the cluster's counts, then finds the bin
// where the count of larger keys first reaches rem. Thread t scans bins
// kTopkBins - 1 - (kPer t + j), j < kPer (largest first), in a block-wide
// inclusive scan. Sets sm.sel_bin (the bin), sm.sel_rem (the keys still
// wanted from it) and sm.sel_count (the keys in it, cluster-wide).
template <class T, int kC>
__device__ __forceinline__ void FindBoundary(int rem, const TopkSmem<T>& sm, u32 rank) {
  constexpr int kPer = kTopkBins / T::kTopkThreads;  // bins each thread scans
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int* hist = MergeHistogram<T, kC>(sm, rank);
  int c[kPer];
  int local = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    c[j] = hist[kTopkBins - 1 - (kPer * tid + j)];
    local += c[j];
  }
  int incl = WarpInclusiveSum(local, lane);
  if (lane == 31) sm.counters[warp] = incl;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < T::kTopkThreads / 32; ++w) incl += w < warp ? sm.counters[w] : 0;
  if (incl - local < rem && incl >= rem) {
    int run = incl - local;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (run < rem && run + c[j] >= rem) {
        sm.sel_bin() = kTopkBins - 1 - (kPer * tid + j);
        sm.sel_rem() = rem - run;
        sm.sel_count() = c[j];
      }
      run += c[j];
    }
  }
  __syncthreads();
}

// One pass over src in position order: every key of the class with (key &
// mask) > prefix goes to the survivors (gather, arrival order); the i-th
// key with (key & mask) == prefix (i from eq_base, in position order) goes
// to eq(i, word). Ranks of equal keys come from the counts of the rounds,
// (u, warp)s, lanes and elements before them.
template <class T, int kC, class Src, class Eq>
__device__ __forceinline__ void Partition(const Src& src, u32 mask, u32 prefix, int eq_base,
                                          const Gather<T, kC>& gather, const TopkSmem<T>& sm,
                                          Eq eq) {
  constexpr int kU = Src::kU, kV = Src::kV, kThreads = T::kTopkThreads;
  constexpr int kWarpsT = kThreads / 32;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int r0 = src.Begin(); r0 < src.End(); r0 += kU * kThreads * kV) {
    u32 key[kU][kV];
    int pos[kU][kV];
    bool in[kU][kV];
    int excl[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) src.Load(r0 + (u * kThreads + tid) * kV, key[u], pos[u], in[u]);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      int c = 0;
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const u32 masked = key[u][e] & mask;
        if (in[u][e] && masked > prefix) {
          gather.Put(gather.NextAbove(), SortWord(key[u][e], pos[u][e]));
        }
        c += in[u][e] && masked == prefix;
      }
      const int incl = WarpInclusiveSum(c, lane);
      excl[u] = incl - c;
      if (lane == 31) sm.counters[u * kWarpsT + warp] = incl;
    }
    __syncthreads();
    ExclusiveScanCounters<kU * kWarpsT>(sm.counters, &sm.round_total());
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      int rank = eq_base + sm.counters[u * kWarpsT + warp] + excl[u];
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        if (in[u][e] && (key[u][e] & mask) == prefix) {
          eq(rank, SortWord(key[u][e], pos[u][e]));
          ++rank;
        }
      }
    }
    eq_base += sm.round_total();
    __syncthreads();  // counters are rewritten by the next round
  }
}

// The radix select's running state: the digits fixed so far (prefix under
// mask), the keys still wanted below them (rem) and the last pass's bin
// (this CTA's sm.hist[bin] counts its keys equal to prefix under mask).
struct Selection {
  u32 prefix, mask;
  int rem, bin;
};

// Counts one digit over src and fixes it; true when its bin is taken whole
// (every key equal to the new prefix survives: the select ends).
template <class T, int kC, class Src>
__device__ __forceinline__ bool NextDigit(const Src& src, int pass, Selection& s,
                                          const TopkSmem<T>& sm, u32 rank) {
  const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
  const u32 digit = pass == 2 ? 1023u : 2047u;
  CountDigit<T>(src, s.mask, s.prefix, shift, digit, sm);
  FindBoundary<T, kC>(s.rem, sm, rank);
  s.bin = sm.sel_bin();
  s.prefix |= static_cast<u32>(s.bin) << shift;
  s.mask |= digit << shift;
  const bool whole = sm.sel_count() == sm.sel_rem();
  s.rem = sm.sel_rem();
  __syncthreads();  // sel_* and counters are rewritten by the next pass
  return whole;
}

// The keys equal to the selection's prefix that lower-ranked CTAs of the
// cluster hold (their last pass's counts of its bin).
template <class T, int kC>
__device__ __forceinline__ int EqualKeysBefore(const Selection& s, const TopkSmem<T>& sm,
                                               u32 rank) {
  int n = 0;
  if constexpr (kC > 1) {
    const u32 bin = ptx::SmemAddr(sm.hist + s.bin);
    for (u32 q = 0; q < rank; ++q) n += ptx::LdClusterU32(ptx::MapShared(bin, q));
  }
  return n;
}

// The later digits over src (the candidates, or the row's keys of the
// boundary bin), then the survivors among them.
template <class T, int kC, class Src>
__device__ __forceinline__ void FinishSelect(const Src& src, Selection s, int first_pass,
                                             const Gather<T, kC>& gather, const TopkSmem<T>& sm,
                                             u32 rank) {
  for (int pass = first_pass; pass < 3; ++pass) {
    if (NextDigit<T, kC>(src, pass, s, sm, rank)) break;
  }
  const int rem = s.rem;
  Partition<T, kC>(src, s.mask, s.prefix, EqualKeysBefore<T, kC>(s, sm, rank), gather, sm,
                   [&](int i, unsigned long long w) {
                     if (i < rem) gather.Put(T::kTopk - rem + i, w);
                   });
}

// The kK largest keys of a row longer than kK into the rank-0 CTA's
// words[0, kK) (module notes). The rank-0 CTA's gt_count is 0 on entry.
template <class T, int kC, int kV>
__device__ __forceinline__ void SelectLargest(const float* logits, const RowPart part,
                                              const TopkSmem<T>& sm) {
  const Gather<T, kC> gather{&sm};
  const RowSource<kV> row{logits, part.beg, part.end, 0u, 0u};
  Selection s{0u, 0u, T::kTopk, 0};
  if (NextDigit<T, kC>(row, 0, s, sm, part.rank)) {
    FinishSelect<T, kC>(row, s, 3, gather, sm, part.rank);  // the top digit decided
    return;
  }
  // Keys above the bin survive; the bin's keys become the candidates.
  const int mine = sm.hist[s.bin];
  Partition<T, kC>(row, s.mask, s.prefix, 0, gather, sm, [&](int i, unsigned long long w) {
    if (i < kTopkCandidates) sm.cand[i] = w;
  });
  if (mine <= kTopkCandidates) {
    FinishSelect<T, kC>(CandidateSource{sm.cand, mine}, s, 1, gather, sm, part.rank);
  } else {
    FinishSelect<T, kC>(RowSource<kV>{logits, part.beg, part.end, s.mask, s.prefix}, s, 1, gather,
                        sm, part.rank);
  }
}

// kC CTAs per row (1, or kTopkClusterCtas in the cluster entry, whose
// grid is rows * kC CTAs in clusters of kC along x).
template <class T, int kC = 1>
__device__ __forceinline__ void TopkMain(const TopkParams& p) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kK = T::kTopk;
  TopkSmem<T> sm;
  sm.words = reinterpret_cast<unsigned long long*>(smem);
  sm.cand = sm.words + T::kTopkSort;
  sm.hist = reinterpret_cast<int*>(sm.cand + kTopkCandidates);
  sm.counters = sm.hist + kTopkBins;
  sm.hist_sum = sm.counters + kTopkCounters;
  unsigned long long* words = sm.words;
  const int tid = threadIdx.x;
  const int row = static_cast<int>(blockIdx.x) / kC;
  const u32 rank = kC == 1 ? 0u : ptx::ClusterCtaRank();

  if (row >= p.rows) return;  // a grid past the rows (a launch not this build's)
  ptx::WaitForPriorGrids();
  const QueryRow qr = LocateRow(p, row);
  const int b = qr.b;
  const int len = min(qr.len, p.max_context);
  const float* logits = p.logits + static_cast<long long>(row) * p.logits_stride;
  const int n_keep = min(len, kK);
  const int n_sort = max(TopkSortSize(n_keep), T::kTopkSortPerThread);

  if (len <= kK) {
    if (rank != 0) return;  // the whole row is the rank-0 CTA's (no cluster traffic)
    for (int s = tid; s < n_sort; s += T::kTopkThreads) {
      words[s] = s < len ? SortWord(OrderedKey(logits[s]), s) : 0ull;
    }
  } else {
    if (tid == 0) sm.gt_count() = 0;  // ordered before any add by the first merge
    // Parts of a multiple of 4 positions keep 16-byte loads aligned.
    const int chunk = ((len + kC - 1) / kC + 3) & ~3;
    const RowPart part{min(len, static_cast<int>(rank) * chunk),
                       min(len, static_cast<int>(rank + 1) * chunk), rank};
    if ((reinterpret_cast<unsigned long long>(logits) & 15) == 0) {
      SelectLargest<T, kC, 4>(logits, part, sm);
    } else {
      SelectLargest<T, kC, 1>(logits, part, sm);
    }
    if constexpr (kC > 1) {
      ptx::ClusterSync();  // every survivor is in rank 0's buffer; no more remote reads
      if (rank != 0) return;
    }
    for (int s = kK + tid; s < n_sort; s += T::kTopkThreads) words[s] = 0ull;
  }
  __syncthreads();
  SortDescending<T>(words, n_sort);

  int* indices = p.indices + static_cast<long long>(row) * p.indices_stride;
  int* slots =
      p.slots != nullptr ? p.slots + static_cast<long long>(row) * p.slots_stride : nullptr;
  const int* table = p.block_table != nullptr && b >= 0
                         ? p.block_table + static_cast<long long>(b) * p.block_table_stride
                         : nullptr;
  for (int j = tid; j < kK; j += T::kTopkThreads) {
    const int pos = j < n_keep ? static_cast<int>(~static_cast<u32>(words[j])) : -1;
    indices[j] = pos;
    if (slots != nullptr) {
      slots[j] = pos < 0 || table == nullptr
                     ? -1
                     : table[pos / p.slot_page_size] * p.slot_page_size + pos % p.slot_page_size;
    }
  }
  ptx::AllowDependentLaunch();
}

}  // namespace dsa_indexer
}  // namespace kforge

#endif  // KFORGE_DSA_INDEXER_TOPK_CUH_
