// Sparse MLA decode, split-KV main kernel.
//
// One CTA computes, for one query token, one group of heads and one split of
// the top-k list:  O = softmax(scale * Q K^T) V  over the selected KV rows,
// where K is a gathered latent row (d_qk = d_v + rope wide) and V is its
// first d_v columns (no second load: V is read from the K tile in smem).
//
// Phases (docs/KERNEL.md):
//   LoadQ              Q tile to smem, resident        (decode_phases.cuh)
//   per KV tile of kTokenTile tokens, kStages-deep cp.async pipeline:
//     GatherKvTile     top-k indices -> rows of the bf16 KV tile through the
//                      KV format T::Kv (LoadRow, then Land)  (kv_format.cuh)
//     QkPhase<T>       S = Q K^T: mma.sync, or wgmma on sm_90a   (qk.cuh)
//     MaskScaleRowMax  invalid tokens -> -inf, scale, row max across warps
//     OnlineSoftmaxToP running max/sum, P to smem as bf16
//     RescaleO, PvPhase<T>     O = O * scale + P V: mma.sync, or wgmma on
//                      sm_90a   (pv.cuh)
//   Epilogue           normalise; bf16 O + lse, or fp32 partials + lse for
//                      the combine kernel (combine.cuh)
// Tiling rules and the smem layout are config.h's (CheckDecodeTiling,
// MakeDecodeSmemLayout), shared with the host codegen.
#ifndef KFORGE_SPARSE_MLA_DECODE_CUH_
#define KFORGE_SPARSE_MLA_DECODE_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/config.h"
#include "kforge/sparse_mla/decode_phases.cuh"
#include "kforge/sparse_mla/decode_traits.cuh"
#include "kforge/sparse_mla/kv_format.cuh"
#include "kforge/sparse_mla/pv.cuh"
#include "kforge/sparse_mla/qk.cuh"

namespace kforge {
namespace sparse_mla {

template <class T>
__device__ __forceinline__ void DecodeMain(const DecodeParams& p) {
  using Qk = QkPhase<T>;
  extern __shared__ __align__(128) unsigned char smem[];
  const DecodeSmem sm = CarveDecodeSmem<T>(smem);
  const DecodeWork w = MakeDecodeWork<T>(p);
  const ThreadRoles r = MakeThreadRoles<T>();
  Qk::CheckSmemBase(sm.q_addr);

  LoadQ<T>(p, w, sm, r);
#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (s < w.num_tiles) GatherKvTile<T>(p, w, sm, r, s, s);
    ptx::CpAsyncCommit();
  }

  const Qk qk(sm, r);
  const PvPhase<T> pv(r);
  OAccum<T> o;
#pragma unroll
  for (int mi = 0; mi < T::kOM; ++mi)
#pragma unroll
    for (int ni = 0; ni < T::kON; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mi][ni][e] = 0.f;
  RowStats<T> stats;
  stats.Init();

  for (int t = 0; t < w.num_tiles; ++t) {
    ptx::CpAsyncWait<T::kStages - 2>();
    PublishSmem<T>();
    {
      const int nt = t + T::kStages - 1;
      if (nt < w.num_tiles) GatherKvTile<T>(p, w, sm, r, nt, nt % T::kStages);
      ptx::CpAsyncCommit();
    }
    const int stage = t % T::kStages;
    T::Kv::template Land<T>(sm, stage, r);
    const ptx::u32 k_tile = sm.kv_addr + stage * T::kTileBytes;

    float s[T::kSM][T::kSN][4];
    qk.Compute(s, k_tile);
    float mx[T::kSM][2];
    MaskScaleRowMax<T>(s, sm.valid + stage * T::kTokenTile, sm, r, mx);
    OnlineSoftmaxToP<T>(s, mx, stats, sm, r);
    PublishSmem<T>();
    RescaleO<T>(o, pv, sm);
    pv.Accumulate(o, sm, k_tile);
  }
  ptx::CpAsyncWait<0>();
  Epilogue<T>(p, w, sm, r, pv, o, stats);
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_DECODE_CUH_
