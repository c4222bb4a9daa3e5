// Sparse MLA decode, split-KV main kernel (generic mma.sync path).
//
// One CTA computes, for one query token, one group of heads and one split of
// the top-k list:  O = softmax(scale * Q K^T) V  over the selected KV rows,
// where K is a gathered latent row (d_qk = d_v + rope wide) and V is its
// first d_v columns (no second load: V is read from the K tile in smem).
//
// Per KV tile of kTokenTile tokens:
//   1. cp.async gathers the rows named by the indices (16 B chunks, 8 threads
//      per row, XOR-swizzled so ldmatrix is conflict-free); invalid slots are
//      zero-filled and masked to -inf.
//   2. S = Q K^T: warps tile S as kWarpsM x kWarpsN blocks of
//      (kSM * 16) x (kSN * 8).
//   3. online softmax in fp32 (base 2); row maxima are exchanged across the
//      kWarpsN warps that share a row through smem; P goes to smem as bf16.
//   4. O += P V: each warp owns kVCols output columns for all heads, so the
//      H x d_v fp32 accumulator is spread over every warp's registers.
// Splits write fp32 partial O and lse to the workspace (combine.cuh merges
// them); a single split writes bf16 O and lse directly.
#ifndef KFORGE_SPARSE_MLA_DECODE_CUH_
#define KFORGE_SPARSE_MLA_DECODE_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/config.h"

namespace kforge {
namespace sparse_mla {

// Instantiated by DecodeTraits only to report a rejected tiling: the
// compiler's "during instantiation of AssertTilingOk<...>" note names the
// TilingError (see CheckDecodeTiling in config.h).
template <TilingError kError>
struct AssertTilingOk {
  static_assert(kError == TilingError::kOk,
                "CheckDecodeTiling (config.h) rejects this DecodeTraits "
                "tiling; the TilingError is this template's argument");
  static constexpr bool value = true;
};

template <int kNumHeads_, int kDv_, int kRope_, int kTopk_, int kHeadTile_,
          int kHeadsPerGroup_, int kTokenTile_, int kStages_, int kWarps_,
          int kPageBlock_, bool kReturnLse_, bool kWgmma_ = false>
struct DecodeTraits {
  static constexpr int kNumHeads = kNumHeads_;
  static constexpr int kDv = kDv_;
  static constexpr int kRope = kRope_;
  static constexpr int kTopk = kTopk_;
  static constexpr int kHeadTile = kHeadTile_;
  static constexpr int kHeadsPerGroup = kHeadsPerGroup_;
  static constexpr int kTokenTile = kTokenTile_;
  static constexpr int kStages = kStages_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kPageBlock = kPageBlock_;
  static constexpr bool kReturnLse = kReturnLse_;
  // S = Q K^T with sm_90a warpgroup MMA (wgmma) instead of mma.sync.
  static constexpr bool kWgmma = kWgmma_;

  // The tiling rule and every derived number come from config.h, which the
  // host codegen evaluates too.
  static constexpr DecodeShape kShape = {
      kDv,    kRope,  kHeadTile, kHeadsPerGroup, kTokenTile,
      kStages, kWarps, kWgmma,   0 /* bf16 KV: nothing staged */};
  static_assert(AssertTilingOk<CheckDecodeTiling(kShape)>::value, "");
  static_assert(kNumHeads >= 1 && kNumHeads <= 128, "1..128 heads");
  static_assert(kPageBlock >= 1, "page block size");

