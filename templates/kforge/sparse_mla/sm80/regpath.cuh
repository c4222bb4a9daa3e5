// The register pipeline of the sparse MLA main kernel (Pipeline::kRegister,
// tiling.h RegisterPipeline; mma.sync, every arch): a staged KV format's
// 16-head tile with no KV tile, no staging buffer and no Q tile in shared
// memory.
//
// Warp w (of 4) owns a quarter of the latent columns: V columns
// [128 w, 128 w + 128) as items 8 w .. 8 w + 7 (16 columns each) and, with
// rope 64, rope item 32 + w. For every token of a tile, thread (n, q) =
// (lane / 4, lane % 4) of the warp holds token 8 j + n's items 8 w + q and
// 8 w + 4 + q (its KV format's RegLoad / RegItem, kv_format.cuh) and rope
// columns 4 q .. 4 q + 3. Those registers are, as they are, the B operand
// of mma.sync m16n8k16 for S = Q K^T once the 16 columns of each k16 block
// are taken in the order the threads hold them: k16 block b of the group of
// items 4 g .. 4 g + 3 is columns 16 (4 g + q) + 4 b + {0, 1} (slots 2 q,
// 2 q + 1) and + {2, 3} (slots 2 q + 8, 2 q + 9). Q's A operand is loaded
// once, into registers, in the same order (a dot product does not care how
// its terms are ordered). So a tile's K never touches shared memory.
//
// Per tile (kTokenTile tokens, the next tile's bytes loading meanwhile):
//   1. convert this thread's items, S_w = Q_w K_w^T (the warp's columns),
//      and store its V items into the warp's own V tile (shared memory);
//   2. issue the next tile's loads into the registers just freed;
//   3. partial S tiles to shared memory, one CTA barrier, every warp sums
//      the four in the same order: each holds the whole (identical) S;
//   4. mask, scale and online softmax in registers; P stays in registers
//      (the C fragments of two n8 tiles are the A fragment of a k16 tile);
//   5. O += P V over the warp's own V columns from its own V tile, which no
//      other warp touches (a __syncwarp orders it).
// Partial S buffers alternate between tiles, so step 3's barrier is the
// only one in the loop. O is the same fragment layout as PvMmaSync's, so
// the epilogue is shared; every warp's row sum is the row's (RowSum).
#ifndef KFORGE_SPARSE_MLA_SM80_REGPATH_CUH_
#define KFORGE_SPARSE_MLA_SM80_REGPATH_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/common/decode_phases.cuh"
#include "kforge/sparse_mla/common/decode_traits.cuh"
#include "kforge/sparse_mla/common/kv_format.cuh"
#include "kforge/sparse_mla/common/mma.cuh"
#include "kforge/sparse_mla/common/params.h"
#include "kforge/sparse_mla/common/tiling.h"

namespace kforge {
namespace sparse_mla {

// This thread's quarter of Q as mma.sync A fragments: qa[gi][b] is k16
// block b of its warp's item group gi, qr the rope block.
template <class T>
struct RegQ {
  ptx::u32 qa[2][4][4];
  ptx::u32 qr[4];

  __device__ __forceinline__ void Load(const DecodeParams& p, const DecodeWork& w, int warp,
                                       int lane) {
    const int n = lane / 4, q = lane % 4;
    const unsigned short* q_tok = p.q + w.token * p.q_token_stride;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = n + 8 * hh;
      const bool ok = row < w.heads_here;
      const unsigned char* q_row = reinterpret_cast<const unsigned char*>(
          q_tok + (ok ? (w.head0 + row) * p.q_head_stride : 0));
#pragma unroll
      for (int gi = 0; gi < 2; ++gi) {
        const unsigned char* src = q_row + 2 * 16 * (8 * warp + 4 * gi + q);
        const uint4 lo = RegLd16(src, ok), hi = RegLd16(src + 16, ok);
        const ptx::u32 words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          qa[gi][b][hh] = words[2 * b];
          qa[gi][b][2 + hh] = words[2 * b + 1];
        }
      }
      if constexpr (T::kRope != 0) {
        const uint2 rope = RegLd8(q_row + 2 * (T::kDv + 16 * warp + 4 * q), ok);
        qr[hh] = rope.x;
        qr[2 + hh] = rope.y;
      }
    }
  }
};

