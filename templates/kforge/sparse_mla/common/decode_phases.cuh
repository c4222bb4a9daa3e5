// The phases of the sparse MLA main kernel, shared by its pipelines
// (decode.cuh picks one; lockstep.cuh runs them in order).
// Each is __forceinline__: DecodeMain compiles to one straight function, the
// split only names the steps. Register fragments follow the mma.sync m16n8
// C layout: thread (lane) holds rows lane / 4 and lane / 4 + 8 of each m16
// tile (index h = 0, 1) and columns 2 * (lane % 4) + {0, 1} of each n8 tile.
#ifndef KFORGE_SPARSE_MLA_COMMON_DECODE_PHASES_CUH_
#define KFORGE_SPARSE_MLA_COMMON_DECODE_PHASES_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/common/decode_traits.cuh"
#include "kforge/sparse_mla/common/mma.cuh"
#include "kforge/sparse_mla/common/params.h"
#include "kforge/sparse_mla/common/sink.cuh"
#include "kforge/sparse_mla/common/tiling.h"

namespace kforge {
namespace sparse_mla {

// Q tile of the CTA's token and head group, resident for the whole CTA, as
// cp.async copies (the caller commits them with the first KV tile); padded
// heads are zero rows. The first kRowsPerPass * kThreadsPerRow threads of the
// CTA copy it (all of them by default).
template <class T, int kRowsPerPass = T::kRowsPerPass>
__device__ __forceinline__ void LoadQ(const DecodeParams& p, const DecodeWork& w,
                                      const DecodeSmem& sm, const ThreadRoles& r) {
  const unsigned short* q_tok = p.q + w.token * p.q_token_stride;
  for (int row = r.row0; row < T::kHeadTile; row += kRowsPerPass) {
    const bool ok = row < w.heads_here;
    const unsigned short* src = q_tok + (ok ? (w.head0 + row) * p.q_head_stride : 0);
    const ptx::u32 dst = sm.q_addr + row * 128 + ((r.sub ^ (row & 7)) << 4);
#pragma unroll
    for (int j = 0; j < T::kBlocks; ++j) {
      ptx::CpAsync16(dst + j * T::kQBlockBytes, src + (8 * j + r.sub) * 8, ok ? 16 : 0);
    }
  }
}

// O = 0 before the first tile.
template <class T>
__device__ __forceinline__ void ZeroO(OAccum<T>& o) {
#pragma unroll
  for (int mi = 0; mi < T::kOM; ++mi)
#pragma unroll
    for (int ni = 0; ni < T::kON; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mi][ni][e] = 0.f;
}

// Running softmax statistics of this thread's S rows, in the scaled log2
// domain: max m and sum l of 2^(s - m).
template <class T>
struct RowStats {
  float m[T::kSM][2];
  float l[T::kSM][2];

