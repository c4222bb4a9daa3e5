#ifndef KFORGE_MODEL_DECODE_PLAN_H_
#define KFORGE_MODEL_DECODE_PLAN_H_

// Everything about one decode call that needs no GPU: the checks of the
// caller's tensors against the model, the variant and launch the manifest
// picks for them, and the kernels' parameter blocks. The C++ runtime
// (runtime/sparse_mla_decode.h) and the Python package (through
// capi/kforge_capi.h) both launch exactly what PlanDecode returns, so the rules
// here exist once.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kforge/v1/service.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/selector.h"
#include "templates/kforge/sparse_mla/common/params.h"

namespace kforge {

// One decode call. Query tokens are numbered request-major:
// token = request * s_q + i, num_tokens = batch * s_q. Pointers are device
// addresses (CUdeviceptr values) in the caller's context; strides are in
// elements of the pointed-to type.
struct DecodeArgs {
  uint64_t q = 0;            // bf16 [num_tokens, num_q_heads, d_qk]; not null
  uint64_t kv = 0;           // paged cache, bf16 or the uint8 fp8_ds_mla
                             // records: the row of slot s starts at
                             // (s / page_block_size) * kv_page_stride +
                             // (s % page_block_size) * kv_row_stride, strides
                             // in the cache's elements (bytes for fp8_ds_mla,
                             // see KvLayoutOf); not null
  uint64_t indices = 0;      // int32 [num_tokens, topk], row stride
                             // indices_stride; -1 or >= num_kv_slots = no
                             // token; not null
  uint64_t out = 0;          // bf16 [num_tokens, num_q_heads, d_v]; not null
  uint64_t lse = 0;          // fp32 [num_tokens, num_q_heads], contiguous
                             // (no strides), natural log, the attention's own
                             // (the sink is not in it); 0 = not wanted
  uint64_t topk_length = 0;  // int32, contiguous, one per topk_length_tokens
                             // query tokens ([batch * s_q] or [batch]):
                             // only a token's first topk_length indices
                             // count (values clamped to 0..topk; the rest
                             // are never read); 0 = all topk count
  uint64_t sink = 0;         // fp32 [num_q_heads] attention sink logits
                             // (templates/kforge/sparse_mla/common/sink.cuh);
                             // 0 = none
  // The extra KV cache, for kernels built with one (spec extra_kv; all 0
  // otherwise): attended in the same softmax as the top-k tokens.
  uint64_t extra_kv = 0;           // its paged cache, addressed as kv with the
                                   // extra_* sizes and strides; not null
  uint64_t extra_indices = 0;      // int32 [num_tokens, extra_topk], row
                                   // stride extra_indices_stride; -1 or >=
                                   // extra_num_kv_slots = no token; not null
  uint64_t extra_topk_length = 0;  // int32 like topk_length (same
                                   // topk_length_tokens), for extra_indices;
                                   // 0 = all extra_topk count

  int batch = 0;               // requests
  int s_q = 0;                 // query tokens per request (1, or 2..4 with MTP)
  int num_q_heads = 0;         // heads on this GPU
  int d_qk = 0;                // kv_lora_rank + rope_dim (576)
  int d_v = 0;                 // kv_lora_rank (512): V is the first d_v columns
  int topk = 0;                // indices per query token
  int page_block_size = 0;     // KV cache tokens per page
  int topk_length_tokens = 0;  // query tokens per topk_length entry: 1 (or
                               // 0) one per token, s_q one per request
  int64_t num_kv_slots = 0;    // num_pages * page_block_size
  v1::KvCacheDtype kv_dtype = v1::KV_CACHE_DTYPE_BF16;
  // The extra cache's (must equal the spec's extra_kv; unused without one).
  int extra_topk = 0;
  int extra_page_block_size = 0;
  int64_t extra_num_kv_slots = 0;
  v1::KvCacheDtype extra_kv_dtype = v1::KV_CACHE_DTYPE_UNSPECIFIED;

  int64_t q_token_stride = 0;
  int64_t q_head_stride = 0;
  int64_t kv_page_stride = 0;
  int64_t kv_row_stride = 0;
  int64_t indices_stride = 0;  // between query tokens
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;
  int64_t extra_kv_page_stride = 0;
  int64_t extra_kv_row_stride = 0;
  int64_t extra_indices_stride = 0;  // between query tokens

