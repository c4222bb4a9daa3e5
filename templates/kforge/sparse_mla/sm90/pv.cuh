// O += P V for one KV tile with sm_90a warpgroup MMA (Mma::kWgmma). The
// phase's interface, and how PvPhase picks this implementation, are in
// common/mma.cuh.
#ifndef KFORGE_SPARSE_MLA_SM90_PV_CUH_
#define KFORGE_SPARSE_MLA_SM90_PV_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/common/decode_traits.cuh"

namespace kforge {
namespace sparse_mla {

// sm_90a warpgroup MMA: warpgroup g owns all 64 rows x columns
// [g d_v / 2, (g + 1) d_v / 2) (m64n{d_v/2}k16, one per 16 tokens); its warp
// w % 4 receives rows 16 (w % 4).. . P is read as a K-major operand (one
// 128-byte-swizzled 64 x 64 block), V as an N-major one straight from the
// KV tile's column blocks. WgmmaCovers (common/tiling.h) is the shape rule.
template <class T>
struct PvWgmma {
  static_assert(T::kWgmma && WgmmaCovers(T::kShape), "PvWgmma is selected by DecodeTraits::kMma");
  static constexpr int kN = T::kDv / 2;
  static_assert(T::kOM == 1 && T::kON == kN / 8, "O fragment of a warpgroup half");
  static_assert(T::kPStride * 2 == 128, "P rows are one 128-byte swizzle row");
  int group, wm, lane;

  __device__ __forceinline__ explicit PvWgmma(const ThreadRoles& r)
      : group(r.warp / 4), wm(r.warp % 4), lane(r.lane) {}

  // 16-byte chunk c of row r at chunk c ^ (r & 7), as the Q and KV tiles.
  __device__ __forceinline__ static int PIndex(int row, int col) {
    return row * 64 + ((((col >> 3) ^ row) & 7) << 3) + (col & 7);
  }
  __device__ __forceinline__ int Row(int, int h) const { return wm * 16 + h * 8 + lane / 4; }
  __device__ __forceinline__ int Col(int ni) const { return group * kN + ni * 8 + 2 * (lane % 4); }

  __device__ __forceinline__ void Accumulate(OAccum<T>& o, const DecodeSmem& sm,
                                             ptx::u32 k_tile) const {
#pragma unroll
    for (int ni = 0; ni < T::kON; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) ptx::FenceOperand(o[0][ni][e]);
    ptx::WgmmaFence();
    const ptx::u32 v_base = k_tile + group * (kN / 64) * T::kKvBlockBytes;
#pragma unroll
    for (int kk = 0; kk < T::kTokenTile / 16; ++kk) {
      const ptx::u64 da = ptx::SmemDescSw128(sm.p_addr + kk * 32);
      const ptx::u64 db = ptx::SmemDescSw128MnMajor(v_base + kk * 16 * 128, T::kKvBlockBytes);
      ptx::WgmmaBf16TransB<kN>(o[0], da, db);
    }
    ptx::WgmmaCommit();
    ptx::WgmmaWait0();
#pragma unroll
    for (int ni = 0; ni < T::kON; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) ptx::FenceOperand(o[0][ni][e]);
  }
};

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_SM90_PV_CUH_
