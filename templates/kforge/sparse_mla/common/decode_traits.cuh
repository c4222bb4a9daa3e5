// Compile-time traits of the sparse MLA main kernel, the schedule of one
// entry, and the per-CTA context its phases share (shared-memory pointers,
// the work item, thread roles). Every number here is derived from
// tiling.h (DecodeShape -> DecodeDims, DecodeSmemLayout), which the host
// planner and codegen use too.
#ifndef KFORGE_SPARSE_MLA_COMMON_DECODE_TRAITS_CUH_
#define KFORGE_SPARSE_MLA_COMMON_DECODE_TRAITS_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/common/kv_layout.h"
#include "kforge/sparse_mla/common/params.h"
#include "kforge/sparse_mla/common/tiling.h"

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

// IsSame<A, B>::value (std::is_same, likewise out of NVRTC's reach).
template <class A, class B>
struct IsSame {
  static constexpr bool value = false;
};
template <class A>
struct IsSame<A, A> {
  static constexpr bool value = true;
};

// Void<X...>::type is void (std::void_t): detects a config's optional
// members.
template <class...>
struct Void {
  using type = void;
};

// Instantiated by DecodeTraits only to report a rejected tiling: the
// compiler's "during instantiation of AssertTilingOk<...>" note names the
// TilingError (see CheckDecodeTiling in tiling.h).
template <TilingError kError>
struct AssertTilingOk {
  static_assert(kError == TilingError::kOk,
                "CheckDecodeTiling (tiling.h) rejects this DecodeTraits "
                "tiling; the TilingError is this template's argument");
  static constexpr bool value = true;
};

// The extra KV cache a config names (spec extra_kv: kExtraTopk indices per
// query token of format ExtraKv, kExtraPageBlock tokens per page, attended
// in the same softmax), or none: a config without ExtraKv has kExtraTopk 0.
template <class C, class = void>
struct ExtraKvOf {
  using Kv = typename C::Kv;
  static constexpr int kTopk = 0;
  static constexpr int kPageBlock = 1;
};
template <class C>
struct ExtraKvOf<C, typename Void<typename C::ExtraKv>::type> {
  using Kv = typename C::ExtraKv;
  static constexpr int kTopk = C::kExtraTopk;
  static constexpr int kPageBlock = C::kExtraPageBlock;
};

// Config: the generated unit's named config (compiler/codegen.cc
// GenerateSource), a struct of static constexpr members:
//   the spec       kNumHeads, kDv (kv_lora_rank), kRope, kTopk, kPageBlock,
//                  kReturnLse, and Kv, the KV cache format type
//                  (kv_format.cuh, e.g. KvBf16); optionally the extra cache
//                  (ExtraKvOf: kExtraTopk, kExtraPageBlock, ExtraKv)
//   the tiling     kHeadTile, kHeadsPerGroup, kTokenTile, kStages, kWarps
//                  (those that run the MMAs and the softmax), kLandWarps
//                  (more that only load Q, gather, land a staged format's
//                  dequantisation and merge)
//   the schedule   kPipeline and kMma (tiling.h), checked against the
//                  tiling: kMma sets the shape's wgmma, kPipeline must be
//                  PipelineOf the shape
template <class Config>
struct DecodeTraits {
  using Kv = typename Config::Kv;
  using ExtraKv = typename ExtraKvOf<Config>::Kv;
  static constexpr int kExtraTopk = ExtraKvOf<Config>::kTopk;
  static constexpr int kExtraPageBlock = ExtraKvOf<Config>::kPageBlock;
  static constexpr int kNumHeads = Config::kNumHeads;
  static constexpr int kDv = Config::kDv;
  static constexpr int kRope = Config::kRope;
  static constexpr int kTopk = Config::kTopk;
  static constexpr int kHeadTile = Config::kHeadTile;
  static constexpr int kHeadsPerGroup = Config::kHeadsPerGroup;
  static constexpr int kTokenTile = Config::kTokenTile;
  static constexpr int kStages = Config::kStages;
  static constexpr int kWarps = Config::kWarps;
  static constexpr int kLandWarps = Config::kLandWarps;
  static constexpr int kPageBlock = Config::kPageBlock;
  static constexpr bool kReturnLse = Config::kReturnLse;
  static constexpr Pipeline kPipeline = Config::kPipeline;
  static constexpr Mma kMma = Config::kMma;
  // The warp-specialised producer's measured choices (the schedule's:
  // KernelTiling producer_prefetch_l2, pair_load_ahead; sm90/wspath.cuh).
  static constexpr bool kProducerPrefetchL2 = Config::kProducerPrefetchL2;
  static constexpr bool kPairLoadAhead = Config::kPairLoadAhead;
  static_assert(kMma == Mma::kMmaSync || kMma == Mma::kWgmma, "Mma: kMmaSync or kWgmma");
  // S = Q K^T and O += P V with sm_90a warpgroup MMA (wgmma) instead of
  // mma.sync.
  static constexpr bool kWgmma = kMma == Mma::kWgmma;

