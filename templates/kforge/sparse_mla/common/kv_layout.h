// The KV cache formats' byte layouts: the numbers the host needs (record
// and staging bytes per token, where values, scales and rope sit). The
// device half of a format (how a record becomes a bf16 row of the KV tile)
// is the type of the same name without "Sizes" in kv_format.cuh, which
// inherits these, so the host sizes shared memory from the very constants
// the kernel uses. Plain C++ shared by the host (model/spec.cc, the
// codegen) and NVRTC.
#ifndef KFORGE_SPARSE_MLA_COMMON_KV_LAYOUT_H_
#define KFORGE_SPARSE_MLA_COMMON_KV_LAYOUT_H_

#if !defined(KFORGE_HD)
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KFORGE_HD __host__ __device__
#else
#define KFORGE_HD
#endif
#endif

namespace kforge {
namespace sparse_mla {

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

// The formats below (byte layouts as vLLM's
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

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_COMMON_KV_LAYOUT_H_