  static constexpr int kThreads = kWarps * 32;
  static constexpr int kNumGroups =
      (kNumHeads + kHeadsPerGroup - 1) / kHeadsPerGroup;
  static constexpr int kDqk = DeriveDecodeDims(kShape).d_qk;
  static constexpr int kMTiles = DeriveDecodeDims(kShape).m_tiles;
  // Q and KV tiles are stored as d_qk / 64 column blocks, each block
  // [rows][128 B] with 16-byte chunk c of row r at c ^ (r & 7): the 128-byte
  // swizzle that wgmma's K-major descriptors read, and conflict-free for
  // ldmatrix on every arch.
  static constexpr int kBlocks = DeriveDecodeDims(kShape).blocks;
  static constexpr int kQBlockBytes = kHeadTile * 128;
  static constexpr int kKvBlockBytes = kTokenTile * 128;
  static constexpr int kTileBytes = kTokenTile * kDqk * 2;
  // S = Q K^T warp layout.
  static constexpr int kWarpsM = DeriveDecodeDims(kShape).warps_m;
  static constexpr int kWarpsN = DeriveDecodeDims(kShape).warps_n;
  static constexpr int kSM = DeriveDecodeDims(kShape).s_m;  // m16 tiles / warp
  static constexpr int kSN = DeriveDecodeDims(kShape).s_n;  // n8 tiles / warp
  // O = P V warp layout: every warp owns all heads and kVCols columns.
  static constexpr int kVCols = DeriveDecodeDims(kShape).v_cols;
  static constexpr int kVN = DeriveDecodeDims(kShape).v_n;
  static constexpr int kPStride = DeriveDecodeDims(kShape).p_stride;
  static constexpr int kRowsPerPass = DeriveDecodeDims(kShape).rows_per_pass;
  // Byte offsets into dynamic shared memory (scalars: device code may read
  // a host constexpr only if it is scalar).
  static constexpr int kSmemQ = MakeDecodeSmemLayout(kShape).q;
  static constexpr int kSmemKv = MakeDecodeSmemLayout(kShape).kv;
  static constexpr int kSmemP = MakeDecodeSmemLayout(kShape).p;
  static constexpr int kSmemRed = MakeDecodeSmemLayout(kShape).red;
  static constexpr int kSmemScale = MakeDecodeSmemLayout(kShape).scale;
  static constexpr int kSmemMax = MakeDecodeSmemLayout(kShape).max;
  static constexpr int kSmemValid = MakeDecodeSmemLayout(kShape).valid;
  static constexpr int kSmemBytes = MakeDecodeSmemLayout(kShape).bytes;
};

template <class T>
__device__ __forceinline__ void DecodeMain(const DecodeParams& p) {
  using ptx::u32;
  extern __shared__ __align__(128) unsigned char smem[];
  // Regions of DecodeSmemLayout (config.h), which also sizes the launch.
  unsigned char* const q_s = smem + T::kSmemQ;
  unsigned char* const kv_s = smem + T::kSmemKv;
  unsigned short* const p_s =
      reinterpret_cast<unsigned short*>(smem + T::kSmemP);
  float* const red_s = reinterpret_cast<float*>(smem + T::kSmemRed);
  float* const scale_s = reinterpret_cast<float*>(smem + T::kSmemScale);
  float* const max_s = reinterpret_cast<float*>(smem + T::kSmemMax);
  int* const valid_s = reinterpret_cast<int*>(smem + T::kSmemValid);

  const int group = blockIdx.x;
  const int split = blockIdx.y;
  const int token = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int head0 = group * T::kHeadsPerGroup;
  const int heads_here = min(T::kHeadsPerGroup, T::kNumHeads - head0);
  const int begin = split * p.tokens_per_split;
  const int end = min(T::kTopk, begin + p.tokens_per_split);
  const int num_tiles =
      end > begin ? (end - begin + T::kTokenTile - 1) / T::kTokenTile : 0;
  const int* const idx_row = p.indices + token * p.indices_stride;

  const u32 q_base = ptx::SmemAddr(q_s);
  if constexpr (T::kWgmma) {
    // The 128-byte swizzle of wgmma descriptors is absolute: atoms must sit
    // on 1024-byte boundaries (dynamic smem starts on one on sm_90).
    if ((q_base & 1023) != 0) __trap();
  }
  const u32 kv_base = ptx::SmemAddr(kv_s);
  const u32 p_base = ptx::SmemAddr(p_s);

  // Gather roles: kThreadsPerRow threads per row, chunk = 8 * j + sub,
  // stored at chunk ^ (row & 7).
  const int sub = tid % kThreadsPerRow;
  const int row0 = tid / kThreadsPerRow;

  {  // Q tile, resident for the whole CTA; padded heads are zero rows.
    const unsigned short* q_tok = p.q + token * p.q_token_stride;
    for (int r = row0; r < T::kHeadTile; r += T::kRowsPerPass) {
      const bool ok = r < heads_here;
      const unsigned short* src =
          q_tok + (ok ? (head0 + r) * p.q_head_stride : 0);
      const u32 dst = q_base + r * 128 + ((sub ^ (r & 7)) << 4);
#pragma unroll
      for (int j = 0; j < T::kBlocks; ++j) {
        ptx::CpAsync16(dst + j * T::kQBlockBytes, src + (8 * j + sub) * 8,
                       ok ? 16 : 0);
      }
    }
  }

  auto load_tile = [&](int tile, int stage) {
    const int base = begin + tile * T::kTokenTile;
#pragma unroll
    for (int pass = 0; pass < T::kTokenTile / T::kRowsPerPass; ++pass) {
      const int r = row0 + pass * T::kRowsPerPass;
      const int pos = base + r;
      const int slot = pos < end ? __ldg(idx_row + pos) : -1;
      const bool ok = slot >= 0 && slot < p.num_kv_slots;
      const unsigned short* src = p.kv;
      if (ok) {
        src += (slot / T::kPageBlock) * p.kv_page_stride +
               (slot % T::kPageBlock) * p.kv_row_stride;
      }
      const u32 dst = kv_base + stage * T::kTileBytes + r * 128 +
                      ((sub ^ (r & 7)) << 4);
#pragma unroll
      for (int j = 0; j < T::kBlocks; ++j) {
        ptx::CpAsync16(dst + j * T::kKvBlockBytes, src + (8 * j + sub) * 8,
                       ok ? 16 : 0);
      }
      if (sub == 0) valid_s[stage * T::kTokenTile + r] = ok;
    }
  };

#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (s < num_tiles) load_tile(s, s);
    ptx::CpAsyncCommit();
  }