  __device__ __forceinline__ void Init() {
#pragma unroll
    for (int mi = 0; mi < T::kSM; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m[mi][h] = ptx::NegInf();
        l[mi][h] = 0.f;
      }
  }
};

// Masks invalid tokens to -inf, scales S by softmax_scale * log2(e) and
// returns in mx the maximum of each of this thread's rows over the whole
// tile (across the kWarpsN warps sharing the rows, through sm.red).
template <class T>
__device__ __forceinline__ void MaskScaleRowMax(float (&s)[T::kSM][T::kSN][4], const int* valid,
                                                const DecodeSmem& sm, const ThreadRoles& r,
                                                float (&mx)[T::kSM][2]) {
  // softmax_scale * log2(e): the codegen derives the traits and bakes it in.
  constexpr float kScaleLog2 = T::kScaleLog2;
  const int lane = r.lane;
#pragma unroll
  for (int mi = 0; mi < T::kSM; ++mi) {
    mx[mi][0] = mx[mi][1] = ptx::NegInf();
#pragma unroll
    for (int ni = 0; ni < T::kSN; ++ni) {
      const int col = (r.wn * T::kSN + ni) * 8 + 2 * (lane % 4);
      const bool v0 = valid[col], v1 = valid[col + 1];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        s[mi][ni][2 * h] = v0 ? s[mi][ni][2 * h] * kScaleLog2 : ptx::NegInf();
        s[mi][ni][2 * h + 1] = v1 ? s[mi][ni][2 * h + 1] * kScaleLog2 : ptx::NegInf();
        mx[mi][h] = fmaxf(mx[mi][h], fmaxf(s[mi][ni][2 * h], s[mi][ni][2 * h + 1]));
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[mi][h] = fmaxf(mx[mi][h], __shfl_xor_sync(0xffffffffu, mx[mi][h], 1));
      mx[mi][h] = fmaxf(mx[mi][h], __shfl_xor_sync(0xffffffffu, mx[mi][h], 2));
    }
  }
  if (T::kWarpsN > 1) {
    if (lane % 4 == 0) {
#pragma unroll
      for (int mi = 0; mi < T::kSM; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          sm.red[r.wn * T::kHeadTile + (r.wm * T::kSM + mi) * 16 + h * 8 + lane / 4] = mx[mi][h];
    }
    // Only the kWarpsN warps that share these rows meet here.
    ptx::NamedBarrier(1 + r.wm, T::kWarpsN * 32);
#pragma unroll
    for (int mi = 0; mi < T::kSM; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = (r.wm * T::kSM + mi) * 16 + h * 8 + lane / 4;
        float m = sm.red[row];
#pragma unroll
        for (int w = 1; w < T::kWarpsN; ++w) m = fmaxf(m, sm.red[w * T::kHeadTile + row]);
        mx[mi][h] = m;
      }
  }
}

// One row's running max moving to cover a tile whose max is `tile_max`
// (scaled log2 domain): updates `m` and returns the exponent offset of this
// tile's P (m_use) and the factor that rescales the row's O and sum.
struct RowMaxStep {
  float m_use;
  float scale;
};
__device__ __forceinline__ RowMaxStep MoveRowMax(float& m, float tile_max) {
  // Largest growth (log2 units) of the running max absorbed without a
  // rescale of O; P <= 2^8 = 256.
  constexpr float kRescaleLog2 = 8.f;
  const float m_old = m;
  float m_new = fmaxf(m_old, tile_max);
  // Lazy rescaling: keep the running max unless the tile raises it by
  // more than kRescaleLog2, so P stays <= 2^kRescaleLog2 (exact enough
  // in fp32 sums and bf16 P) and O is rarely rescaled. The first valid
  // tile always moves it (x - (-inf) = inf); -inf - -inf is NaN and
  // keeps it.
  if (!(m_new - m_old > kRescaleLog2)) m_new = m_old;
  // All -inf so far (every token masked): subtract 0, not -inf, so
  // exp2 gives 0 rather than NaN.
  const float m_use = m_new == ptx::NegInf() ? 0.f : m_new;
  m = m_new;
  return {m_use, m_new == m_old ? 1.f : ptx::Exp2(m_old - m_use)};
}

// Online softmax: updates the running max and sum, writes P = 2^(s - m) as
// bf16 to sm.p and each row's O rescale factor to sm.scale. The caller's
// barrier then publishes both to the PV phase.
template <class T>
__device__ __forceinline__ void OnlineSoftmaxToP(const float (&s)[T::kSM][T::kSN][4],
                                                 const float (&mx)[T::kSM][2], RowStats<T>& stats,
                                                 const DecodeSmem& sm, const ThreadRoles& r) {
  const int lane = r.lane;
#pragma unroll
  for (int mi = 0; mi < T::kSM; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = (r.wm * T::kSM + mi) * 16 + h * 8 + lane / 4;
      const RowMaxStep step = MoveRowMax(stats.m[mi][h], mx[mi][h]);
      const float m_use = step.m_use, scale = step.scale;
      float sum = 0.f;
#pragma unroll
      for (int ni = 0; ni < T::kSN; ++ni) {
        const float p0 = ptx::Exp2(s[mi][ni][2 * h] - m_use);
        const float p1 = ptx::Exp2(s[mi][ni][2 * h + 1] - m_use);
        sum += p0 + p1;
        const int col = (r.wn * T::kSN + ni) * 8 + 2 * (lane % 4);
        *reinterpret_cast<ptx::u32*>(sm.p + PvPhase<T>::PIndex(row, col)) = ptx::PackBf16x2(p0, p1);
      }
      stats.l[mi][h] = stats.l[mi][h] * scale + sum;
      if (r.wn == 0 && lane % 4 == 0) sm.scale[row] = scale;
    }
  }
}

// O *= this tile's per-row rescale factor (skipped, warp-uniformly, when no
// row's max moved).
template <class T>
__device__ __forceinline__ void RescaleO(OAccum<T>& o, const PvPhase<T>& pv, const DecodeSmem& sm) {
  float sc[T::kOM][2];
  bool rescale = false;
#pragma unroll
  for (int mi = 0; mi < T::kOM; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sc[mi][h] = sm.scale[pv.Row(mi, h)];
      rescale |= sc[mi][h] != 1.f;
    }
  // Warp-uniform skip: after the first tiles the max rarely moves.
  if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
    for (int mi = 0; mi < T::kOM; ++mi)
#pragma unroll
      for (int ni = 0; ni < T::kON; ++ni) {
        o[mi][ni][0] *= sc[mi][0];
        o[mi][ni][1] *= sc[mi][0];
        o[mi][ni][2] *= sc[mi][1];
        o[mi][ni][3] *= sc[mi][1];
      }
  }
}

// Each row's sum over the kWarpsN warps sharing it, to sm.red (one partial
// per warp column; RowSum adds them) and its running max to sm.max (the
// MMA warps), then a CTA barrier: after it no warp reads the Q or KV tiles
// any more, and every thread's copies have landed (the caller waited).
// kWithO false: the caller holds no statistics (the warp-specialised
// pipeline's producer warps, sm90/wspath.cuh) and only meets the barrier.
template <class T, bool kWithO = true>
__device__ __forceinline__ void PublishRowStats(const DecodeSmem& sm, const ThreadRoles& r,
                                                const RowStats<T>& stats) {
  const int lane = r.lane;
  // Only the warps that computed S hold statistics: all MMA warps, but the
  // warp-specialised pipeline's first warpgroup only.
  const bool holds_stats = !T::kWarpSpecialized || r.wn < T::kWarpsN;
  if (kWithO && r.mma && holds_stats) {
#pragma unroll
    for (int mi = 0; mi < T::kSM; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float l = stats.l[mi][h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = (r.wm * T::kSM + mi) * 16 + h * 8 + lane / 4;
        if (lane % 4 == 0) {
          sm.red[r.wn * T::kHeadTile + row] = l;
          if (r.wn == 0) sm.max[row] = stats.m[mi][h];
        }
      }
  }
  __syncthreads();
}

template <class T>
__device__ __forceinline__ float RowSum(const DecodeSmem& sm, int row) {
  // Register pipeline: every warp holds the whole S, so each warp's sum is
  // the row's (warp 0's is read).
  if constexpr (T::kRegPath) return sm.red[row];
  float l = 0.f;
#pragma unroll
  for (int wn = 0; wn < T::kWarpsN; ++wn) l += sm.red[wn * T::kHeadTile + row];
  return l;
}

// The split epilogue (Epilogue::kSplit): row sums across warps,
// normalisation and the write: bf16 O and lse for a single split, else fp32
// partial O and lse to the workspace (combine.cuh).
// kWithO false: a caller without O or statistics (PublishRowStats).
template <class T, bool kWithO = true>
__device__ __forceinline__ void SplitEpilogue(const DecodeParams& p, const DecodeWork& w,
                                              const DecodeSmem& sm, const ThreadRoles& r,
                                              const PvPhase<T>& pv, const OAccum<T>& o,
                                              const RowStats<T>& stats) {
  PublishRowStats<T, kWithO>(sm, r, stats);
  if (!kWithO || !r.mma) return;
  const bool single = p.num_splits == 1;
  const long long split_token = (long long)w.split * p.num_tokens + w.token;
#pragma unroll
  for (int mi = 0; mi < T::kOM; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = pv.Row(mi, h);
      if (row >= w.heads_here) continue;
      const float l = RowSum<T>(sm, row);
      // sm.max is in the scaled log2 domain; lse is reported in natural log.
      const float lse = l > 0.f ? (sm.max[row] + __log2f(l)) * 0.69314718055994531f : ptx::NegInf();
      const int head = w.head0 + row;
      // A single split's O is final: the sink joins its denominator here.
      const float inv = l > 0.f ? (single ? SinkFactor(p.sink, head, lse) : 1.f) / l : 0.f;
      // One writer of each row's lse: the thread holding its column 0.
      const bool lse_writer = pv.Col(0) == 0;
      if (single) {
        unsigned short* dst = p.out + w.token * p.out_token_stride + head * p.out_head_stride;
#pragma unroll
        for (int ni = 0; ni < T::kON; ++ni) {
          const int col = pv.Col(ni);
          *reinterpret_cast<ptx::u32*>(dst + col) =
              ptx::PackBf16x2(o[mi][ni][2 * h] * inv, o[mi][ni][2 * h + 1] * inv);
        }
        if (T::kReturnLse && p.lse != nullptr && lse_writer)
          p.lse[(long long)w.token * T::kNumHeads + head] = lse;
      } else {
        float* dst = p.o_accum + (split_token * T::kNumHeads + head) * T::kDv;
#pragma unroll
        for (int ni = 0; ni < T::kON; ++ni) {
          const int col = pv.Col(ni);
          *reinterpret_cast<float2*>(dst + col) =
              make_float2(o[mi][ni][2 * h] * inv, o[mi][ni][2 * h + 1] * inv);
        }
        if (lse_writer) p.lse_accum[split_token * T::kNumHeads + head] = lse;
      }
    }
  }
}

// The cluster entries' epilogue (Epilogue::kClusterMerge; kClusterSplits,
// kMainClusterSplits in tiling.h): the CTAs of a cluster are the splits of
// one (head group, query token). Each writes its normalised O and lse (log2
// domain) to its merge buffer; after a cluster barrier, CTA `rank` merges
// column pairs [rank, rank + 1) * kPairs of
// every real row over all the splits' buffers (distributed shared memory),
//   lse = log(sum_j exp(lse_j)),  O = sum_j exp(lse_j - lse) O_j,
// and writes bf16 O (and lse) itself: no workspace, no combine kernel. A
// row whose splits are all empty gets O = 0 and lse = -inf. kWithO false:
// a caller without O or statistics, which only merges (PublishRowStats).
template <class T, int kSplits, bool kWithO = true>
__device__ __forceinline__ void ClusterMergeEpilogue(const DecodeParams& p, const DecodeWork& w,
                                                     const DecodeSmem& sm, const ThreadRoles& r,
                                                     const PvPhase<T>& pv, const OAccum<T>& o,
                                                     const RowStats<T>& stats) {
  static_assert(ClusterMergeFits(T::kShape, kSplits),
                "the cluster entry needs ClusterMergeFits (tiling.h)");
  static_assert(T::kSmemQ == 0, "the merge buffer starts at the shared-memory base");
  constexpr ClusterMergeLayout kL = MakeClusterMergeLayout(T::kShape);
  constexpr int kPairs = T::kDv / 2 / kSplits;  // column pairs per CTA
  float* buf = reinterpret_cast<float*>(sm.q + kL.o);
  float* buf_lse = reinterpret_cast<float*>(sm.q + kL.lse);
  // The buffer overlays Q and the KV tiles, dead after PublishRowStats's
  // barrier. The MMA warps fill it; every warp merges.
  PublishRowStats<T, kWithO>(sm, r, stats);
  if (kWithO && r.mma) {
#pragma unroll
    for (int mi = 0; mi < T::kOM; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = pv.Row(mi, h);
        const float l = RowSum<T>(sm, row);
        const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
        for (int ni = 0; ni < T::kON; ++ni) {
          *reinterpret_cast<float2*>(buf + row * kL.o_stride + pv.Col(ni)) =
              make_float2(o[mi][ni][2 * h] * inv, o[mi][ni][2 * h + 1] * inv);
        }
        if (pv.Col(0) == 0) buf_lse[row] = l > 0.f ? sm.max[row] + __log2f(l) : ptx::NegInf();
      }
    }
  }
  ptx::ClusterSync();

