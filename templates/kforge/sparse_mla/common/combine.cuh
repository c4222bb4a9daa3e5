// Merges the per-split partial results of decode.cuh:
//   lse = log(sum_i exp(lse_i)),  O = sum_i exp(lse_i - lse) O_i
// One warp per (query token, head, column slice: CombineSlices in
// params.h); each lane owns pairs of the slice's columns.
// A head whose splits are all empty (every index invalid) gets O = 0 and
// lse = -inf, never NaN.
//
// The kernel is latency-bound (a few MB of L2-resident partials at small
// batch), so it keeps loads in flight instead of walking the splits one L2
// round trip at a time: the split lse values of a chunk of 32 splits are
// loaded at once, one per lane, and their weights broadcast with shuffles;
// the partial rows of kUnroll splits are loaded before any is accumulated.
#ifndef KFORGE_SPARSE_MLA_COMMON_COMBINE_CUH_
#define KFORGE_SPARSE_MLA_COMMON_COMBINE_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/common/params.h"
#include "kforge/sparse_mla/common/sink.cuh"

namespace kforge {
namespace sparse_mla {

template <class T, int kSlices>
__device__ __forceinline__ void CombineSlice(const CombineParams& p) {
  constexpr int kPairs = T::kDv / 64 / kSlices;  // float2 per lane
  // Splits whose rows are loaded together: 8 of a slice, 4 of a whole row
  // (the one-warp combine measured at 64 x 64 and 128 x 32, BENCH.md).
  constexpr int kUnroll = kSlices == 1 ? 4 : 8;
  constexpr float kLog2e = 1.4426950408889634f;
  // Launched programmatically after the main kernel (sm_90+), it is
  // scheduled while that kernel still runs: wait for its partials.
  ptx::WaitForPriorGrids();
  ptx::AllowDependentLaunch();
  const int token = blockIdx.x;
  const int lane = threadIdx.x % 32;
  const int warp = blockIdx.y * kCombineWarps + threadIdx.x / 32;
  const int head = warp / kSlices;
  const int slice = warp % kSlices;  // float2 [slice * kPairs * 32, +kPairs * 32) of the row
  if (head >= T::kNumHeads) return;

  const long long split_stride = (long long)p.num_tokens * T::kNumHeads;
  const long long th = (long long)token * T::kNumHeads + head;
  float lse_max = ptx::NegInf();
  for (int s = lane; s < p.num_splits; s += 32)
    lse_max = fmaxf(lse_max, p.lse_accum[s * split_stride + th]);
#pragma unroll
  for (int o = 16; o > 0; o /= 2)
    lse_max = fmaxf(lse_max, __shfl_xor_sync(0xffffffffu, lse_max, o));

  float acc[kPairs][2];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) acc[j][0] = acc[j][1] = 0.f;
  float wsum = 0.f;  // this lane's splits; summed across the warp below
  if (lse_max != ptx::NegInf()) {
    for (int s0 = 0; s0 < p.num_splits; s0 += 32) {
      const int n = min(32, p.num_splits - s0);
      // exp(lse_s - lse_max) as exp2; an empty split (-inf) weighs 0.
      const float w_lane =
          lane < n ? ptx::Exp2((p.lse_accum[(s0 + lane) * split_stride + th] - lse_max) * kLog2e)
                   : 0.f;
      wsum += w_lane;
      for (int j0 = 0; j0 < n; j0 += kUnroll) {
        float2 v[kUnroll][kPairs];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          // Past the chunk's end: no load (predicated), weight 0 below.
          const bool in = j0 + u < n;
          const float2* src =
              reinterpret_cast<const float2*>(
                  p.o_accum + ((s0 + (in ? j0 + u : 0)) * split_stride + th) * T::kDv) +
              slice * kPairs * 32;
#pragma unroll
          for (int j = 0; j < kPairs; ++j)
            v[u][j] = in ? src[j * 32 + lane] : make_float2(0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const float w_u = __shfl_sync(0xffffffffu, w_lane, min(j0 + u, 31));
          const float w = j0 + u < n ? w_u : 0.f;
#pragma unroll
          for (int j = 0; j < kPairs; ++j) {
            acc[j][0] += w * v[u][j].x;
            acc[j][1] += w * v[u][j].y;
          }
        }
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) wsum += __shfl_xor_sync(0xffffffffu, wsum, o);
  const float lse = wsum > 0.f ? lse_max + __logf(wsum) : ptx::NegInf();
  const float inv = wsum > 0.f ? SinkFactor(p.sink, head, lse) / wsum : 0.f;
  unsigned short* dst =
      p.out + token * p.out_token_stride + head * p.out_head_stride + slice * kPairs * 64;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    *reinterpret_cast<ptx::u32*>(dst + 2 * (j * 32 + lane)) =
        ptx::PackBf16x2(acc[j][0] * inv, acc[j][1] * inv);
  }
  if (T::kReturnLse && p.lse != nullptr && slice == 0 && lane == 0) {
    p.lse[th] = lse;
  }
}

// The entry: p.column_slices warps per head (CombineColumnSlices); any
// value but CombineSlices(d_v) means 1, so a plan can never make a warp
// address past its row.
template <class T>
__device__ __forceinline__ void Combine(const CombineParams& p) {
  constexpr int kSlices = CombineSlices(T::kDv);
  if (kSlices > 1 && p.column_slices == kSlices) {
    CombineSlice<T, kSlices>(p);
  } else {
    CombineSlice<T, 1>(p);
  }
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_COMMON_COMBINE_CUH_
