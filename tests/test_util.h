#ifndef KFORGE_TESTS_TEST_UTIL_H_
#define KFORGE_TESTS_TEST_UTIL_H_

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "kforge/v1/spec.pb.h"

namespace kforge::testing {

// Substring check that prints both strings on failure.
inline ::testing::AssertionResult Contains(absl::string_view haystack,
                                           absl::string_view needle) {
  if (absl::StrContains(haystack, needle)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "\"" << haystack << "\" does not contain \"" << needle << "\"";
}

// The deepseek-v3.2 decode spec at TP 1, written out field by field (every
// field set, none left to SpecFromPreset) so tests pin exact values.
inline v1::AttentionSpec DeepseekTp1Spec() {
  v1::AttentionSpec spec;
  spec.set_kind(v1::ATTENTION_KIND_SPARSE_MLA_DECODE);
  spec.set_num_q_heads(128);
  spec.set_kv_lora_rank(512);
  spec.set_rope_dim(64);
  spec.set_topk(2048);
  spec.set_s_q(1);
  spec.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_BF16);
  spec.set_page_block_size(64);
  spec.set_softmax_scale(0.135234f);
  spec.set_return_lse(true);
  return spec;
}

}  // namespace kforge::testing

#endif  // KFORGE_TESTS_TEST_UTIL_H_
