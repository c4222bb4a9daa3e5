// The parameter ABI of the sparse MLA kernels: the blocks the host fills
// and passes by value (DecodeParams, CombineParams) and the launch
// constants that go with them. Shared by the host (model/, runtime/, capi/:
// the engine side includes it) and the device templates; plain C++ with
// fundamental types only, so it compiles under NVRTC with no toolkit
// headers and byte-for-byte identically on the host. A change here is an
// ABI change: the loaders check each entry's parameter size against it.
#ifndef KFORGE_SPARSE_MLA_COMMON_PARAMS_H_
#define KFORGE_SPARSE_MLA_COMMON_PARAMS_H_

#if !defined(KFORGE_HD)
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KFORGE_HD __host__ __device__
#else
#define KFORGE_HD
#endif
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
// warps with fewer loads each finish sooner; 1 above, where it is
// bandwidth-bound and the per-warp fixed work (lse loads, reductions) of 4x
// the warps costs more than it saves (BENCH.md, "Combine column slices").
KFORGE_HD constexpr int CombineColumnSlices(int d_v, long long num_tokens, int num_heads,
                                            int sm_count) {
  return num_tokens * num_heads <= 8LL * sm_count ? CombineSlices(d_v) : 1;
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_COMMON_PARAMS_H_