  static constexpr DecodeShape kShape = {
      kDv,
      kRope,
      kHeadTile,
      kHeadsPerGroup,
      kTokenTile,
      kStages,
      kWarps,
      kWgmma,
      PipelineStagingBytes(Kv::StagingBytesPerToken(kDv + kRope), Kv::BytesPerToken(kDv + kRope),
                           ExtraKv::StagingBytesPerToken(kDv + kRope),
                           kExtraTopk > 0 ? ExtraKv::BytesPerToken(kDv + kRope) : 0),
      kLandWarps};
  static_assert(AssertTilingOk<CheckDecodeTiling(kShape)>::value, "");
  static_assert(kPipeline == PipelineOf(kShape, kPipeline == Pipeline::kCrossoverPair),
                "the config's Pipeline is not its tiling's (tiling.h PipelineOf)");
  static_assert(kPipeline != Pipeline::kCrossoverPair || PairCovers(kShape),
                "a crossover-pair tiling needs tiling.h PairCovers");
  static_assert(kNumHeads >= 1 && kNumHeads <= 128, "1..128 heads");
  static_assert(kPageBlock >= 1 && kExtraPageBlock >= 1, "page block size");
  static_assert(kExtraTopk >= 0, "extra topk");
  // Key positions: [0, kMainSpan) the topk indices (padded to whole tiles
  // when an extra cache follows), then [kMainSpan, kKeys) the extra ones.
  static constexpr int kMainSpan = MainKeySpan(kTopk, kExtraTopk, kTokenTile);
  static constexpr int kKeys = KeySpan(kTopk, kExtraTopk, kTokenTile);

  // The block: every warp loads, gathers, lands and merges; the first
  // kWarps also run S, the softmax and PV.
  static constexpr int kThreads = CtaWarps(kShape) * 32;
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
  // The register pipeline (sm80/regpath.cuh): the KV format's bytes go to
  // registers, not to a staging buffer.
  static constexpr bool kRegPath = kPipeline == Pipeline::kRegister;
  // The warp-specialised pipeline (sm90/wspath.cuh), paired or not: the
  // land-only warps are a producer warpgroup feeding kStages bf16 tiles.
  static constexpr bool kWarpSpecialized =
      kPipeline == Pipeline::kWarpSpecialized || kPipeline == Pipeline::kCrossoverPair;
  static constexpr int kStagingBytesPerToken = kShape.kv_staging_bytes_per_token;
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
  // O accumulator per thread: kOM x kON m16n8 C fragments (common/mma.cuh
  // says which rows and columns).
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
  static constexpr int kSmemBar = MakeDecodeSmemLayout(kShape).bar;
  static constexpr int kSmemBytes = MakeDecodeSmemLayout(kShape).bytes;
};

// One main-kernel entry's schedule (the generated unit names it:
// DecodeMain<Traits, kPipeline, kEpilogue, kClusterSplits>): the pipeline
// it runs, its tiling's (a crossover-pair tiling's cluster entries run it
// unpaired, kWarpSpecialized), and how it finishes: kSplit, or
// kClusterMerge over a compiled-in cluster of kClusterSplits CTAs along
// grid.y (kClusterSplits, kMainClusterSplits in tiling.h).
template <Pipeline kPipeline_, Epilogue kEpilogue_, int kClusterSplits_ = 0>
struct DecodeEntry {
  static constexpr Pipeline kPipeline = kPipeline_;
  static constexpr Epilogue kEpilogue = kEpilogue_;
  static constexpr int kClusterSplits = kClusterSplits_;
  static_assert(kEpilogue == Epilogue::kSplit || kEpilogue == Epilogue::kClusterMerge,
                "Epilogue: kSplit or kClusterMerge");
  static_assert((kEpilogue == Epilogue::kClusterMerge) == (kClusterSplits > 0),
                "a cluster merge, and only it, has its split count");
  // The crossover pair: a 2-CTA cluster over two head groups.
  static constexpr bool kPair = kPipeline == Pipeline::kCrossoverPair;
};

// The O accumulator of one thread: kOM x kON m16n8 C fragments (the MMA
// implementation says which rows and columns: common/mma.cuh).
template <class T>
using OAccum = float[T::kOM][T::kON][4];

