// The lockstep pipeline of the sparse MLA main kernel (Pipeline::kLockstep,
// every arch; the S and PV products are the traits' Mma, common/mma.cuh):
// every warp issues the next KV tile's gather and lands (dequantises) this
// one, then all compute it; they meet at CTA barriers between the phases
// (docs/KERNEL.md, "Phases of DecodeMain").
//
// Per KV tile of kTokenTile tokens, kStages-deep cp.async pipeline:
//   GatherKvTile     top-k indices -> rows of the bf16 KV tile through the
//                    KV format T::Kv, or T::ExtraKv for the extra cache's
//                    tiles (LoadRow, then Land)   (kv_format.cuh)
//   QkPhase<T>       S = Q K^T: mma.sync, or wgmma on sm_90a   (mma.cuh)
//   MaskScaleRowMax  invalid tokens -> -inf, scale, row max across warps
//   OnlineSoftmaxToP running max/sum, P to smem as bf16
//   RescaleO, PvPhase<T>     O = O * scale + P V: mma.sync, or wgmma on
//                    sm_90a   (mma.cuh)
// after LoadQ (Q tile to smem, resident) and before the entry's epilogue
// (decode_phases.cuh).
#ifndef KFORGE_SPARSE_MLA_COMMON_LOCKSTEP_CUH_
#define KFORGE_SPARSE_MLA_COMMON_LOCKSTEP_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/common/decode_phases.cuh"
#include "kforge/sparse_mla/common/decode_traits.cuh"
#include "kforge/sparse_mla/common/kv_format.cuh"
#include "kforge/sparse_mla/common/mma.cuh"
#include "kforge/sparse_mla/common/params.h"

namespace kforge {
namespace sparse_mla {

// E: the entry (DecodeEntry): its epilogue, split (partials to the
// workspace when p.num_splits > 1) or the cluster merge in the kernel
// (ClusterMergeEpilogue).
template <class T, class E>
__device__ __forceinline__ void DecodeLockstep(const DecodeParams& p) {
  static_assert(E::kPipeline == Pipeline::kLockstep, "the lockstep pipeline's entry");
  using Qk = QkPhase<T>;
  extern __shared__ __align__(128) unsigned char smem[];
  const DecodeSmem sm = CarveDecodeSmem<T>(smem);
  DecodeWork w = MakeDecodeWork<T>(p);
  const ThreadRoles r = MakeThreadRoles<T>();
  Qk::CheckSmemBase(sm.q_addr);

  BeginDecode<T, E>(p, w);
  LoadQ<T>(p, w, sm, r);
  // Pipeline (KvTiles in tiling.h): a direct format keeps kStages - 1 tiles
  // in flight in their own bf16 tiles; a staged one keeps the next tile in
  // the staging buffer. Slots are loaded one tile ahead of their gather.
  constexpr int kAhead = T::kStaged ? 1 : T::kStages - 1;
  TileSlots<T> slots;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    slots.Load(w, r.row0, s);
    if (s < w.num_tiles) GatherKvTile(p, slots, sm, r.row0, r.sub, s);
    ptx::CpAsyncCommit();
  }
  slots.Load(w, r.row0, kAhead);

  const Qk qk(sm, r);
  const PvPhase<T> pv(r);
  OAccum<T> o;
  ZeroO<T>(o);
  RowStats<T> stats;
  stats.Init();

  for (int t = 0; t < w.num_tiles; ++t) {
    ptx::CpAsyncWait<kAhead - 1>();
    PublishSmem<T>();
    const int stage = t % T::kStages;  // validity flags; bf16 tile if direct
    LandKvTile<T>(w, t, sm, r);
    const ptx::u32 k_tile = sm.kv_addr + (T::kStaged ? 0 : stage * T::kTileBytes);

    float s[T::kSM][T::kSN][4];
    // The next gather goes into the stage PV read last iteration (or the
    // staging buffer Land just emptied): while S runs on the tensor cores
    // when S is asynchronous (wgmma), else before S, as early as possible.
    if (Qk::kAsync && r.mma) qk.Start(s, k_tile);
    {
      const int nt = t + kAhead;
      if (nt < w.num_tiles) GatherKvTile(p, slots, sm, r.row0, r.sub, nt % T::kStages);
      ptx::CpAsyncCommit();
      slots.Load(w, r.row0, nt + 1);
    }
    // Land-only warps skip the MMA phases but meet the MMA warps at every
    // CTA barrier (P's, the next tile's): the same barriers as without them.
    if (r.mma) {
      if (!Qk::kAsync) qk.Start(s, k_tile);
      qk.Finish(s);
      float mx[T::kSM][2];
      MaskScaleRowMax<T>(s, sm.valid + stage * T::kTokenTile, sm, r, mx);
      OnlineSoftmaxToP<T>(s, mx, stats, sm, r);
    }
    PublishSmem<T>();
    if (r.mma) {
      RescaleO<T>(o, pv, sm);
      pv.Accumulate(o, sm, k_tile);
    }
  }
  ptx::CpAsyncWait<0>();
  FinishDecode<T, E>(p, w, sm, r, pv, o, stats);
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_COMMON_LOCKSTEP_CUH_
