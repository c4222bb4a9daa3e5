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
//                       kv_row_stride in units of Elem.
//   F::BytesPerToken(d_qk), F::StagingBytesPerToken(d_qk)
//                       through F's base struct in config.h (the host sizes
//                       shared memory from the same constants). Staging 0
//                       makes a direct format (`kStages` bf16 tiles), > 0 a
//                       staged one (one bf16 tile and one staging buffer of
//                       kStagingBytesPerToken per row; StagedPipeline).
//   F::LoadRow<T>(p, slot, ok, sm, stage, row, sub)
//                       called by the kThreadsPerRow threads of one tile row
//                       (sub = 0..7) for every row of a tile, inside that
//                       tile's cp.async group. ok: 0 <= slot < num_kv_slots.
//                       May issue only asynchronous copies (cp.async): a
//                       direct format into bf16 tile `stage`, a staged one
//                       into the staging buffer (sm.kv_staging_addr). The
//                       validity flag of the row is written by the caller
//                       (GatherKvTile).
//   F::Land<T>(sm, r)
//                       called by every thread once the tile's copies have
//                       completed and the CTA has passed a barrier (so the
//                       previous tile's readers are done), before S reads
//                       the tile. A staged format converts the staging
//                       buffer into the bf16 tile (rows of invalid slots
//                       must come out all zero) and ends with
//                       PublishSmem<T>() (qk.cuh); after it returns the
//                       staging buffer takes the next tile. A direct format
//                       does nothing.
//
// Formats: KvBf16 (direct: gathers straight into the tile, Land is empty)
// and KvFp8DsMla (staged: 656-byte records of 512 e4m3, 4 fp32 scales and
// 64 bf16 rope; Land dequantises). The codegen names the type in the
// instantiation unit (KvFormatOf); DecodeMain does not change.
#ifndef KFORGE_SPARSE_MLA_KV_FORMAT_CUH_
#define KFORGE_SPARSE_MLA_KV_FORMAT_CUH_

#include "kforge/common/fp8.cuh"
#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/config.h"
#include "kforge/sparse_mla/decode_traits.cuh"
#include "kforge/sparse_mla/qk.cuh"

namespace kforge {
namespace sparse_mla {

// bf16 cache (1152 B/token for d_qk 576): each row is copied as is, in 16 B
// cp.async chunks; invalid slots are zero-filled by the copy itself.
struct KvBf16 : KvBf16Sizes {
  using Elem = unsigned short;

  template <class T>
  __device__ __forceinline__ static void LoadRow(const DecodeParams& p, int slot, bool ok,
                                                 const DecodeSmem& sm, int stage, int row,
                                                 int sub) {
    static_assert(sizeof(Elem) * T::kDqk == BytesPerToken(T::kDqk),
                  "a bf16 cache row is the d_qk-wide latent row itself");
    const Elem* src = reinterpret_cast<const Elem*>(p.kv);
    if (ok) {
      src += (slot / T::kPageBlock) * p.kv_page_stride + (slot % T::kPageBlock) * p.kv_row_stride;
    }
    const ptx::u32 dst = sm.kv_addr + stage * T::kTileBytes + row * 128 + ((sub ^ (row & 7)) << 4);
#pragma unroll
    for (int j = 0; j < T::kBlocks; ++j) {
      ptx::CpAsync16(dst + j * T::kKvBlockBytes, src + (8 * j + sub) * 8, ok ? 16 : 0);
    }
  }

  template <class T>
  __device__ __forceinline__ static void Land(const DecodeSmem&, const ThreadRoles&) {}
};

// fp8_ds_mla cache (KvFp8DsMlaSizes in config.h: 512 e4m3 + 4 fp32 scales
// + 64 bf16 rope = 656 B/token, 528 without rope). A staged format
// (StagedPipeline): LoadRow copies the whole record into the staging
// buffer; invalid slots are zero-filled, so their values, scales and rope
// are 0 and Land writes zero rows without looking at the validity flags.
// Land converts e4m3 * scale to bf16 in fp32 (the product rounded once to
// fp32, then to bf16; exact for power-of-two scales) and copies the rope,
// into the one bf16 tile.
//
// kScalePow2: the spec's scales are powers of two (DeepSeek-V3.2). Both
// conventions take the same fp32 multiply for now; the parameter exists so
// an exponent-add path can specialise without a new format type.
template <bool kScalePow2>
struct KvFp8DsMla : KvFp8DsMlaSizes {
  using Elem = unsigned char;
  static constexpr bool kPow2Scales = kScalePow2;
  // 16-byte chunks of e4m3 values per record; each fills two bf16 chunks.
  static constexpr int kValueChunks = kLatent / 16;

