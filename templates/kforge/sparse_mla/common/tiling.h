// The tiling of the sparse MLA main kernel: its compile-time shape
// (DecodeShape), the pipeline and MMA it runs, by name (Pipeline, Mma,
// PipelineOf), the validity rule (CheckDecodeTiling), the quantities derived
// from a shape and its shared-memory layout, and the cluster entries'
// merge layout. Each is written once: DecodeTraits (decode_traits.cuh)
// evaluates them on the device and the host planner and codegen call the
// same functions, so a unit is never emitted that fails to compile. Plain
// C++ with fundamental types only, shared by the host and NVRTC.
#ifndef KFORGE_SPARSE_MLA_COMMON_TILING_H_
#define KFORGE_SPARSE_MLA_COMMON_TILING_H_

#if !defined(KFORGE_HD)
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KFORGE_HD __host__ __device__
#else
#define KFORGE_HD
#endif
#endif

namespace kforge {
namespace sparse_mla {

// ---------------------------------------------------------------------------
// A schedule by name. Each number is that of the proto enum of the same
// name (proto/kforge/v1/artifact.proto Pipeline, Mma, Epilogue), which the
// host asserts, so a tiling, the artifact and the generated unit name a
// schedule alike.

// How a tiling moves KV tiles through the CTA (docs/KERNEL.md,
// "Pipelines"); PipelineOf names a shape's.
enum class Pipeline : int {
  // Every warp gathers (and lands) the next tile, then all compute this
  // one, between CTA barriers; stages-deep (common/lockstep.cuh).
  kLockstep = 1,
  // A staged format's 16-head tile: each warp loads its quarter of the
  // columns into registers one tile ahead and converts them there; no KV
  // tile in shared memory (stages 1; sm80/regpath.cuh, mma.sync).
  kRegister = 2,
  // sm_90a: a producer warpgroup fills the bf16 tiles while two wgmma
  // warpgroups compute, handed over through mbarriers (sm90/wspath.cuh).
  kWarpSpecialized = 3,
  // The warp-specialised pipeline run as 2-CTA clusters over two head
  // groups, each CTA converting half of every tile into both CTAs' tiles
  // (sm90/wspath.cuh WsProducePair).
  kCrossoverPair = 4,
};

// The instruction that computes S = Q K^T and O += P V.
enum class Mma : int {
  kMmaSync = 1,  // mma.sync m16n8k16, every arch (sm80/qk.cuh, sm80/pv.cuh)
  kWgmma = 2,    // sm_90a warpgroup MMA (sm90/qk.cuh, sm90/pv.cuh)
};

// How a main-kernel entry finishes its split of the keys.
enum class Epilogue : int {
  // One CTA a split: with one split it writes O directly, else fp32
  // partials that the combine kernel merges (decode_phases.cuh SplitEpilogue).
  kSplit = 1,
  // The splits are one thread-block cluster and merge through distributed
  // shared memory in the kernel: no combine, no workspace
  // (ClusterMergeEpilogue).
  kClusterMerge = 2,
};

// Threads that gather one KV row together: 8 x 16 B = 128 contiguous bytes
// per row per warp instruction (every d_qk is a multiple of 64 elements, so
// a row is always a whole number of 8-chunk groups).
constexpr int kThreadsPerRow = 8;

// ---------------------------------------------------------------------------
// Tiling: the compile-time shape of the main kernel, its validity rule and
// the quantities derived from it. DecodeTraits (decode_traits.cuh) asserts
// CheckDecodeTiling; the host planner calls the same function to choose a
// tiling, so the codegen never emits a unit that fails to compile and no
// rule is written twice.

struct DecodeShape {
  int d_v;                         // kv_lora_rank: V columns = first d_v columns of K
  int rope;                        // rope_dim: the K columns after d_v
  int head_tile;                   // Q rows per CTA (whole 16-row MMA tiles)
  int heads_per_group;             // real heads among them; the rest are zero padding
  int token_tile;                  // KV rows per pipeline stage
  int stages;                      // KV pipeline depth
  int warps;                       // warps that run the MMAs and the softmax
  bool wgmma;                      // S = Q K^T with sm_90a wgmma instead of mma.sync
  int kv_staging_bytes_per_token;  // PipelineStagingBytes of the KV formats;
                                   // > 0: a staged pipeline (below)
  int land_warps;                  // more warps that only load Q, gather,
                                   // land (dequantise) and merge: a staged
                                   // pipeline's Land spread over
                                   // warps + land_warps warps (CtaWarps)
};

// Warps per CTA: those of the MMAs and the land-only ones.
KFORGE_HD constexpr int CtaWarps(const DecodeShape& s) { return s.warps + s.land_warps; }

// The KV pipeline. Direct formats (no staging, bf16) gather into `stages`
// bf16 tiles. Staged formats (fp8_ds_mla) keep one bf16 tile and one
// staging buffer: tile t lands in the buffer, is converted into the tile
// at the top of iteration t, and the buffer then takes tile t + 1 while
// tile t is computed, so the pipeline is still two deep in about half the
// shared memory of two bf16 tiles.
KFORGE_HD constexpr bool StagedPipeline(const DecodeShape& s) {
  return s.kv_staging_bytes_per_token > 0;
}

// The warp-specialised pipeline (sm_90a; sm90/wspath.cuh): the wgmma tiling
// with one producer warpgroup (land_warps 4) that fills one of `stages`
// bf16 KV tiles per tile, handing tiles to the two MMA warpgroups and back
// through mbarriers, so the next tile's gather (and conversion) runs beside
// S, the softmax and PV of this one instead of in lockstep with them. A
// staged format's producer gathers each tile's records into registers and
// converts them (the formats' register seam, kv_format.cuh); a direct one's
// (bf16) copies the rows with cp.async. No staging buffer.
KFORGE_HD constexpr bool WarpSpecialized(const DecodeShape& s) {
  return s.wgmma && s.land_warps == 4;
}
// The crossover pair (sm90/wspath.cuh WsProducePair): a staged format's
// warp-specialised tiling run as 2-CTA clusters over two head groups, each
// CTA converting half of every tile's rows into both CTAs' tiles. Its
// producer maps one row a lane over the 512 latent columns (and 64 rope).
KFORGE_HD constexpr bool PairCovers(const DecodeShape& s) {
  return WarpSpecialized(s) && StagedPipeline(s) && s.token_tile == 64 && s.d_v == 512 &&
         (s.rope == 0 || s.rope == 64);
}
// The bytes one CTA of the pair stores into the other's shared memory per
// tile: half the tile's bf16 rows and their validity flags.
KFORGE_HD constexpr int PairBytesPerTile(const DecodeShape& s) {
  return s.token_tile / 2 * (2 * (s.d_v + s.rope) + 4);
}
KFORGE_HD constexpr int KvTiles(const DecodeShape& s) {
  return StagedPipeline(s) && !WarpSpecialized(s) ? 1 : s.stages;
}

// The register pipeline (stages == 1; sm80/regpath.cuh): a staged format's
// 16-head tile without a KV tile in shared memory. Each of the 4 warps owns
// a quarter of the latent columns (d_v / 4 of V, and a quarter of the rope
// columns): it loads those bytes of every token of the tile straight into
// registers one tile ahead, converts them to bf16 there and feeds them to
// S = Q K^T as MMA operands against its quarter of Q (held in registers);
// the four partial S tiles are summed through shared memory (one barrier a
// tile), so every warp holds the whole S and P, and its V columns go
// through a shared-memory tile of its own to PV. Per token that is ~3 KB of
// shared-memory traffic where the staged pipeline moves ~6 KB (staging
// write and read, bf16 tile write, Q and K reads for S, V reads for PV).
KFORGE_HD constexpr bool RegisterPipeline(const DecodeShape& s) { return s.stages == 1; }
KFORGE_HD constexpr bool RegisterPipelineCovers(const DecodeShape& s) {
  return s.stages == 1 && StagedPipeline(s) && s.head_tile == 16 && s.warps == 4 &&
         s.land_warps == 0 && !s.wgmma && s.d_v == 512 && (s.rope == 0 || s.rope == 64) &&
         (s.token_tile == 16 || s.token_tile == 32);
}

// The pipeline a shape runs: the one rule that names it. DecodeTraits
// asserts that its config's kPipeline is this; the host planner and the
// codegen call it on the tiling's shape. crossover_pair: the
// warp-specialised main entry compiled as 2-CTA pairs (KernelTiling
// crossover; where it may be: PairCovers).
KFORGE_HD constexpr Pipeline PipelineOf(const DecodeShape& s, bool crossover_pair) {
  if (RegisterPipeline(s)) return Pipeline::kRegister;
  if (WarpSpecialized(s))
    return crossover_pair ? Pipeline::kCrossoverPair : Pipeline::kWarpSpecialized;
  return Pipeline::kLockstep;
}

// The MMA of a shape: wgmma where the tiling asks for it (WgmmaCovers).
KFORGE_HD constexpr Mma MmaOf(const DecodeShape& s) {
  return s.wgmma ? Mma::kWgmma : Mma::kMmaSync;
}

KFORGE_HD constexpr int Gcd(int a, int b) { return b == 0 ? a : Gcd(b, a % b); }

// Everything the kernel derives from a shape. Zero where a shape is too
// broken to derive it (CheckDecodeTiling reports why).
struct DecodeDims {
  int d_qk;           // K row width = d_v + rope
  int blocks;         // 64-column (128-byte) swizzled blocks per K/Q row
  int m_tiles;        // 16-row MMA tiles of the head tile
  int warps_m;        // S = Q K^T: warps along the head axis ...
  int warps_n;        // ... and along the token axis (warps_m * warps_n)
  int s_m;            // m16 tiles of S per warp
  int s_n;            // n8 tiles of S per warp
  int v_cols;         // O = P V with mma.sync: output columns of each warp
  int v_n;            // ... as n8 tiles
  int o_m;            // O accumulator per thread, in m16n8 C fragments:
  int o_n;            // o_m m16 tiles x o_n n8 tiles (mma.sync: all rows x
                      // v_n; wgmma: its warp's 16 rows x d_v / 2 columns)
  int rows_per_pass;  // KV rows one gather pass of the CTA (all its warps)
                      // covers
  int p_stride;       // bf16 elements per P row (mma.sync: 16 B of padding,
                      // no bank conflicts for ldmatrix; wgmma: 128 B rows
                      // with the 128-byte swizzle)
};

KFORGE_HD constexpr DecodeDims DeriveDecodeDims(const DecodeShape& s) {
  DecodeDims d{};
  d.d_qk = s.d_v + s.rope;
  d.blocks = d.d_qk / 64;
  d.m_tiles = s.head_tile / 16;
  if (s.warps <= 0) return d;
  d.warps_m = Gcd(d.m_tiles, s.warps);
  if (d.warps_m <= 0) return d;
  // The warp-specialised pipeline computes S on its first warpgroup only.
  d.warps_n = WarpSpecialized(s) ? 1 : s.warps / d.warps_m;
  d.s_m = d.m_tiles / d.warps_m;
  d.s_n = s.token_tile / 8 / d.warps_n;
  d.v_cols = s.d_v / s.warps;
  d.v_n = d.v_cols / 8;
  d.o_m = s.wgmma ? 1 : d.m_tiles;
  d.o_n = s.wgmma ? s.d_v / 2 / 8 : d.v_n;
  d.rows_per_pass = CtaWarps(s) * 32 / kThreadsPerRow;
  // wgmma reads P as a K-major 128-byte-swizzled operand: unpadded rows.
  d.p_stride = s.wgmma ? s.token_tile : s.token_tile + 8;
  return d;
}

// The one wgmma eligibility rule (apart from the arch, sm_90a, which the
// codegen checks). S (QkWgmma, sm90/qk.cuh): each warpgroup a 64-head x
// 32-token slab of S (m64n32k16), its 4 warps one m16 row tile each; with a
// producer warpgroup (WarpSpecialized) the first warpgroup all 64 tokens
// (m64n64k16), so Q is read from shared memory once a tile. O = P V
// (PvWgmma, sm90/pv.cuh): each warpgroup all 64 heads x d_v / 2 columns
// (m64n256k16 for d_v 512, m64n128k16 for 256). It is admitted only for the
// pipeline it was measured and checked with on the H200, 8 warps (two
// warpgroups) x 64 tokens (BENCH.md); other warp counts would compile but
// have never run. A producer warpgroup (WarpSpecialized) only for the
// 512 + 0 / 64 geometry, 64 tokens and two bf16 tiles, the shape its
// producers' thread maps (sm90/wspath.cuh) cover.
KFORGE_HD constexpr bool WgmmaCovers(const DecodeShape& s) {
  const DecodeDims d = DeriveDecodeDims(s);
  const bool producer = s.land_warps == 4 && s.stages == 2 && s.token_tile == 64 && s.d_v == 512 &&
                        (s.rope == 0 || s.rope == 64);
  const bool s_split = producer ? d.warps_n == 1 : d.warps_n == 2 && s.token_tile / 2 == 32;
  return s.head_tile == 64 && s.warps == 8 && (s.land_warps == 0 || producer) && d.warps_m == 4 &&
         d.s_m == 1 && s_split && (s.d_v == 256 || s.d_v == 512);
}

enum class TilingError : int {
  kOk = 0,
  kDims,           // d_v not a multiple of 64 in 64..512, or rope not 0/64
  kHeadTile,       // head tile not 1..4 MMA rows of 16
  kHeadsPerGroup,  // a group padded by >= 16 rows, or larger than the tile
  kTokenTile,      // token tile not a positive multiple of MMA K (16)
  kStages,         // fewer than 2 stages (no double buffering), or 1 (the
                   // register pipeline) outside RegisterPipelineCovers
  kWarps,          // warps not 1..16, or d_v not split evenly over them
  kSColumns,       // S columns (token_tile / 8) not split evenly over warps_n
  kVCols,          // a warp's V columns not a whole pair of n8 tiles
  kGatherPasses,   // token tile not a whole number of gather passes
  kORegisters,     // O accumulator over 128 fp32 registers per thread
  kStaging,        // KV staging bytes per token negative or not 16-B chunks,
                   // or a staged pipeline with stages != 2
  kWgmmaShape,     // wgmma asked for a shape it does not implement
  kLandWarps,      // land-only warps without a staged pipeline (nothing to
                   // land), or more than 16 warps in all
};

// Whether the main kernel can be instantiated for `s`. The only source of
// the tiling rules: on the device DecodeTraits static_asserts it, on the
// host ChooseTiling keeps the candidates it accepts.
KFORGE_HD constexpr TilingError CheckDecodeTiling(const DecodeShape& s) {
  if (s.d_v % 64 != 0 || s.d_v < 64 || s.d_v > 512 || (s.rope != 0 && s.rope != 64))
    return TilingError::kDims;
  if (s.head_tile % 16 != 0 || s.head_tile < 16 || s.head_tile > 64) return TilingError::kHeadTile;
  if (s.heads_per_group > s.head_tile || s.heads_per_group <= s.head_tile - 16)
    return TilingError::kHeadsPerGroup;
  if (s.token_tile % 16 != 0 || s.token_tile <= 0) return TilingError::kTokenTile;
  if (s.stages < 1 || (s.stages == 1 && !RegisterPipelineCovers(s))) return TilingError::kStages;
  if (s.warps < 1 || s.warps > 16 || s.d_v % s.warps != 0) return TilingError::kWarps;
  if (s.land_warps < 0 || CtaWarps(s) > 16 ||
      (s.land_warps > 0 && !StagedPipeline(s) && !WarpSpecialized(s)))
    return TilingError::kLandWarps;
  const DecodeDims d = DeriveDecodeDims(s);
  if ((s.token_tile / 8) % d.warps_n != 0) return TilingError::kSColumns;
  if (d.v_cols % 16 != 0) return TilingError::kVCols;
  // (The producer warpgroup of the warp-specialised pipeline has its own
  // thread map; rows_per_pass then only paces the Q load.)
  if (s.token_tile % d.rows_per_pass != 0 && !WarpSpecialized(s)) return TilingError::kGatherPasses;
  if (d.o_m * d.o_n * 4 > 128) return TilingError::kORegisters;
  if (s.kv_staging_bytes_per_token < 0 || s.kv_staging_bytes_per_token % 16 != 0 ||
      (StagedPipeline(s) && s.stages != 2 && !RegisterPipeline(s)))
    return TilingError::kStaging;
  if (s.wgmma && !WgmmaCovers(s)) return TilingError::kWgmmaShape;
  return TilingError::kOk;
}

// For messages (the codegen's, and this header's readers').
KFORGE_HD constexpr const char* TilingErrorName(TilingError e) {
  switch (e) {
    case TilingError::kOk:
      return "ok";
    case TilingError::kDims:
      return "d_v/rope";
    case TilingError::kHeadTile:
      return "head tile";
    case TilingError::kHeadsPerGroup:
      return "heads per group";
    case TilingError::kTokenTile:
      return "token tile";
    case TilingError::kStages:
      return "stages";
    case TilingError::kWarps:
      return "warps";
    case TilingError::kSColumns:
      return "S columns per warp";
    case TilingError::kVCols:
      return "V columns per warp";
    case TilingError::kGatherPasses:
      return "gather passes";
    case TilingError::kORegisters:
      return "O accumulator registers";
    case TilingError::kStaging:
      return "KV staging bytes";
    case TilingError::kWgmmaShape:
      return "wgmma shape";
    case TilingError::kLandWarps:
      return "land-only warps";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------
// Shared memory of the main kernel: byte offsets from the dynamic smem base.
// The host sizes the launch with `bytes`; the kernel takes its pointers from
// the same offsets (CarveDecodeSmem in decode_traits.cuh).
struct DecodeSmemLayout {
  int q;           // Q tile: head_tile x d_qk bf16 as d_qk / 64 swizzled
                   // [head_tile][128 B] blocks; first, so it sits on the
                   // 1024-B boundary wgmma's swizzle needs
  int kv;          // KvTiles x [token_tile x d_qk bf16] in the same blocks
  int kv_staging;  // token_tile x kv_staging_bytes_per_token raw cache
                   // bytes (empty for direct formats and WarpSpecialized)
  int p;           // P: head_tile x p_stride bf16 (1024-B aligned for
                   // wgmma's swizzle)
  int red;         // warps_n x head_tile fp32: row max / row sum exchange
  int scale;       // head_tile fp32: this tile's O rescale factor per row
  int max;         // head_tile fp32: running row max, for the epilogue
  int valid;       // stages x token_tile int32: token validity flags
  int bar;         // WarpSpecialized: stages `full`, stages `empty`, then
                   // `p_full` and `p_empty` mbarriers (8 B each), 8-byte
                   // aligned after `valid`; else none
  int bytes;       // total dynamic shared memory
};

KFORGE_HD constexpr DecodeSmemLayout MakeDecodeSmemLayout(const DecodeShape& s) {
  const DecodeDims d = DeriveDecodeDims(s);
  DecodeSmemLayout l{};
  l.q = 0;
  if (RegisterPipeline(s)) {
    // No Q tile and no staging. kv: each warp's own V tile, token_tile x
    // v_cols bf16 in 128-byte swizzled blocks; p: the partial S tiles, two
    // buffers of warps x head_tile x token_tile fp32 (sm80/regpath.cuh).
    l.kv = 0;
    l.kv_staging = l.kv + s.warps * s.token_tile * d.v_cols * 2;
    l.p = l.kv_staging;
    l.red = l.p + 2 * s.warps * s.head_tile * s.token_tile * 4;
  } else {
    l.kv = l.q + s.head_tile * d.d_qk * 2;
    l.kv_staging = l.kv + KvTiles(s) * s.token_tile * d.d_qk * 2;
    l.p = l.kv_staging + (WarpSpecialized(s) ? 0 : s.token_tile * s.kv_staging_bytes_per_token);
    if (s.wgmma) l.p = (l.p + 1023) / 1024 * 1024;
    l.red = l.p + s.head_tile * d.p_stride * 2;
  }
  l.scale = l.red + d.warps_n * s.head_tile * 4;
  l.max = l.scale + s.head_tile * 4;
  l.valid = l.max + s.head_tile * 4;
  const int valid_end = l.valid + s.stages * s.token_tile * 4;
  l.bar = (valid_end + 7) / 8 * 8;
  l.bytes = WarpSpecialized(s) ? l.bar + (2 * s.stages + 2) * 8 : valid_end;
  return l;
}

// ---------------------------------------------------------------------------
// The cluster entry (sm_90+): the small-batch tiling compiled with
// __cluster_dims__(1, kClusterSplits, 1), so the kClusterSplits splits of one
// (head group, query token) run as one thread-block cluster and merge their
// partial O and lse through distributed shared memory at the end of the
// kernel (ClusterMergeEpilogue, decode_phases.cuh): one launch, no fp32
// workspace and no combine kernel. 16, past the portable 8 (the loaders opt
// the entry into non-portable sizes): the launch rule's own split count at
// batch 1 with 64-token tiles (2048 keys, 2 tiles per split), where 8
// merged splits ran slower than 16 + combine (H200, BENCH.md 2026-12-02).
constexpr int kClusterSplits = 16;
// The throughput tiling's cluster entry (v1::ClusterPath): 2 splits, the
// rule's count where a wave of 64-head CTAs is half full (128 heads x 32
// tokens, 64 x 64 on the H200), whose partials (16 MB at 128 x 32) the
// combine otherwise writes and reads back. Portable: no opt-in.
constexpr int kMainClusterSplits = 2;

// The merge buffer each CTA of a cluster fills for the others to read. It
// reuses shared memory from offset 0 (the Q tile, the KV tiles and staging,
// all dead once the last tile is done) and must end before the P tile,
// whose neighbours (red, max) the epilogue still uses.
struct ClusterMergeLayout {
  int o;         // head_tile x o_stride fp32: this split's normalised O
  int o_stride;  // floats per row: d_v + 8, so the m16n8 fragment's float2
                 // stores (8 rows x 4 column pairs per half-warp) hit 16
                 // distinct bank pairs
  int lse;       // head_tile fp32: this split's lse, log2 domain (-inf: empty)
  int bytes;
};

KFORGE_HD constexpr ClusterMergeLayout MakeClusterMergeLayout(const DecodeShape& s) {
  ClusterMergeLayout l{};
  l.o = 0;
  l.o_stride = s.d_v + 8;
  l.lse = l.o + s.head_tile * l.o_stride * 4;
  l.bytes = l.lse + s.head_tile * 4;
  return l;
}

// Whether a tiling can have a cluster entry of `splits` CTAs: the merge
// buffer fits below the P tile, and each CTA of the cluster gets whole
// column pairs of d_v.
KFORGE_HD constexpr bool ClusterMergeFits(const DecodeShape& s, int splits) {
  return CheckDecodeTiling(s) == TilingError::kOk && splits >= 1 && (s.d_v / 2) % splits == 0 &&
         MakeClusterMergeLayout(s).bytes <= MakeDecodeSmemLayout(s).p;
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_COMMON_TILING_H_
