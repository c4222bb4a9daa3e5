// Shared by the host (codegen, Python's parameter blocks through their
// sizes) and the device templates of the DSA lightning indexer: the two
// parameter blocks, the index-key page layout and the limits, each written
// once. Plain C++ with fundamental types only, so it compiles under NVRTC
// with no toolkit headers and byte-for-byte identically on the host.
//
// The computation (docs/DESIGN.md, "The DSA lightning indexer"): for query
// row r of request b (context length L_b; decode: r = b * s_q + i at
// position p = L_b - s_q + i; prefill: the request's n_b rows from
// query_start[b], row query_start[b] + i at p = L_b - n_b + i) and every
// cached position s <= p,
//   logit[r, s] = sum_{j < H} w[r, j] * max(0, q8[r, j] . k8[s]) * scale[s]
// then the top-k positions of each row by logit (descending, ties by the
// smaller position, -1 padding) and, optionally, their cache slots.
#ifndef KFORGE_DSA_INDEXER_CONFIG_H_
#define KFORGE_DSA_INDEXER_CONFIG_H_

#ifndef KFORGE_HD
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KFORGE_HD __host__ __device__
#else
#define KFORGE_HD
#endif
#endif

namespace kforge {
namespace dsa_indexer {

// The index-key cache page (vLLM's indexer cache, DeepGEMM's
// fp8_paged_mqa_logits input): kPageTokens keys of kHeadDim e4m3 bytes,
// token-major, then their kPageTokens fp32 scales. 132 bytes per token.
struct IndexKeyPage {
  static constexpr int kPageTokens = 64;
  static constexpr int kHeadDim = 128;
  static constexpr int kValueBytes = kPageTokens * kHeadDim;  // scales start here
  static constexpr int kBytes = kPageTokens * (kHeadDim + 4);
};

// Limits of the template family (what the kernels are written for).
constexpr int kMaxIndexHeads = 128;  // 8 warps of 16 head rows
constexpr int kMaxTopk = 4096;       // the engines' largest (2048) with room
constexpr int kMaxSq = 4;            // plain decode plus up to 3 MTP tokens

// Parameter block of the logits kernel (dsa_indexer_logits), passed by
// value. Strides are in elements of the pointed-to type. Device pointers.
struct LogitsParams {
  const unsigned char* q;   // e4m3 [rows, index_heads, 128], row = b * s_q + i;
                            // heads contiguous (128 bytes each); not null
  const float* weights;     // fp32 [rows, index_heads], q's scale and the
                            // model's H^-0.5 D^-0.5 folded in; not null
  const unsigned char* kv;  // pages of IndexKeyPage::kBytes, page_stride apart;
                            // not null
  const int* block_table;   // int32 [batch, block_table_stride]: page of
                            // positions [64 n, 64 n + 64) of request b at
                            // [b, n]; only pages below the context are read
  const int* context_lens;  // int32 [batch], L_b >= 0 (the current tokens
                            // included); not null
  float* logits;            // fp32 [rows, logits_stride]; positions
                            // [0, max_context) written, -inf where masked
  long long q_row_stride;   // bytes between query rows (>= index_heads * 128)
  long long weights_row_stride;
  long long page_stride;  // bytes between pages (>= IndexKeyPage::kBytes)
  long long block_table_stride;
  long long logits_stride;  // floats between rows (>= max_context)
  const int* query_start;   // prefill: int32 [batch + 1], request b's query
                            // rows [query_start[b], query_start[b + 1]) at
                            // positions L_b - n_b + i (n_b rows; any number);
                            // null: decode, s_q rows per request (LocateRow)
  int batch;
  int s_q;          // decode: query rows per request, 1..kMaxSq; prefill: 0
  int rows;         // query rows: batch * s_q, or prefill's total; grid.y
  int max_context;  // >= every L_b; grid.x covers it
};

// Parameter block of the top-k kernel (dsa_indexer_topk), passed by value.
struct TopkParams {
  const float* logits;      // fp32 [rows, logits_stride]; only positions
                            // [0, len_r) are read, len_r = the row's causal
                            // length (min(L_b, L_b - s_q + i + 1), >= 0),
                            // at most max_context
  const int* context_lens;  // int32 [batch]; not null
  int* indices;             // int32 [rows, indices_stride]: the top-k
                            // positions, -1 after the valid ones; not null
  const int* block_table;   // int32 [batch, block_table_stride] of the cache
                            // the slots address (sparse MLA's); null: no slots
  int* slots;               // int32 [rows, slots_stride]: block_table[b, pos /
                            // slot_page_size] * slot_page_size + pos %
                            // slot_page_size, -1 kept; null: not written
  long long logits_stride;
  long long indices_stride;
  long long block_table_stride;
  long long slots_stride;
  const int* query_start;  // prefill's rows per request, as LogitsParams'
  int batch;
  int s_q;
  int rows;            // grid.x
  int slot_page_size;  // tokens per page of the slot cache (>= 1)
  int max_context;     // positions [0, max_context) of a row exist; a row's
                       // length is clamped to it (a caller's short bound
                       // never makes the kernel read past the row)
};

// The launch of each kernel (one rule for the host and the device).
// Logits: grid (ceil(max_context / (64 * LogitsPagesPerCta(wgmma))), rows),
// block LogitsThreads(heads, wgmma), wgmma on sm_90a only. Top-k: grid
// (rows), block kTopkThreads; or, on sm_90+ for few rows
// (kTopkClusterShortRows, or kTopkClusterMaxRows of a long context), the
// cluster entry: grid (rows * kTopkClusterCtas) in clusters of
// kTopkClusterCtas along x.
//
// mma.sync logits (every arch but sm_90a): one warp per 16 head rows, Q in
// registers, kPagesPerCta pages per CTA.
KFORGE_HD constexpr int HeadRowTiles(int heads) { return (heads + 15) / 16; }
constexpr int kPagesPerCta = 4;  // key pages a logits CTA walks (Q stays in registers)
// Logits CTAs resident per SM, the entry's __launch_bounds__ minimum: 1024
// threads, so 64 registers a thread (the kernel is a stream of small CTAs;
// at 72 registers, 7 of 128 threads fit and the 128 x 32768 logits took 6%
// longer on the H200).
//
// wgmma logits (sm_90a): one warpgroup a CTA, walking its chunk of pages
// through a ring of kLogitsWgmmaStages shared-memory stages (each page one
// bulk copy, as it is in the cache): a page's 64 keys are the A operand
// (e4m3 -> f16 into registers from the stage), Q the B operand (f16 in
// shared memory, N = the heads rounded up to a wgmma width). 512 threads
// per SM while N <= 64 (128 registers a thread), else 256: four
// warpgroups an SM beat a deeper pipeline in fewer (two sets of A
// fragments need 201 registers: at 2 CTAs an SM 30% slower, BENCH.md
// "logits variants, top-k survivors by a merge"). Four stages:
// the most 4 CTAs an SM hold in 228 KB (indexer_spec_test). Untuned: with
// one accumulator 2 stages were as fast as 4 (BENCH.md, "the logits' pages
// by bulk copies"); the two-accumulator kernel was measured with 4 only.
constexpr int kLogitsWgmmaStages = 4;
constexpr int kLogitsWgmmaPagesPerCta = 32;
// The wgmma kernel takes ceil(ceil(max_context / 64) / gridDim.x) pages a
// CTA (at most kLogitsWgmmaPagesPerCta). The plan halves the chunk from 32
// pages down to kLogitsWgmmaMinPagesPerCta while the grid has fewer than
// kLogitsTargetCtas CTAs: long chunks amortise a CTA's start (Q staged, the
// first loads' latency), short ones fill the GPU at few rows: 8 pages won
// at one long row, 32 at many (BENCH.md, "wgmma logits: CTA shape" and
// "the chunk from the grid").
constexpr int kLogitsWgmmaMinPagesPerCta = 8;
constexpr int kLogitsTargetCtas = 1024;
KFORGE_HD constexpr int LogitsWgmmaN(int heads) {
  return heads <= 16 ? 16 : (heads <= 32 ? 32 : (heads <= 64 ? 64 : 128));
}
KFORGE_HD constexpr int LogitsThreads(int heads, bool wgmma) {
  return wgmma ? 128 : 32 * HeadRowTiles(heads);
}
KFORGE_HD constexpr int LogitsPagesPerCta(bool wgmma) {
  return wgmma ? kLogitsWgmmaPagesPerCta : kPagesPerCta;
}
// The logits grid's x for a chunk of `pages_per_cta` pages, and the chunk
// the wgmma kernel derives back from it (never more than pages_per_cta).
KFORGE_HD constexpr long long LogitsGridX(long long max_context, int pages_per_cta) {
  return (max_context + 64LL * pages_per_cta - 1) / (64LL * pages_per_cta);
}
KFORGE_HD constexpr int LogitsChunkPages(int max_context, int grid_x) {
  return ((max_context + 63) / 64 + grid_x - 1) / grid_x;
}
KFORGE_HD constexpr int LogitsMinBlocks(int heads, bool wgmma) {
  const int threads_per_sm = wgmma ? (LogitsWgmmaN(heads) <= 64 ? 512 : 256) : 1024;
  const int blocks = threads_per_sm / LogitsThreads(heads, wgmma);
  return blocks > 0 ? blocks : 1;
}
constexpr int kLogitsStages = 2;
constexpr int kTopkThreads = 512;
// Logits each top-k thread loads at once in a pass over a row (their loads
// in flight together: one at a time, a pass was a chain of L2 round trips).
constexpr int kTopkUnroll = 8;
// CTAs of a top-k row in the cluster entry (the portable cluster size, so
// every sm_90+ part runs it without an opt-in), and the rows it takes: up
// to kTopkClusterShortRows whatever their length, up to kTopkClusterMaxRows
// when max_context is at least kTopkClusterLongContext. Past 8 rows the
// clusters no longer run at once, and one CTA per row wins on short rows
// (H200, BENCH.md "Top-k over a cluster per row": 16 x 32768 one CTA 28-29
// us, cluster 40-44; 16 x 131072 one CTA 88-97, cluster 44-48; 32 x 131072
// 89-97 against 69-71).
constexpr int kTopkClusterCtas = 8;
constexpr int kTopkClusterShortRows = 8;
constexpr int kTopkClusterMaxRows = 32;
constexpr int kTopkClusterLongContext = 65536;
// Shared counters of the top-k kernel: one per (unrolled load, warp) for
// the collect pass's position-order ranks, then three scalars.
constexpr int kTopkCounters = kTopkUnroll * (kTopkThreads / 32) + 5;
// Sort words of the top digit's boundary bin a top-k CTA keeps in shared
// memory for the later digits (a CTA holding more reads its part of the
// row again for each).
constexpr int kTopkCandidates = 4096;

// Shared memory of the logits kernel. mma.sync: kLogitsStages pages and
// one float per (warp, key) for the cross-warp sum. wgmma: Q as f16 (two
// 64-column blocks of N rows x 128 bytes, 1024-byte aligned: the start of
// dynamic shared memory), the ring of kLogitsWgmmaStages pages, an 8-byte
// mbarrier per stage, N weights, the CTA's page ids.
KFORGE_HD constexpr int LogitsWgmmaRingOffset(int heads) { return LogitsWgmmaN(heads) * 2 * 128; }
KFORGE_HD constexpr int LogitsWgmmaBarriersOffset(int heads) {
  return LogitsWgmmaRingOffset(heads) + kLogitsWgmmaStages * IndexKeyPage::kBytes;
}
KFORGE_HD constexpr int LogitsWgmmaWeightsOffset(int heads) {
  return LogitsWgmmaBarriersOffset(heads) + kLogitsWgmmaStages * 8;
}
KFORGE_HD constexpr int LogitsSmemBytes(int heads, bool wgmma) {
  return wgmma ? LogitsWgmmaWeightsOffset(heads) + LogitsWgmmaN(heads) * 4 +
                     kLogitsWgmmaPagesPerCta * 4
               : kLogitsStages * IndexKeyPage::kBytes +
                     HeadRowTiles(heads) * IndexKeyPage::kPageTokens * 4;
}

// Bins of the top-k radix histogram: digits of 11 bits (then 10).
constexpr int kTopkBins = 2048;
// Shared memory of the top-k kernel: kTopkCandidates 64-bit candidate
// words, the kTopkBins histogram, kTopkCounters counters, and each
// thread's kTopkUnroll in-warp offsets of a position-ordered round (kept
// here across the round's barriers: in registers they spilled), and k
// survivor positions (the two position-ordered lists the output ranks are
// merged from: topk.cuh, MergeSelect).
KFORGE_HD constexpr int TopkSmemBytes(int topk) {
  return kTopkCandidates * 8 + kTopkBins * 4 + kTopkCounters * 4 + kTopkUnroll * kTopkThreads * 4 +
         topk * 4;
}
// The cluster entry's: one more kTopkBins histogram, the cluster's sums,
// and a count per CTA of the cluster.
KFORGE_HD constexpr int TopkClusterSmemBytes(int topk) {
  return TopkSmemBytes(topk) + kTopkBins * 4 + kTopkClusterCtas * 4;
}

}  // namespace dsa_indexer
}  // namespace kforge

#endif  // KFORGE_DSA_INDEXER_CONFIG_H_
