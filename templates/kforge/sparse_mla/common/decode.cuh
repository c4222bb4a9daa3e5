// Sparse MLA decode, split-KV main kernel: the entry point of every
// generated unit, which picks the pipeline an entry names.
//
// One CTA computes, for one query token, one group of heads and one split of
// the top-k list:  O = softmax(scale * Q K^T) V  over the selected KV rows,
// where K is a gathered latent row (d_qk = d_v + rope wide) and V is its
// first d_v columns (no second load: V is read from the K tile in smem).
//
// Pipelines (Pipeline in tiling.h; docs/KERNEL.md), one file each:
//   kLockstep         every arch: the phases in order between CTA barriers
//                     (common/lockstep.cuh)
//   kRegister         a staged format's 16-head tile, no KV tile in shared
//                     memory (sm80/regpath.cuh: mma.sync)
//   kWarpSpecialized  the 64-head wgmma tile with a producer warpgroup
//   kCrossoverPair    beside the MMA warps, unpaired or as 2-CTA pairs
//                     (sm90/wspath.cuh: wgmma)
// Each ends with the entry's epilogue (Epilogue in tiling.h;
// decode_phases.cuh FinishDecode): kSplit writes bf16 O + lse, or fp32
// partials + lse for the combine kernel (combine.cuh); kClusterMerge
// merges the splits through distributed shared memory instead
// (ClusterMergeEpilogue).
// The traits' Mma picks the S and PV products inside the lockstep pipeline
// (common/mma.cuh). Tiling rules and the smem layout are tiling.h's
// (CheckDecodeTiling, MakeDecodeSmemLayout), shared with the host.
#ifndef KFORGE_SPARSE_MLA_COMMON_DECODE_CUH_
#define KFORGE_SPARSE_MLA_COMMON_DECODE_CUH_

#include "kforge/sparse_mla/common/decode_traits.cuh"
#include "kforge/sparse_mla/common/lockstep.cuh"
#include "kforge/sparse_mla/common/params.h"
#include "kforge/sparse_mla/common/tiling.h"
#include "kforge/sparse_mla/sm80/regpath.cuh"
#include "kforge/sparse_mla/sm90/wspath.cuh"

namespace kforge {
namespace sparse_mla {

// The main kernel of one entry: T, the traits (DecodeTraits); kPipeline,
// the pipeline the entry runs, its tiling's (a crossover-pair tiling's
// cluster entries run it unpaired: kWarpSpecialized); kEpilogue, how it
// finishes, with kClusterSplits the CTAs of its compiled-in cluster
// (kClusterMerge only).
template <class T, Pipeline kPipeline, Epilogue kEpilogue, int kClusterSplits = 0>
__device__ __forceinline__ void DecodeMain(const DecodeParams& p) {
  using E = DecodeEntry<kPipeline, kEpilogue, kClusterSplits>;
  static_assert(kPipeline == T::kPipeline || (T::kPipeline == Pipeline::kCrossoverPair &&
                                              kPipeline == Pipeline::kWarpSpecialized),
                "an entry runs its tiling's pipeline (tiling.h PipelineOf)");
  if constexpr (kPipeline == Pipeline::kRegister) {
    DecodeRegPath<T, E>(p);
  } else if constexpr (kPipeline == Pipeline::kWarpSpecialized ||
                       kPipeline == Pipeline::kCrossoverPair) {
    DecodeWarpSpecialized<T, E>(p);
  } else {
    DecodeLockstep<T, E>(p);
  }
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_COMMON_DECODE_CUH_
