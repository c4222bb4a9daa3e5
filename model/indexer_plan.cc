#include "model/indexer_plan.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/problems.h"

namespace kforge {
namespace {

using dsa_indexer::IndexKeyPage;

// Grid y and z hold at most 65535 blocks.
constexpr int64_t kMaxGridY = 65535;

// The module itself: an indexer spec and the launch its compile recorded.
void CheckModule(const v1::DsaIndexerSpec& spec, const v1::IndexerLaunch& launch, Problems& p) {
  if (launch.logits_params_bytes() != sizeof(dsa_indexer::LogitsParams) ||
      launch.topk_params_bytes() != sizeof(dsa_indexer::TopkParams)) {
    p.Add("launch.logits_params_bytes / topk_params_bytes",
          absl::StrCat(launch.logits_params_bytes(), " / ", launch.topk_params_bytes()),
          absl::StrCat(sizeof(dsa_indexer::LogitsParams), " / ", sizeof(dsa_indexer::TopkParams),
                       " (this build's config.h)"));
  }
  // The kernels stride by the block and split rows by the cluster size they
  // were compiled with: a launch that says otherwise is not this build's.
  if (launch.topk_block_threads() != dsa_indexer::kTopkThreads) {
    p.Add("launch.topk_block_threads", launch.topk_block_threads(),
          absl::StrCat(dsa_indexer::kTopkThreads, " (this build's config.h)"));
  }
  // The logits chunk: whole pages of one of this build's two kernels (the
  // wgmma one sizes its page list by kLogitsWgmmaPagesPerCta).
  const uint32_t page = dsa_indexer::IndexKeyPage::kPageTokens;
  const uint32_t keys = launch.logits_keys_per_cta(), min_keys = launch.logits_min_keys_per_cta();
  const bool fixed = min_keys == 0 && keys == page * dsa_indexer::LogitsPagesPerCta(false);
  const bool from_grid = keys == page * dsa_indexer::LogitsPagesPerCta(true) &&
                         min_keys == page * dsa_indexer::kLogitsWgmmaMinPagesPerCta;
  if (!fixed && !from_grid) {
    p.Add("launch.logits_keys_per_cta / logits_min_keys_per_cta",
          absl::StrCat(keys, " / ", min_keys),
          absl::StrCat(page * dsa_indexer::LogitsPagesPerCta(false), " / 0 or ",
                       page * dsa_indexer::LogitsPagesPerCta(true), " / ",
                       page * dsa_indexer::kLogitsWgmmaMinPagesPerCta, " (this build's config.h)"));
  }
  if (launch.has_topk_cluster()) {
    const v1::IndexerTopkCluster& c = launch.topk_cluster();
    if (c.entry().empty() || c.ctas() != dsa_indexer::kTopkClusterCtas ||
        c.smem_bytes() != static_cast<uint32_t>(dsa_indexer::TopkClusterSmemBytes(spec.topk()))) {
      p.Add("launch.topk_cluster", absl::StrCat(c.ctas(), " CTAs, ", c.smem_bytes(), " bytes"),
            absl::StrCat("an entry, ", dsa_indexer::kTopkClusterCtas, " CTAs, ",
                         dsa_indexer::TopkClusterSmemBytes(spec.topk()),
                         " bytes (this build's config.h)"));
    }
  }
}

// The query rows of a decode step (s_q per request) or a prefill chunk
// (query_start's ragged rows); returns how many, which is the grid's row
// dimension (at most kMaxGridY: the logits kernel's grid.y).
template <class Args>
int64_t CheckRows(const Args& a, Problems& p) {
  if (a.batch < 1) p.Add("batch", a.batch, ">= 1");
  if (a.query_start != 0) {
    p.Aligned("query_start", a.query_start, 4);
    if (a.s_q != 0) {
      p.Add("s_q", a.s_q, "0 with query_start (prefill: the rows per request are query_start's)");
    }
    if (a.rows < 1 || a.rows > kMaxGridY) p.Add("rows", a.rows, absl::StrCat("1..", kMaxGridY));
    return a.rows;
  }
  if (a.s_q < 1 || a.s_q > dsa_indexer::kMaxSq) {
    p.Add("s_q", a.s_q, absl::StrCat("1..", dsa_indexer::kMaxSq, " (or query_start for prefill)"));
  }
  const int64_t rows = int64_t{a.batch} * a.s_q;
  if (a.batch >= 1 && a.s_q >= 1 && rows > kMaxGridY) {
    p.Add("batch * s_q", rows, absl::StrCat("1..", kMaxGridY));
  }
  if (a.rows != 0 && a.rows != rows) {
    p.Add("rows", a.rows, absl::StrCat("0 or batch * s_q = ", rows, " without query_start"));
  }
  return rows;
}

}  // namespace

absl::StatusOr<IndexerKernelLaunch<dsa_indexer::LogitsParams>> PlanIndexerLogits(
    const v1::DsaIndexerSpec& spec, const v1::IndexerLaunch& launch, const IndexerLogitsArgs& a) {
  Problems p;
  CheckModule(spec, launch, p);
  const int64_t rows = CheckRows(a, p);
  const int64_t heads = spec.index_heads();
  for (const auto& [field, ptr] : {std::pair<const char*, uint64_t>{"q", a.q},
                                   {"weights", a.weights},
                                   {"index_cache", a.index_cache},
                                   {"block_table", a.block_table},
                                   {"context_lens", a.context_lens},
                                   {"logits", a.logits}}) {
    p.NonNull(field, ptr);
  }
  // 16-byte copies of q rows and cache pages, 4-byte scalars elsewhere.
  p.Aligned("q", a.q, 16);
  p.Aligned("q_row_stride", static_cast<uint64_t>(a.q_row_stride), 16);
  p.Aligned("index_cache", a.index_cache, 16);
  p.Aligned("page_stride", static_cast<uint64_t>(a.page_stride), 16);
  for (const auto& [field, ptr] : {std::pair<const char*, uint64_t>{"weights", a.weights},
                                   {"block_table", a.block_table},
                                   {"context_lens", a.context_lens},
                                   {"logits", a.logits}}) {
    p.Aligned(field, ptr, 4);
  }
  p.AtLeast("q_row_stride", a.q_row_stride, heads * IndexKeyPage::kHeadDim);
  p.AtLeast("weights_row_stride", a.weights_row_stride, heads);
  p.AtLeast("page_stride", a.page_stride, IndexKeyPage::kBytes);
  p.AtLeast("max_context", a.max_context, 1);
  p.AtLeast("block_table_cols", a.block_table_cols,
            (int64_t{a.max_context} + IndexKeyPage::kPageTokens - 1) / IndexKeyPage::kPageTokens);
  p.AtLeast("block_table_stride", a.block_table_stride, a.block_table_cols);
  p.AtLeast("logits_cols", a.logits_cols, a.max_context);
  p.AtLeast("logits_stride", a.logits_stride, a.logits_cols);
  if (absl::Status s = p.ToStatus(); !s.ok()) return s;

  IndexerKernelLaunch<dsa_indexer::LogitsParams> l;
  l.entry = launch.logits_entry();
  // The chunk: the module's, or (a kernel that takes it from its grid)
  // halved down to the least it allows while the grid is under
  // kLogitsTargetCtas CTAs (config.h).
  int64_t pages_per_cta = launch.logits_keys_per_cta() / dsa_indexer::IndexKeyPage::kPageTokens;
  const int64_t min_pages =
      launch.logits_min_keys_per_cta() / dsa_indexer::IndexKeyPage::kPageTokens;
  while (min_pages > 0 && pages_per_cta / 2 >= min_pages &&
         rows * dsa_indexer::LogitsGridX(a.max_context, static_cast<int>(pages_per_cta)) <
             dsa_indexer::kLogitsTargetCtas) {
    pages_per_cta /= 2;
  }
  l.grid_x = static_cast<uint32_t>(
      dsa_indexer::LogitsGridX(a.max_context, static_cast<int>(pages_per_cta)));
  l.grid_y = static_cast<uint32_t>(rows);
  l.block_threads = launch.logits_block_threads();
  l.dynamic_smem_bytes = launch.logits_smem_bytes();
  l.programmatic = launch.programmatic();
  dsa_indexer::LogitsParams& k = l.params;
  k.q = reinterpret_cast<const unsigned char*>(a.q);
  k.weights = reinterpret_cast<const float*>(a.weights);
  k.kv = reinterpret_cast<const unsigned char*>(a.index_cache);
  k.block_table = reinterpret_cast<const int*>(a.block_table);
  k.context_lens = reinterpret_cast<const int*>(a.context_lens);
  k.logits = reinterpret_cast<float*>(a.logits);
  k.q_row_stride = a.q_row_stride;
  k.weights_row_stride = a.weights_row_stride;
  k.page_stride = a.page_stride;
  k.block_table_stride = a.block_table_stride;
  k.logits_stride = a.logits_stride;
  k.query_start = reinterpret_cast<const int*>(a.query_start);
  k.batch = a.batch;
  k.s_q = a.s_q;
  k.rows = static_cast<int>(rows);
  k.max_context = a.max_context;
  return l;
}

absl::StatusOr<IndexerKernelLaunch<dsa_indexer::TopkParams>> PlanIndexerTopk(
    const v1::DsaIndexerSpec& spec, const v1::IndexerLaunch& launch, const IndexerTopkArgs& a) {
  Problems p;
  CheckModule(spec, launch, p);
  const int64_t rows = CheckRows(a, p);
  for (const auto& [field, ptr] : {std::pair<const char*, uint64_t>{"logits", a.logits},
                                   {"context_lens", a.context_lens},
                                   {"indices", a.indices}}) {
    p.NonNull(field, ptr);
  }
  for (const auto& [field, ptr] : {std::pair<const char*, uint64_t>{"logits", a.logits},
                                   {"context_lens", a.context_lens},
                                   {"indices", a.indices},
                                   {"block_table", a.block_table},
                                   {"slots", a.slots}}) {
    p.Aligned(field, ptr, 4);
  }
  if ((a.block_table == 0) != (a.slots == 0)) {
    p.Add("slots", a.slots == 0 ? "null" : "an address", "both block_table and slots, or neither");
  }
  p.AtLeast("indices_stride", a.indices_stride, spec.topk());
  if (a.slots != 0) {
    p.AtLeast("slots_stride", a.slots_stride, spec.topk());
    p.AtLeast("slot_page_size", a.slot_page_size, 1);
  }
  p.AtLeast("max_context", a.max_context, 1);
  p.AtLeast("logits_stride", a.logits_stride, a.max_context);
  if (absl::Status s = p.ToStatus(); !s.ok()) return s;

  IndexerKernelLaunch<dsa_indexer::TopkParams> l;
  l.entry = launch.topk_entry();
  l.grid_x = static_cast<uint32_t>(rows);
  l.block_threads = launch.topk_block_threads();
  l.dynamic_smem_bytes = launch.topk_smem_bytes();
  l.programmatic = launch.programmatic();
  // Few rows: a cluster of CTAs per row (config.h's launch rule).
  const v1::IndexerTopkCluster& c = launch.topk_cluster();
  if (launch.has_topk_cluster() &&
      (rows <= c.short_rows() ||
       (rows <= c.max_rows() && static_cast<uint32_t>(a.max_context) >= c.long_context()))) {
    l.entry = c.entry();
    l.grid_x = static_cast<uint32_t>(rows * c.ctas());
    l.dynamic_smem_bytes = c.smem_bytes();
  }
  dsa_indexer::TopkParams& k = l.params;
  k.logits = reinterpret_cast<const float*>(a.logits);
  k.context_lens = reinterpret_cast<const int*>(a.context_lens);
  k.indices = reinterpret_cast<int*>(a.indices);
  k.block_table = reinterpret_cast<const int*>(a.block_table);
  k.slots = reinterpret_cast<int*>(a.slots);
  k.logits_stride = a.logits_stride;
  k.indices_stride = a.indices_stride;
  k.block_table_stride = a.block_table_stride;
  k.slots_stride = a.slots_stride;
  k.query_start = reinterpret_cast<const int*>(a.query_start);
  k.batch = a.batch;
  k.s_q = a.s_q;
  k.rows = static_cast<int>(rows);
  k.slot_page_size = a.slot_page_size > 0 ? a.slot_page_size : 1;
  k.max_context = a.max_context;
  return l;
}

}  // namespace kforge
