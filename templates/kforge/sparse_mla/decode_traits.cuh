// Compile-time traits of the sparse MLA main kernel and the per-CTA context
// its phases share (shared-memory pointers, the work item, thread roles).
// Every number here is derived from config.h (DecodeShape -> DecodeDims,
// DecodeSmemLayout), which the host codegen uses too.
#ifndef KFORGE_SPARSE_MLA_DECODE_TRAITS_CUH_
#define KFORGE_SPARSE_MLA_DECODE_TRAITS_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/config.h"

namespace kforge {
namespace sparse_mla {

// Choose<c, A, B>::type is A if c, else B (std::conditional, which NVRTC
// units cannot include); picks a phase's implementation from the traits.
template <bool kCond, class A, class B>
struct Choose {
  using type = A;
};
template <class A, class B>
struct Choose<false, A, B> {
  using type = B;
};

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

// KvFormat_: a KV cache format type (kv_format.cuh), e.g. KvBf16.
template <int kNumHeads_, int kDv_, int kRope_, int kTopk_, int kHeadTile_, int kHeadsPerGroup_,
          int kTokenTile_, int kStages_, int kWarps_, int kPageBlock_, bool kReturnLse_,
          bool kWgmma_, class KvFormat_>
struct DecodeTraits {
  using Kv = KvFormat_;
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

  static constexpr DecodeShape kShape = {kDv,
                                         kRope,
                                         kHeadTile,
                                         kHeadsPerGroup,
                                         kTokenTile,
                                         kStages,
                                         kWarps,
                                         kWgmma,
                                         Kv::StagingBytesPerToken(kDv + kRope)};
  static_assert(AssertTilingOk<CheckDecodeTiling(kShape)>::value, "");
  static_assert(kNumHeads >= 1 && kNumHeads <= 128, "1..128 heads");
  static_assert(kPageBlock >= 1, "page block size");

