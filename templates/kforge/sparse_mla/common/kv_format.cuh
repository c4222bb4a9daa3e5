// KV cache formats: the seam between the cache layout in global memory and
// the kernel's bf16 KV tile in shared memory.
//
// Whatever the format, a pipeline stage ends as the same bf16 tile: row r
// (one top-k position) holds the token's d_qk latent values, V being the
// first d_v of them, stored as d_qk / 64 column blocks of
// [kTokenTile][128 B], 16-byte chunk c of row r at chunk c ^ (r & 7) (the
// 128-byte swizzle that ldmatrix and the wgmma descriptors read). Rows of
// invalid slots must be all zeros: a masked token's P is 0, and 0 * NaN in
// the PV MMA would poison O.
//
// A format type F provides (all static; T is the DecodeTraits type):
//   F::Elem             element type the cache is addressed in; the runtime
//                       passes DecodeParams::kv, kv_page_stride and
//                       kv_row_stride (and the extra cache's) in units of
//                       Elem.
//   F::BytesPerToken(d_qk), F::StagingBytesPerToken(d_qk)
//                       through F's base struct in kv_layout.h (the host sizes
//                       shared memory from the same constants). Staging 0
//                       makes a direct format (`kStages` bf16 tiles), > 0 a
//                       staged one (one bf16 tile and one staging buffer of
//                       kStagingBytesPerToken per row; StagedPipeline).
//   F::LoadRow<T, kPageBlock>(v, slot, ok, sm, stage, row, sub)
//                       called by the kThreadsPerRow threads of one tile row
//                       (sub = 0..7) for every row of a tile, inside that
//                       tile's cp.async group, for the cache `v` (a KvView:
//                       the main cache or the extra one, kPageBlock tokens
//                       per page). ok: 0 <= slot < v.num_slots.
//                       May issue only asynchronous copies (cp.async): a
//                       direct format into bf16 tile `stage`, a staged one
//                       into the staging buffer (sm.kv_staging_addr); in a
//                       staged pipeline (T::kStaged: the other cache is
//                       staged) a direct format stages its row too. The
//                       validity flag of the row is written by the caller
//                       (GatherKvTile).
//   F::Land<T>(sm, r)
//                       called by every thread once the tile's copies have
//                       completed and the CTA has passed a barrier (so the
//                       previous tile's readers are done), before S reads
//                       the tile. A staged format converts the staging
//                       buffer into the bf16 tile (rows of invalid slots
//                       must come out all zero) and ends with
//                       PublishSmem<T>() (decode_traits.cuh); after it
//                       returns the staging buffer takes the next tile. A
//                       direct format does nothing, or in a staged pipeline
//                       copies its staged rows into the tile.
//
// A staged format may also provide the register pipeline's part
// (sm80/regpath.cuh; tiling.h RegisterPipeline): warp w (of 4) owns latent
// items 8 w .. 8 w + 7 (an item is 16 columns: V columns [128 w, 128 w +
// 128)) and, with rope 64, rope item d_v / 16 + w; thread q = lane % 4 of a
// token takes items 8 w + q and 8 w + 4 + q whole and columns 4 q .. 4 q + 3
// of the rope item:
//   F::RegRaw           this thread's raw bytes of one token
//   F::RegLoad<T, kPageBlock>(v, slot, ok, w, q, raw)
//                       global loads into raw (zeros where !ok)
//   F::RegItem<kInProducer = false, kInWsProducer = false>(raw, gi, w, q, out)
//                       item 8 w + 4 gi + q as 16 bf16 (out[k] holds
//                       columns 2 k, 2 k + 1), as Land would store it;
//                       kInProducer: called by the crossover pair's
//                       producer, whose loop only converts and stores
//                       (a format may branch there: nvfp4_ds_mla);
//                       kInWsProducer: by either warp-specialised
//                       producer (fp8_ds_mla's power-of-two route)
//   F::kConstChunkOrder  whether the producers store its items with the
//                       chunk order known at compile time (StoreChunkPair)
//   F::kWsRowLoad       whether the unpaired warp-specialised producer
//                       loads a row through the format's WsRow,
//                       WsRowLoad<T, kPageBlock>(v, slot, ok, q, raw) and
//                       WsRowItem(raw, u, gi, out) (wider loads than
//                       RegLoad's units, the rope stored as loaded:
//                       sm90/wspath.cuh ConvertWsRow)
//   F::RegRope(raw, out)
//                       the rope columns 4 q .. 4 q + 3 as two bf16 pairs
//                       (only formats with rope columns need it)
//   F::RegPrefetch<T, kPageBlock>(v, slot, ok)
//                       the warp-specialised producer's L2 prefetch of a
//                       token's bytes two tiles ahead (sm90/wspath.cuh), for
//                       a format whose tuning asks for it (compiler/tuning.h
//                       FormatTuning: where it prefetches and whether the
//                       crossover pair's producer loads ahead are measured
//                       per GPU and reach the traits as the schedule's)
//
// Formats: KvBf16 (direct: gathers straight into the tile, Land is empty)
// and the staged ones, whose Land dequantises: KvFp8DsMla (656-byte records
// of 512 e4m3, 4 fp32 scales and 64 bf16 rope), KvFp8DsMlaV4 (DeepSeek-V4,
// 584 B page-blocked), KvMxfp8DsMlaV41 (DeepSeek-V4.1, 528 B page-blocked)
// and KvNvfp4DsMla (352 B of e2m1, e4m3 rope and e4m3 scales); their byte
// layouts are in kv_layout.h. The model's KV format table (model/spec.cc,
// KvFormats) names the type for the codegen; DecodeMain does not change.
#ifndef KFORGE_SPARSE_MLA_COMMON_KV_FORMAT_CUH_
#define KFORGE_SPARSE_MLA_COMMON_KV_FORMAT_CUH_

#include "kforge/common/fp8.cuh"
#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/common/decode_traits.cuh"
#include "kforge/sparse_mla/common/kv_layout.h"
#include "kforge/sparse_mla/common/params.h"
#include "kforge/sparse_mla/common/tiling.h"

