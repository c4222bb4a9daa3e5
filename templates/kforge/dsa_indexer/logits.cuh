// Paged fp8 MQA logits of the DSA lightning indexer, decode and prefill
// (config.h, LogitsParams; docs/DESIGN.md "The DSA lightning indexer").
// Two paths: LogitsWgmma (sm_90a, below) and LogitsMma (every other arch).
//
// LogitsMma: one CTA = one query row x kPagesPerCta key pages. Warp w holds head rows
// [16 w, 16 w + 16) of the row's Q as m16n8k16 A fragments (f16, converted
// once from e4m3) for the whole CTA; each page is copied whole into shared
// memory (cp.async, double-buffered), every warp computes its 16 heads x
// 64 keys with mma.sync (keys converted e4m3 -> f16 per fragment), applies
// relu and its heads' weights and sums its rows; the warps' sums meet in
// shared memory, where the per-key scale and the causal mask finish them.
// e4m3 is exact in f16, products accumulate in fp32: mma.sync m16n8k16 f16
// exists on every arch sm_80..sm_121a.
//
// The K dimension (128 values) is read in a permuted order, the same for Q
// and K, so each thread takes 16 contiguous bytes per load: k-step 4 g + m
// (g in 0..1, m in 0..3) of thread t (lane % 4) covers bytes
// 64 g + 16 t + 4 m .. + 3, whose first two go to the fragment's k pair
// (2t, 2t+1) and the last two to (2t+8, 2t+9). A dot product is a sum, so
// any permutation applied to both operands gives the same result.
#ifndef KFORGE_DSA_INDEXER_LOGITS_CUH_
#define KFORGE_DSA_INDEXER_LOGITS_CUH_

#include "kforge/common/fp8.cuh"
#include "kforge/common/ptx.cuh"
#include "kforge/dsa_indexer/config.h"
#include "kforge/dsa_indexer/traits.cuh"

