// S = Q K^T for one KV tile: two implementations of the same phase, picked
// by DecodeTraits::kWgmma through QkPhase<T>.
//
// Both produce this warp's (kSM * 16) x (kSN * 8) block of S (rows of the
// head tile, columns of the KV tile; warp position wm, wn) in the mma.sync
// m16n8 C-fragment layout, unscaled, so the softmax phases are shared.
// Q (resident) and K (one pipeline stage) are bf16 in the 128-byte-swizzled
// column blocks of decode_traits.cuh. Start(s, k_tile) begins the product
// and Finish(s) completes it: wgmma runs asynchronously in between (the
// caller issues the next tile's gather there), mma.sync does all the work
// in Start. Each implementation also says what it needs of shared memory:
//   CheckSmemBase(q_addr)  once, before anything is written to it;
//   FenceSmemWrites()      by every thread after its last shared-memory
//                          write of a KV tile (cp.async landed, or a KV
//                          format's conversion) and before the barrier that
//                          publishes the tile (PublishSmem).
#ifndef KFORGE_SPARSE_MLA_QK_CUH_
#define KFORGE_SPARSE_MLA_QK_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/decode_traits.cuh"

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
  __device__ __forceinline__ static void FenceSmemWrites() {}

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

// sm_90a warpgroup MMA: warpgroup wn computes S[0:64, kN wn : kN wn + kN)
// (kN = kTokenTile / kWarpsN: 32 of 64 tokens each, or all 64 on the
// warp-specialised pipeline's first warpgroup) straight from shared-memory
// descriptors (no ldmatrix); its 4 warps receive rows 16 * wm.. in the
// mma.sync C layout. WgmmaCovers (config.h) is the shape rule.
template <class T>
struct QkWgmma {
  static_assert(T::kWgmma && WgmmaCovers(T::kShape), "QkWgmma is selected by DecodeTraits::kWgmma");
  static constexpr int kN = T::kTokenTile / T::kWarpsN;
  static constexpr bool kAsync = true;

  ptx::u32 q_base;
  int wn;

  // The 128-byte swizzle of wgmma descriptors is absolute: atoms must sit on
  // 1024-byte boundaries (dynamic smem starts on one on sm_90).
  __device__ __forceinline__ static void CheckSmemBase(ptx::u32 q_addr) {
    if ((q_addr & 1023) != 0) __trap();
  }
  // cp.async (and st.shared) write through the generic proxy; wgmma reads
  // through the async proxy.
  __device__ __forceinline__ static void FenceSmemWrites() { ptx::FenceProxyAsync(); }

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
    // Fully unrolled: with a rolled block loop 128 heads x batch 128 ran
    // 250.5 us instead of 243.8 us on the H200 (BENCH.md).
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

// The S = Q K^T implementation of a traits type.
template <class T>
using QkPhase = typename Choose<T::kWgmma, QkWgmma<T>, QkMmaSync<T>>::type;

// Makes this thread's shared-memory writes of a KV tile visible to the whole
// CTA and to the S phase's reads.
template <class T>
__device__ __forceinline__ void PublishSmem() {
  QkPhase<T>::FenceSmemWrites();
  __syncthreads();
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_QK_CUH_
