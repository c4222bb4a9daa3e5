// S = Q K^T for one KV tile with sm_90a warpgroup MMA (Mma::kWgmma). The
// phase's interface, and how QkPhase picks this implementation, are in
// common/mma.cuh.
#ifndef KFORGE_SPARSE_MLA_SM90_QK_CUH_
#define KFORGE_SPARSE_MLA_SM90_QK_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/common/decode_traits.cuh"

namespace kforge {
namespace sparse_mla {

// sm_90a warpgroup MMA: warpgroup wn computes S[0:64, kN wn : kN wn + kN)
// (kN = kTokenTile / kWarpsN: 32 of 64 tokens each, or all 64 on the
// warp-specialised pipeline's first warpgroup) straight from shared-memory
// descriptors (no ldmatrix); its 4 warps receive rows 16 * wm.. in the
// mma.sync C layout. WgmmaCovers (common/tiling.h) is the shape rule.
template <class T>
struct QkWgmma {
  static_assert(T::kWgmma && WgmmaCovers(T::kShape), "QkWgmma is selected by DecodeTraits::kMma");
  static constexpr int kN = T::kTokenTile / T::kWarpsN;
  static constexpr bool kAsync = true;

  ptx::u32 q_base;
  int wn;

  // The 128-byte swizzle of wgmma descriptors is absolute: atoms must sit on
  // 1024-byte boundaries (dynamic smem starts on one on sm_90).
  __device__ __forceinline__ static void CheckSmemBase(ptx::u32 q_addr) {
    if ((q_addr & 1023) != 0) __trap();
  }

  __device__ __forceinline__ QkWgmma(const DecodeSmem& sm, const ThreadRoles& r)
      : q_base(sm.q_addr), wn(r.wn) {}

  __device__ __forceinline__ void Start(float (&s)[T::kSM][T::kSN][4], ptx::u32 k_tile) const {
#pragma unroll
    for (int ni = 0; ni < T::kSN; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[0][ni][e] = 0.f;
#pragma unroll
    for (int ni = 0; ni < T::kSN; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) ptx::FenceOperand(s[0][ni][e]);
    ptx::WgmmaFence();
    // Fully unrolled: a rolled block loop measured slower at 128 heads x
    // batch 128 (BENCH.md).
#pragma unroll
    for (int kg = 0; kg < T::kBlocks; ++kg) {
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const ptx::u64 da = ptx::SmemDescSw128(q_base + kg * T::kQBlockBytes + u * 32);
        const ptx::u64 db =
            ptx::SmemDescSw128(k_tile + kg * T::kKvBlockBytes + wn * kN * 128 + u * 32);
        ptx::WgmmaBf16<kN>(s[0], da, db);
      }
    }
    ptx::WgmmaCommit();
  }

  __device__ __forceinline__ void Finish(float (&s)[T::kSM][T::kSN][4]) const {
    ptx::WgmmaWait0();
#pragma unroll
    for (int ni = 0; ni < T::kSN; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) ptx::FenceOperand(s[0][ni][e]);
  }
};

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_SM90_QK_CUH_