namespace kforge {
namespace dsa_indexer {

using ptx::u32;

// The 16-byte chunk c (0..7) of key row `key` in a staged page: odd rows
// swap their halves, so the 8 lanes of one 128-bit load phase (keys g and
// g + 1, threads t 0..3, one chunk group) hit all 32 banks once, and the 8
// lanes of a copy phase still write one whole row.
__device__ __forceinline__ int SwizzledChunk(int key, int c) { return c ^ ((key & 1) << 2); }

// The causal length of query row r: positions [0, len) are valid.
__device__ __forceinline__ int CausalLength(int context_len, int s_q, int i) {
  const int len = context_len - s_q + i + 1;
  return len < 0 ? 0 : (len > context_len ? context_len : len);
}

// A query row's request and causal length (positions [0, len) valid).
struct QueryRow {
  int b;    // request; -1 when no request holds the row
  int len;  // 0 for such a row
};

// Decode (p.query_start null): row = b * s_q + i. Prefill: the request b
// with query_start[b] <= row < query_start[b + 1] (a binary search; any
// contents stay in bounds: a row no request holds, as with a decreasing
// query_start, is empty). Reads global memory: after WaitForPriorGrids.
template <class P>
__device__ __forceinline__ QueryRow LocateRow(const P& p, int row) {
  if (p.query_start == nullptr) {
    const int b = row / p.s_q, i = row % p.s_q;
    return {b, CausalLength(p.context_lens[b], p.s_q, i)};
  }
  int lo = 0, hi = p.batch;  // the first b whose rows end past `row`
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (p.query_start[mid + 1] <= row) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo >= p.batch) return {-1, 0};
  const int start = p.query_start[lo];
  const int n = p.query_start[lo + 1] - start;
  if (row < start || n <= 0) return {-1, 0};
  return {lo, CausalLength(p.context_lens[lo], n, row - start)};
}

template <class T>
__device__ __forceinline__ void LoadPage(const LogitsParams& p, int page, u32 smem_stage) {
  const unsigned char* src = p.kv + static_cast<long long>(page) * p.page_stride;
  constexpr int kValueChunks = IndexKeyPage::kValueBytes / 16;
  constexpr int kChunks = IndexKeyPage::kBytes / 16;
  for (int ci = threadIdx.x; ci < kChunks; ci += T::kThreads) {
    int dst = ci;
    if (ci < kValueChunks) dst = (ci & ~7) | SwizzledChunk(ci >> 3, ci & 7);
    ptx::CpAsync16(smem_stage + dst * 16, src + ci * 16, 16);
  }
}

// The warp's 16 head rows x 8 keys of n-tile nt (an m16n8 C fragment: c[0],
// c[1] row g, keys 2t, 2t + 1; c[2], c[3] row g + 8) through relu, the
// heads' weights and the sum over the 16 rows (lanes of one t hold the same
// two keys), into red[warp][nt * 8 + 2t ..].
__device__ __forceinline__ void SumHeads(const float (&c)[4], float w_lo, float w_hi, float* red,
                                         int warp, int nt, int g, int t) {
  float s0 = w_lo * fmaxf(c[0], 0.f) + w_hi * fmaxf(c[2], 0.f);
  float s1 = w_lo * fmaxf(c[1], 0.f) + w_hi * fmaxf(c[3], 0.f);
#pragma unroll
  for (int off = 4; off < 32; off *= 2) {
    s0 += __shfl_xor_sync(0xffffffffu, s0, off);
    s1 += __shfl_xor_sync(0xffffffffu, s1, off);
  }
  if (g == 0) {
    *reinterpret_cast<float2*>(red + warp * IndexKeyPage::kPageTokens + nt * 8 + 2 * t) =
        make_float2(s0, s1);
  }
}

// e4m3 tensor-core MMA (mma.sync m16n8k32) where the arch runs it natively,
// sm_89 and sm_120a / sm_121a: the staged page and Q are the operands as
// they are, with half the MMAs of the f16 path and no conversions. The k
// order is permuted as for f16: step 2 g + m of thread t reads bytes 64 g +
// 16 t + 8 m .. + 7, the first four its k 4t..4t+3 and the last four
// 16+4t.. sm_90a and sm_100a accept the instruction but have no such MMA
// (ptxas expands it, and the entry spilled at 64 registers), so they keep
// f16. KFORGE_INDEXER_FP8_MMA (0 / 1) overrides the choice: the H200 runs
// the e4m3 path that way to check its fragment layout.
#if defined(KFORGE_INDEXER_FP8_MMA)
#if KFORGE_INDEXER_FP8_MMA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "KFORGE_INDEXER_FP8_MMA: e4m3 mma.sync needs sm_89 or newer"
#endif
constexpr bool kFp8Mma = KFORGE_INDEXER_FP8_MMA;
#elif defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 890 || __CUDA_ARCH__ >= 1200)
constexpr bool kFp8Mma = true;
#else
constexpr bool kFp8Mma = false;
#endif

template <class T>
__device__ __forceinline__ void LogitsMma(const LogitsParams& p) {
  extern __shared__ __align__(128) unsigned char smem[];  // as topk.cuh's (LogitsWgmma)
  constexpr int kPage = T::kPage;
  constexpr int kChunkKeys = kPage * T::kPagesPerCta;
  float* red = reinterpret_cast<float*>(smem + kLogitsStages * IndexKeyPage::kBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int row = blockIdx.y;
  const int first = blockIdx.x * kChunkKeys;  // first position of the CTA

  ptx::WaitForPriorGrids();
  // The top-k may be scheduled now: it waits for this grid in its own
  // WaitForPriorGrids, on SMs this grid no longer fills.
  ptx::AllowDependentLaunch();
  const QueryRow qr = LocateRow(p, row);
  const int b = qr.b, len = qr.len;
  float* out = p.logits + static_cast<long long>(row) * p.logits_stride;
  const int end = min(first + kChunkKeys, p.max_context);
  // Pages with a valid position below max_context (a caller's max_context
  // below a context never makes the kernel read past the block table's
  // ceil(max_context / 64) columns).
  const int valid_end = min(len, end);
  int pages = valid_end > first ? (valid_end - first + kPage - 1) / kPage : 0;
  pages = min(pages, T::kPagesPerCta);

  if (pages > 0) {
    const int* table = p.block_table + static_cast<long long>(b) * p.block_table_stride;
    const int first_page = first / kPage;
    const u32 smem_base = ptx::SmemAddr(smem);
    LoadPage<T>(p, table[first_page], smem_base);
    ptx::CpAsyncCommit();

    // Q fragments of head rows h0 = 16 warp + g and h0 + 8; padded heads
    // are zero (and weigh 0). kFp8Mma: 4 k32 steps of e4m3 as they are;
    // else 8 k16 steps converted to f16.
    u32 a[kFp8Mma ? 4 : 8][4];
    float w_lo = 0.f, w_hi = 0.f;
    {
      const int h0 = warp * 16 + g, h1 = h0 + 8;
      const unsigned char* q = p.q + static_cast<long long>(row) * p.q_row_stride;
      const float* wr = p.weights + static_cast<long long>(row) * p.weights_row_stride;
      if (h0 < T::kHeads) w_lo = wr[h0];
      if (h1 < T::kHeads) w_hi = wr[h1];
#pragma unroll
      for (int grp = 0; grp < 2; ++grp) {
        u32 lw[4] = {0, 0, 0, 0}, hw[4] = {0, 0, 0, 0};
        if (h0 < T::kHeads) ptx::LdGlobal128(q + h0 * T::kHeadDim + 64 * grp + 16 * t, lw);
        if (h1 < T::kHeads) ptx::LdGlobal128(q + h1 * T::kHeadDim + 64 * grp + 16 * t, hw);
        if constexpr (kFp8Mma) {
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            a[grp * 2 + m][0] = lw[2 * m];
            a[grp * 2 + m][1] = hw[2 * m];
            a[grp * 2 + m][2] = lw[2 * m + 1];
            a[grp * 2 + m][3] = hw[2 * m + 1];
          }
        } else {
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            fp8::E4m3x4ToHalf2(lw[m], a[grp * 4 + m][0], a[grp * 4 + m][2]);
            fp8::E4m3x4ToHalf2(hw[m], a[grp * 4 + m][1], a[grp * 4 + m][3]);
          }
        }
      }
    }
    // Both operands carry the conversion's factor (1, or 2^-8 each where
    // the arch converts in software; none is converted on the fp8 path).
    constexpr float kUnscale = kFp8Mma ? 1.f : fp8::kE4m3HalfFactor * fp8::kE4m3HalfFactor;

    for (int pi = 0; pi < pages; ++pi) {
      const int stage = pi % kLogitsStages;
      if (pi + 1 < pages) {
        LoadPage<T>(p, table[first_page + pi + 1],
                    smem_base + ((pi + 1) % kLogitsStages) * IndexKeyPage::kBytes);
      }
      ptx::CpAsyncCommit();
      ptx::CpAsyncWait<1>();
      __syncthreads();

      const u32 stage_addr = smem_base + stage * IndexKeyPage::kBytes;
      // Per n-tile of 8 keys: 16 heads x 8 keys on the tensor cores, then
      // relu, the heads' weights and the sum over this warp's 16 head rows
      // (lanes of one t hold the same two keys), so only one tile's
      // accumulators are live beside the Q fragments.
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        const int key = nt * 8 + g;
#pragma unroll
        for (int grp = 0; grp < 2; ++grp) {
          u32 v[4];
          ptx::LdShared128(stage_addr + key * T::kHeadDim + SwizzledChunk(key, grp * 4 + t) * 16,
                           v);
          if constexpr (kFp8Mma) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#pragma unroll
            for (int m = 0; m < 2; ++m) ptx::MmaE4m3(acc, a[grp * 2 + m], v[2 * m], v[2 * m + 1]);
#endif
          } else {
#pragma unroll
            for (int m = 0; m < 4; ++m) {
              u32 b0, b1;
              fp8::E4m3x4ToHalf2(v[m], b0, b1);
              ptx::MmaF16(acc, a[grp * 4 + m], b0, b1);
            }
          }
        }
        SumHeads(acc, w_lo, w_hi, red, warp, nt, g, t);
      }
      __syncthreads();
      const float* scales = reinterpret_cast<const float*>(smem + stage * IndexKeyPage::kBytes +
                                                           IndexKeyPage::kValueBytes);
      const int page_first = first + pi * kPage;
      for (int k = threadIdx.x; k < kPage; k += T::kThreads) {
        const int s = page_first + k;
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < T::kWarps; ++w) sum += red[w * kPage + k];
        if (s < end) out[s] = s < len ? sum * kUnscale * scales[k] : -__int_as_float(0x7f800000);
      }
      __syncthreads();
    }
  }
  // Positions of the CTA past the row's causal length.
  for (int s = first + pages * kPage + threadIdx.x; s < end; s += T::kThreads) {
    out[s] = -__int_as_float(0x7f800000);
  }
}

