#ifndef KFORGE_MODEL_LAUNCH_H_
#define KFORGE_MODEL_LAUNCH_H_

// The split-K launch rule, evaluated where a kernel is launched (the
// selector) for the GPU it runs on. The compiler writes the rule's inputs
// (LaunchRule in artifact.proto) into the manifest; this is the only place
// that turns them into a split count.

#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/spec.pb.h"

namespace kforge {

// Splits of the top-k range for num_tokens query tokens on sm_count SMs:
// split only while (head groups x tokens x splits) CTAs fit one wave
// (ctas_per_sm per SM), and never below min_tiles_per_split tiles of
// split_granularity_tokens keys per split (min_tiles_per_split_past past
// min_tiles_max_tokens tokens, where that is set). Always >= 1.
int NumSplits(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling,
              const v1::LaunchRule& rule, int num_tokens, int sm_count);

// The key positions a token's splits cover for tiles of `token_tile` keys
// (params.h KeySpan): topk, or with an extra cache (spec extra_kv) topk
// rounded up to whole tiles plus the extra topk. The rules below split it.
long long KeySpanOf(const v1::AttentionSpec& spec, long long token_tile);

// How many of num_splits splits hold keys: each takes ceil(tiles /
// num_splits) whole tiles (TokensPerSplit), so where that does not divide
// evenly the last ones would be empty. <= num_splits, and the same keys per
// split.
int SplitsHoldingKeys(const v1::AttentionSpec& spec, const v1::LaunchRule& rule, int num_splits);

// Keys of the top-k range per split: ceil(topk / num_splits) rounded up to
// the rule's granularity (the token tile), as the main kernel's grid.y
// blocks expect.
int TokensPerSplit(const v1::AttentionSpec& spec, const v1::LaunchRule& rule, int num_splits);

// The most splits the kernels accept: one granule (split_granularity_tokens
// keys) per split, ceil(topk / granularity). A forced split count (tests,
// sweeps) must be in 1..MaxSplits; NumSplits never exceeds it.
int MaxSplits(const v1::AttentionSpec& spec, const v1::LaunchRule& rule);

}  // namespace kforge

#endif  // KFORGE_MODEL_LAUNCH_H_
