#ifndef KFORGE_TESTS_TEST_UTIL_H_
#define KFORGE_TESTS_TEST_UTIL_H_

#include <memory>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "compiler/key.h"
#include "kforge/v1/artifact.pb.h"
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

// An artifact as the compiler would hand it over, with `cubin_bytes` of
// seeded random "cubin" (cache tests need no NVRTC).
inline std::shared_ptr<const v1::KernelArtifact> FakeArtifact(
    const std::string& key, size_t cubin_bytes, uint64_t seed = 1) {
  auto artifact = std::make_shared<v1::KernelArtifact>();
  artifact->set_format_version(kFormatVersion);
  artifact->set_key(key);
  artifact->set_module_name("sparse_mla_decode_test_" + key.substr(0, 8));
  artifact->set_arch("sm_90a");
  std::mt19937_64 rng(seed);
  std::string cubin(cubin_bytes, '\0');
  for (char& c : cubin) c = static_cast<char>(rng());
  artifact->set_cubin(std::move(cubin));
  return artifact;
}

}  // namespace kforge::testing

#endif  // KFORGE_TESTS_TEST_UTIL_H_