// Makes this thread's shared-memory writes of a KV tile (cp.async landed,
// or a KV format's conversion) visible to the whole CTA and to the S
// phase's reads; every thread calls it after its last write of the tile.
// cp.async and st.shared write through the generic proxy; wgmma reads
// through the async proxy, so its tiles take a proxy fence first.
template <class T>
__device__ __forceinline__ void PublishSmem() {
  if constexpr (T::kMma == Mma::kWgmma) ptx::FenceProxyAsync();
  __syncthreads();
}

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
// key positions [0, T::kKeys): its tiles are first those of the top-k list
// (positions [begin, main_end)), then, with an extra cache, those of the
// extra list (positions [extra_begin, extra_end), extra index pos -
// T::kMainSpan). Every tile reads one cache.
struct DecodeWork {
  int split;
  int token;
  int head0;                 // first head of the group
  int heads_here;            // real heads of the group (the last may be short)
  int begin;                 // key positions [begin, main_end) of this split in
  int main_end;              // the top-k list, cut at the token's topk_length
  int extra_begin;           // ... and [extra_begin, extra_end) in the extra
  int extra_end;             // list (empty without an extra cache)
  int main_tiles;            // KV tiles of kTokenTile positions: main_tiles of
  int num_tiles;             // the top-k list, then the extra list's
  const int* idx_row;        // this token's top-k indices
  const int* extra_idx_row;  // this token's extra indices (extra cache only)
};

// KV tiles of kTokenTile positions covering key positions [begin, end).
template <class T>
__device__ __forceinline__ int TilesOf(int begin, int end) {
  return end > begin ? (end - begin + T::kTokenTile - 1) / T::kTokenTile : 0;
}

template <class T>
__device__ __forceinline__ void CountTiles(DecodeWork& w) {
  w.main_tiles = TilesOf<T>(w.begin, w.main_end);
  w.num_tiles = w.main_tiles;
  if constexpr (T::kExtraTopk > 0) w.num_tiles += TilesOf<T>(w.extra_begin, w.extra_end);
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
  const int end = min(T::kKeys, w.begin + p.tokens_per_split);
  w.main_end = min(T::kTopk, end);
  w.idx_row = p.indices + w.token * p.indices_stride;
  w.extra_begin = max(w.begin, T::kMainSpan);
  w.extra_end = end;
  w.extra_idx_row = nullptr;
  if constexpr (T::kExtraTopk > 0)
    w.extra_idx_row = p.extra_indices + w.token * p.extra_indices_stride;
  CountTiles<T>(w);
  return w;
}

// A token's list length from a topk_length-style array (null: all of
// `topk`), clamped to 0..topk.
__device__ __forceinline__ int ListLength(const DecodeParams& p, const int* lengths, int token,
                                          int topk) {
  if (lengths == nullptr) return topk;
  return min(max(__ldg(lengths + token / max(1, p.topk_length_tokens)), 0), topk);
}

// Cuts the split at the token's topk_length (and extra_topk_length) when
// the call passes them. It reads global memory: call it after
// ptx::WaitForPriorGrids (the engine's kernel before this one may have
// written the lengths); MakeDecodeWork, parameters only, runs before the
// wait, overlapping the previous kernel.
template <class T>
__device__ __forceinline__ void ApplyTopkLength(const DecodeParams& p, DecodeWork& w) {
  bool cut = false;
  if (p.topk_length != nullptr) {
    w.main_end = min(w.main_end, ListLength(p, p.topk_length, w.token, T::kTopk));
    cut = true;
  }
  if constexpr (T::kExtraTopk > 0) {
    if (p.extra_topk_length != nullptr) {
      w.extra_end = min(w.extra_end,
                        T::kMainSpan + ListLength(p, p.extra_topk_length, w.token, T::kExtraTopk));
      cut = true;
    }
  }
  if (cut) CountTiles<T>(w);
}

// A main-kernel entry's first steps. Launched programmatically (sm_90+),
// this CTA may start before the previous kernel in the stream (the last
// call's combine, or the engine's kernel that wrote Q, the indices and
// their lengths) has finished: wait for it before any global access, then
// let the next kernel be scheduled, to wait in turn; then cut the work at
// the token's lengths. A cluster-merge entry (E, a DecodeEntry) traps
// unless its grid.y is its cluster, one CTA per split: any other launch
// would merge the wrong partials.
template <class T, class E>
__device__ __forceinline__ void BeginDecode(const DecodeParams& p, DecodeWork& w) {
  ptx::WaitForPriorGrids();
  ptx::AllowDependentLaunch();
  ApplyTopkLength<T>(p, w);
  if constexpr (E::kEpilogue == Epilogue::kClusterMerge) {
    if (gridDim.y != E::kClusterSplits || p.num_splits != E::kClusterSplits ||
        ptx::ClusterNumCtas() != E::kClusterSplits)
      __trap();
  }
}

// This thread's roles in the phases.
struct ThreadRoles {
  int warp;
  int lane;
  bool mma;  // one of the kWarps MMA warps (not a land-only one)
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
  r.mma = T::kLandWarps == 0 || r.warp < T::kWarps;
  r.wm = r.warp % T::kWarpsM;
  r.wn = r.warp / T::kWarpsM;
  r.sub = tid % kThreadsPerRow;
  r.row0 = tid / kThreadsPerRow;
  return r;
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_COMMON_DECODE_TRAITS_CUH_
