#include "model/indexer_spec.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/absl_compat.h"
#include "kforge/v1/spec.pb.h"
#include "model/problems.h"
#include "model/spec.h"
#include "templates/kforge/dsa_indexer/config.h"

namespace kforge {
using dsa_indexer::IndexKeyPage;

absl::Status ValidateIndexerSpec(const v1::DsaIndexerSpec& spec) {
  Problems problems;
  if (spec.index_heads() < 1 ||
      spec.index_heads() > static_cast<uint32_t>(dsa_indexer::kMaxIndexHeads)) {
    problems.Add("index_heads", spec.index_heads(),
                 absl::StrCat("1..", dsa_indexer::kMaxIndexHeads));
  }
  if (spec.index_head_dim() != static_cast<uint32_t>(IndexKeyPage::kHeadDim)) {
    problems.Add("index_head_dim", spec.index_head_dim(), absl::StrCat(IndexKeyPage::kHeadDim));
  }
  if (spec.topk() < 1 || spec.topk() > static_cast<uint32_t>(dsa_indexer::kMaxTopk)) {
    problems.Add("topk", spec.topk(), absl::StrCat("1..", dsa_indexer::kMaxTopk));
  }
  if (spec.page_block_size() != static_cast<uint32_t>(IndexKeyPage::kPageTokens)) {
    problems.Add("page_block_size", spec.page_block_size(),
                 absl::StrCat(IndexKeyPage::kPageTokens, " (the index-key cache's page)"));
  }
  if (spec.s_q() > static_cast<uint32_t>(dsa_indexer::kMaxSq)) {
    problems.Add("s_q", spec.s_q(), absl::StrCat("0 (not given) or 1..", dsa_indexer::kMaxSq));
  }
  return problems.ToStatus();
}

absl::StatusOr<v1::DsaIndexerSpec> NormalizeIndexerSpec(const v1::DsaIndexerSpec& spec) {
  if (absl::Status status = ValidateIndexerSpec(spec); !status.ok()) return status;
  v1::DsaIndexerSpec normalized = spec;
  normalized.DiscardUnknownFields();
  normalized.clear_s_q();
  return normalized;
}

const std::vector<IndexerPresetInfo>& IndexerPresets() {
  // docs/DESIGN.md: DeepSeek-V3.2 index_n_heads 64, GLM-5 32; both
  // index_head_dim 128 and index_topk 2048.
  static const std::vector<IndexerPresetInfo>* const kPresets = new std::vector<IndexerPresetInfo>{
      {"deepseek-v3.2", 64, 128, 2048},
      {"glm-5", 32, 128, 2048},
  };
  return *kPresets;
}

absl::StatusOr<v1::DsaIndexerSpec> IndexerSpecFromPreset(std::string_view name,
                                                         int64_t tensor_parallel) {
  const IndexerPresetInfo* preset = nullptr;
  for (const IndexerPresetInfo& p : IndexerPresets()) {
    if (p.name == name) preset = &p;
  }
  const PresetInfo* model = FindPreset(name);
  if (preset == nullptr || model == nullptr) {
    std::vector<absl::string_view> known;
    for (const IndexerPresetInfo& p : IndexerPresets()) known.push_back(p.name);
    return absl::InvalidArgumentError(
        absl::StrCat("preset: got \"", AsAbsl(name), "\", supported ", absl::StrJoin(known, ", ")));
  }
  if (tensor_parallel < 1 || model->total_heads % tensor_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel: got ", tensor_parallel,
                                                   ", supported a divisor of ", model->total_heads,
                                                   " (", model->name, " heads)"));
  }
  v1::DsaIndexerSpec spec;
  spec.set_index_heads(preset->index_heads);
  spec.set_index_head_dim(preset->index_head_dim);
  spec.set_topk(preset->topk);
  spec.set_page_block_size(dsa_indexer::IndexKeyPage::kPageTokens);
  return NormalizeIndexerSpec(spec);
}

absl::StatusOr<v1::AttentionKind> ParseAttentionKind(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(AsAbsl(name));
  if (lower == "sparse-mla") return v1::ATTENTION_KIND_SPARSE_MLA_DECODE;
  if (lower == "dsa-indexer") return v1::ATTENTION_KIND_DSA_INDEXER;
  v1::AttentionKind kind;
  if (v1::AttentionKind_Parse(std::string(name), &kind) && kind != v1::ATTENTION_KIND_UNSPECIFIED) {
    return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "kind: got \"", AsAbsl(name), "\", supported sparse-mla, dsa-indexer (or the enum names)"));
}

}  // namespace kforge
