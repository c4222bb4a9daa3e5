// Deployment matrices (deploy/matrix.h): the shipped default, the JSON
// format, the expansion into (spec, arch) jobs and the error for each bad
// field.
#include "deploy/matrix.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/io.h"
#include "gtest/gtest.h"
#include "kforge/v1/spec.pb.h"
#include "model/spec.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

using ::kforge::testing::Contains;

std::vector<std::string> Labels(const std::vector<MatrixJob>& jobs) {
  std::vector<std::string> labels;
  for (const MatrixJob& job : jobs) labels.push_back(job.label);
  return labels;
}

std::vector<MatrixJob> Expand(const std::string& json) {
  absl::StatusOr<v1::DeploymentMatrix> matrix = ParseMatrix(json, "m.json");
  EXPECT_TRUE(matrix.ok()) << matrix.status();
  if (!matrix.ok()) return {};
  absl::StatusOr<std::vector<MatrixJob>> jobs = ExpandMatrix(*matrix);
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  return jobs.ok() ? *jobs : std::vector<MatrixJob>{};
}

TEST(MatrixTest, EmbeddedDefaultIsTheShippedFile) {
  absl::StatusOr<std::string> file =
      ReadFile(KFORGE_SOURCE_DIR "/deploy/default_matrix.json", 1 << 20);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(DefaultMatrixJson(), *file);
}

TEST(MatrixTest, DefaultMatrixExpandsToEveryPresetTpArch) {
  absl::StatusOr<v1::DeploymentMatrix> matrix = DefaultMatrix();
  ASSERT_TRUE(matrix.ok()) << matrix.status();
  absl::StatusOr<std::vector<MatrixJob>> jobs = ExpandMatrix(*matrix);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  // 2 presets x 4 tp x 2 kv dtypes (bf16, fp8_ds_mla) x 5 archs (s_q is
  // not part of a kernel: 0.1 built each kernel once per s_q).
  ASSERT_EQ(jobs->size(), 2u * 4 * 2 * 5);
  EXPECT_EQ(jobs->front().label, "deepseek-v3.2 tp1 bf16 sm_80");
  EXPECT_EQ((*jobs)[1].label, "deepseek-v3.2 tp1 bf16 sm_89");
  EXPECT_EQ((*jobs)[5].label, "deepseek-v3.2 tp1 fp8_ds_mla sm_80");
  EXPECT_EQ(jobs->back().label, "glm-5 tp8 fp8_ds_mla sm_120a");
  for (const MatrixJob& job : *jobs) {
    SCOPED_TRACE(job.label);
    absl::StatusOr<v1::AttentionSpec> preset = SpecFromPreset(job.model, job.tp, job.kv_dtype);
    ASSERT_TRUE(preset.ok()) << preset.status();
    EXPECT_EQ(job.spec.sparse_mla_decode().num_q_heads(), preset->num_q_heads());
    EXPECT_EQ(job.spec.sparse_mla_decode().softmax_scale(), preset->softmax_scale());
    EXPECT_EQ(job.spec.sparse_mla_decode().s_q(), 0u);  // not part of the kernel
    EXPECT_EQ(job.spec.sparse_mla_decode().kv_cache_dtype(), job.kv_dtype);
    EXPECT_EQ(job.spec.sparse_mla_decode().kv_scale_format(), preset->kv_scale_format());
    EXPECT_TRUE(ValidateSpec(job.spec.sparse_mla_decode()).ok());
  }
}

TEST(MatrixTest, OrderIsCanonicalWhateverTheFileOrder) {
  const std::vector<MatrixJob> sorted = Expand(R"({"models": [
      {"preset": "glm-5", "tp": [4, 8], "s_q": [1, 2]}],
      "archs": ["sm_90a", "sm_120a"]})");
  // Same set, shuffled, repeated and spelled differently.
  const std::vector<MatrixJob> shuffled = Expand(R"({"models": [
      {"preset": "glm-5", "tp": [8, 4, 8], "sQ": [2, 1, 2]}],
      "archs": ["SM_120A", "90a", "sm_90a"]})");
  EXPECT_EQ(Labels(sorted),
            (std::vector<std::string>{"glm-5 tp4 bf16 sm_90a", "glm-5 tp4 bf16 sm_120a",
                                      "glm-5 tp8 bf16 sm_90a", "glm-5 tp8 bf16 sm_120a"}));
  EXPECT_EQ(Labels(shuffled), Labels(sorted));
  EXPECT_EQ(Labels(Expand(R"({"models": [
      {"preset": "glm-5", "tp": [4, 8], "s_q": [1, 2]}],
      "archs": ["sm_90a", "sm_120a"]})")),
            Labels(sorted));
}