  static constexpr int kThreads = kWarps * 32;
  static constexpr int kNumGroups = (kNumHeads + kHeadsPerGroup - 1) / kHeadsPerGroup;
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
  // Staged formats: one bf16 tile and one staging buffer (StagedPipeline).
  static constexpr bool kStaged = StagedPipeline(kShape);
  static constexpr int kStagingBytesPerToken = Kv::StagingBytesPerToken(kDqk);
  static constexpr int kStagingBytes = kTokenTile * kStagingBytesPerToken;
  // S = Q K^T warp layout: kWarpsM x kWarpsN warps, each (kSM * 16) x
  // (kSN * 8) of S.
  static constexpr int kWarpsM = DeriveDecodeDims(kShape).warps_m;
  static constexpr int kWarpsN = DeriveDecodeDims(kShape).warps_n;
  static constexpr int kSM = DeriveDecodeDims(kShape).s_m;
  static constexpr int kSN = DeriveDecodeDims(kShape).s_n;
  // O = P V with mma.sync: every warp owns all heads and kVCols columns.
  static constexpr int kVCols = DeriveDecodeDims(kShape).v_cols;
  static constexpr int kVN = DeriveDecodeDims(kShape).v_n;
  // O accumulator per thread: kOM x kON m16n8 C fragments (pv.cuh says
  // which rows and columns).
  static constexpr int kOM = DeriveDecodeDims(kShape).o_m;
  static constexpr int kON = DeriveDecodeDims(kShape).o_n;
  static constexpr int kPStride = DeriveDecodeDims(kShape).p_stride;
  static constexpr int kRowsPerPass = DeriveDecodeDims(kShape).rows_per_pass;
  // Byte offsets into dynamic shared memory (scalars: device code may read
  // a host constexpr only if it is scalar).
  static constexpr int kSmemQ = MakeDecodeSmemLayout(kShape).q;
  static constexpr int kSmemKv = MakeDecodeSmemLayout(kShape).kv;
  static constexpr int kSmemKvStaging = MakeDecodeSmemLayout(kShape).kv_staging;
  static constexpr int kSmemP = MakeDecodeSmemLayout(kShape).p;
  static constexpr int kSmemRed = MakeDecodeSmemLayout(kShape).red;
  static constexpr int kSmemScale = MakeDecodeSmemLayout(kShape).scale;
  static constexpr int kSmemMax = MakeDecodeSmemLayout(kShape).max;
  static constexpr int kSmemValid = MakeDecodeSmemLayout(kShape).valid;
  static constexpr int kSmemBytes = MakeDecodeSmemLayout(kShape).bytes;
};

// This CTA's shared memory, carved by DecodeSmemLayout.
struct DecodeSmem {
  unsigned char* q;           // Q tile (swizzled blocks)
  unsigned char* kv;          // KV stages (swizzled blocks)
  unsigned char* kv_staging;  // the KV format's raw bytes per stage
  unsigned short* p;          // bf16 P, kPStride per row
  float* red;                 // [kWarpsN][kHeadTile] row max / sum exchange
  float* scale;               // [kHeadTile] O rescale factor of this tile
  float* max;                 // [kHeadTile] final running max
  int* valid;                 // [kStages][kTokenTile] token validity
  ptx::u32 q_addr;            // shared-window addresses (cp.async,
  ptx::u32 kv_addr;           // ldmatrix, wgmma descriptors)
  ptx::u32 kv_staging_addr;
  ptx::u32 p_addr;
};

template <class T>
__device__ __forceinline__ DecodeSmem CarveDecodeSmem(unsigned char* smem) {
  DecodeSmem s;
  s.q = smem + T::kSmemQ;
  s.kv = smem + T::kSmemKv;
  s.kv_staging = smem + T::kSmemKvStaging;
  s.p = reinterpret_cast<unsigned short*>(smem + T::kSmemP);
  s.red = reinterpret_cast<float*>(smem + T::kSmemRed);
  s.scale = reinterpret_cast<float*>(smem + T::kSmemScale);
  s.max = reinterpret_cast<float*>(smem + T::kSmemMax);
  s.valid = reinterpret_cast<int*>(smem + T::kSmemValid);
  s.q_addr = ptx::SmemAddr(s.q);
  s.kv_addr = ptx::SmemAddr(s.kv);
  s.kv_staging_addr = ptx::SmemAddr(s.kv_staging);
  s.p_addr = ptx::SmemAddr(s.p);
  return s;
}

// What this CTA computes: one query token, one head group, one split of the
// top-k list.
struct DecodeWork {
  int split;
  int token;
  int head0;           // first head of the group
  int heads_here;      // real heads of the group (the last may be short)
  int begin;           // top-k positions [begin, end) of this split, end
  int end;             // clamped to the token's topk_length
  int num_tiles;       // KV tiles of kTokenTile positions
  const int* idx_row;  // this token's top-k indices
};

// KV tiles of kTokenTile positions covering top-k positions [begin, end).
template <class T>
__device__ __forceinline__ int TilesOf(int begin, int end) {
  return end > begin ? (end - begin + T::kTokenTile - 1) / T::kTokenTile : 0;
}

template <class T>
__device__ __forceinline__ DecodeWork MakeDecodeWork(const DecodeParams& p) {
  DecodeWork w;
  const int group = blockIdx.x;
  w.split = blockIdx.y;
  w.token = blockIdx.z;
  w.head0 = group * T::kHeadsPerGroup;
  w.heads_here = min(T::kHeadsPerGroup, T::kNumHeads - w.head0);
  w.begin = w.split * p.tokens_per_split;
  w.end = min(T::kTopk, w.begin + p.tokens_per_split);
  w.num_tiles = TilesOf<T>(w.begin, w.end);
  w.idx_row = p.indices + w.token * p.indices_stride;
  return w;
}

// Cuts the split at the token's topk_length when the call passes one. It
// reads global memory: call it after ptx::WaitForPriorGrids (the engine's
// kernel before this one may have written the lengths); MakeDecodeWork,
// parameters only, runs before the wait, overlapping the previous kernel.
template <class T>
__device__ __forceinline__ void ApplyTopkLength(const DecodeParams& p, DecodeWork& w) {
  if (p.topk_length == nullptr) return;
  const int len =
      min(max(__ldg(p.topk_length + w.token / max(1, p.topk_length_tokens)), 0), T::kTopk);
  w.end = min(w.end, len);
  w.num_tiles = TilesOf<T>(w.begin, w.end);
}

// This thread's roles in the phases.
struct ThreadRoles {
  int warp;
  int lane;
  int wm;    // S = Q K^T: row block of this warp (0..kWarpsM)
  int wn;    // S = Q K^T: column block of this warp (0..kWarpsN)
  int sub;   // gather: 16-byte chunk of each 128-byte block row (0..7)
  int row0;  // gather: first row; then every kRowsPerPass
};

template <class T>
__device__ __forceinline__ ThreadRoles MakeThreadRoles() {
  ThreadRoles r;
  const int tid = threadIdx.x;
  r.warp = tid / 32;
  r.lane = tid % 32;
  r.wm = r.warp % T::kWarpsM;
  r.wn = r.warp / T::kWarpsM;
  r.sub = tid % kThreadsPerRow;
  r.row0 = tid / kThreadsPerRow;
  return r;
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_DECODE_TRAITS_CUH_
