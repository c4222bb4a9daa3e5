#ifndef KFORGE_MODEL_INDEXER_PLAN_H_
#define KFORGE_MODEL_INDEXER_PLAN_H_

// One DSA indexer call without a GPU: the checks of the caller's tensors
// against the module's spec and the two kernels' launches with their
// parameter blocks (templates/kforge/dsa_indexer/config.h). The C++ runtime
// (runtime/dsa_indexer.h) launches exactly what these return.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/spec.pb.h"
#include "templates/kforge/dsa_indexer/config.h"

namespace kforge {

// Logits of one step. Query rows are request-major. Decode (query_start
// 0): s_q rows per request, row = b * s_q + i at position context_lens[b] -
// s_q + i. Prefill (query_start set, s_q 0): request b's rows are
// [query_start[b], query_start[b + 1]) of `rows`, row query_start[b] + i at
// position context_lens[b] - n_b + i (ragged: any n_b; a row no request
// holds gets no valid position). Pointers are device addresses; strides in
// elements of the pointed-to type (bytes for q and the cache).
struct IndexerLogitsArgs {
  uint64_t q = 0;             // e4m3 [rows, index_heads, 128], heads contiguous
  uint64_t weights = 0;       // fp32 [rows, index_heads]
  uint64_t index_cache = 0;   // pages of 64 x 132 bytes (config.h IndexKeyPage)
  uint64_t block_table = 0;   // int32 [batch, block_table_cols]
  uint64_t context_lens = 0;  // int32 [batch]
  uint64_t logits = 0;        // fp32 [rows, logits_cols]
  int64_t q_row_stride = 0;
  int64_t weights_row_stride = 0;
  int64_t page_stride = 0;
  int64_t block_table_stride = 0;
  int64_t block_table_cols = 0;
  int64_t logits_stride = 0;
  int64_t logits_cols = 0;
  uint64_t query_start = 0;  // prefill: int32 [batch + 1]; 0: decode
  int batch = 0;
  int s_q = 0;          // decode: 1..4; prefill: 0
  int rows = 0;         // prefill: the query rows (1..65535); decode: 0 or batch * s_q
  int max_context = 0;  // >= every context length (the caller's bound, never read)
};

// Top-k (and slots) of one step's logits.
struct IndexerTopkArgs {
  uint64_t logits = 0;        // fp32 [rows, >= max context], logits_stride
  uint64_t context_lens = 0;  // int32 [batch]
  uint64_t indices = 0;       // int32 [rows, topk], indices_stride
  uint64_t block_table = 0;   // int32 [batch, *] of the slot cache; 0: no slots
  uint64_t slots = 0;         // int32 [rows, topk]; 0 exactly when block_table is 0
  int64_t logits_stride = 0;
  int64_t indices_stride = 0;
  int64_t block_table_stride = 0;
  int64_t slots_stride = 0;
  uint64_t query_start = 0;  // prefill's rows per request, as IndexerLogitsArgs'
  int batch = 0;
  int s_q = 0;
  int rows = 0;
  int slot_page_size = 0;  // >= 1 (64 for the sparse MLA cache)
  int max_context = 0;     // >= 1: the logits' positions; longer rows are cut
};

// One kernel launch: entry, grid, block, dynamic shared memory and the
// parameter block to pass by value.
template <typename Params>
struct IndexerKernelLaunch {
  std::string entry;
  uint32_t grid_x = 1, grid_y = 1, grid_z = 1;
  uint32_t block_threads = 0;
  uint32_t dynamic_smem_bytes = 0;
  // cuLaunchKernelEx with programmatic stream serialization (sm_90+, the
  // module's IndexerLaunch.programmatic).
  bool programmatic = false;
  Params params{};
};

// InvalidArgument naming the field, the value and what is supported
// ("s_q: got 5, supported 1..4") when the arguments do not fit the module
// (spec, launch: an indexer artifact's or manifest variant's).
absl::StatusOr<IndexerKernelLaunch<dsa_indexer::LogitsParams>> PlanIndexerLogits(
    const v1::DsaIndexerSpec& spec, const v1::IndexerLaunch& launch, const IndexerLogitsArgs& args);
absl::StatusOr<IndexerKernelLaunch<dsa_indexer::TopkParams>> PlanIndexerTopk(
    const v1::DsaIndexerSpec& spec, const v1::IndexerLaunch& launch, const IndexerTopkArgs& args);

}  // namespace kforge

#endif  // KFORGE_MODEL_INDEXER_PLAN_H_
