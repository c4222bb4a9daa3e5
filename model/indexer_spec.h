#ifndef KFORGE_MODEL_INDEXER_SPEC_H_
#define KFORGE_MODEL_INDEXER_SPEC_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kforge/v1/spec.pb.h"

namespace kforge {

// The DSA lightning indexer's specs (KernelSpec.dsa_indexer): what
// ValidateSpec and NormalizeSpec (model/spec.h) do for sparse MLA, and the
// models' indexer presets. The computation is stated in docs/DESIGN.md ("The
// DSA lightning indexer"); the limits are templates/kforge/dsa_indexer/config.h's.

// Checks an indexer spec: InvalidArgument naming each field, the value given
// and what is supported, e.g. "topk: got 5000, supported 1..4096".
absl::Status ValidateIndexerSpec(const v1::DsaIndexerSpec& spec);

// The canonical indexer spec (validated; s_q cleared: every launch passes
// its own, the kernel does not depend on it).
absl::StatusOr<v1::DsaIndexerSpec> NormalizeIndexerSpec(const v1::DsaIndexerSpec& spec);

struct IndexerPresetInfo {
  std::string name;  // the model preset's name (model/spec.h Presets)
  int index_heads;
  int index_head_dim;
  int topk;
};

// deepseek-v3.2: 64 heads; glm-5: 32 heads; both head dim 128, top-k 2048.
const std::vector<IndexerPresetInfo>& IndexerPresets();

// The indexer spec of a model preset. tensor_parallel is checked as the
// attention preset checks it (a divisor of the model's heads) but changes
// nothing: the indexer runs whole on every rank. InvalidArgument for an
// unknown preset or degree.
absl::StatusOr<v1::DsaIndexerSpec> IndexerSpecFromPreset(std::string_view name,
                                                         int64_t tensor_parallel);

// "sparse-mla" / "dsa-indexer" (also the enum names) to a kind;
// InvalidArgument listing the names otherwise.
absl::StatusOr<v1::AttentionKind> ParseAttentionKind(std::string_view name);

}  // namespace kforge

#endif  // KFORGE_MODEL_INDEXER_SPEC_H_