  template <class T>
  __device__ __forceinline__ static void LoadRow(const DecodeParams& p, int slot, bool ok,
                                                 const DecodeSmem& sm, int, int row, int sub) {
    static_assert(Supports(T::kDv, T::kRope), "fp8_ds_mla: kv_lora_rank 512, rope_dim 0 or 64");
    static_assert(T::kStaged && T::kStagingBytesPerToken == BytesPerToken(T::kDqk),
                  "whole records are staged");
    constexpr int kChunks = BytesPerToken(T::kDqk) / 16;
    const Elem* src = reinterpret_cast<const Elem*>(p.kv);
    if (ok) {
      src += (slot / T::kPageBlock) * p.kv_page_stride + (slot % T::kPageBlock) * p.kv_row_stride;
    }
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

  // Values: thread i converts staged chunk k = i % 32 of row i / 32 (a warp
  // reads one row's 512 contiguous bytes) into bf16 chunks 2 (k % 4) and
  // 2 (k % 4) + 1 of column block k / 4. Lanes of odd blocks store their
  // second chunk first, so each 8-lane phase of a 16-byte store hits eight
  // distinct chunks of 128 bytes: no bank conflicts. Rope: one 16-byte copy
  // per chunk into the last column block.
  template <class T>
  __device__ __forceinline__ static void Land(const DecodeSmem& sm, const ThreadRoles& r) {
    constexpr int kItems = T::kTokenTile * kValueChunks;
    const int tid = r.warp * 32 + r.lane;
    const unsigned char* staged = sm.kv_staging;
    const ptx::u32 staged_addr = sm.kv_staging_addr;
    const ptx::u32 tile = sm.kv_addr;
#pragma unroll
    for (int i0 = 0; i0 < kItems; i0 += T::kThreads) {
      const int i = i0 + tid;
      if (kItems % T::kThreads != 0 && i >= kItems) break;
      const int row = i / kValueChunks;
      const int k = i % kValueChunks;
      const int row_off = row * T::kStagingBytesPerToken;
      ptx::u32 w[4];
      ptx::LdShared128(staged_addr + row_off + 16 * k, w);
      const float scale =
          reinterpret_cast<const float*>(staged + row_off + kScalesOffset)[k * 16 / kScaleGroup] *
          fp8::kE4m3HalfFactor;
      ptx::u32 out[8];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        ptx::u32 h01, h23;
        fp8::E4m3x4ToHalf2(w[q], h01, h23);
        float f0, f1, f2, f3;
        fp8::Half2ToFloat2(h01, f0, f1);
        fp8::Half2ToFloat2(h23, f2, f3);
        out[2 * q] = ptx::PackBf16x2(f0 * scale, f1 * scale);
        out[2 * q + 1] = ptx::PackBf16x2(f2 * scale, f3 * scale);
      }
      // The chunk stored first: 2 (k % 4) in even blocks, 2 (k % 4) + 1 in
      // odd ones (selects, so the warp issues exactly two stores).
      const bool odd_block = (k >> 2) & 1;
      const int first = 2 * (k & 3) + (odd_block ? 1 : 0);
      const ptx::u32 base = tile + (k >> 2) * T::kKvBlockBytes + row * 128;
      const int swz = row & 7;
      ptx::StShared128(base + ((first ^ swz) << 4), odd_block ? out[4] : out[0],
                       odd_block ? out[5] : out[1], odd_block ? out[6] : out[2],
                       odd_block ? out[7] : out[3]);
      ptx::StShared128(base + (((first ^ 1) ^ swz) << 4), odd_block ? out[0] : out[4],
                       odd_block ? out[1] : out[5], odd_block ? out[2] : out[6],
                       odd_block ? out[3] : out[7]);
    }
    if (T::kRope != 0) {
      constexpr int kRopeItems = T::kTokenTile * 8;
#pragma unroll
      for (int i0 = 0; i0 < kRopeItems; i0 += T::kThreads) {
        const int i = i0 + tid;
        if (kRopeItems % T::kThreads != 0 && i >= kRopeItems) break;
        const int row = i / 8;
        const int c = i % 8;
        ptx::u32 w[4];
        ptx::LdShared128(staged_addr + row * T::kStagingBytesPerToken + kRopeOffset + 16 * c, w);
        ptx::StShared128(
            tile + (T::kBlocks - 1) * T::kKvBlockBytes + row * 128 + ((c ^ (row & 7)) << 4), w[0],
            w[1], w[2], w[3]);
      }
    }
    PublishSmem<T>();
  }
};

// The top-k slots of one KV tile that this thread gathers (rows row0 +
// pass * kRowsPerPass), loaded one tile ahead so the index latency is not on
// the gather's path. -1 past the split or the tile range.
template <class T>
struct TileSlots {
  int slot[T::kTokenTile / T::kRowsPerPass];

  __device__ __forceinline__ void Load(const DecodeWork& w, const ThreadRoles& r, int tile) {
    const int base = w.begin + tile * T::kTokenTile;
#pragma unroll
    for (int pass = 0; pass < T::kTokenTile / T::kRowsPerPass; ++pass) {
      const int pos = base + r.row0 + pass * T::kRowsPerPass;
      slot[pass] = tile < w.num_tiles && pos < w.end ? __ldg(w.idx_row + pos) : -1;
    }
  }
};

// Issues the copies of the KV tile whose slots are `s` into pipeline stage
// `stage` (direct formats: its bf16 tile; staged: the staging buffer) and
// records which rows are real tokens: an index of -1, one >= num_kv_slots,
// or a position past the split is no token.
template <class T>
__device__ __forceinline__ void GatherKvTile(const DecodeParams& p, const TileSlots<T>& s,
                                             const DecodeSmem& sm, const ThreadRoles& r,
                                             int stage) {
#pragma unroll
  for (int pass = 0; pass < T::kTokenTile / T::kRowsPerPass; ++pass) {
    const int row = r.row0 + pass * T::kRowsPerPass;
    const int slot = s.slot[pass];
    const bool ok = slot >= 0 && slot < p.num_kv_slots;
    T::Kv::template LoadRow<T>(p, slot, ok, sm, stage, row, r.sub);
    if (r.sub == 0) sm.valid[stage * T::kTokenTile + row] = ok;
  }
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_KV_FORMAT_CUH_