  const ptx::u32 rank = ptx::ClusterCtaRank();
  const ptx::u32 o_addr = sm.q_addr + kL.o;
  const ptx::u32 lse_addr = sm.q_addr + kL.lse;
  const int items = w.heads_here * kPairs;
  for (int i = r.warp * 32 + r.lane; i < items; i += T::kThreads) {
    const int row = i / kPairs;
    const int col = 2 * (static_cast<int>(rank) * kPairs + i % kPairs);
    // Every split's lse and O pair are loaded before any is used: one
    // distributed-shared-memory round trip, not one for the lse and a
    // second for O.
    float lse[kSplits];
    float2 v[kSplits];
#pragma unroll
    for (int j = 0; j < kSplits; ++j) {
      lse[j] = ptx::LdCluster(ptx::MapShared(lse_addr + row * 4, j));
      v[j] = ptx::LdCluster2(ptx::MapShared(o_addr + (row * kL.o_stride + col) * 4, j));
    }
    float m = ptx::NegInf();
#pragma unroll
    for (int j = 0; j < kSplits; ++j) m = fmaxf(m, lse[j]);
    float sum = 0.f, ox = 0.f, oy = 0.f;
    if (m != ptx::NegInf()) {
#pragma unroll
      for (int j = 0; j < kSplits; ++j) {
        const float wj = ptx::Exp2(lse[j] - m);  // an empty split (-inf) weighs 0
        sum += wj;
        ox += wj * v[j].x;
        oy += wj * v[j].y;
      }
    }
    const int head = w.head0 + row;
    const float merged = sum > 0.f ? (m + __log2f(sum)) * 0.69314718055994531f : ptx::NegInf();
    const float inv = sum > 0.f ? SinkFactor(p.sink, head, merged) / sum : 0.f;
    *reinterpret_cast<ptx::u32*>(p.out + w.token * p.out_token_stride + head * p.out_head_stride +
                                 col) = ptx::PackBf16x2(ox * inv, oy * inv);
    if (T::kReturnLse && p.lse != nullptr && col == 0) {
      p.lse[(long long)w.token * T::kNumHeads + head] = merged;
    }
  }
  // No CTA may leave (its shared memory freed) while another reads it.
  ptx::ClusterSync();
}

// A main-kernel entry's epilogue, by the entry's name (E, a DecodeEntry):
// the cluster merge (Epilogue::kClusterMerge), else SplitEpilogue (kSplit).
// kWithO false: a caller without O or statistics (the warp-specialised
// pipeline's producer) that meets the barriers.
template <class T, class E, bool kWithO = true>
__device__ __forceinline__ void FinishDecode(const DecodeParams& p, const DecodeWork& w,
                                             const DecodeSmem& sm, const ThreadRoles& r,
                                             const PvPhase<T>& pv, const OAccum<T>& o,
                                             const RowStats<T>& stats) {
  if constexpr (E::kEpilogue == Epilogue::kClusterMerge) {
    ClusterMergeEpilogue<T, E::kClusterSplits, kWithO>(p, w, sm, r, pv, o, stats);
  } else {
    SplitEpilogue<T, kWithO>(p, w, sm, r, pv, o, stats);
  }
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_COMMON_DECODE_PHASES_CUH_