TEST(MatrixTest, EqualSpecOnEqualArchIsOneJob) {
  // The spec entry is glm-5 at tp 8 written out: its jobs are the preset's.
  const std::vector<MatrixJob> jobs = Expand(R"({"models": [
      {"preset": "glm-5", "tp": [8]},
      {"preset": "glm-5", "tp": [8]},
      {"name": "glm-5 by hand", "tp": [8], "spec": {
         "num_q_heads": 64,
         "kv_lora_rank": 512, "rope_dim": 64, "topk": 2048,
         "page_block_size": 64, "softmax_scale": 0.0625, "return_lse": true}}],
      "archs": ["sm_90a"]})");
  EXPECT_EQ(Labels(jobs), std::vector<std::string>{"glm-5 tp8 bf16 sm_90a"});
}

TEST(MatrixTest, SpecModelIsDividedByTpAndNamed) {
  const std::vector<MatrixJob> jobs = Expand(R"({"models": [
      {"name": "tiny", "tp": [2, 4], "spec": {
         "num_q_heads": 32,
         "kv_lora_rank": 256, "rope_dim": 0, "topk": 512, "s_q": 3,
         "kv_cache_dtype": "bf16", "page_block_size": 16,
         "softmax_scale": 0.1}},
      {"spec": {
         "num_q_heads": 8,
         "kv_lora_rank": 512, "rope_dim": 64, "topk": 64,
         "page_block_size": 64, "softmax_scale": 0.1}}],
      "archs": ["sm_89"]})");
  ASSERT_EQ(Labels(jobs), (std::vector<std::string>{"tiny tp2 bf16 sm_89", "tiny tp4 bf16 sm_89",
                                                    "models[1] tp1 bf16 sm_89"}));
  EXPECT_EQ(jobs[0].spec.sparse_mla_decode().num_q_heads(), 16u);
  EXPECT_EQ(jobs[1].spec.sparse_mla_decode().num_q_heads(), 8u);
  EXPECT_EQ(jobs[1].spec.sparse_mla_decode().kv_lora_rank(), 256u);
  EXPECT_TRUE(jobs[1].spec.sparse_mla_decode().has_rope_dim());
  EXPECT_EQ(jobs[1].spec.sparse_mla_decode().rope_dim(), 0u);
  EXPECT_EQ(jobs[2].spec.sparse_mla_decode().kv_cache_dtype(), v1::KV_CACHE_DTYPE_BF16);
}

// A matrix written before KernelSpec named the sparse kind inside a spec
// model; it still expands to the same jobs. Another kind there is refused.
TEST(MatrixTest, AnOlderSpecModelNamingTheSparseKindStillReads) {
  const char* body = R"("num_q_heads": 8, "kv_lora_rank": 512, "rope_dim": 64, "topk": 64,
      "page_block_size": 64, "softmax_scale": 0.1})";
  const std::vector<MatrixJob> plain =
      Expand(absl::StrCat(R"({"models": [{"spec": {)", body, R"(}], "archs": ["sm_89"]})"));
  const std::vector<MatrixJob> old =
      Expand(absl::StrCat(R"({"models": [{"spec": {"kind": "ATTENTION_KIND_SPARSE_MLA_DECODE", )",
                          body, R"(}], "archs": ["sm_89"]})"));
  ASSERT_EQ(plain.size(), 1u);
  ASSERT_EQ(old.size(), 1u);
  EXPECT_EQ(old[0].spec.SerializeAsString(), plain[0].spec.SerializeAsString());
  absl::StatusOr<v1::DeploymentMatrix> other =
      ParseMatrix(absl::StrCat(R"({"models": [{"spec": {"kind": "ATTENTION_KIND_DSA_INDEXER", )",
                               body, R"(}], "archs": ["sm_89"]})"),
                  "test");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MatrixTest, ModelArchsReplaceTheMatrixArchs) {
  const std::vector<MatrixJob> jobs = Expand(R"({"models": [
      {"preset": "glm-5", "tp": [8], "archs": ["sm_120a"]},
      {"preset": "deepseek-v3.2", "tp": [8]}],
      "archs": ["sm_90a"]})");
  EXPECT_EQ(Labels(jobs),
            (std::vector<std::string>{"glm-5 tp8 bf16 sm_120a", "deepseek-v3.2 tp8 bf16 sm_90a"}));
}