// ---- sm_90a: warpgroup MMA, the keys as A from registers ----

// Q chunk c (16 bytes, 0..7) of head n as f16 into the B tile at q16 (two
// 64-column blocks of kN rows x 128 bytes, 16-byte chunk j of row n at j ^
// (n & 7)), in the permuted k order the A fragments read the keys in: byte
// 64 G + 16 t + 4 m + 2 h + e of a row (c = 4 G + t) is k 64 G + 16 m + 8 h
// + 2 t + e, so that k-step 4 G + m of thread t takes the four bytes 4 m ..
// 4 m + 3 of its 16-byte chunk G as its (2t, 2t + 1) and (2t + 8, 2t + 9).
template <int kN>
__device__ __forceinline__ void StoreQChunk(u32 q16, int n, int c, const u32 (&w)[4]) {
  const u32 row = q16 + (c >> 2) * (kN * 128) + n * 128 + 4 * (c & 3);
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    u32 lo, hi;
    fp8::E4m3x4ToHalf2(w[m], lo, hi);
    ptx::StShared32(row + (((2 * m) ^ (n & 7)) << 4), lo);
    ptx::StShared32(row + (((2 * m + 1) ^ (n & 7)) << 4), hi);
  }
}

// The A fragments of one staged page (a page as it is in the cache) for a
// thread of the warpgroup: key rows r0 = 16 w + g and r0 + 8 (w its warp),
// chunks t and 4 + t of each, e4m3 -> f16; and the scale of row r0 + 8 (t &
// 1), which lanes t 0 and 1 use. Odd rows read chunk 4 + t first, so the 8
// lanes of a 16-byte load phase (rows g, g + 1, t 0..3) cover the 32 banks
// once: the unswizzled 128-byte rows of a bulk copy would otherwise put
// both rows' chunks t on the same banks.
__device__ __forceinline__ void PageFragments(u32 stage, int r0, int t, u32 (&a)[8][4],
                                              float& scale) {
  const u32 odd = r0 & 1;
  u32 v[2][2][4];  // [row r0 / r0 + 8][chunk group][word]
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const u32 row = stage + (r0 + 8 * rr) * IndexKeyPage::kHeadDim + 16 * t;
    u32 x[4], y[4];
    ptx::LdShared128(row + 64 * odd, x);
    ptx::LdShared128(row + 64 * (odd ^ 1), y);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      v[rr][0][m] = odd ? y[m] : x[m];
      v[rr][1][m] = odd ? x[m] : y[m];
    }
  }
  scale = ptx::LdSharedF32(stage + IndexKeyPage::kValueBytes + 4 * (r0 + 8 * (t & 1)));
