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
//   F::BytesPerToken(d_qk), F::kStagingBytesPerToken
//                       through F's base struct in config.h (the host sizes
//                       shared memory from the same constants).
//   F::LoadRow<T>(p, slot, ok, sm, stage, row, sub)
//                       called by the kThreadsPerRow threads of one tile row
//                       (sub = 0..7) for every row of a tile, inside that
//                       tile's cp.async group. ok: 0 <= slot < num_kv_slots.
//                       May issue only asynchronous copies (cp.async), into
//                       the stage's bf16 tile or its staging area
//                       (sm.kv_staging_addr + stage * T::kStagingBytes,
//                       kStagingBytesPerToken per row). The validity flag of
//                       the row is written by the caller (GatherKvTile).
//   F::Land<T>(sm, stage, r)
//                       called by every thread once the stage's copies have
//                       completed and the CTA has passed a barrier, before S
//                       reads the tile. Completes the bf16 tile (e.g.
//                       dequantises the staging bytes, zeroing rows whose
//                       sm.valid flag is 0) and, if it wrote shared memory,
//                       ends with PublishSmem<T>() (qk.cuh). A format that
//                       gathers straight into the tile does nothing.
//
// How fp8_ds_mla (656 B/token: 512 e4m3, 4 fp32 scales one per 128 values,
// 64 bf16 rope) fits: KvFp8DsMlaSizes { BytesPerToken = 656,
// kStagingBytesPerToken = 656 } in config.h; KvFp8DsMla : KvFp8DsMlaSizes
// with Elem = unsigned char, LoadRow copying the record's 41 16-byte chunks
// to the staging row, and Land converting e4m3 x scale to bf16 (and copying
// the rope) into the swizzled tile, then PublishSmem<T>(). The codegen names
// the type in the instantiation unit; DecodeMain does not change.
#ifndef KFORGE_SPARSE_MLA_KV_FORMAT_CUH_
#define KFORGE_SPARSE_MLA_KV_FORMAT_CUH_

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
  __device__ __forceinline__ static void Land(const DecodeSmem&, int, const ThreadRoles&) {}
};

// Issues the copies of KV tile `tile` (top-k positions begin + tile *
// kTokenTile ..) into pipeline stage `stage` and records which rows are real
// tokens: an index of -1, one >= num_kv_slots, or a position past the split
// is no token.
template <class T>
__device__ __forceinline__ void GatherKvTile(const DecodeParams& p, const DecodeWork& w,
                                             const DecodeSmem& sm, const ThreadRoles& r, int tile,
                                             int stage) {
  const int base = w.begin + tile * T::kTokenTile;
#pragma unroll
  for (int pass = 0; pass < T::kTokenTile / T::kRowsPerPass; ++pass) {
    const int row = r.row0 + pass * T::kRowsPerPass;
    const int pos = base + row;
    const int slot = pos < w.end ? __ldg(w.idx_row + pos) : -1;
    const bool ok = slot >= 0 && slot < p.num_kv_slots;
    T::Kv::template LoadRow<T>(p, slot, ok, sm, stage, row, r.sub);
    if (r.sub == 0) sm.valid[stage * T::kTokenTile + row] = ok;
  }
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_KV_FORMAT_CUH_
