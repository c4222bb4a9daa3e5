// A deployment matrix that asks for a preset's DSA indexer beside (or
// instead of) its attention kernels.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "deploy/matrix.h"
#include "gtest/gtest.h"
#include "kforge/v1/spec.pb.h"

namespace kforge {
namespace {

std::vector<MatrixJob> Expand(const std::string& json) {
  absl::StatusOr<v1::DeploymentMatrix> m = ParseMatrix(json, "test");
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {};
  absl::StatusOr<std::vector<MatrixJob>> jobs = ExpandMatrix(*m);
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  return jobs.ok() ? *jobs : std::vector<MatrixJob>{};
}

TEST(IndexerMatrixTest, KindsAddTheIndexerOncePerArchAfterTheAttention) {
  const std::vector<MatrixJob> jobs = Expand(R"({"models": [{"preset": "glm-5", "tp": [4, 8],
      "kinds": ["ATTENTION_KIND_SPARSE_MLA_DECODE", "ATTENTION_KIND_DSA_INDEXER"]}],
      "archs": ["sm_90a", "sm_120a"]})");
  ASSERT_EQ(jobs.size(), 6u);  // 2 tp x 2 archs of attention, then 2 indexers
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(jobs[i].spec.has_sparse_mla_decode()) << jobs[i].label;
  }
  for (int i = 4; i < 6; ++i) {
    EXPECT_TRUE(jobs[i].spec.has_dsa_indexer()) << jobs[i].label;
    EXPECT_EQ(jobs[i].spec.dsa_indexer().index_heads(), 32u);
    EXPECT_TRUE(absl::StrContains(jobs[i].label, "glm-5 dsa-indexer sm_")) << jobs[i].label;
  }
  EXPECT_NE(jobs[4].arch, jobs[5].arch);
}

TEST(IndexerMatrixTest, IndexerAloneAndTheDefaultIsAttentionOnly) {
  std::vector<MatrixJob> jobs = Expand(
      R"({"models": [{"preset": "deepseek-v3.2", "tp": [1, 2, 8],
          "kinds": ["ATTENTION_KIND_DSA_INDEXER"]}], "archs": ["sm_90a"]})");
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].spec.dsa_indexer().index_heads(), 64u);
  jobs = Expand(R"({"models": [{"preset": "glm-5", "tp": [8]}], "archs": ["sm_90a"]})");
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_TRUE(jobs[0].spec.has_sparse_mla_decode());
}

TEST(IndexerMatrixTest, IndexerNeedsAPreset) {
  absl::StatusOr<v1::DeploymentMatrix> m = ParseMatrix(
      R"({"models": [{"spec": {"num_q_heads": 64,
          "kv_lora_rank": 512, "rope_dim": 64, "topk": 2048, "kv_cache_dtype": "bf16",
          "page_block_size": 64, "softmax_scale": 0.0625},
          "kinds": ["ATTENTION_KIND_DSA_INDEXER"]}], "archs": ["sm_90a"]})",
      "test");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StrContains(m.status().message(), "models[0].kinds[0]: got ATTENTION_KIND_DSA_INDEXER"))
      << m.status();
}

}  // namespace
}  // namespace kforge
