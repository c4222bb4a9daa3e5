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
//                      KV format T::Kv, or T::ExtraKv for the extra
//                      cache's tiles (LoadRow, then Land)  (kv_format.cuh)
//     QkPhase<T>       S = Q K^T: mma.sync, or wgmma on sm_90a   (qk.cuh)
//     MaskScaleRowMax  invalid tokens -> -inf, scale, row max across warps
//     OnlineSoftmaxToP running max/sum, P to smem as bf16
//     RescaleO, PvPhase<T>     O = O * scale + P V: mma.sync, or wgmma on
//                      sm_90a   (pv.cuh)
//   Epilogue           normalise; bf16 O + lse, or fp32 partials + lse for
//                      the combine kernel (combine.cuh); in the cluster
//                      entry the splits merge through distributed shared
//                      memory instead (ClusterMergeEpilogue)
// A 16-head tile of a staged format may instead run the register pipeline
// (regpath.cuh: no KV tile in shared memory), and the 64-head wgmma tile of
// one the warp-specialised pipeline (wspath.cuh: a producer warpgroup
// gathers and converts beside the MMA warps), each chosen by its tiling.
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
#include "kforge/sparse_mla/regpath.cuh"
#include "kforge/sparse_mla/wspath.cuh"

namespace kforge {
namespace sparse_mla {

// kClusterSplits_: 0 for the split-K entries (partials to the workspace
// when p.num_splits > 1), else the cluster entry's split count, merged in
// the kernel (ClusterMergeEpilogue).
template <class T, int kClusterSplits_>
__device__ __forceinline__ void DecodeSmemPipeline(const DecodeParams& p) {
  using Qk = QkPhase<T>;
  extern __shared__ __align__(128) unsigned char smem[];
  const DecodeSmem sm = CarveDecodeSmem<T>(smem);
  DecodeWork w = MakeDecodeWork<T>(p);
  const ThreadRoles r = MakeThreadRoles<T>();
  Qk::CheckSmemBase(sm.q_addr);

  BeginDecode<T, kClusterSplits_>(p, w);
  LoadQ<T>(p, w, sm, r);
  // Pipeline (KvTiles in config.h): a direct format keeps kStages - 1 tiles
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
  FinishDecode<T, kClusterSplits_>(p, w, sm, r, pv, o, stats);
}

// The main kernel: the register pipeline (regpath.cuh) or the
// warp-specialised one (wspath.cuh) where the tiling asks for it, else the
// shared-memory pipeline above. kPair: the warp-specialised pipeline's
// crossover pair (a 2-CTA cluster over two head groups).
template <class T, int kClusterSplits_ = 0, bool kPair = false>
__device__ __forceinline__ void DecodeMain(const DecodeParams& p) {
  static_assert(!kPair || T::kWarpSpecialized, "the crossover pair is warp-specialised");
  if constexpr (T::kRegPath) {
    DecodeRegPath<T, kClusterSplits_>(p);
  } else if constexpr (T::kWarpSpecialized) {
    DecodeWarpSpecialized<T, kClusterSplits_, kPair>(p);
  } else {
    DecodeSmemPipeline<T, kClusterSplits_>(p);
  }
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_DECODE_CUH_