  // S-phase position of this warp.
  const int wm = warp % T::kWarpsM;
  const int wn = warp / T::kWarpsM;
  // ldmatrix lane roles. A (16x16 row-major): row lane % 16, chunk lane / 16.
  // B from K rows (non-trans, pairs of n8 tiles): row (lane / 16) * 8 +
  // lane % 8, chunk (lane / 8) % 2. Rows are multiples of 8 plus lane % 8, so
  // the swizzle term is always lane & 7.
  const int sw = lane & 7;
  u32 a_off[4], b_off[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    a_off[u] = ((2 * u + lane / 16) ^ sw) << 4;
    b_off[u] = ((2 * u + (lane / 8) % 2) ^ sw) << 4;
  }
  const u32 a_row = q_base + (wm * T::kSM * 16 + lane % 16) * 128;
  const int b_row = wn * T::kSN * 8 + (lane / 16) * 8 + lane % 8;
  const int b_last_row = (wn * T::kSN + T::kSN - 1) * 8 + lane % 8;

  float o[T::kMTiles][T::kVN][4];
#pragma unroll
  for (int mi = 0; mi < T::kMTiles; ++mi)
#pragma unroll
    for (int ni = 0; ni < T::kVN; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mi][ni][e] = 0.f;
  float m_run[T::kSM][2], l_run[T::kSM][2];
#pragma unroll
  for (int mi = 0; mi < T::kSM; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_run[mi][h] = ptx::NegInf();
      l_run[mi][h] = 0.f;
    }
  // softmax_scale * log2(e): the codegen derives the traits and bakes it in.
  constexpr float kScaleLog2 = T::kScaleLog2;
  // Largest growth (log2 units) of the running max absorbed without a
  // rescale of O; P <= 2^8 = 256.
  constexpr float kRescaleLog2 = 8.f;

