// Shared by the host (codegen, runtime) and the device templates: the kernel
// parameter blocks and the shared-memory layout arithmetic. Plain C++ with
// fundamental types only, so it compiles under NVRTC with no toolkit headers
// and byte-for-byte identically on the host.
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
  const unsigned short* q;  // bf16 [num_tokens, num_q_heads, d_qk]; not null
  const unsigned short* kv;  // bf16 cache; row of slot s at
                             // (s / page_block) * kv_page_stride +
                             // (s % page_block) * kv_row_stride; not null
  const int* indices;        // int32 [num_tokens, topk]; -1 or >= num_kv_slots
                             // means "no token"; not null
  unsigned short* out;       // bf16 [num_tokens, num_q_heads, d_v]; not null
  float* lse;                // fp32 [num_tokens, num_q_heads], natural log;
                             // may be null (then not written)
  float* o_accum;    // fp32 [num_splits, num_tokens, num_q_heads, d_v];
                     // workspace, null when num_splits == 1
  float* lse_accum;  // fp32 [num_splits, num_tokens, num_q_heads]; workspace,
                     // null when num_splits == 1
  long long q_token_stride;
  long long q_head_stride;
  long long kv_page_stride;
  long long kv_row_stride;
  long long num_kv_slots;
  long long indices_stride;  // between query tokens
  long long out_token_stride;
  long long out_head_stride;
  int num_tokens;        // batch * s_q
  int num_splits;        // >= 1; grid.y
  int tokens_per_split;  // multiple of the token tile
  int reserved;          // keeps the block a multiple of 8 bytes
};

// Parameter block of the combine kernel (only launched when num_splits > 1).
struct CombineParams {
  const float* o_accum;    // fp32 [num_splits, num_tokens, num_q_heads, d_v]
  const float* lse_accum;  // fp32 [num_splits, num_tokens, num_q_heads]
  unsigned short* out;     // bf16 [num_tokens, num_q_heads, d_v]
  float* lse;              // fp32 [num_tokens, num_q_heads]; may be null
  long long out_token_stride;
  long long out_head_stride;
  int num_tokens;
  int num_splits;
};

// Threads that gather one KV row together: 8 x 16 B = 128 contiguous bytes
// per row per warp instruction (every d_qk is a multiple of 64 elements, so
// a row is always a whole number of 8-chunk groups).
constexpr int kThreadsPerRow = 8;
// Heads handled by one warp of the combine kernel's block.
constexpr int kCombineWarps = 4;

// Shared memory of the main kernel, in bytes: the resident Q tile, the KV
// pipeline stages, the bf16 P tile (rows padded by 16 B against bank
// conflicts), the cross-warp row-max buffer, per-row rescale/max/sum and the
// per-stage token validity flags.
KFORGE_HD constexpr int DecodeSmemBytes(int head_tile, int token_tile,
                                        int stages, int d_qk, int warps_n) {
  return head_tile * d_qk * 2                 // Q
         + stages * token_tile * d_qk * 2     // KV stages
         + head_tile * (token_tile + 8) * 2   // P
         + warps_n * head_tile * 4            // row max / row sum exchange
         + 2 * head_tile * 4                  // row scale, row max
         + stages * token_tile * 4;           // validity flags
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_CONFIG_H_
