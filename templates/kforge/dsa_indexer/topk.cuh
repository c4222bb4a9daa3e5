// Top-k of the indexer logits per query row, and the positions' cache
// slots (config.h, TopkParams; docs/DESIGN.md "The DSA lightning indexer").
//
// One CTA = one query row. Each logit becomes an order-preserving 32-bit
// key (larger float, larger key). Rows of at most k valid positions skip
// the selection. Longer rows find the k-th largest key with a radix select
// of four 8-bit digits (one 256-bin shared-memory histogram per pass over
// the row's logits), then one more pass collects every key above the
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

template <class T>
__device__ __forceinline__ void TopkMain(const TopkParams& p) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kK = T::kTopk;
  constexpr int kWarpsT = T::kTopkThreads / 32;
  unsigned long long* words = reinterpret_cast<unsigned long long*>(smem);
  int* hist = reinterpret_cast<int*>(smem + T::kTopkSort * 8);
  constexpr int kU = kTopkUnroll;
  int* counters = hist + 256;  // [0, kU * kWarpsT): per-(load, warp) counts; then scalars
  int& sel_bin = counters[kU * kWarpsT];
  int& sel_rem = counters[kU * kWarpsT + 1];
  int& gt_count = counters[kU * kWarpsT + 2];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row = blockIdx.x;
  const int b = row / p.s_q, i = row % p.s_q;

  ptx::WaitForPriorGrids();
  const int len = min(CausalLength(p.context_lens[b], p.s_q, i), p.max_context);
  const float* logits = p.logits + static_cast<long long>(row) * p.logits_stride;
  const int n_keep = min(len, kK);
  const int n_sort = TopkSortSize(n_keep);

  if (len <= kK) {
    for (int s = tid; s < n_sort; s += T::kTopkThreads) {
      words[s] = s < len ? SortWord(OrderedKey(logits[s]), s) : 0ull;
    }
  } else {
    // Radix select: after the passes, the k-th largest key is `prefix`,
    // and `rem` of the keys equal to it belong to the top k.
    u32 prefix = 0, mask = 0;
    int rem = kK;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int j = tid; j < 256; j += T::kTopkThreads) hist[j] = 0;
      __syncthreads();
      for (int base = tid; base < len; base += kU * T::kTopkThreads) {
        float v[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int s = base + u * T::kTopkThreads;
          v[u] = s < len ? logits[s] : 0.f;
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const u32 key = OrderedKey(v[u]);
          if (base + u * T::kTopkThreads < len && (key & mask) == prefix) {
            atomicAdd(&hist[(key >> shift) & 255], 1);
          }
        }
      }
      __syncthreads();
      // Thread j < 256 takes bin 255 - j: an inclusive scan over j counts
      // the keys in bins >= 255 - j; the selected bin is where it first
      // reaches rem.
      int c = 0, incl = 0;
      if (tid < 256) {
        c = hist[255 - tid];
        incl = c;
#pragma unroll
        for (int off = 1; off < 32; off *= 2) {
          const int v = __shfl_up_sync(0xffffffffu, incl, off);
          if (lane >= off) incl += v;
        }
        if (lane == 31) counters[warp] = incl;
      }
      __syncthreads();
      if (tid < 256) {
        for (int w = 0; w < warp; ++w) incl += counters[w];
        const int excl = incl - c;
        if (excl < rem && incl >= rem) {
          sel_bin = 255 - tid;
          sel_rem = rem - excl;
        }
      }
      __syncthreads();
      prefix |= static_cast<u32>(sel_bin) << shift;
      mask |= 255u << shift;
      rem = sel_rem;
      __syncthreads();  // sel_* and counters are rewritten by the next pass
    }
    // Collect: keys above the threshold anywhere in [0, kK - rem), keys
    // equal to it in position order after them.
    if (tid == 0) gt_count = 0;
    __syncthreads();
    // kU loads per thread per round: position base + u * threads + tid, so
    // position order is (u, warp, lane) and a key's rank among the equal
    // ones is the counts of the (u, warp) before it.
    int eq_base = 0;
    for (int base = 0; base < len; base += kU * T::kTopkThreads) {
      u32 key[kU];
      u32 ballot[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int s = base + u * T::kTopkThreads + tid;
        key[u] = s < len ? OrderedKey(logits[s]) : 0u;
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int s = base + u * T::kTopkThreads + tid;
        const bool in = s < len;
        if (in && key[u] > prefix) words[atomicAdd(&gt_count, 1)] = SortWord(key[u], s);
        ballot[u] = __ballot_sync(0xffffffffu, in && key[u] == prefix);
        if (lane == 0) counters[u * kWarpsT + warp] = __popc(ballot[u]);
      }
      __syncthreads();
      int total = 0;
      for (int c = 0; c < kU * kWarpsT; ++c) total += counters[c];
      int before = eq_base;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int s = base + u * T::kTopkThreads + tid;
        if (s < len && key[u] == prefix) {
          int rank = before + __popc(ballot[u] & ((1u << lane) - 1u));
          for (int w = 0; w < warp; ++w) rank += counters[u * kWarpsT + w];
          if (rank < rem) words[kK - rem + rank] = SortWord(key[u], s);
        }
        for (int w = 0; w < kWarpsT; ++w) before += counters[u * kWarpsT + w];
      }
      eq_base += total;
      __syncthreads();  // counters are rewritten by the next round
    }
    for (int s = kK + tid; s < n_sort; s += T::kTopkThreads) words[s] = 0ull;
  }
  __syncthreads();
  SortDescending<T>(words, n_sort);

  int* indices = p.indices + static_cast<long long>(row) * p.indices_stride;
  int* slots =
      p.slots != nullptr ? p.slots + static_cast<long long>(row) * p.slots_stride : nullptr;
  const int* table = p.block_table != nullptr
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
