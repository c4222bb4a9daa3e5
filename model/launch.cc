#include "model/launch.h"

#include <algorithm>

#include "templates/kforge/sparse_mla/common/params.h"

namespace kforge {
namespace {

long long CeilDiv(long long a, long long b) { return (a + b - 1) / b; }

}  // namespace

long long KeySpanOf(const v1::AttentionSpec& spec, long long token_tile) {
  return sparse_mla::KeySpan(static_cast<int>(spec.topk()),
                             spec.has_extra_kv() ? static_cast<int>(spec.extra_kv().topk()) : 0,
                             static_cast<int>(token_tile));
}

int NumSplits(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling,
              const v1::LaunchRule& rule, int num_tokens, int sm_count) {
  const long long granularity = std::max<long long>(1, rule.split_granularity_tokens());
  const long long ctas = std::max<long long>(1, tiling.num_head_groups()) * std::max(1, num_tokens);
  const long long fit = static_cast<long long>(std::max(0, sm_count)) * rule.ctas_per_sm() / ctas;
  const long long tiles = CeilDiv(KeySpanOf(spec, granularity), granularity);
  const bool past = rule.min_tiles_max_tokens() > 0 &&
                    static_cast<long long>(num_tokens) > rule.min_tiles_max_tokens();
  const long long floor = past ? rule.min_tiles_per_split_past() : rule.min_tiles_per_split();
  const long long max_splits =
      std::max<long long>(1, CeilDiv(tiles, std::max<long long>(1, floor)));
  return static_cast<int>(std::clamp<long long>(fit, 1, max_splits));
}

int SplitsHoldingKeys(const v1::AttentionSpec& spec, const v1::LaunchRule& rule, int num_splits) {
  const long long tiles = MaxSplits(spec, rule);  // one tile a split at most
  const long long splits = std::clamp<long long>(num_splits, 1, tiles);
  return static_cast<int>(CeilDiv(tiles, CeilDiv(tiles, splits)));
}

int TokensPerSplit(const v1::AttentionSpec& spec, const v1::LaunchRule& rule, int num_splits) {
  const long long granularity = std::max<long long>(1, rule.split_granularity_tokens());
  const long long per_split = CeilDiv(KeySpanOf(spec, granularity), std::max(1, num_splits));
  return static_cast<int>(CeilDiv(per_split, granularity) * granularity);
}

int MaxSplits(const v1::AttentionSpec& spec, const v1::LaunchRule& rule) {
  const long long granularity = std::max<long long>(1, rule.split_granularity_tokens());
  return static_cast<int>(
      std::max<long long>(1, CeilDiv(KeySpanOf(spec, granularity), granularity)));
}

}  // namespace kforge
