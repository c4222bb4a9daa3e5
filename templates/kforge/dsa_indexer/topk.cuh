// Top-k of the indexer logits per query row, and the positions' cache
// slots (config.h, TopkParams; docs/DESIGN.md "The DSA lightning indexer").
//
// One CTA = one query row. Each logit becomes an order-preserving 32-bit
// key (larger float, larger key). Rows of at most k valid positions skip
// the selection. Longer rows find the k-th largest key with a radix select
// of 11-, 11- and 10-bit digits (one 2048-bin shared-memory histogram per
// pass over the row's logits), then one more pass collects every key above the
// threshold and, of the keys equal to it, the ones with the smallest
// positions (a block-wide scan in position order, so the choice is
// deterministic). The survivors are sorted in shared memory by (key
// descending, position ascending) with a bitonic sort of 64-bit words
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

// Bitonic sort of n (a power of two) words in shared memory, descending.
template <class T>
__device__ __forceinline__ void SortDescending(unsigned long long* w, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int j = threadIdx.x; j < n / 2; j += T::kTopkThreads) {
        const int lo = 2 * j - (j & (stride - 1));
        const int hi = lo + stride;
        const bool descending = (lo & size) == 0;
        const unsigned long long x = w[lo], y = w[hi];
        if ((x < y) == descending) {
          w[lo] = y;
          w[hi] = x;
        }
      }
      __syncthreads();
    }
  }
}