  for (int t = 0; t < num_tiles; ++t) {
    ptx::CpAsyncWait<T::kStages - 2>();
    // cp.async wrote through the generic proxy; wgmma reads through the
    // async proxy.
    if constexpr (T::kWgmma) ptx::FenceProxyAsync();
    __syncthreads();
    {
      const int nt = t + T::kStages - 1;
      if (nt < num_tiles) load_tile(nt, nt % T::kStages);
      ptx::CpAsyncCommit();
    }
    const int stage = t % T::kStages;
    const u32 k_tile = kv_base + stage * T::kTileBytes;

    // ---- S = Q K^T ----
    float s[T::kSM][T::kSN][4];
#pragma unroll
    for (int mi = 0; mi < T::kSM; ++mi)
#pragma unroll
      for (int ni = 0; ni < T::kSN; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mi][ni][e] = 0.f;
    if constexpr (T::kWgmma) {
      // Warpgroup wn computes S[0:64, 32 wn : 32 wn + 32) from shared memory
      // descriptors; its 4 warps receive rows 16 * wm.. in the mma.sync C
      // layout, so the softmax below is shared by both paths.
      constexpr int kN = T::kTokenTile / T::kWarpsN;
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
          const ptx::u64 db = ptx::SmemDescSw128(
              k_tile + kg * T::kKvBlockBytes + wn * kN * 128 + u * 32);
          ptx::WgmmaBf16<kN>(s[0], da, db);
        }
      }
      ptx::WgmmaCommit();
      ptx::WgmmaWait0();
#pragma unroll
      for (int ni = 0; ni < T::kSN; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) ptx::FenceOperand(s[0][ni][e]);
    } else {
#pragma unroll 1
      for (int kg = 0; kg < T::kDqk / 64; ++kg) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          u32 a[T::kSM][4];
#pragma unroll
          for (int mi = 0; mi < T::kSM; ++mi) {
            ptx::Ldmatrix4(a_row + mi * 16 * 128 + kg * T::kQBlockBytes + a_off[u],
                           a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
          }
          u32 b[T::kSN][2];
#pragma unroll
          for (int ni = 0; ni + 1 < T::kSN; ni += 2) {
            ptx::Ldmatrix4(
                k_tile + (b_row + ni * 8) * 128 + kg * T::kKvBlockBytes + b_off[u],
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
            for (int ni = 0; ni < T::kSN; ++ni)
              ptx::MmaBf16(s[mi][ni], a[mi], b[ni][0], b[ni][1]);
        }
      }
    }

    // ---- mask, scale, row max ----
    const int* valid = valid_s + stage * T::kTokenTile;
    float mx[T::kSM][2];
#pragma unroll
    for (int mi = 0; mi < T::kSM; ++mi) {
      mx[mi][0] = mx[mi][1] = ptx::NegInf();
#pragma unroll
      for (int ni = 0; ni < T::kSN; ++ni) {
        const int col = (wn * T::kSN + ni) * 8 + 2 * (lane % 4);
        const bool v0 = valid[col], v1 = valid[col + 1];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          s[mi][ni][2 * h] = v0 ? s[mi][ni][2 * h] * kScaleLog2 : ptx::NegInf();
          s[mi][ni][2 * h + 1] =
              v1 ? s[mi][ni][2 * h + 1] * kScaleLog2 : ptx::NegInf();
          mx[mi][h] = fmaxf(mx[mi][h], fmaxf(s[mi][ni][2 * h], s[mi][ni][2 * h + 1]));
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[mi][h] = fmaxf(mx[mi][h], __shfl_xor_sync(0xffffffffu, mx[mi][h], 1));
        mx[mi][h] = fmaxf(mx[mi][h], __shfl_xor_sync(0xffffffffu, mx[mi][h], 2));
      }
    }
    if (T::kWarpsN > 1) {
      if (lane % 4 == 0) {
#pragma unroll
        for (int mi = 0; mi < T::kSM; ++mi)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            red_s[wn * T::kHeadTile + (wm * T::kSM + mi) * 16 + h * 8 + lane / 4] =
                mx[mi][h];
      }
      // Only the kWarpsN warps that share these rows meet here.
      ptx::NamedBarrier(1 + wm, T::kWarpsN * 32);
#pragma unroll
      for (int mi = 0; mi < T::kSM; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = (wm * T::kSM + mi) * 16 + h * 8 + lane / 4;
          float m = red_s[row];
#pragma unroll
          for (int w = 1; w < T::kWarpsN; ++w)
            m = fmaxf(m, red_s[w * T::kHeadTile + row]);
          mx[mi][h] = m;
        }
    }

    // ---- online softmax, P to smem ----
#pragma unroll
    for (int mi = 0; mi < T::kSM; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = (wm * T::kSM + mi) * 16 + h * 8 + lane / 4;
        const float m_old = m_run[mi][h];
        float m_new = fmaxf(m_old, mx[mi][h]);
        // Lazy rescaling: keep the running max unless the tile raises it by
        // more than kRescaleLog2, so P stays <= 2^kRescaleLog2 (exact enough
        // in fp32 sums and bf16 P) and O is rarely rescaled. The first valid
        // tile always moves it (x - (-inf) = inf); -inf - -inf is NaN and
        // keeps it.
        if (!(m_new - m_old > kRescaleLog2)) m_new = m_old;
        // All -inf so far (every token masked): subtract 0, not -inf, so
        // exp2 gives 0 rather than NaN.
        const float m_use = m_new == ptx::NegInf() ? 0.f : m_new;
        const float scale = m_new == m_old ? 1.f : ptx::Exp2(m_old - m_use);
        m_run[mi][h] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int ni = 0; ni < T::kSN; ++ni) {
          const float p0 = ptx::Exp2(s[mi][ni][2 * h] - m_use);
          const float p1 = ptx::Exp2(s[mi][ni][2 * h + 1] - m_use);
          sum += p0 + p1;
          const int col = (wn * T::kSN + ni) * 8 + 2 * (lane % 4);
          *reinterpret_cast<u32*>(p_s + row * T::kPStride + col) =
              ptx::PackBf16x2(p0, p1);
        }
        l_run[mi][h] = l_run[mi][h] * scale + sum;
        if (wn == 0 && lane % 4 == 0) scale_s[row] = scale;
      }
    }
    __syncthreads();

    // ---- O = O * scale + P V ----
    {
      float sc[T::kMTiles][2];
      bool rescale = false;
#pragma unroll
      for (int mi = 0; mi < T::kMTiles; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sc[mi][h] = scale_s[mi * 16 + h * 8 + lane / 4];
          rescale |= sc[mi][h] != 1.f;
        }
      // Warp-uniform skip: after the first tiles the max rarely moves.
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int mi = 0; mi < T::kMTiles; ++mi)
#pragma unroll
          for (int ni = 0; ni < T::kVN; ++ni) {
            o[mi][ni][0] *= sc[mi][0];
            o[mi][ni][1] *= sc[mi][0];
            o[mi][ni][2] *= sc[mi][1];
            o[mi][ni][3] *= sc[mi][1];
          }
      }
    }
