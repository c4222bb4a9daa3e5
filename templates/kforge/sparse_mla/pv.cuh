// O = P V for one KV tile: two implementations of the same phase, picked by
// DecodeTraits::kWgmma through PvPhase<T> (as QkPhase picks S).
//
// V is the first d_v columns of the stage's bf16 KV tile (no second load).
// Each implementation says how P is laid out in sm.p (PIndex, written by
// OnlineSoftmaxToP) and which output element each accumulator register
// holds: o[mi][ni][2 h + c] is row Row(mi, h), column Col(ni) + c, in the
// m16n8 C-fragment order, so RescaleO and Epilogue are shared.
#ifndef KFORGE_SPARSE_MLA_PV_CUH_
#define KFORGE_SPARSE_MLA_PV_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/decode_traits.cuh"

namespace kforge {
namespace sparse_mla {

template <class T>
using OAccum = float[T::kOM][T::kON][4];

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

// sm_90a warpgroup MMA: warpgroup g owns all 64 rows x columns
// [g d_v / 2, (g + 1) d_v / 2) (m64n{d_v/2}k16, one per 16 tokens); its warp
// w % 4 receives rows 16 (w % 4).. . P is read as a K-major operand (one
// 128-byte-swizzled 64 x 64 block), V as an N-major one straight from the
// KV tile's column blocks. WgmmaCovers (config.h) is the shape rule.
template <class T>
struct PvWgmma {
  static_assert(T::kWgmma && WgmmaCovers(T::kShape), "PvWgmma is selected by DecodeTraits::kWgmma");
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

// The O = P V implementation of a traits type.
template <class T>
using PvPhase = typename Choose<T::kWgmma, PvWgmma<T>, PvMmaSync<T>>::type;

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_PV_CUH_
