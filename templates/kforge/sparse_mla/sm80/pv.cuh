// O += P V for one KV tile with mma.sync (Mma::kMmaSync): every arch. The
// phase's interface, and how PvPhase picks this implementation, are in
// common/mma.cuh.
#ifndef KFORGE_SPARSE_MLA_SM80_PV_CUH_
#define KFORGE_SPARSE_MLA_SM80_PV_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/common/decode_traits.cuh"

namespace kforge {
namespace sparse_mla {

// mma.sync m16n8k16, P and V through ldmatrix: every arch. Every warp owns
// all kHeadTile rows and kVCols output columns.
template <class T>
struct PvMmaSync {
  int warp, lane;

  __device__ __forceinline__ explicit PvMmaSync(const ThreadRoles& r)
      : warp(r.warp), lane(r.lane) {}

  // P row-major with kPStride (16 B of padding: conflict-free ldmatrix).
  __device__ __forceinline__ static int PIndex(int row, int col) { return row * T::kPStride + col; }
  __device__ __forceinline__ int Row(int mi, int h) const { return mi * 16 + h * 8 + lane / 4; }
  __device__ __forceinline__ int Col(int ni) const {
    return warp * T::kVCols + ni * 8 + 2 * (lane % 4);
  }

  __device__ __forceinline__ void Accumulate(OAccum<T>& o, const DecodeSmem& sm,
                                             ptx::u32 k_tile) const {
    using ptx::u32;
    const int sw = lane & 7;
#pragma unroll
    for (int kk = 0; kk < T::kTokenTile / 16; ++kk) {
      u32 a[T::kMTiles][4];
#pragma unroll
      for (int mi = 0; mi < T::kMTiles; ++mi) {
        ptx::Ldmatrix4(
            sm.p_addr + ((mi * 16 + lane % 16) * T::kPStride + kk * 16 + (lane / 16) * 8) * 2,
            a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
      }
      const u32 v_row = k_tile + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * 128;
#pragma unroll
      for (int np = 0; np < T::kVN / 2; ++np) {
        const int chunk = warp * (T::kVCols / 8) + 2 * np + lane / 16;
        u32 b0, b1, b2, b3;
        ptx::Ldmatrix4Trans(v_row + (chunk / 8) * T::kKvBlockBytes + (((chunk % 8) ^ sw) << 4), b0,
                            b1, b2, b3);
#pragma unroll
        for (int mi = 0; mi < T::kMTiles; ++mi) {
          ptx::MmaBf16(o[mi][2 * np], a[mi], b0, b1);
          ptx::MmaBf16(o[mi][2 * np + 1], a[mi], b2, b3);
        }
      }
    }
  }
};

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_SM80_PV_CUH_