#pragma unroll
    for (int kk = 0; kk < T::kTokenTile / 16; ++kk) {
      u32 a[T::kMTiles][4];
#pragma unroll
      for (int mi = 0; mi < T::kMTiles; ++mi) {
        ptx::Ldmatrix4(p_base + ((mi * 16 + lane % 16) * T::kPStride +
                                 kk * 16 + (lane / 16) * 8) * 2,
                       a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
      }
      const u32 v_row =
          k_tile + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * 128;
#pragma unroll
      for (int np = 0; np < T::kVN / 2; ++np) {
        const int chunk = warp * (T::kVCols / 8) + 2 * np + lane / 16;
        u32 b0, b1, b2, b3;
        ptx::Ldmatrix4Trans(
            v_row + (chunk / 8) * T::kKvBlockBytes + (((chunk % 8) ^ sw) << 4),
            b0, b1, b2, b3);
#pragma unroll
        for (int mi = 0; mi < T::kMTiles; ++mi) {
          ptx::MmaBf16(o[mi][2 * np], a[mi], b0, b1);
          ptx::MmaBf16(o[mi][2 * np + 1], a[mi], b2, b3);
        }
      }
    }
  }
  ptx::CpAsyncWait<0>();

  // ---- epilogue: row sums across warps, normalise, write ----
#pragma unroll
  for (int mi = 0; mi < T::kSM; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[mi][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = (wm * T::kSM + mi) * 16 + h * 8 + lane / 4;
      if (lane % 4 == 0) {
        red_s[wn * T::kHeadTile + row] = l;
        if (wn == 0) max_s[row] = m_run[mi][h];
      }
    }
  __syncthreads();

  const bool single = p.num_splits == 1;
  const long long split_token = (long long)split * p.num_tokens + token;
#pragma unroll
  for (int mi = 0; mi < T::kMTiles; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = mi * 16 + h * 8 + lane / 4;
      if (row >= heads_here) continue;
      float l = 0.f;
#pragma unroll
      for (int w = 0; w < T::kWarpsN; ++w) l += red_s[w * T::kHeadTile + row];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      // max_s is in the scaled log2 domain; lse is reported in natural log.
      const float lse =
          l > 0.f ? (max_s[row] + __log2f(l)) * 0.69314718055994531f
                  : ptx::NegInf();
      const int head = head0 + row;
      if (single) {
        unsigned short* dst =
            p.out + token * p.out_token_stride + head * p.out_head_stride;
#pragma unroll
        for (int ni = 0; ni < T::kVN; ++ni) {
          const int col = warp * T::kVCols + ni * 8 + 2 * (lane % 4);
          *reinterpret_cast<u32*>(dst + col) = ptx::PackBf16x2(
              o[mi][ni][2 * h] * inv, o[mi][ni][2 * h + 1] * inv);
        }
        if (T::kReturnLse && p.lse != nullptr && warp == 0 && lane % 4 == 0)
          p.lse[(long long)token * T::kNumHeads + head] = lse;
      } else {
        float* dst = p.o_accum + (split_token * T::kNumHeads + head) * T::kDv;
#pragma unroll
        for (int ni = 0; ni < T::kVN; ++ni) {
          const int col = warp * T::kVCols + ni * 8 + 2 * (lane % 4);
          *reinterpret_cast<float2*>(dst + col) =
              make_float2(o[mi][ni][2 * h] * inv, o[mi][ni][2 * h + 1] * inv);
        }
        if (warp == 0 && lane % 4 == 0)
          p.lse_accum[split_token * T::kNumHeads + head] = lse;
      }
    }
  }
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_DECODE_CUH_