#pragma unroll
  for (int grp = 0; grp < 2; ++grp)
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      fp8::E4m3x4ToHalf2(v[0][grp][m], a[4 * grp + m][0], a[4 * grp + m][2]);
      fp8::E4m3x4ToHalf2(v[1][grp][m], a[4 * grp + m][1], a[4 * grp + m][3]);
    }
}

// One page of the warpgroup, issued: its 64 keys (the A fragments) x kN
// heads, 8 k16 steps into acc, committed as one wgmma group. a and acc
// belong to the wgmma until a WgmmaWait0.
template <int kN>
__device__ __forceinline__ void IssuePage(const u32 (&a)[8][4], float (&acc)[kN / 8][4], u32 q16) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) ptx::FenceOperand(acc[j][e]);
  ptx::WgmmaFence();
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    ptx::WgmmaF16Rs<kN>(acc, a[ks],
                        ptx::SmemDescSw128(q16 + (ks >> 2) * (kN * 128) + (ks & 3) * 32), ks > 0);
  }
  ptx::WgmmaCommit();
}

// A completed page's accumulators: relu, the heads' weights and the sum
// over heads (each thread's 2 x kN / 4 values, then the 4 lanes of a key
// row), the key's scale and the mask.
template <int kN>
__device__ __forceinline__ void FinishPage(float (&acc)[kN / 8][4], float scale, const float* w_s,
                                           float* out, int page_first, int r0, int t, int len,
                                           int end) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) ptx::FenceOperand(acc[j][e]);
  // One fused multiply-add chain a row (the compiler keeps a sum's order:
  // written as a + b * c + d * e it was a multiply, a fused one and an
  // add per pair).
  float s[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    const float2 w = *reinterpret_cast<const float2*>(w_s + 8 * j + 2 * t);
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      s[rr] = fmaf(w.x, fmaxf(acc[j][2 * rr], 0.f), s[rr]);
      s[rr] = fmaf(w.y, fmaxf(acc[j][2 * rr + 1], 0.f), s[rr]);
    }
  }
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    s[rr] += __shfl_xor_sync(0xffffffffu, s[rr], 1);
    s[rr] += __shfl_xor_sync(0xffffffffu, s[rr], 2);
  }
  // Lane t 0 writes row r0, lane t 1 row r0 + 8.
  if (t < 2) {
    constexpr float kUnscale = fp8::kE4m3HalfFactor * fp8::kE4m3HalfFactor;
    const int pos = page_first + r0 + 8 * t;
    const float v = (t == 0 ? s[0] : s[1]) * scale;
    if (pos < end) out[pos] = pos < len ? v * kUnscale : -__int_as_float(0x7f800000);
  }
}