TEST(MatrixTest, DtypesAcceptShortAndEnumNames) {
  for (const char* name : {"bf16", "BF16", "KV_CACHE_DTYPE_BF16"}) {
    SCOPED_TRACE(name);
    const std::vector<MatrixJob> jobs =
        Expand(absl::StrCat(R"({"models": [{"preset": "glm-5", "tp": [8], "kvDtypes": [")", name,
                            R"("]}], "archs": ["sm_90a"]})"));
    ASSERT_EQ(jobs.size(), 1u);
    EXPECT_EQ(jobs[0].kv_dtype, v1::KV_CACHE_DTYPE_BF16);
    EXPECT_EQ(jobs[0].label, "glm-5 tp8 bf16 sm_90a");
  }
  EXPECT_EQ(KvDtypeName(v1::KV_CACHE_DTYPE_FP8_DS_MLA), "fp8_ds_mla");
  EXPECT_EQ(KvDtypeName(v1::KV_CACHE_DTYPE_UNSPECIFIED), "KV_CACHE_DTYPE_UNSPECIFIED");
}

TEST(MatrixTest, TheNewRecordsExpandForAPresetOfTheirGeometry) {
  // nvfp4_ds_mla has V3.2's geometry: every preset takes it, by either name.
  for (const char* name : {"nvfp4_ds_mla", "KV_CACHE_DTYPE_NVFP4_DS_MLA"}) {
    SCOPED_TRACE(name);
    const std::vector<MatrixJob> jobs =
        Expand(absl::StrCat(R"({"models": [{"preset": "glm-5", "tp": [8], "kvDtypes": [")", name,
                            R"("]}], "archs": ["sm_120a"]})"));
    ASSERT_EQ(jobs.size(), 1u);
    EXPECT_EQ(jobs[0].kv_dtype, v1::KV_CACHE_DTYPE_NVFP4_DS_MLA);
    EXPECT_EQ(jobs[0].label, "glm-5 tp8 nvfp4_ds_mla sm_120a");
  }
}

// A spec model takes the spec files' short names (model/spec.h
// ExpandKvEnumNames) in its spec, its extra_kv and kv_dtypes.
TEST(MatrixTest, SpecModelsTakeShortKvNames) {
  const std::vector<MatrixJob> jobs = Expand(R"({"models": [{"name": "v4-like", "tp": [2],
      "kv_dtypes": ["FP8_DS_MLA_V4", "mxfp8_ds_mla_v41"],
      "spec": {"num_q_heads": 64,
               "kv_lora_rank": 512, "rope_dim": 0, "topk": 512, "page_block_size": 64,
               "softmax_scale": 0.0441941738, "kvCacheDtype": "bf16",
               "extra_kv": {"kv_cache_dtype": "fp8_ds_mla", "kvScaleFormat": "Pow2",
                            "topk": 128, "page_block_size": 64}}}],
      "archs": ["sm_90a"]})");
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(Labels(jobs), (std::vector<std::string>{"v4-like tp2 fp8_ds_mla_v4 sm_90a",
                                                    "v4-like tp2 mxfp8_ds_mla_v41 sm_90a"}));
  for (const MatrixJob& job : jobs) {
    EXPECT_EQ(job.spec.sparse_mla_decode().num_q_heads(), 32u);
    EXPECT_EQ(job.spec.sparse_mla_decode().extra_kv().kv_cache_dtype(),
              v1::KV_CACHE_DTYPE_FP8_DS_MLA);
    EXPECT_EQ(job.spec.sparse_mla_decode().extra_kv().kv_scale_format(), v1::KV_SCALE_FORMAT_POW2);
  }
  // The spec's own dtype and scale format, short, when kv_dtypes is absent.
  const std::vector<MatrixJob> own = Expand(R"({"models": [{"spec": {
      "num_q_heads": 8, "kv_lora_rank": 512,
      "rope_dim": 64, "topk": 2048, "page_block_size": 64, "softmax_scale": 0.0625,
      "kv_cache_dtype": "fp8_ds_mla", "kv_scale_format": "arbitrary"}}], "archs": ["sm_120a"]})");
  ASSERT_EQ(own.size(), 1u);
  EXPECT_EQ(own[0].kv_dtype, v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  EXPECT_EQ(own[0].spec.sparse_mla_decode().kv_scale_format(), v1::KV_SCALE_FORMAT_ARBITRARY);
}

