// S = Q K^T for one KV tile with mma.sync (Mma::kMmaSync): every arch,
// sm_80 .. sm_121. The phase's interface, and how QkPhase picks this
// implementation, are in common/mma.cuh.
#ifndef KFORGE_SPARSE_MLA_SM80_QK_CUH_
#define KFORGE_SPARSE_MLA_SM80_QK_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/common/decode_traits.cuh"

namespace kforge {
namespace sparse_mla {

// mma.sync m16n8k16 with ldmatrix operands: every arch (sm_80 .. sm_121).
template <class T>
struct QkMmaSync {
  // ldmatrix lane roles. A (16x16 row-major): row lane % 16, chunk lane / 16.
  // B from K rows (non-trans, pairs of n8 tiles): row (lane / 16) * 8 +
  // lane % 8, chunk (lane / 8) % 2. Rows are multiples of 8 plus lane % 8, so
  // the swizzle term is always lane & 7.
  ptx::u32 a_off[4], b_off[4];
  ptx::u32 a_row;
  int b_row;
  int b_last_row;

  static constexpr bool kAsync = false;
  __device__ __forceinline__ static void CheckSmemBase(ptx::u32) {}

  __device__ __forceinline__ QkMmaSync(const DecodeSmem& sm, const ThreadRoles& r) {
    const int lane = r.lane;
    const int sw = lane & 7;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      a_off[u] = ((2 * u + lane / 16) ^ sw) << 4;
      b_off[u] = ((2 * u + (lane / 8) % 2) ^ sw) << 4;
    }
    a_row = sm.q_addr + (r.wm * T::kSM * 16 + lane % 16) * 128;
    b_row = r.wn * T::kSN * 8 + (lane / 16) * 8 + lane % 8;
    b_last_row = (r.wn * T::kSN + T::kSN - 1) * 8 + lane % 8;
  }

  __device__ __forceinline__ void Finish(float (&)[T::kSM][T::kSN][4]) const {}

  __device__ __forceinline__ void Start(float (&s)[T::kSM][T::kSN][4], ptx::u32 k_tile) const {
    using ptx::u32;
#pragma unroll
    for (int mi = 0; mi < T::kSM; ++mi)
#pragma unroll
      for (int ni = 0; ni < T::kSN; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mi][ni][e] = 0.f;
#pragma unroll 1
    for (int kg = 0; kg < T::kDqk / 64; ++kg) {
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        u32 a[T::kSM][4];
#pragma unroll
        for (int mi = 0; mi < T::kSM; ++mi) {
          ptx::Ldmatrix4(a_row + mi * 16 * 128 + kg * T::kQBlockBytes + a_off[u], a[mi][0],
                         a[mi][1], a[mi][2], a[mi][3]);
        }
        u32 b[T::kSN][2];
#pragma unroll
        for (int ni = 0; ni + 1 < T::kSN; ni += 2) {
          ptx::Ldmatrix4(k_tile + (b_row + ni * 8) * 128 + kg * T::kKvBlockBytes + b_off[u],
                         b[ni][0], b[ni][1], b[ni + 1][0], b[ni + 1][1]);
        }
        if (T::kSN % 2 == 1) {
          // x2: lanes 0..15 address rows lane % 8 of the last n8 tile.
          ptx::Ldmatrix2(k_tile + b_last_row * 128 + kg * T::kKvBlockBytes + b_off[u],
                         b[T::kSN - 1][0], b[T::kSN - 1][1]);
        }
#pragma unroll
        for (int mi = 0; mi < T::kSM; ++mi)
#pragma unroll
          for (int ni = 0; ni < T::kSN; ++ni) ptx::MmaBf16(s[mi][ni], a[mi], b[ni][0], b[ni][1]);
      }
    }
  }
};

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_SM80_QK_CUH_