  // Must equal the model's (it is compiled into the kernel): relative
  // difference <= kSoftmaxScaleTolerance.
  double softmax_scale = 0;
};

// Alignments the kernels rely on. q and kv rows are gathered with 16-byte
// cp.async (templates/kforge/sparse_mla/common/kv_format.cuh), so their pointers and
// strides must keep every row on a 16-byte boundary; out is written as
// pairs of bf16 (4-byte stores) by both kernels; indices, lse, topk_length
// and sink are read/written as 4-byte scalars.
inline constexpr int kQKvAlignBytes = 16;
inline constexpr int kOutAlignBytes = 4;
inline constexpr int kIndicesLseAlignBytes = 4;
// PlanDecode looks at a pointer only to check that it is not null and that
// its value modulo each alignment above is 0, and copies it into the
// parameter blocks; the workspace only places o_accum and lse_accum in
// them. So a plan made for some pointers holds for any others that are null
// where they were and equal to them modulo kDecodePointerModulus, once the
// pointers in its blocks are replaced (the Python package caches plans
// that way; capi's kforge_decode_pointer_modulus and kforge_offsetof).
inline constexpr int kDecodePointerModulus = 16;
static_assert(kDecodePointerModulus % kQKvAlignBytes == 0 &&
                  kDecodePointerModulus % kOutAlignBytes == 0 &&
                  kDecodePointerModulus % kIndicesLseAlignBytes == 0,
              "every pointer alignment PlanDecode checks must divide kDecodePointerModulus");
// The scale is baked into the kernel as a float; a caller's double that
// rounds to it differs by about 6e-8 relative.
inline constexpr double kSoftmaxScaleTolerance = 1e-6;

// How a spec's KV cache is addressed: the bytes of one token's record and
// the size of the element its strides count (the layouts themselves are
// templates/kforge/sparse_mla/common/kv_layout.h's, shared with the kernels).
struct KvCacheLayout {
  int row_bytes;      // bf16: 2 * d_qk (1152); fp8_ds_mla: 656 (528 without rope); ...
  int element_bytes;  // 2 (bf16 elements) or 1 (quantised records: strides in bytes)
  bool page_blocked;  // data rows, then scale rows, per page (kv_row_stride = row_bytes)
};
KvCacheLayout KvLayoutOf(const v1::AttentionSpec& spec);
// The same for the spec's extra cache (extra_kv), which must be set.
KvCacheLayout ExtraKvLayoutOf(const v1::AttentionSpec& spec);

// Checks `args` against the model the manifest was built for (every variant
// shares heads, d_qk, d_v, topk, page size, dtype, scale, return_lse)
// before anything is launched. InvalidArgument naming the field, the value
// and what the kernels support: null pointers, non-positive sizes, sizes and
// scale that differ from the model, strides smaller than the row they step
// over (rows are head-inner: token stride >= heads * head stride),
// misaligned pointers and strides (see kQKvAlignBytes), lse given when the
// kernels were built without return_lse. FailedPrecondition for a manifest
// with no variants.
absl::StatusOr<RuntimeShape> ValidateDecodeArgs(const DecodeArgs& args,
                                                const v1::Manifest& manifest);

// What to launch for one call: the selection (variant, grids, workspace
// size) and both parameter blocks, filled for a workspace at `workspace`
// (which must hold selection.workspace_bytes; 0 when none is needed).
struct DecodeLaunch {
  Selection selection;
  sparse_mla::DecodeParams main{};
  sparse_mla::CombineParams combine{};  // meaningful when needs_combine
};

// ValidateDecodeArgs + Select + the parameter blocks.
absl::StatusOr<DecodeLaunch> PlanDecode(const v1::Manifest& manifest, const DeviceInfo& device,
                                        const DecodeArgs& args, uint64_t workspace);

// Workspace layout (selection.workspace_bytes at `workspace`, only when
// selection.needs_combine): fp32 o_accum [num_splits, num_tokens, heads,
// d_v], then fp32 lse_accum [num_splits, num_tokens, heads].
sparse_mla::DecodeParams MakeDecodeParams(const Selection& selection, const DecodeArgs& args,
                                          uint64_t workspace);
sparse_mla::CombineParams MakeCombineParams(const Selection& selection, const DecodeArgs& args,
                                            uint64_t workspace);

// The workspace that serves every call of up to max_tokens (batch * s_q)
// query tokens with any variant on `device`: reserve it before capturing a
// CUDA graph. InvalidArgument for max_tokens < 1.
absl::StatusOr<uint64_t> WorkspaceBytesFor(const v1::Manifest& manifest, const DeviceInfo& device,
                                           int max_tokens);

}  // namespace kforge

#endif  // KFORGE_MODEL_DECODE_PLAN_H_