// The top-k kernel's shared memory: the sort buffer, the histogram
// and the counters (config.h, TopkSmemBytes).
template <class T>
struct TopkSmem {
  unsigned long long* words;  // [kTopkSort] sort words
  int* hist;                  // [kTopkBins]
  int* counters;              // [kTopkUnroll * warps] per-(load, warp) counts, then 3 scalars
  __device__ int& sel_bin() const { return counters[kTopkUnroll * (T::kTopkThreads / 32)]; }
  __device__ int& sel_rem() const { return counters[kTopkUnroll * (T::kTopkThreads / 32) + 1]; }
  __device__ int& gt_count() const { return counters[kTopkUnroll * (T::kTopkThreads / 32) + 2]; }
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

// The kK largest keys of a row longer than kK into words[0, kK): radix
// select of three digits over the row (one kTopkBins-bin histogram per
// pass), then a collection pass: keys above the k-th anywhere in
// [0, kK - rem), the `rem` keys equal to it with the smallest positions
// after them. Each thread loads kV consecutive logits at once (4: 16-byte
// loads of a 16-byte aligned row; 1 otherwise), kTopkUnroll of those in
// flight. Position order within a round of kU * threads *
// kV positions is (load u, thread, element e).
template <class T, int kV>
__device__ __forceinline__ void SelectLargest(const float* logits, int len, const TopkSmem<T>& sm) {
  constexpr int kK = T::kTopk;
  constexpr int kU = kTopkUnroll;
  constexpr int kThreads = T::kTopkThreads;
  constexpr int kWarpsT = kThreads / 32;
  constexpr int kStep = kU * kThreads * kV;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  u32 prefix = 0, mask = 0;
  int rem = kK;
  // Digits of 11, 11 and 10 bits from the top. The first holds the sign,
  // the exponent and 3 mantissa bits: 8-bit digits (sign and exponent only)
  // put nearly every logit of a row in a few bins, whose shared-memory
  // atomics then serialise.
  constexpr int kPer = kTopkBins / kThreads;  // bins each thread scans
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const u32 digit = pass == 2 ? 1023u : 2047u;
    for (int j = tid; j < kTopkBins; j += kThreads) sm.hist[j] = 0;
    __syncthreads();
    for (int r0 = 0; r0 < len; r0 += kStep) {
      float v[kU][kV];
#pragma unroll
      for (int u = 0; u < kU; ++u)
        LoadLogits<kV>(logits, r0 + (u * kThreads + tid) * kV, len, v[u]);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          const u32 key = OrderedKey(v[u][e]);
          if (r0 + (u * kThreads + tid) * kV + e < len && (key & mask) == prefix) {
            atomicAdd(&sm.hist[(key >> shift) & digit], 1);
          }
        }
      }
    }
    __syncthreads();
    // Thread t scans bins kTopkBins - 1 - (kPer t + j), j < kPer (largest
    // first): a block-wide inclusive scan of the counts finds the bin where
    // the count of larger keys first reaches rem.
    int c[kPer];
    int local = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      c[j] = sm.hist[kTopkBins - 1 - (kPer * tid + j)];
      local += c[j];
    }
    int incl = WarpInclusiveSum(local, lane);
    if (lane == 31) sm.counters[warp] = incl;
    __syncthreads();
    for (int w = 0; w < warp; ++w) incl += sm.counters[w];
    if (incl - local < rem && incl >= rem) {
      int run = incl - local;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (run < rem && run + c[j] >= rem) {
          sm.sel_bin() = kTopkBins - 1 - (kPer * tid + j);
          sm.sel_rem() = rem - run;
        }
        run += c[j];
      }
    }
    __syncthreads();
    prefix |= static_cast<u32>(sm.sel_bin()) << shift;
    mask |= digit << shift;
    rem = sm.sel_rem();
    __syncthreads();  // sel_* and counters are rewritten by the next pass
  }
  // Collect. A key equal to the threshold ranks, among the equal ones, by
  // the counts of the rounds, (u, warp)s, lanes and elements before it.
  if (tid == 0) sm.gt_count() = 0;
  __syncthreads();
  int eq_base = 0;
  for (int r0 = 0; r0 < len; r0 += kStep) {
    u32 key[kU][kV];
    int excl[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      float v[kV];
      LoadLogits<kV>(logits, r0 + (u * kThreads + tid) * kV, len, v);
#pragma unroll
      for (int e = 0; e < kV; ++e) key[u][e] = OrderedKey(v[e]);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      int c = 0;
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const int s = r0 + (u * kThreads + tid) * kV + e;
        if (s < len && key[u][e] > prefix) {
          sm.words[atomicAdd(&sm.gt_count(), 1)] = SortWord(key[u][e], s);
        }
        c += s < len && key[u][e] == prefix;
      }
      const int incl = WarpInclusiveSum(c, lane);
      excl[u] = incl - c;
      if (lane == 31) sm.counters[u * kWarpsT + warp] = incl;
    }
    __syncthreads();
    int total = 0;
    for (int c = 0; c < kU * kWarpsT; ++c) total += sm.counters[c];
    int before = eq_base;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      int rank = before + excl[u];
      for (int w = 0; w < warp; ++w) rank += sm.counters[u * kWarpsT + w];
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const int s = r0 + (u * kThreads + tid) * kV + e;
        if (s < len && key[u][e] == prefix) {
          if (rank < rem) sm.words[kK - rem + rank] = SortWord(key[u][e], s);
          ++rank;
        }
      }
      for (int w = 0; w < kWarpsT; ++w) before += sm.counters[u * kWarpsT + w];
    }
    eq_base += total;
    __syncthreads();  // counters are rewritten by the next round
  }
}

template <class T>
__device__ __forceinline__ void TopkMain(const TopkParams& p) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kK = T::kTopk;
  TopkSmem<T> sm;
  sm.words = reinterpret_cast<unsigned long long*>(smem);
  sm.hist = reinterpret_cast<int*>(smem + T::kTopkSort * 8);
  sm.counters = sm.hist + kTopkBins;
  unsigned long long* words = sm.words;
  const int tid = threadIdx.x;
  const int row = blockIdx.x;

  ptx::WaitForPriorGrids();
  const QueryRow qr = LocateRow(p, row);
  const int b = qr.b;
  const int len = min(qr.len, p.max_context);
  const float* logits = p.logits + static_cast<long long>(row) * p.logits_stride;
  const int n_keep = min(len, kK);
  const int n_sort = TopkSortSize(n_keep);

  if (len <= kK) {
    for (int s = tid; s < n_sort; s += T::kTopkThreads) {
      words[s] = s < len ? SortWord(OrderedKey(logits[s]), s) : 0ull;
    }
  } else {
    if ((reinterpret_cast<unsigned long long>(logits) & 15) == 0) {
      SelectLargest<T, 4>(logits, len, sm);
    } else {
      SelectLargest<T, 1>(logits, len, sm);
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
