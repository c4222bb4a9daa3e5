// Shared by the host (codegen, runtime) and the device templates: the kernel
// parameter blocks, the tiling rule of the main kernel and its shared-memory
// layout, each written once. Plain C++ with fundamental types only, so it
// compiles under NVRTC with no toolkit headers and byte-for-byte identically
// on the host.
#ifndef KFORGE_SPARSE_MLA_CONFIG_H_
#define KFORGE_SPARSE_MLA_CONFIG_H_

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KFORGE_HD __host__ __device__
#else
#define KFORGE_HD
#endif

namespace kforge {
namespace sparse_mla {

// Parameter block of the main kernel, passed by value. Strides are in
// elements of the pointed-to type. All pointers are device pointers.
struct DecodeParams {
  const unsigned short* q;   // bf16 [num_tokens, num_q_heads, d_qk]; not null
  const unsigned short* kv;  // bf16 cache; row of slot s at
                             // (s / page_block) * kv_page_stride +
                             // (s % page_block) * kv_row_stride; not null
  const int* indices;        // int32 [num_tokens, topk]; -1 or >= num_kv_slots
                             // means "no token"; not null
  unsigned short* out;       // bf16 [num_tokens, num_q_heads, d_v]; not null
  float* lse;                // fp32 [num_tokens, num_q_heads], natural log;
                             // may be null (then not written)
  float* o_accum;            // fp32 [num_splits, num_tokens, num_q_heads, d_v];
                             // workspace, null when num_splits == 1
  float* lse_accum;          // fp32 [num_splits, num_tokens, num_q_heads]; workspace,
                             // null when num_splits == 1
  const int* topk_length;    // int32, one per topk_length_tokens query tokens:
                             // only the first topk_length[token /
                             // topk_length_tokens] indices of a token count
                             // (clamped to 0..topk; the rest are not read);
                             // null: all topk
  const float* sink;         // fp32 [num_q_heads] attention sink logits
                             // (sink.cuh); null: none. Read where O is final
                             // (num_splits == 1, cluster entries), else by
                             // the combine
  // The extra KV cache (spec extra_kv: DeepSeek-V4's sliding-window tokens
  // beside the top-k ones), attended in the same softmax; its format, top-k
  // and page size are the spec's extra_kv, compiled in. Null / 0 in a kernel
  // built without one (never read there); not null in one built with one.
  const unsigned short* extra_kv;  // addressed as kv, with the extra strides
  const int* extra_indices;        // int32 [num_tokens, extra topk]; -1 or
                                   // >= extra_num_kv_slots: no token
  const int* extra_topk_length;    // like topk_length (same
                                   // topk_length_tokens), for extra_indices
  long long q_token_stride;
  long long q_head_stride;
  long long kv_page_stride;
  long long kv_row_stride;
  long long num_kv_slots;
  long long indices_stride;  // between query tokens
  long long out_token_stride;
  long long out_head_stride;
  long long extra_kv_page_stride;
  long long extra_kv_row_stride;
  long long extra_num_kv_slots;
  long long extra_indices_stride;
  int num_tokens;          // batch * s_q
  int num_splits;          // >= 1; grid.y
  int tokens_per_split;    // multiple of the token tile; splits cover the
                           // key positions [0, KeySpan) (below)
  int topk_length_tokens;  // query tokens per topk_length entry: 1 (one per
                           // token) or s_q (one per request); >= 1
};

// Parameter block of the combine kernel (only launched when num_splits > 1).
struct CombineParams {
  const float* o_accum;    // fp32 [num_splits, num_tokens, num_q_heads, d_v]
  const float* lse_accum;  // fp32 [num_splits, num_tokens, num_q_heads]
  unsigned short* out;     // bf16 [num_tokens, num_q_heads, d_v]
  float* lse;              // fp32 [num_tokens, num_q_heads]; may be null
  const float* sink;       // fp32 [num_q_heads]; may be null (DecodeParams::sink)
  long long out_token_stride;
  long long out_head_stride;
  int num_tokens;
  int num_splits;
  int column_slices;  // warps per (token, head): 1 or CombineSlices(d_v)
                      // (CombineColumnSlices); grid.y = ceil(heads *
                      // column_slices / kCombineWarps)
  int reserved;       // keeps the block a multiple of 8 bytes
};

// The key positions a query token's splits cover: its topk indices, then,
// with an extra cache, its extra_topk ones from position
// MainKeySpan = topk rounded up to whole token tiles, so every tile reads
// one cache (one format). The launch rule (model/launch.cc) splits this
// range; the kernel maps positions back (DecodeWork).
KFORGE_HD constexpr int MainKeySpan(int topk, int extra_topk, int token_tile) {
  return extra_topk > 0 ? (topk + token_tile - 1) / token_tile * token_tile : topk;
}
KFORGE_HD constexpr int KeySpan(int topk, int extra_topk, int token_tile) {
  return MainKeySpan(topk, extra_topk, token_tile) + extra_topk;
}

// Threads that gather one KV row together: 8 x 16 B = 128 contiguous bytes
// per row per warp instruction (every d_qk is a multiple of 64 elements, so
// a row is always a whole number of 8-chunk groups).
constexpr int kThreadsPerRow = 8;
// Warps of the combine kernel's block.
constexpr int kCombineWarps = 4;

// Column slices of one head's output row in the combine kernel: one warp per
// (query token, head, slice), each lane a pair of columns per 64 (so d_v 512
// gives 4 slices of 128 columns, 2 float2 per lane). A slice is a whole
// number of 64-column groups: 4 where d_v / 64 divides by 4, else 2 where it
// divides by 2, else 1.
KFORGE_HD constexpr int CombineSlices(int d_v) {
  return (d_v / 64) % 4 == 0 ? 4 : ((d_v / 64) % 2 == 0 ? 2 : 1);
}

// The slices a combine launch uses: CombineSlices(d_v) while the combine has
// few warps (tokens x heads <= 8 per SM), where it is latency-bound and more
// warps with fewer loads each finish sooner (H200, BENCH.md 2026-12-02: 64 x 1
// 12.5 -> 11.9 us, fp8 8 x 1 13.6 -> 12.1); 1 above, where it is
// bandwidth-bound and the per-warp fixed work (lse loads, reductions) of 4x
// the warps cost 5-8% at 64 x 64 and 128 x 32.
KFORGE_HD constexpr int CombineColumnSlices(int d_v, long long num_tokens, int num_heads,
                                            int sm_count) {
  return num_tokens * num_heads <= 8LL * sm_count ? CombineSlices(d_v) : 1;
}

// ---------------------------------------------------------------------------
// KV cache formats: the numbers the host needs. The device half of a format
// (how one cache record becomes a bf16 row of the KV tile) is the type of the
// same name without "Sizes" in kv_format.cuh, which inherits these, so the
// host sizes shared memory from the very constants the kernel uses.

// bf16: the cache row is the d_qk-wide latent row itself, gathered straight
// into the tile; nothing is staged.
struct KvBf16Sizes {
  static constexpr bool kPageBlocked = false;
  KFORGE_HD static constexpr int BytesPerToken(int d_qk) { return 2 * d_qk; }
  // Raw bytes per token that the format lands in shared memory before
  // converting them into the bf16 tile (0: it gathers into the tile).
  KFORGE_HD static constexpr int StagingBytesPerToken(int) { return 0; }
};

// fp8_ds_mla (FlashMLA / vLLM): one record per token, 656 bytes with rope 64
// (528 without):
//   bytes [0, 512)    the 512 latent values, fp8 e4m3 (e4m3fn: no inf)
//   bytes [512, 528)  4 fp32 scales, scale g for values [128 g, 128 g + 128)
//                     (value = e4m3 * scale)
//   bytes [528, 656)  the 64 rope values, bf16 (absent when rope is 0)
// Only kv_lora_rank 512 with rope 0 or 64 exists (Supports); both record
// sizes are whole 16-byte chunks, as cp.async needs. The kernel stages whole
// records and converts them into the bf16 tile.
struct KvFp8DsMlaSizes {
  static constexpr bool kPageBlocked = false;
  static constexpr int kLatent = 512;      // kv_lora_rank (d_v)
  static constexpr int kScaleGroup = 128;  // latent values per fp32 scale
  static constexpr int kNumScales = kLatent / kScaleGroup;
  static constexpr int kScalesOffset = kLatent;                       // 512
  static constexpr int kRopeOffset = kScalesOffset + 4 * kNumScales;  // 528
  KFORGE_HD static constexpr bool Supports(int d_v, int rope) {
    return d_v == kLatent && (rope == 0 || rope == 64);
  }
  // d_qk = kv_lora_rank + rope_dim; meaningful where Supports(512, d_qk - 512).
  KFORGE_HD static constexpr int BytesPerToken(int d_qk) {
    return kRopeOffset + 2 * (d_qk - kLatent);
  }
  KFORGE_HD static constexpr int StagingBytesPerToken(int d_qk) { return BytesPerToken(d_qk); }
};

// The formats below (issue 15; byte layouts as vLLM's
// vllm/v1/attention/backends/mla/flashmla_sparse.py module note and
// FlashMLA's tests/quant.py state them, docs/DESIGN.md) each exist for one
// geometry only (Supports). Page-blocked formats (kPageBlocked) do not
// store records token by token: within a page of page_block_size tokens
// all kDataBytes-wide data rows come first, then all kScaleBytes-wide scale
// rows, so token i of a page has its data at page + kDataBytes * i and its
// scales at page + kDataBytes * page_block_size + kScaleBytes * i. The
// runtime's kv_row_stride is then the whole record (BytesPerToken) and
// carries no freedom; kv_page_stride is the page (vLLM rounds it up to a
// multiple of kDataBytes). Staged as data row then scale row, padded to
// whole 16-byte chunks.

// DeepSeek-V4, 584 B/token, d_qk = d_v = 512 (spec: kv_lora_rank 512,
// rope_dim 0): data row [0, 448) e4m3 values of columns 0..447, [448, 576)
// bf16 values of columns 448..511; scale row 7 ue8m0 exponents (scale g for
// columns [64 g, 64 g + 64): value = e4m3 * 2^(e - 127)) and a pad byte.
struct KvFp8DsMlaV4Sizes {
  static constexpr bool kPageBlocked = true;
  static constexpr int kLatent = 512;
  static constexpr int kE4m3Values = 448;
  static constexpr int kScaleGroup = 64;
  static constexpr int kDataBytes = kE4m3Values + 2 * (kLatent - kE4m3Values);  // 576
  static constexpr int kScaleBytes = 8;                                         // 7 ue8m0 + pad
  KFORGE_HD static constexpr bool Supports(int d_v, int rope) {
    return d_v == kLatent && rope == 0;
  }
  KFORGE_HD static constexpr int BytesPerToken(int) { return kDataBytes + kScaleBytes; }
  KFORGE_HD static constexpr int StagingBytesPerToken(int) {
    return (kDataBytes + kScaleBytes + 15) / 16 * 16;  // 592
  }
};

// DeepSeek-V4.1 (MXFP8), 528 B/token, d_qk = d_v = 512: data row 512 e4m3
// values (every column, rope included); scale row 16 ue8m0 exponents, one
// per 32 columns.
struct KvMxfp8DsMlaV41Sizes {
  static constexpr bool kPageBlocked = true;
  static constexpr int kLatent = 512;
  static constexpr int kE4m3Values = kLatent;  // every column, no bf16 ones
  static constexpr int kScaleGroup = 32;
  static constexpr int kDataBytes = kLatent;                 // 512
  static constexpr int kScaleBytes = kLatent / kScaleGroup;  // 16
  KFORGE_HD static constexpr bool Supports(int d_v, int rope) {
    return d_v == kLatent && rope == 0;
  }
  KFORGE_HD static constexpr int BytesPerToken(int) { return kDataBytes + kScaleBytes; }
  KFORGE_HD static constexpr int StagingBytesPerToken(int) { return kDataBytes + kScaleBytes; }
};

// nvfp4_ds_mla, 352 B/token, DeepSeek-V3.2 geometry (kv_lora_rank 512,
// rope_dim 64), one record per token: [0, 256) the 512 latent values as
// e2m1, two per byte, the low nibble the even column; [256, 320) the 64
// rope values as e4m3, unscaled; [320, 352) 32 e4m3 scales, one per 16
// latent values, the scale of block s (columns [16 s, 16 s + 16)) at byte
// 320 + 8 (s & 3) + (s >> 2). value = e2m1 * scale.
struct KvNvfp4DsMlaSizes {
  static constexpr bool kPageBlocked = false;
  static constexpr int kLatent = 512;
  static constexpr int kScaleGroup = 16;
  static constexpr int kRopeOffset = kLatent / 2;         // 256
  static constexpr int kScalesOffset = kRopeOffset + 64;  // 320
  KFORGE_HD static constexpr bool Supports(int d_v, int rope) {
    return d_v == kLatent && rope == 64;
  }
  KFORGE_HD static constexpr int BytesPerToken(int) {
    return kScalesOffset + kLatent / kScaleGroup;
  }
  KFORGE_HD static constexpr int StagingBytesPerToken(int d_qk) { return BytesPerToken(d_qk); }
  // The byte (from the record's start) of latent block s's scale.
  KFORGE_HD static constexpr int ScaleByte(int s) { return kScalesOffset + 8 * (s & 3) + (s >> 2); }
};

// The staging bytes per token of a pipeline that gathers a cache of format
// (staging, record) and, with an extra cache (x_record > 0), one of format
// (x_staging, x_record); staging and record are a format's
// StagingBytesPerToken and BytesPerToken. 0 (a direct pipeline) when every
// cache is direct; else each staged row holds either cache's record, a
// direct format's (bf16) rounded to whole 16-byte chunks and copied into
// the tile by its Land.
KFORGE_HD constexpr int StagedRowBytes(int staging, int record) {
  return staging > 0 ? staging : (record + 15) / 16 * 16;
}
KFORGE_HD constexpr int PipelineStagingBytes(int staging, int record, int x_staging, int x_record) {
  if (staging == 0 && (x_record == 0 || x_staging == 0)) return 0;
  const int a = StagedRowBytes(staging, record);
  const int b = x_record > 0 ? StagedRowBytes(x_staging, x_record) : 0;
  return a > b ? a : b;
}

// ---------------------------------------------------------------------------
// Tiling: the compile-time shape of the main kernel, its validity rule and
// the quantities derived from it. DecodeTraits (decode_traits.cuh) asserts
// CheckDecodeTiling; the codegen (compiler/codegen.cc) calls the same
// function to choose a tiling, so it never emits a unit that fails to
// compile and no rule is written twice.

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

// The warp-specialised pipeline (sm_90a; wspath.cuh): the wgmma tiling
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
// The crossover pair (wspath.cuh WsProducePair): a staged format's
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

// The register pipeline (stages == 1; regpath.cuh): a staged format's
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
// codegen checks). S (QkWgmma, qk.cuh): each warpgroup a 64-head x 32-token
// slab of S (m64n32k16), its 4 warps one m16 row tile each; with a
// producer warpgroup (WarpSpecialized) the first warpgroup all 64 tokens
// (m64n64k16), so Q is read from shared memory once a tile. O = P V
// (PvWgmma, pv.cuh): each warpgroup all 64 heads x d_v / 2 columns
// (m64n256k16 for d_v 512, m64n128k16 for 256). It is admitted only for the
// pipeline it was measured and checked with on the H200, 8 warps (two
// warpgroups) x 64 tokens (BENCH.md); other warp counts would compile but
// have never run. A producer warpgroup (WarpSpecialized) only for the
// 512 + 0 / 64 geometry, 64 tokens and two bf16 tiles, the shape its
// producers' thread maps (wspath.cuh) cover.
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
    // buffers of warps x head_tile x token_tile fp32 (regpath.cuh).
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

#endif  // KFORGE_SPARSE_MLA_CONFIG_H_