namespace kforge {
namespace sparse_mla {

// One KV cache as LoadRow addresses it: DecodeParams' main cache or its
// extra one (strides in the format's Elem).
struct KvView {
  const void* base;
  long long page_stride;
  long long row_stride;
  long long num_slots;
  // Whether `slot` names a record of this cache (0 <= slot < num_slots):
  // the `ok` every load takes (-1 and out-of-range slots read nothing).
  __device__ __forceinline__ bool Holds(long long slot) const {
    return slot >= 0 && slot < num_slots;
  }
};

__device__ __forceinline__ KvView MainKv(const DecodeParams& p) {
  return {p.kv, p.kv_page_stride, p.kv_row_stride, p.num_kv_slots};
}

__device__ __forceinline__ KvView ExtraKv(const DecodeParams& p) {
  return {p.extra_kv, p.extra_kv_page_stride, p.extra_kv_row_stride, p.extra_num_kv_slots};
}

// The first element of slot `slot`'s record in cache v (a format stored
// token by token); the cache's base for an invalid slot (`ok` false), whose
// copies read nothing.
template <class Elem, int kPageBlock>
__device__ __forceinline__ const Elem* RowOf(const KvView& v, int slot, bool ok) {
  const Elem* src = reinterpret_cast<const Elem*>(v.base);
  if (ok) src += (slot / kPageBlock) * v.page_stride + (slot % kPageBlock) * v.row_stride;
  return src;
}

template <class T, class F, int kPageBlock>
__device__ __forceinline__ void StageRecord(const KvView& v, int slot, bool ok,
                                            const DecodeSmem& sm, int row, int sub);

// The shared-window address of 16-byte chunk `chunk` (columns 8 chunk ..
// 8 chunk + 7) of row `row` of the bf16 KV tile at `tile`: column block
// chunk / 8, chunk chunk % 8 swizzled by the row.
template <class T>
__device__ __forceinline__ ptx::u32 TileChunkAddr(ptx::u32 tile, int row, int chunk) {
  return tile + (chunk >> 3) * T::kKvBlockBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// bf16 cache (1152 B/token for d_qk 576): each row is copied as is, in 16 B
// cp.async chunks; invalid slots are zero-filled by the copy itself. In a
// staged pipeline (the other cache is quantised) the row is staged whole
// and Land copies it into the tile.
struct KvBf16 : KvBf16Sizes {
  using Elem = unsigned short;

  template <class T, int kPageBlock>
  __device__ __forceinline__ static void LoadRow(const KvView& v, int slot, bool ok,
                                                 const DecodeSmem& sm, int stage, int row,
                                                 int sub) {
    static_assert(sizeof(Elem) * T::kDqk == BytesPerToken(T::kDqk),
                  "a bf16 cache row is the d_qk-wide latent row itself");
    if constexpr (T::kStaged) {
      StageRecord<T, KvBf16, kPageBlock>(v, slot, ok, sm, row, sub);
    } else {
      const Elem* src = RowOf<Elem, kPageBlock>(v, slot, ok);
      const ptx::u32 dst =
          sm.kv_addr + stage * T::kTileBytes + row * 128 + ((sub ^ (row & 7)) << 4);
#pragma unroll
      for (int j = 0; j < T::kBlocks; ++j) {
        ptx::CpAsync16(dst + j * T::kKvBlockBytes, src + (8 * j + sub) * 8, ok ? 16 : 0);
      }
    }
  }

  template <class T>
  __device__ __forceinline__ static void Land(const DecodeSmem& sm, const ThreadRoles& r) {
    if constexpr (T::kStaged) {
      // Whole rows of 16-byte chunks, a rolled loop: unrolled beside the
      // other cache's conversion it spilled (16 heads, fp8_ds_mla + bf16).
      constexpr int kItems = T::kTokenTile * (T::kDqk / 8);
#pragma unroll 1
      for (int i = r.warp * 32 + r.lane; i < kItems; i += T::kThreads) {
        const int row = i / (T::kDqk / 8), chunk = i % (T::kDqk / 8);
        ptx::u32 w[4];
        ptx::LdShared128(sm.kv_staging_addr + row * T::kStagingBytesPerToken + 16 * chunk, w);
        ptx::StShared128(TileChunkAddr<T>(sm.kv_addr, row, chunk), w[0], w[1], w[2], w[3]);
      }
      PublishSmem<T>();
    }
  }
};

// ---------------------------------------------------------------------------
// What the staged formats share. A staged format's Land converts its
// staging rows into the bf16 tile in items of 16 latent columns: item k of a
// row is columns [16 k, 16 k + 16), bf16 chunks 2 k and 2 k + 1 of the row,
// in column block k / 4.

// Calls fn(row, k) for every (row, item k < kPerRow) of a tile, spread over
// the CTA's threads (consecutive threads take consecutive items of a row).
template <class T, int kPerRow, class Fn>
__device__ __forceinline__ void ForEachRowItem(const ThreadRoles& r, Fn&& fn) {
  constexpr int kItems = T::kTokenTile * kPerRow;
  const int tid = r.warp * 32 + r.lane;
#pragma unroll
  for (int i0 = 0; i0 < kItems; i0 += T::kThreads) {
    const int i = i0 + tid;
    if (kItems % T::kThreads != 0 && i >= kItems) break;
    fn(i / kPerRow, i % kPerRow);
  }
}

// Stores the two 16-byte chunks `first` and first ^ 1 of column block
// `block` of tile row `row` (out: 16 bf16, low column first) by store(addr,
// 4 words): st.shared (StoreItem) or a store into the crossover peer's tile
// (sm90/wspath.cuh). Lanes of odd column blocks store their second chunk
// first, so each 8-lane phase of a 16-byte store hits eight distinct chunks
// of 128 bytes when a warp converts one row's consecutive items: no bank
// conflicts.
template <class T, class Store>
__device__ __forceinline__ void StoreChunkPair(ptx::u32 tile, int row, int block, int first,
                                               bool odd_block, const ptx::u32 (&out)[8],
                                               Store&& store) {
  const ptx::u32 base = tile + block * T::kKvBlockBytes + row * 128;
  const int swz = row & 7;
  store(base + ((first ^ swz) << 4), odd_block ? out[4] : out[0], odd_block ? out[5] : out[1],
        odd_block ? out[6] : out[2], odd_block ? out[7] : out[3]);
  store(base + (((first ^ 1) ^ swz) << 4), odd_block ? out[0] : out[4], odd_block ? out[1] : out[5],
        odd_block ? out[2] : out[6], odd_block ? out[3] : out[7]);
}
// Item k (16 columns) of tile row `row`: column block k / 4, chunks
// 2 (k % 4) and + 1.
template <class T, class Store>
__device__ __forceinline__ void StoreItemWith(ptx::u32 tile, int row, int k,
                                              const ptx::u32 (&out)[8], Store&& store) {
  const bool odd_block = (k >> 2) & 1;
  StoreChunkPair<T>(tile, row, k >> 2, 2 * (k & 3) + (odd_block ? 1 : 0), odd_block, out, store);
}
// StoreItemWith's store into this CTA's shared memory.
struct StoreShared128 {
  __device__ __forceinline__ void operator()(ptx::u32 addr, ptx::u32 a, ptx::u32 b, ptx::u32 c,
                                             ptx::u32 d) const {
    ptx::StShared128(addr, a, b, c, d);
  }
};
template <class T>
__device__ __forceinline__ void StoreItem(ptx::u32 tile, int row, int k, const ptx::u32 (&out)[8]) {
  StoreItemWith<T>(tile, row, k, out, StoreShared128{});
}

// An e4m3 code's value from E4m3x4ToHalf2's half (which is short of
// kE4m3HalfFactor on the software path). The factor is applied to the value,
// never folded into a scale: a scale near the fp32 maximum times 2^8 would
// overflow where the product with the code does not.
__device__ __forceinline__ float E4m3Value(float half_value) {
  return fp8::kE4m3HalfFactor == 1.f ? half_value : half_value * fp8::kE4m3HalfFactor;
}

// 16 e4m3 codes (w, low byte first) times `scale` as 16 bf16: the product
// in fp32, rounded once to bf16 (exact for power-of-two scales in range).
// kPow2Scale (a power-of-two scale): each code to bf16 first (exact: an
// e4m3 value has 4 significant bits), then one bf16x2 multiply by the scale
// (fma with -0, which keeps a zero's sign), one instruction fewer a pair of
// codes. The product is as exact and rounded once for every scale bf16
// holds, every power of two from 2^-133 (its least subnormal) up; a smaller
// scale, which no quantiser writes, rounds to 0 or 2^-133 (its tile's
// values are below 2^-124).
template <bool kPow2Scale = false>
__device__ __forceinline__ void E4m3ItemToBf16(const ptx::u32 (&w)[4], float scale,
                                               ptx::u32 (&out)[8]) {
  [[maybe_unused]] ptx::u32 s2 = 0u;
  if constexpr (kPow2Scale) s2 = ptx::PackBf16x2(scale, scale);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    ptx::u32 h01, h23;
    fp8::E4m3x4ToHalf2(w[q], h01, h23);
    float f0, f1, f2, f3;
    fp8::Half2ToFloat2(h01, f0, f1);
    fp8::Half2ToFloat2(h23, f2, f3);
    if constexpr (kPow2Scale) {
      out[2 * q] = ptx::FmaBf16x2(ptx::PackBf16x2(E4m3Value(f0), E4m3Value(f1)), s2, 0x80008000u);
      out[2 * q + 1] =
          ptx::FmaBf16x2(ptx::PackBf16x2(E4m3Value(f2), E4m3Value(f3)), s2, 0x80008000u);
    } else {
      out[2 * q] = ptx::PackBf16x2(E4m3Value(f0) * scale, E4m3Value(f1) * scale);
      out[2 * q + 1] = ptx::PackBf16x2(E4m3Value(f2) * scale, E4m3Value(f3) * scale);
    }
  }
}

// One e4m3 code (the low byte of `code`) as a float.
__device__ __forceinline__ float E4m3ToFloat(ptx::u32 code) {
  ptx::u32 h01, h23;
  fp8::E4m3x4ToHalf2(code & 0xFFu, h01, h23);
  float lo, hi;
  fp8::Half2ToFloat2(h01, lo, hi);
  return E4m3Value(lo);
}

// A ue8m0 scale, 2^(e - 127): e = 0 is 2^-127 (an fp32 subnormal), 255 is
// NaN (as OCP MX defines it).
__device__ __forceinline__ float Ue8m0ToFloat(ptx::u32 e) {
  return e == 0 ? __uint_as_float(0x00400000u)
                : (e == 255 ? __uint_as_float(0x7FFFFFFFu) : __uint_as_float(e << 23));
}

// 16 e2m1 codes (w, two per byte, the low nibble first) times an e4m3
// `scale` as 16 bf16, in bf16x2 arithmetic: fp8::E2m1x2ToBf16x2Bits gives
// value * 2^-126 (code 1 a bf16 subnormal), times 2^8, then times scale *
// 2^118 (at most 448 * 2^118 < 2^127). Exact, as the fp32 products rounded
// once were: e2m1 has 2 significant bits and an e4m3 scale 4, so every
// product fits bf16's 8 and is normal (0.5 * 2^-9 at the least). Two bf16x2
// multiplies a pair of codes where the fp32 route took two conversions, two
// multiplies and a pack (BENCH.md, "e2m1 to bf16 in bf16 arithmetic").
// kScaleBranch: where |scale| < 4 (scale * 2^126 is a bf16), one multiply
// instead; a branch per item, which paid only in the crossover pair's
// producer and cost the register pipeline and the unpaired producer
// (BENCH.md, "e2m1 to bf16 in bf16 arithmetic").
template <bool kScaleBranch = false>
__device__ __forceinline__ void E2m1ItemToBf16(const ptx::u32 (&w)[2], float scale,
                                               ptx::u32 (&out)[8]) {
  static_assert(fp8::kE2m1Bf16Exp == 8 + 118, "the two factors below");
  constexpr ptx::u32 kTwoTo8 = (127u + 8u) * 0x00800080u;  // bf16x2 bits of 2^8, 2^8
  constexpr ptx::u32 kNegZero = 0x80008000u;               // the addend that keeps a product's -0
  // Codes 2 b and 2 b + 1 as bf16x2 bits of value * 2^-126.
  auto codes = [&w](int b) {
    return fp8::E2m1x2ToBf16x2Bits((w[b >> 2] >> (8 * (b & 3))) & 0xFFu);
  };
  if (kScaleBranch && fabsf(scale) < 4.f) {
    const float s = scale * 0x1p126f;
    const ptx::u32 s2 = ptx::PackBf16x2(s, s);
#pragma unroll
    for (int b = 0; b < 8; ++b) out[b] = ptx::FmaBf16x2(codes(b), s2, kNegZero);
    return;
  }
  const float s = scale * 0x1p118f;
  const ptx::u32 s2 = ptx::PackBf16x2(s, s);
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    out[b] = ptx::FmaBf16x2(ptx::FmaBf16x2(codes(b), kTwoTo8, kNegZero), s2, kNegZero);
  }
}

// The register pipelines' loads (sm80/regpath.cuh, sm90/wspath.cuh): read-only
// global memory, zeros for an invalid slot. kL2Prefetch 0 is a plain load;
// 256 adds ld's `.L2::256B` prefetch-size hint, so the L2 fetches the
// aligned 256 bytes around a missed sector from DRAM at once (F::kL2Prefetch:
// a format whose records measured faster with it).
template <int kL2Prefetch = 0>
__device__ __forceinline__ uint4 RegLd16(const unsigned char* p, bool ok) {
  static_assert(kL2Prefetch == 0 || kL2Prefetch == 256, "a plain load or .L2::256B");
  if constexpr (kL2Prefetch == 0) {
    return ok ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0u, 0u, 0u, 0u);
  } else {
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (ok)
      asm("ld.global.nc.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
          : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
          : "l"(p));
    return v;
  }
}
template <int kL2Prefetch = 0>
__device__ __forceinline__ uint2 RegLd8(const unsigned char* p, bool ok) {
  static_assert(kL2Prefetch == 0 || kL2Prefetch == 256, "a plain load or .L2::256B");
  if constexpr (kL2Prefetch == 0) {
    return ok ? __ldg(reinterpret_cast<const uint2*>(p)) : make_uint2(0u, 0u);
  } else {
    uint2 v = make_uint2(0u, 0u);
    if (ok) asm("ld.global.nc.L2::256B.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
  }
}
template <int kL2Prefetch = 0>
__device__ __forceinline__ ptx::u32 RegLd4(const unsigned char* p, bool ok) {
  static_assert(kL2Prefetch == 0 || kL2Prefetch == 256, "a plain load or .L2::256B");
  if constexpr (kL2Prefetch == 0) {
    return ok ? __ldg(reinterpret_cast<const unsigned int*>(p)) : 0u;
  } else {
    ptx::u32 v = 0u;
    if (ok) asm("ld.global.nc.L2::256B.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
    return v;
  }
}
__device__ __forceinline__ ptx::u32 RegLd2(const unsigned char* p, bool ok) {
  return ok ? static_cast<ptx::u32>(__ldg(reinterpret_cast<const unsigned short*>(p))) : 0u;
}
__device__ __forceinline__ ptx::u32 RegLd1(const unsigned char* p, bool ok) {
  return ok ? static_cast<ptx::u32>(__ldg(p)) : 0u;
}

// 16 e4m3 codes of a uint4 times `scale` (E4m3ItemToBf16).
template <bool kPow2Scale = false>
__device__ __forceinline__ void E4m3Item16ToBf16(const uint4& d, float scale, ptx::u32 (&out)[8]) {
  const ptx::u32 w[4] = {d.x, d.y, d.z, d.w};
  E4m3ItemToBf16<kPow2Scale>(w, scale, out);
}

// Copies `kChunks` 16-byte chunks of bf16 columns from staging offset
// `staged_offset` of each row into the tile's chunks first_chunk.. (8 per
// 64-column block), swizzled.
template <class T, int kChunks>
__device__ __forceinline__ void CopyBf16Chunks(const DecodeSmem& sm, const ThreadRoles& r,
                                               int staged_offset, int first_chunk) {
  ForEachRowItem<T, kChunks>(r, [&](int row, int c) {
    ptx::u32 w[4];
    ptx::LdShared128(sm.kv_staging_addr + row * T::kStagingBytesPerToken + staged_offset + 16 * c,
                     w);
    const int chunk = first_chunk + c;
    ptx::StShared128(TileChunkAddr<T>(sm.kv_addr, row, chunk), w[0], w[1], w[2], w[3]);
  });
}

// LoadRow of a format F stored one record per token: copies the whole
// record (whole 16-byte chunks) into staging row `row`; an invalid slot
// copies zeros.
template <class T, class F, int kPageBlock>
__device__ __forceinline__ void StageRecord(const KvView& v, int slot, bool ok,
                                            const DecodeSmem& sm, int row, int sub) {
  constexpr int kRecord = F::BytesPerToken(T::kDqk);
  static_assert(
      !F::kPageBlocked && T::kStaged && T::kStagingBytesPerToken >= kRecord && kRecord % 16 == 0,
      "whole records of whole 16-byte chunks are staged");
  constexpr int kChunks = kRecord / 16;
  const unsigned char* src =
      reinterpret_cast<const unsigned char*>(RowOf<typename F::Elem, kPageBlock>(v, slot, ok));
  const ptx::u32 bytes = ok ? 16 : 0;
  const ptx::u32 staged = sm.kv_staging_addr + row * T::kStagingBytesPerToken;
#pragma unroll
  for (int j = 0; j < (kChunks + kThreadsPerRow - 1) / kThreadsPerRow; ++j) {
    const int c = j * kThreadsPerRow + sub;
    if (kChunks % kThreadsPerRow == 0 || c < kChunks) {
      ptx::CpAsync16(staged + 16 * c, src + 16 * c, bytes);
    }
  }
}

// A page-blocked format F's (kv_layout.h) data row and scale row of a slot:
// within a page all kPageBlock data rows come first, then the scale rows.
// An invalid slot gives page 0's first rows, for loads that are then
// predicated off or zero-filled.
struct PageBlockedRows {
  const unsigned char* data;
  const unsigned char* scales;
};
template <class F, int kPageBlock>
__device__ __forceinline__ PageBlockedRows PageBlockedRowsOf(const KvView& v, int slot, bool ok) {
  const unsigned char* page = reinterpret_cast<const unsigned char*>(v.base);
  int i = 0;
  if (ok) {
    page += (slot / kPageBlock) * v.page_stride;
    i = slot % kPageBlock;
  }
  return {page + i * F::kDataBytes, page + kPageBlock * F::kDataBytes + i * F::kScaleBytes};
}

// LoadRow of a page-blocked format F (kv_layout.h): the token's data row to
// staging offset 0 and its scale row right after it (kDataBytes); an
// invalid slot copies zeros (so its scales are ue8m0 0 and its values 0).
template <class T, class F, int kPageBlock>
__device__ __forceinline__ void StagePageBlockedRecord(const KvView& v, int slot, bool ok,
                                                       const DecodeSmem& sm, int row, int sub) {
  static_assert(F::kPageBlocked && T::kStaged && F::kDataBytes % 16 == 0 &&
                    (F::kScaleBytes == 8 || F::kScaleBytes == 16) &&
                    T::kStagingBytesPerToken >= F::kDataBytes + F::kScaleBytes,
                "a page-blocked record: whole 16-byte data chunks and one 8- or 16-byte scale row");
  constexpr int kDataChunks = F::kDataBytes / 16;
  constexpr int kCopies = kDataChunks + 1;  // the data chunks, then the scale row
  const PageBlockedRows rows = PageBlockedRowsOf<F, kPageBlock>(v, slot, ok);
  const unsigned char* data = rows.data;
  const unsigned char* scales = rows.scales;
  const ptx::u32 staged = sm.kv_staging_addr + row * T::kStagingBytesPerToken;
#pragma unroll
  for (int j = 0; j < (kCopies + kThreadsPerRow - 1) / kThreadsPerRow; ++j) {
    const int c = j * kThreadsPerRow + sub;
    if (c < kDataChunks) {
      ptx::CpAsync16(staged + 16 * c, data + 16 * c, ok ? 16 : 0);
    } else if (c == kDataChunks) {
      if (F::kScaleBytes == 16) {
        ptx::CpAsync16(staged + F::kDataBytes, scales, ok ? 16 : 0);
      } else {
        ptx::CpAsync8(staged + F::kDataBytes, scales, ok ? 8 : 0);
      }
    }
  }
}

// fp8_ds_mla cache (KvFp8DsMlaSizes in kv_layout.h: 512 e4m3 + 4 fp32 scales
// + 64 bf16 rope = 656 B/token, 528 without rope). Staged whole; Land
// converts e4m3 * scale to bf16 and copies the rope into the last block.
// Invalid slots stage zeros, so their values, scales and rope are 0 and
// Land writes zero rows without looking at the validity flags.
//
// kScalePow2: the spec's scales are powers of two (DeepSeek-V3.2). Both
// conventions take the same fp32 multiply for now; the parameter exists so
// an exponent-add path can specialise without a new format type.
template <bool kScalePow2>
struct KvFp8DsMla : KvFp8DsMlaSizes {
  using Elem = unsigned char;
  static constexpr bool kPow2Scales = kScalePow2;

  template <class T, int kPageBlock>
  __device__ __forceinline__ static void LoadRow(const KvView& v, int slot, bool ok,
                                                 const DecodeSmem& sm, int, int row, int sub) {
    static_assert(Supports(T::kDv, T::kRope), "fp8_ds_mla: kv_lora_rank 512, rope_dim 0 or 64");
    StageRecord<T, KvFp8DsMla, kPageBlock>(v, slot, ok, sm, row, sub);
  }

  template <class T>
  __device__ __forceinline__ static void Land(const DecodeSmem& sm, const ThreadRoles& r) {
    ForEachRowItem<T, kLatent / 16>(r, [&](int row, int k) {
      const int row_off = row * T::kStagingBytesPerToken;
      ptx::u32 w[4], out[8];
      ptx::LdShared128(sm.kv_staging_addr + row_off + 16 * k, w);
      E4m3ItemToBf16(w,
                     reinterpret_cast<const float*>(sm.kv_staging + row_off +
                                                    kScalesOffset)[k * 16 / kScaleGroup],
                     out);
      StoreItem<T>(sm.kv_addr, row, k, out);
    });
    if (T::kRope != 0) CopyBf16Chunks<T, 8>(sm, r, kRopeOffset, kLatent / 8);
    PublishSmem<T>();
  }

  // Register pipeline: items 8 w + q and 8 w + 4 + q share scale w (128
  // columns per scale).
  struct RegRaw {
    uint4 d[2];
    float scale;
    uint2 rope;
  };
  template <class T, int kPageBlock>
  __device__ __forceinline__ static void RegLoad(const KvView& v, int slot, bool ok, int w, int q,
                                                 RegRaw& raw) {
    static_assert(Supports(T::kDv, T::kRope), "fp8_ds_mla: kv_lora_rank 512, rope_dim 0 or 64");
    const unsigned char* rec = RowOf<Elem, kPageBlock>(v, slot, ok);
    raw.d[0] = RegLd16<kL2Prefetch>(rec + 16 * (8 * w + q), ok);
    raw.d[1] = RegLd16<kL2Prefetch>(rec + 16 * (8 * w + 4 + q), ok);
    raw.scale = __uint_as_float(RegLd4<kL2Prefetch>(rec + kScalesOffset + 4 * w, ok));
    raw.rope = T::kRope != 0 ? RegLd8<kL2Prefetch>(rec + kRopeOffset + 32 * w + 8 * q, ok)
                             : make_uint2(0u, 0u);
  }
  // RegLoad's loads ask for the 256 bytes around each miss (RegLd16): the
  // warp-specialised producer, bound by its loads' latency, ran 128 x 32 and
  // 128 x 128 4-5% faster on the H200; the register pipeline and batch 1
  // unchanged (BENCH.md, "L2 prefetch-size hint"). The other records
  // measured no faster or slower with it.
  static constexpr int kL2Prefetch = 256;
  // The producers: stores in a compile-time chunk order and, for
  // power-of-two scales, one bf16x2 multiply (H100: 128 x 128 239 -> 221
  // us; BENCH.md "Issue 45: the fp8 producer's instructions"). The register
  // pipeline keeps the fp32 route: with the other it spilled 8 bytes on
  // sm_80 at 255 registers.
  static constexpr bool kConstChunkOrder = true;
  template <bool kInProducer = false, bool kInWsProducer = false>
  __device__ __forceinline__ static void RegItem(const RegRaw& raw, int gi, int, int,
                                                 ptx::u32 (&out)[8]) {
    E4m3Item16ToBf16<kPow2Scales && kInWsProducer>(raw.d[gi], raw.scale, out);
  }
  __device__ __forceinline__ static void RegRope(const RegRaw& raw, ptx::u32 (&out)[2]) {
    out[0] = raw.rope.x;
    out[1] = raw.rope.y;
  }

  // The unpaired warp-specialised producer's row (kWsRowLoad): lane q's part
  // of one record in 16-byte loads only: items 8 u + 4 gi + q (d[2 u + gi],
  // as RegLoad's), the four scales at once and rope bytes 32 q .. 32 q + 31
  // (columns 16 q .. 16 q + 15, stored as they are: chunks d_v / 8 + 2 q and
  // + 1). 11 loads a row where four RegLoads take 16 (four 4-byte scale
  // loads, four 8-byte rope loads), and 2 rope stores where RegRope's units
  // take 8. Power-of-two scales only: the fp32 route's conversion needs
  // more registers beside a WsRow, and its producer spilled 32-56 bytes
  // (64 heads, even at 144 registers).
  static constexpr bool kWsRowLoad = kScalePow2;
  struct WsRow {
    uint4 d[8];
    uint4 scales;
    uint4 rope[2];
  };
  template <class T, int kPageBlock>
  __device__ __forceinline__ static void WsRowLoad(const KvView& v, int slot, bool ok, int q,
                                                   WsRow& raw) {
    static_assert(Supports(T::kDv, T::kRope), "fp8_ds_mla: kv_lora_rank 512, rope_dim 0 or 64");
    static_assert(kScalesOffset % 16 == 0 && kRopeOffset % 16 == 0, "16-byte loads");
    const unsigned char* rec = RowOf<Elem, kPageBlock>(v, slot, ok);
#pragma unroll
    for (int i = 0; i < 8; ++i) raw.d[i] = RegLd16<kL2Prefetch>(rec + 16 * (4 * i + q), ok);
    raw.scales = RegLd16<kL2Prefetch>(rec + kScalesOffset, ok);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      raw.rope[i] = T::kRope != 0 ? RegLd16<kL2Prefetch>(rec + kRopeOffset + 32 * q + 16 * i, ok)
                                  : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  // Item 8 u + 4 gi + q of the row as 16 bf16 (RegItem's values).
  __device__ __forceinline__ static void WsRowItem(const WsRow& raw, int u, int gi,
                                                   ptx::u32 (&out)[8]) {
    const ptx::u32 s =
        u == 0 ? raw.scales.x : (u == 1 ? raw.scales.y : (u == 2 ? raw.scales.z : raw.scales.w));
    E4m3Item16ToBf16<kPow2Scales>(raw.d[2 * u + gi], __uint_as_float(s), out);
  }
};

// The ue8m0 page-blocked records (S: their Sizes in kv_layout.h): kE4m3Values
// e4m3 columns with a ue8m0 scale per kScaleGroup, then any columns left
// as bf16, data rows then scale rows per page. DeepSeek-V4
// (KvFp8DsMlaV4Sizes: 448 e4m3 per 64, 64 bf16) and V4.1
// (KvMxfp8DsMlaV41Sizes: 512 e4m3 per 32).
template <class S>
struct KvUe8m0PageBlocked : S {
  using Elem = unsigned char;

  template <class T, int kPageBlock>
  __device__ __forceinline__ static void LoadRow(const KvView& v, int slot, bool ok,
                                                 const DecodeSmem& sm, int, int row, int sub) {
    static_assert(S::Supports(T::kDv, T::kRope),
                  "a V4 / V4.1 record: kv_lora_rank 512, rope_dim 0");
    StagePageBlockedRecord<T, KvUe8m0PageBlocked, kPageBlock>(v, slot, ok, sm, row, sub);
  }

  template <class T>
  __device__ __forceinline__ static void Land(const DecodeSmem& sm, const ThreadRoles& r) {
    ForEachRowItem<T, S::kE4m3Values / 16>(r, [&](int row, int k) {
      const int row_off = row * T::kStagingBytesPerToken;
      ptx::u32 w[4], out[8];
      ptx::LdShared128(sm.kv_staging_addr + row_off + 16 * k, w);
      const ptx::u32 e = sm.kv_staging[row_off + S::kDataBytes + k * 16 / S::kScaleGroup];
      E4m3ItemToBf16(w, Ue8m0ToFloat(e), out);
      StoreItem<T>(sm.kv_addr, row, k, out);
    });
    if constexpr (S::kE4m3Values < S::kLatent) {
      CopyBf16Chunks<T, (S::kLatent - S::kE4m3Values) / 8>(sm, r, S::kE4m3Values,
                                                           S::kE4m3Values / 8);
    }
    PublishSmem<T>();
  }

  // Register pipeline. The bf16 columns (V4: items 28..31) are the second
  // group of warp kBf16Warp, 32 bytes an item (d and hi).
  static constexpr int kBf16Warp = S::kE4m3Values / 128;
  static_assert(S::kE4m3Values == S::kLatent || S::kE4m3Values % 128 == 64,
                "bf16 columns make up a warp's second group of items");
  struct RegRaw {
    uint4 d[2];
    uint4 hi;
    ptx::u32 e[2];
  };
  template <class T, int kPageBlock>
  __device__ __forceinline__ static void RegLoad(const KvView& v, int slot, bool ok, int w, int q,
                                                 RegRaw& raw) {
    static_assert(S::Supports(T::kDv, T::kRope),
                  "a V4 / V4.1 record: kv_lora_rank 512, rope_dim 0");
    const PageBlockedRows rows = PageBlockedRowsOf<S, kPageBlock>(v, slot, ok);
    const unsigned char* data = rows.data;
    const unsigned char* scales = rows.scales;
    raw.hi = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int gi = 0; gi < 2; ++gi) {
      const int k = 8 * w + 4 * gi + q;
      if (S::kE4m3Values < S::kLatent && gi == 1 && w == kBf16Warp) {
        const unsigned char* src = data + S::kE4m3Values + 32 * (k - S::kE4m3Values / 16);
        raw.d[gi] = RegLd16(src, ok);
        raw.hi = RegLd16(src + 16, ok);
        raw.e[gi] = 0u;
      } else {
        raw.d[gi] = RegLd16(data + 16 * k, ok);
        raw.e[gi] = RegLd1(scales + k * 16 / S::kScaleGroup, ok);
      }
    }
  }
  // The token's data row (one bulk prefetch; sm_90+) and scale row into L2.
  template <class T, int kPageBlock>
  __device__ __forceinline__ static void RegPrefetch(const KvView& v, int slot, bool ok) {
    static_assert(S::kDataBytes % 16 == 0, "a data row is whole 16-byte chunks");
    if (!ok) return;
    const PageBlockedRows rows = PageBlockedRowsOf<S, kPageBlock>(v, slot, ok);
    ptx::BulkPrefetchL2(rows.data, S::kDataBytes);
    ptx::PrefetchL2(rows.scales);
  }
  // Not measured with the compile-time chunk order (fp8_ds_mla's).
  static constexpr bool kConstChunkOrder = false;
  static constexpr bool kWsRowLoad = false;
  template <bool kInProducer = false, bool kInWsProducer = false>
  __device__ __forceinline__ static void RegItem(const RegRaw& raw, int gi, int w, int,
                                                 ptx::u32 (&out)[8]) {
    if (S::kE4m3Values < S::kLatent && gi == 1 && w == kBf16Warp) {
      out[0] = raw.d[1].x;
      out[1] = raw.d[1].y;
      out[2] = raw.d[1].z;
      out[3] = raw.d[1].w;
      out[4] = raw.hi.x;
      out[5] = raw.hi.y;
      out[6] = raw.hi.z;
      out[7] = raw.hi.w;
    } else {
      E4m3Item16ToBf16(raw.d[gi], Ue8m0ToFloat(raw.e[gi]), out);
    }
  }
};

using KvFp8DsMlaV4 = KvUe8m0PageBlocked<KvFp8DsMlaV4Sizes>;
using KvMxfp8DsMlaV41 = KvUe8m0PageBlocked<KvMxfp8DsMlaV41Sizes>;

// nvfp4_ds_mla cache (KvNvfp4DsMlaSizes): 512 e2m1 columns with e4m3
// scales per 16 (permuted), 64 unscaled e4m3 rope columns; one record per
// token. No arch's fp4 conversion is used: e2m1 -> bf16 is a few integer
// ops and two bf16x2 multiplies (E2m1ItemToBf16) on every arch.
struct KvNvfp4DsMla : KvNvfp4DsMlaSizes {
  using Elem = unsigned char;

  template <class T, int kPageBlock>
  __device__ __forceinline__ static void LoadRow(const KvView& v, int slot, bool ok,
                                                 const DecodeSmem& sm, int, int row, int sub) {
    static_assert(Supports(T::kDv, T::kRope), "nvfp4_ds_mla: kv_lora_rank 512, rope_dim 64");
    StageRecord<T, KvNvfp4DsMla, kPageBlock>(v, slot, ok, sm, row, sub);
  }

  template <class T>
  __device__ __forceinline__ static void Land(const DecodeSmem& sm, const ThreadRoles& r) {
    // Latent items: 8 bytes of e2m1 codes and one scale each.
    ForEachRowItem<T, kLatent / kScaleGroup>(r, [&](int row, int k) {
      const int row_off = row * T::kStagingBytesPerToken;
      const uint2 codes = *reinterpret_cast<const uint2*>(sm.kv_staging + row_off + 8 * k);
      const ptx::u32 w[2] = {codes.x, codes.y};
      ptx::u32 out[8];
      E2m1ItemToBf16(w, E4m3ToFloat(sm.kv_staging[row_off + ScaleByte(k)]), out);
      StoreItem<T>(sm.kv_addr, row, k, out);
    });
    // Rope items: 16 e4m3 codes each, scale 1, into the last block.
    ForEachRowItem<T, 4>(r, [&](int row, int k) {
      ptx::u32 w[4], out[8];
      ptx::LdShared128(sm.kv_staging_addr + row * T::kStagingBytesPerToken + kRopeOffset + 16 * k,
                       w);
      E4m3ItemToBf16(w, 1.f, out);
      StoreItem<T>(sm.kv_addr, row, kLatent / 16 + k, out);
    });
    PublishSmem<T>();
  }

  // Register pipeline: item k = 8 w + 4 gi + q has its scale at ScaleByte(k)
  // = kScalesOffset + 8 q + 2 w + gi (both in one 16-bit load); rope item w's
  // columns 4 q.. are 4 e4m3 bytes.
  struct RegRaw {
    uint2 d[2];
    ptx::u32 scales;
    ptx::u32 rope;
  };
  template <class T, int kPageBlock>
  __device__ __forceinline__ static void RegLoad(const KvView& v, int slot, bool ok, int w, int q,
                                                 RegRaw& raw) {
    static_assert(Supports(T::kDv, T::kRope), "nvfp4_ds_mla: kv_lora_rank 512, rope_dim 64");
    const unsigned char* rec = RowOf<Elem, kPageBlock>(v, slot, ok);
    raw.d[0] = RegLd8(rec + 8 * (8 * w + q), ok);
    raw.d[1] = RegLd8(rec + 8 * (8 * w + 4 + q), ok);
    raw.scales = RegLd2(rec + ScaleByte(8 * w + q), ok);
    raw.rope = RegLd4(rec + kRopeOffset + 16 * w + 4 * q, ok);
  }
  // With the compile-time chunk order (fp8_ds_mla's) its unpaired
  // producer (the wide cluster entry) spilled 8 bytes; not measured.
  static constexpr bool kConstChunkOrder = false;
  static constexpr bool kWsRowLoad = false;
  template <bool kInProducer = false, bool kInWsProducer = false>
  __device__ __forceinline__ static void RegItem(const RegRaw& raw, int gi, int, int,
                                                 ptx::u32 (&out)[8]) {
    const ptx::u32 w[2] = {raw.d[gi].x, raw.d[gi].y};
    // Both items' e4m3 scales in one conversion (the two calls share it).
    ptx::u32 h01, h23;
    fp8::E4m3x4ToHalf2(raw.scales & 0xFFFFu, h01, h23);
    float s0, s1;
    fp8::Half2ToFloat2(h01, s0, s1);
    E2m1ItemToBf16<kInProducer>(w, E4m3Value(gi == 0 ? s0 : s1), out);
  }
  __device__ __forceinline__ static void RegRope(const RegRaw& raw, ptx::u32 (&out)[2]) {
    ptx::u32 h01, h23;
    fp8::E4m3x4ToHalf2(raw.rope, h01, h23);
    float f0, f1, f2, f3;
    fp8::Half2ToFloat2(h01, f0, f1);
    fp8::Half2ToFloat2(h23, f2, f3);
    out[0] = ptx::PackBf16x2(E4m3Value(f0), E4m3Value(f1));
    out[1] = ptx::PackBf16x2(E4m3Value(f2), E4m3Value(f3));
  }
};

// The slots of one KV tile that this thread gathers (rows row0 + pass *
// kRowsPerPass: the whole CTA's share by default, the warp-specialised
// producer's with its own row count), loaded one tile ahead so the index
// latency is not on the gather's path, and which cache the tile reads
// (DecodeWork: the split's top-k tiles, then its extra ones). -1 past the
// split or the list's length.
template <class T, int kRowsPerPass = T::kRowsPerPass>
struct TileSlots {
  static constexpr int kPasses = T::kTokenTile / kRowsPerPass;
  static_assert(T::kTokenTile % kRowsPerPass == 0, "whole passes of the gathering threads");
  int slot[kPasses];
  bool extra;

  __device__ __forceinline__ void Load(const DecodeWork& w, int row0, int tile) {
    extra = T::kExtraTopk > 0 && tile >= w.main_tiles;
    const int base = extra ? w.extra_begin + (tile - w.main_tiles) * T::kTokenTile
                           : w.begin + tile * T::kTokenTile;
    const int end = extra ? w.extra_end : w.main_end;
    // Extra position pos is extra index pos - kMainSpan.
    const int* row = extra ? w.extra_idx_row : w.idx_row;
    const int first = extra ? T::kMainSpan : 0;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int pos = base + row0 + pass * kRowsPerPass;
      slot[pass] = tile < w.num_tiles && pos < end ? __ldg(row + (pos - first)) : -1;
    }
  }
};

// Issues the copies of the KV tile whose slots are `s` into pipeline stage
// `stage` (direct formats: its bf16 tile; staged: the staging buffer) from
// the tile's cache, and records which rows are real tokens: an index of -1,
// one >= the cache's slot count, or a position past the split is no token.
// This thread copies its part `sub` (of kThreadsPerRow) of rows row0 +
// pass * kRowsPerPass.
template <class T, int kRowsPerPass>
__device__ __forceinline__ void GatherKvTile(const DecodeParams& p,
                                             const TileSlots<T, kRowsPerPass>& s,
                                             const DecodeSmem& sm, int row0, int sub, int stage) {
  const bool extra = T::kExtraTopk > 0 && s.extra;
  const KvView v = extra ? ExtraKv(p) : MainKv(p);
#pragma unroll
  for (int pass = 0; pass < TileSlots<T, kRowsPerPass>::kPasses; ++pass) {
    const int row = row0 + pass * kRowsPerPass;
    const int slot = s.slot[pass];
    const bool ok = v.Holds(slot);
    if constexpr (T::kExtraTopk > 0) {
      if (extra) {
        T::ExtraKv::template LoadRow<T, T::kExtraPageBlock>(v, slot, ok, sm, stage, row, sub);
      } else {
        T::Kv::template LoadRow<T, T::kPageBlock>(v, slot, ok, sm, stage, row, sub);
      }
    } else {
      T::Kv::template LoadRow<T, T::kPageBlock>(v, slot, ok, sm, stage, row, sub);
    }
    if (sub == 0) sm.valid[stage * T::kTokenTile + row] = ok;
  }
}

// Lands tile t of the work item (KV format Land of the cache it reads).
template <class T>
__device__ __forceinline__ void LandKvTile(const DecodeWork& w, int t, const DecodeSmem& sm,
                                           const ThreadRoles& r) {
  // Two caches of one format land alike: one copy of the conversion.
  if constexpr (T::kExtraTopk > 0 && !IsSame<typename T::Kv, typename T::ExtraKv>::value) {
    if (t >= w.main_tiles) {
      T::ExtraKv::template Land<T>(sm, r);
      return;
    }
  }
  T::Kv::template Land<T>(sm, r);
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_COMMON_KV_FORMAT_CUH_