// One warpgroup a CTA, its chunk of pages streamed through a ring of
// kLogitsWgmmaStages shared-memory stages: thread 0 copies each page whole
// (one bulk copy of IndexKeyPage::kBytes, completing on the stage's
// mbarrier) as soon as its stage is free, the warpgroup converts the
// staged keys to A fragments and the stage is refilled while the page's
// MMAs run, which overlap the previous page's finish (two accumulators).
// Bulk copies read the pages faster than per-thread 16-byte loads, and the
// overlap shortened the long-context logits (BENCH.md, "the logits' pages
// by bulk copies").
template <class T>
__device__ __forceinline__ void LogitsWgmma(const LogitsParams& p) {
  // One module declares this array in each entry and the declarations must
  // agree: 128 bytes, as the top-k's. The 1024 the Q tile's swizzle needs
  // is checked when the kernel runs (the trap below).
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kN = T::kWgmmaN;
  constexpr int kPage = T::kPage;
  constexpr int kStages = kLogitsWgmmaStages;
  constexpr u32 kPageBytes = IndexKeyPage::kBytes;
  // The layout LogitsSmemBytes sizes (config.h).
  const u32 q16 = ptx::SmemAddr(smem);
  const u32 ring = q16 + LogitsWgmmaRingOffset(T::kHeads);
  const u32 full = q16 + LogitsWgmmaBarriersOffset(T::kHeads);  // an mbarrier a stage
  float* w_s = reinterpret_cast<float*>(smem + LogitsWgmmaWeightsOffset(T::kHeads));
  int* pages_s = reinterpret_cast<int*>(w_s + kN);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = lane % 4, r0 = warp * 16 + lane / 4;
  const int row = blockIdx.y;
  // The chunk of pages from the grid (the plan's rule, config.h); a grid
  // too narrow for the page list is not the plan's.
  const int chunk_pages = LogitsChunkPages(p.max_context, gridDim.x);
  if (chunk_pages > T::kPagesPerCta) __trap();
  const int chunk_keys = kPage * chunk_pages;
  const int first = blockIdx.x * chunk_keys;

  ptx::WaitForPriorGrids();
  // The top-k may be scheduled now: it waits for this grid in its own
  // WaitForPriorGrids, on SMs this grid no longer fills.
  ptx::AllowDependentLaunch();
  const int end = min(first + chunk_keys, p.max_context);
  // Decode knows the request without a load (row / s_q), so thread 0 reads
  // the first kStages page ids beside context_lens: columns below
  // ceil(max_context / 64), inside the table (the plan checks its
  // columns), used only where the context reaches them. Prefill reads them
  // after LocateRow. Either way the first copies go out before Q is staged.
  int first_ids[kStages] = {};
  const bool decode = p.query_start == nullptr;
  if (decode && threadIdx.x == 0) {
    const int* table = p.block_table + static_cast<long long>(row / p.s_q) * p.block_table_stride;
#pragma unroll
    for (int i = 0; i < kStages; ++i) {
      if (first + i * kPage < end) first_ids[i] = table[first / kPage + i];
    }
  }
  const QueryRow qr = LocateRow(p, row);
  const int len = qr.len;
  float* out = p.logits + static_cast<long long>(row) * p.logits_stride;
  const int valid_end = min(len, end);
  int pages = valid_end > first ? (valid_end - first + kPage - 1) / kPage : 0;
  pages = min(pages, chunk_pages);

  if (pages > 0) {
    const int* table = p.block_table + static_cast<long long>(qr.b) * p.block_table_stride;
    const auto copy_page = [&](int id, int stage) {
      const u32 bar = full + 8 * stage;
      ptx::MbarArriveExpectTx(bar, kPageBytes);
      ptx::BulkCopyToShared(ring + stage * kPageBytes,
                            p.kv + static_cast<long long>(id) * p.page_stride, kPageBytes, bar);
    };
    if (threadIdx.x == 0) {
      if ((q16 & 1023) != 0) __trap();  // the swizzle is on address bits
#pragma unroll
      for (int i = 0; i < kStages; ++i) ptx::MbarInit(full + 8 * i, 1);
      ptx::FenceMbarInit();
#pragma unroll
      for (int i = 0; i < kStages; ++i) {
        if (i < pages) copy_page(decode ? first_ids[i] : table[first / kPage + i], i);
      }
    }

    const unsigned char* q = p.q + static_cast<long long>(row) * p.q_row_stride;
    for (int ci = threadIdx.x; ci < kN * 8; ci += T::kThreads) {
      u32 w[4] = {0, 0, 0, 0};  // padded heads are zero and weigh 0
      if ((ci >> 3) < T::kHeads) ptx::LdGlobal128(q + (ci >> 3) * T::kHeadDim + (ci & 7) * 16, w);
      StoreQChunk<kN>(q16, ci >> 3, ci & 7, w);
    }
    const float* wr = p.weights + static_cast<long long>(row) * p.weights_row_stride;
    for (int n = threadIdx.x; n < kN; n += T::kThreads) w_s[n] = n < T::kHeads ? wr[n] : 0.f;
    for (int i = threadIdx.x; i < pages; i += T::kThreads) pages_s[i] = table[first / kPage + i];
    ptx::FenceProxyAsync();  // st.shared writes, then wgmma reads
    __syncthreads();         // also: the barriers are initialised

    // Pages in turn, two accumulators: page pi's MMAs run while page pi -
    // 1's accumulators are finished (its A fragments are free once the
    // wgmma before it has completed).
    int stage = 0;
    u32 parity = 0;  // of the stage's current use
    u32 a[8][4];
    const auto stage_page = [&](int pi, float& scale) {
      ptx::MbarWait(full + 8 * stage, parity);
      PageFragments(ring + stage * kPageBytes, r0, t, a, scale);
      __syncthreads();  // every thread has read the stage: refill it
      if (threadIdx.x == 0 && pi + kStages < pages) copy_page(pages_s[pi + kStages], stage);
      if (++stage == kStages) {
        stage = 0;
        parity ^= 1;
      }
    };
    const auto finish = [&](float(&acc)[kN / 8][4], float scale, int pi) {
      FinishPage<kN>(acc, scale, w_s, out, first + pi * kPage, r0, t, len, end);
    };
    float acc0[kN / 8][4] = {}, acc1[kN / 8][4] = {};  // (the first k-step overwrites)
    float scale0, scale1;
    stage_page(0, scale0);
    IssuePage<kN>(a, acc0, q16);
    int pi = 1;
    for (; pi + 1 < pages; pi += 2) {
      ptx::WgmmaWait0();
      stage_page(pi, scale1);
      IssuePage<kN>(a, acc1, q16);
      finish(acc0, scale0, pi - 1);
      ptx::WgmmaWait0();
      stage_page(pi + 1, scale0);
      IssuePage<kN>(a, acc0, q16);
      finish(acc1, scale1, pi);
    }
    ptx::WgmmaWait0();
    if (pi < pages) {  // an even count: one more page
      stage_page(pi, scale1);
      IssuePage<kN>(a, acc1, q16);
      finish(acc0, scale0, pi - 1);
      ptx::WgmmaWait0();
      finish(acc1, scale1, pi);
    } else {
      finish(acc0, scale0, pi - 1);
    }
  }
  // Positions of the CTA past the row's causal length.
  for (int s = first + pages * kPage + threadIdx.x; s < end; s += T::kThreads) {
    out[s] = -__int_as_float(0x7f800000);
  }
}

// The entry's body: wgmma where the traits say so (sm_90a), else mma.sync.
template <class T>
__device__ __forceinline__ void LogitsMain(const LogitsParams& p) {
  if constexpr (T::kWgmma) {
    LogitsWgmma<T>(p);
  } else {
    LogitsMma<T>(p);
  }
}

}  // namespace dsa_indexer
}  // namespace kforge

#endif  // KFORGE_DSA_INDEXER_LOGITS_CUH_