// E: the entry (DecodeEntry), its epilogue.
template <class T, class E>
__device__ __forceinline__ void DecodeRegPath(const DecodeParams& p) {
  static_assert(
      E::kPipeline == Pipeline::kRegister && T::kRegPath && RegisterPipelineCovers(T::kShape),
      "the register pipeline's shape (tiling.h RegisterPipelineCovers)");
  static_assert(T::kExtraTopk == 0, "the register pipeline reads one cache");
  static_assert(T::kVCols == 128 && T::kOM == 1 && T::kON == 16, "a warp's 128 V columns");
  using Kv = typename T::Kv;
  constexpr int kN8 = T::kTokenTile / 8;  // n8 tiles of S (tokens) per tile
  constexpr int kVBlockBytes = T::kTokenTile * 128;
  extern __shared__ __align__(128) unsigned char smem[];
  const DecodeSmem sm = CarveDecodeSmem<T>(smem);
  DecodeWork w = MakeDecodeWork<T>(p);
  const ThreadRoles r = MakeThreadRoles<T>();
  const int warp = r.warp, lane = r.lane, n = lane / 4, q = lane % 4;

  BeginDecode<T, E>(p, w);

  const KvView v = MainKv(p);
  // Token 8 j + n of tile `tile`: its slot, or -1 past the split or length.
  auto slot_of = [&](int tile, int j) {
    const int pos = w.begin + tile * T::kTokenTile + 8 * j + n;
    return tile < w.num_tiles && pos < w.main_end ? __ldg(w.idx_row + pos) : -1;
  };
  typename Kv::RegRaw raw[kN8];
  // Bit 4 c + j: token 8 j + c of the loaded tile is a real token (ballots
  // over the lanes q == 0, whose bits sit at 4 c, shifted by j).
  ptx::u32 valid = 0;
  auto load_tile = [&](const int(&slot)[kN8]) {
    valid = 0;
#pragma unroll
    for (int j = 0; j < kN8; ++j) {
      const bool ok = v.Holds(slot[j]);
      Kv::template RegLoad<T, T::kPageBlock>(v, slot[j], ok, warp, q, raw[j]);
      valid |= __ballot_sync(0xffffffffu, ok && q == 0) << j;
    }
  };
  int slot[kN8];
#pragma unroll
  for (int j = 0; j < kN8; ++j) slot[j] = slot_of(0, j);
  load_tile(slot);
#pragma unroll
  for (int j = 0; j < kN8; ++j) slot[j] = slot_of(1, j);

  RegQ<T> qf;
  qf.Load(p, w, warp, lane);

  const PvPhase<T> pv(r);
  OAccum<T> o;
#pragma unroll
  for (int ni = 0; ni < T::kON; ++ni)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[0][ni][e] = 0.f;
  RowStats<T> stats;
  stats.Init();

  const ptx::u32 v_tile = sm.kv_addr + warp * (T::kVCols / 64) * kVBlockBytes;
  float4* part = reinterpret_cast<float4*>(sm.p);  // [2][kWarps][kN8][32]

  for (int t = 0; t < w.num_tiles; ++t) {
    // 1. S over this warp's columns; its V items to its own V tile (after
    // its PV reads of the last tile).
    float s[kN8][4];
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kN8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
      const int row = 8 * j + n;
#pragma unroll
      for (int gi = 0; gi < 2; ++gi) {
        ptx::u32 kv[8];
        Kv::RegItem(raw[j], gi, warp, q, kv);
        const ptx::u32 base = v_tile + gi * kVBlockBytes + row * 128;
        ptx::StShared128(base + (((2 * q) ^ (row & 7)) << 4), kv[0], kv[1], kv[2], kv[3]);
        ptx::StShared128(base + (((2 * q + 1) ^ (row & 7)) << 4), kv[4], kv[5], kv[6], kv[7]);
#pragma unroll
        for (int b = 0; b < 4; ++b) ptx::MmaBf16(s[j], qf.qa[gi][b], kv[2 * b], kv[2 * b + 1]);
      }
      if constexpr (T::kRope != 0) {
        ptx::u32 kr[2];
        Kv::RegRope(raw[j], kr);
        ptx::MmaBf16(s[j], qf.qr, kr[0], kr[1]);
      }
    }
    const ptx::u32 valid_now = valid;
    // 2. The next tile's bytes into the registers just freed; the slots of
    // the one after.
    if (t + 1 < w.num_tiles) load_tile(slot);
#pragma unroll
    for (int j = 0; j < kN8; ++j) slot[j] = slot_of(t + 2, j);

    // 3. The partial tiles, summed in warp order by every warp.
    float4* mine = part + ((t & 1) * T::kWarps + warp) * kN8 * 32;
#pragma unroll
    for (int j = 0; j < kN8; ++j)
      mine[j * 32 + lane] = make_float4(s[j][0], s[j][1], s[j][2], s[j][3]);
    __syncthreads();
    const float4* all = part + (t & 1) * T::kWarps * kN8 * 32;
#pragma unroll
    for (int j = 0; j < kN8; ++j) {
      float4 x = all[j * 32 + lane];
#pragma unroll
      for (int ww = 1; ww < T::kWarps; ++ww) {
        const float4 y = all[(ww * kN8 + j) * 32 + lane];
        x.x += y.x;
        x.y += y.y;
        x.z += y.z;
        x.w += y.w;
      }
      s[j][0] = x.x;
      s[j][1] = x.y;
      s[j][2] = x.z;
      s[j][3] = x.w;
    }

    // 4. Mask, scale, row max (the row is spread over the 4 lanes of a quad).
    constexpr float kScaleLog2 = T::kScaleLog2;
    float mx[2] = {ptx::NegInf(), ptx::NegInf()};
#pragma unroll
    for (int j = 0; j < kN8; ++j) {
      const bool v0 = (valid_now >> (8 * q + j)) & 1u, v1 = (valid_now >> (8 * q + 4 + j)) & 1u;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        s[j][2 * hh] = v0 ? s[j][2 * hh] * kScaleLog2 : ptx::NegInf();
        s[j][2 * hh + 1] = v1 ? s[j][2 * hh + 1] * kScaleLog2 : ptx::NegInf();
        mx[hh] = fmaxf(mx[hh], fmaxf(s[j][2 * hh], s[j][2 * hh + 1]));
      }
    }
    float sc[2];
    bool rescale = false;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
      mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
      const RowMaxStep step = MoveRowMax(stats.m[0][hh], mx[hh]);
      const float m_use = step.m_use;
      sc[hh] = step.scale;
      rescale |= sc[hh] != 1.f;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kN8; ++j) {
        s[j][2 * hh] = ptx::Exp2(s[j][2 * hh] - m_use);
        s[j][2 * hh + 1] = ptx::Exp2(s[j][2 * hh + 1] - m_use);
        sum += s[j][2 * hh] + s[j][2 * hh + 1];
      }
      stats.l[0][hh] = stats.l[0][hh] * sc[hh] + sum;
    }
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int ni = 0; ni < T::kON; ++ni) {
        o[0][ni][0] *= sc[0];
        o[0][ni][1] *= sc[0];
        o[0][ni][2] *= sc[1];
        o[0][ni][3] *= sc[1];
      }
    }

    // 5. O += P V: P from registers, V from this warp's tile (PvMmaSync's
    // ldmatrix addressing on a tile of kVCols columns).
    __syncwarp();
    const int sw = lane & 7;
#pragma unroll
    for (int kk = 0; kk < kN8 / 2; ++kk) {
      const ptx::u32 a[4] = {ptx::PackBf16x2(s[2 * kk][0], s[2 * kk][1]),
                             ptx::PackBf16x2(s[2 * kk][2], s[2 * kk][3]),
                             ptx::PackBf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             ptx::PackBf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const ptx::u32 v_row = v_tile + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * 128;
#pragma unroll
      for (int np = 0; np < T::kVN / 2; ++np) {
        const int chunk = 2 * np + lane / 16;
        ptx::u32 b0, b1, b2, b3;
        ptx::Ldmatrix4Trans(v_row + (chunk / 8) * kVBlockBytes + (((chunk % 8) ^ sw) << 4), b0, b1,
                            b2, b3);
        ptx::MmaBf16(o[0][2 * np], a, b0, b1);
        ptx::MmaBf16(o[0][2 * np + 1], a, b2, b3);
      }
    }
  }
  FinishDecode<T, E>(p, w, sm, r, pv, o, stats);
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_SM80_REGPATH_CUH_