struct BadMatrix {
  const char* json;
  std::vector<const char*> message_parts;  // each must appear
};

TEST(MatrixTest, EachBadFieldIsNamedWithItsValue) {
  const std::vector<BadMatrix> cases = {
      {R"({"models": [], "archs": ["sm_90a"]})", {"m.json: models: empty", "deepseek-v3.2, glm-5"}},
      {R"({"models": [{"preset": "glm-6"}], "archs": ["sm_90a"]})",
       {"m.json: models[0].preset", "\"glm-6\"", "deepseek-v3.2, glm-5"}},
      {R"({"models": [{"tp": [8]}], "archs": ["sm_90a"]})",
       {"m.json: models[0]: names no model", "\"preset\"", "\"spec\""}},
      {R"({"models": [{"preset": "glm-5", "tp": [8, 3]}], "archs": ["sm_90a"]})",
       {"m.json: models[0].tp[1]", "got 3", "divisor of 64"}},
      {R"({"models": [{"preset": "glm-5", "tp": [0]}], "archs": ["sm_90a"]})",
       {"models[0].tp[0]", "got 0"}},
      // A spec model with an fp8 cache must say how its scales were written.
      {R"({"models": [{"spec": {
          "num_q_heads": 64,
          "kv_lora_rank": 512, "rope_dim": 64, "topk": 2048,
          "page_block_size": 64, "softmax_scale": 0.0625},
          "kv_dtypes": ["bf16", "fp8_ds_mla"]}], "archs": ["sm_90a"]})",
       {"m.json: models[0].kv_dtypes[1]", "kv_scale_format", "required with kv_cache_dtype"}},
      {R"({"models": [{"preset": "glm-5", "kv_dtypes": ["fp4"]}], "archs": ["sm_90a"]})",
       {"m.json: models[0].kv_dtypes[0]: got \"fp4\"", "bf16, fp8_ds_mla"}},
      {R"({"models": [{"preset": "glm-5", "kv_dtypes": ["bf16", ""]}], "archs": ["sm_90a"]})",
       {"m.json: models[0].kv_dtypes[1]: got \"\"", "nvfp4_ds_mla"}},
      {R"({"models": [{"preset": "glm-5", "kv_dtypes": [true]}], "archs": ["sm_90a"]})",
       {"m.json: not a deployment matrix"}},
      {R"({"models": [{"preset": "glm-5", "kv_dtypes": [99]}], "archs": ["sm_90a"]})",
       {"m.json: models[0].kv_dtypes[0]", "kv_cache_dtype: got 99"}},
      {R"({"models": [{"spec": {
          "num_q_heads": 64,
          "kv_lora_rank": 512, "rope_dim": 64, "topk": 2048, "kv_cache_dtype": "fp8_ds_mla",
          "kv_scale_format": "pow3", "page_block_size": 64, "softmax_scale": 0.0625}}],
          "archs": ["sm_90a"]})",
       {"m.json: models[0].spec.kv_scale_format: got \"pow3\"", "pow2, arbitrary"}},
      {R"({"models": [{"spec": {
          "num_q_heads": 64,
          "kv_lora_rank": 512, "rope_dim": 64, "topk": 2048, "page_block_size": 64,
          "softmax_scale": 0.0625, "extraKv": {"kvCacheDtype": "fp8_ds_mla_v5"}}}],
          "archs": ["sm_90a"]})",
       {"m.json: models[0].spec.extraKv.kvCacheDtype: got \"fp8_ds_mla_v5\"", "fp8_ds_mla_v4"}},
      {R"({"models": [{"preset": "glm-5", "s_q": [1, 5]}], "archs": ["sm_90a"]})",
       {"m.json: models[0].s_q[1]", "got 5", "1..4"}},
      {R"({"models": [{"preset": "glm-5"}], "archs": ["sm_90a", "sm_70"]})",
       {"m.json: archs[1]", "\"sm_70\"", "sm_80", "sm_120a"}},
      {R"({"models": [{"preset": "glm-5", "archs": ["sm_75"]}], "archs": ["sm_90a"]})",
       {"m.json: models[0].archs[0]", "\"sm_75\""}},
      {R"({"models": [{"preset": "glm-5"}]})", {"m.json: models[0].archs: empty", "sm_90a"}},
      {R"({"models": [{"preset": "glm-5", "tpp": [8]}], "archs": ["sm_90a"]})",
       {"m.json: not a deployment matrix", "tpp"}},
      {R"({"models": [{"preset": "glm-5")", {"m.json: invalid JSON"}},
      {R"({"models": [{"tp": [3], "spec": {
          "num_q_heads": 64,
          "kv_lora_rank": 512, "rope_dim": 64, "topk": 2048,
          "page_block_size": 64, "softmax_scale": 0.0625}}], "archs": ["sm_90a"]})",
       {"m.json: models[0].tp[0]", "got 3", "divisor of 64"}},
      {R"({"models": [{"spec": {
          "num_q_heads": 64,
          "kv_lora_rank": 512, "topk": 2048,
          "page_block_size": 64, "softmax_scale": 0.0625}}], "archs": ["sm_90a"]})",
       {"m.json: models[0].spec", "rope_dim"}},
      {R"({"models": [{"spec": {
          "num_q_heads": 256,
          "kv_lora_rank": 512, "rope_dim": 64, "topk": 2048,
          "page_block_size": 64, "softmax_scale": 0.0625}}], "archs": ["sm_90a"]})",
       {"m.json: models[0].tp", "num_q_heads: got 256", "1..128"}},
  };
  for (const BadMatrix& c : cases) {
    SCOPED_TRACE(c.json);
    absl::StatusOr<v1::DeploymentMatrix> matrix = ParseMatrix(c.json, "m.json");
    ASSERT_FALSE(matrix.ok());
    EXPECT_EQ(matrix.status().code(), absl::StatusCode::kInvalidArgument);
    for (const char* part : c.message_parts) {
      EXPECT_TRUE(Contains(matrix.status().message(), part));
    }
  }
}

TEST(MatrixTest, ExpandRejectsAnInvalidMatrixBuiltInCode) {
  v1::DeploymentMatrix matrix;
  matrix.add_models()->set_preset("glm-5");
  matrix.mutable_models(0)->add_s_q(9);
  matrix.add_archs("sm_90a");
  absl::StatusOr<std::vector<MatrixJob>> jobs = ExpandMatrix(matrix);
  ASSERT_FALSE(jobs.ok());
  EXPECT_TRUE(Contains(jobs.status().message(), "models[0].s_q[0]: s_q: got 9"));
}

TEST(MatrixTest, MissingFileIsNamed) {
  absl::StatusOr<v1::DeploymentMatrix> matrix = LoadMatrixFile("/nonexistent/kforge_matrix.json");
  ASSERT_FALSE(matrix.ok());
  EXPECT_EQ(matrix.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(matrix.status().message(), "/nonexistent/kforge_matrix.json"));
}

}  // namespace
}  // namespace kforge
