// Merges the per-split partial results of decode.cuh:
//   lse = log(sum_i exp(lse_i)),  O = sum_i exp(lse_i - lse) O_i
// One warp per (query token, head); each lane owns pairs of d_v columns.
// A head whose splits are all empty (every index invalid) gets O = 0 and
// lse = -inf, never NaN.
#ifndef KFORGE_SPARSE_MLA_COMBINE_CUH_
#define KFORGE_SPARSE_MLA_COMBINE_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/config.h"

namespace kforge {
namespace sparse_mla {

template <class T>
__device__ __forceinline__ void Combine(const CombineParams& p) {
  constexpr int kPairs = T::kDv / 64;  // float2 per lane
  const int token = blockIdx.x;
  const int lane = threadIdx.x % 32;
  const int head = blockIdx.y * kCombineWarps + threadIdx.x / 32;
  if (head >= T::kNumHeads) return;

  const long long split_stride = (long long)p.num_tokens * T::kNumHeads;
  const long long th = (long long)token * T::kNumHeads + head;
  float lse_max = ptx::NegInf();
  for (int s = 0; s < p.num_splits; ++s)
    lse_max = fmaxf(lse_max, p.lse_accum[s * split_stride + th]);

  float acc[kPairs][2];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) acc[j][0] = acc[j][1] = 0.f;
  float wsum = 0.f;
  if (lse_max != ptx::NegInf()) {
    for (int s = 0; s < p.num_splits; ++s) {
      const float lse_s = p.lse_accum[s * split_stride + th];
      // exp(lse_s - lse_max) as exp2; an empty split (-inf) weighs 0.
      const float w = ptx::Exp2((lse_s - lse_max) * 1.4426950408889634f);
      wsum += w;
      const float2* src =
          reinterpret_cast<const float2*>(p.o_accum + (s * split_stride + th) * T::kDv);
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const float2 v = src[j * 32 + lane];
        acc[j][0] += w * v.x;
        acc[j][1] += w * v.y;
      }
    }
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  unsigned short* dst = p.out + token * p.out_token_stride + head * p.out_head_stride;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    *reinterpret_cast<ptx::u32*>(dst + 2 * (j * 32 + lane)) =
        ptx::PackBf16x2(acc[j][0] * inv, acc[j][1] * inv);
  }
  if (T::kReturnLse && p.lse != nullptr && lane == 0) {
    p.lse[th] = wsum > 0.f ? lse_max + __logf(wsum) : ptx::NegInf();
  }
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_COMBINE_CUH_
