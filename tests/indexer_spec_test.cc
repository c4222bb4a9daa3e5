// The DSA indexer kind: validation messages, presets, selectors and the
// generated instantiation unit (no NVRTC: indexer_compile_test compiles).
#include <string>

#include "absl/strings/match.h"
#include "compiler/compiler.h"
#include "compiler/indexer_codegen.h"
#include "compiler/manifest.h"
#include "gtest/gtest.h"
#include "kforge/v1/service.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/indexer_spec.h"
#include "model/selector.h"
#include "model/spec.h"
#include "templates/kforge/dsa_indexer/config.h"

namespace kforge {
namespace {

v1::DsaIndexerSpec GoodSpec() {
  v1::DsaIndexerSpec spec;
  spec.set_index_heads(64);
  spec.set_index_head_dim(128);
  spec.set_topk(2048);
  spec.set_page_block_size(64);
  return spec;
}

void ExpectProblem(const v1::DsaIndexerSpec& spec, const std::string& text) {
  const absl::Status status = ValidateIndexerSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
  EXPECT_TRUE(absl::StrContains(status.message(), text)) << status << " lacks " << text;
  EXPECT_EQ(NormalizeIndexerSpec(spec).status(), status);
  EXPECT_EQ(NormalizeKernelSpec(KernelSpecOf(spec)).status(), status);
}

TEST(IndexerSpecTest, AcceptsTheModelsShapesAndClearsSq) {
  v1::DsaIndexerSpec spec = GoodSpec();
  spec.set_s_q(4);
  ASSERT_TRUE(ValidateIndexerSpec(spec).ok()) << ValidateIndexerSpec(spec);
  absl::StatusOr<v1::DsaIndexerSpec> n = NormalizeIndexerSpec(spec);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->s_q(), 0u);
  absl::StatusOr<v1::KernelSpec> k = NormalizeKernelSpec(KernelSpecOf(spec));
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE(k->has_dsa_indexer());
  EXPECT_EQ(k->dsa_indexer().SerializeAsString(), n->SerializeAsString());
  for (int topk : {1, 2048, 4096}) {
    spec.set_topk(topk);
    EXPECT_TRUE(ValidateIndexerSpec(spec).ok()) << topk;
  }
  for (int heads : {1, 32, 64, 100, 128}) {
    spec.set_index_heads(heads);
    EXPECT_TRUE(ValidateIndexerSpec(spec).ok()) << heads;
  }
}

TEST(IndexerSpecTest, NamesEachBadFieldWithItsRange) {
  v1::DsaIndexerSpec spec = GoodSpec();
  spec.set_topk(0);
  ExpectProblem(spec, "topk: got 0, supported 1..4096");
  spec.set_topk(4097);
  ExpectProblem(spec, "topk: got 4097, supported 1..4096");
  spec = GoodSpec();
  spec.set_index_heads(0);
  ExpectProblem(spec, "index_heads: got 0, supported 1..128");
  spec.set_index_heads(129);
  ExpectProblem(spec, "index_heads: got 129, supported 1..128");
  spec = GoodSpec();
  spec.set_index_head_dim(64);
  ExpectProblem(spec, "index_head_dim: got 64, supported 128");
  spec = GoodSpec();
  spec.set_page_block_size(32);
  ExpectProblem(spec, "page_block_size: got 32, supported 64");
  spec = GoodSpec();
  spec.set_s_q(5);
  ExpectProblem(spec, "s_q: got 5, supported 0 (not given) or 1..4");
  // Every problem at once.
  spec.set_topk(0);
  spec.set_index_heads(0);
  const std::string message(ValidateIndexerSpec(spec).message());
  for (const char* field : {"topk", "index_heads", "s_q"}) {
    EXPECT_TRUE(absl::StrContains(message, field)) << message;
  }
}

TEST(IndexerSpecTest, AKernelSpecWithoutACaseIsNamed) {
  EXPECT_TRUE(absl::StrContains(NormalizeKernelSpec(v1::KernelSpec()).status().message(),
                                "kind: got none, supported sparse_mla_decode or dsa_indexer"))
      << NormalizeKernelSpec(v1::KernelSpec()).status();
}

TEST(IndexerSpecTest, PresetsKeepTheirHeadsAtEveryTensorParallelDegree) {
  for (int tp : {1, 2, 8}) {
    absl::StatusOr<v1::DsaIndexerSpec> glm = IndexerSpecFromPreset("glm-5", tp);
    ASSERT_TRUE(glm.ok()) << glm.status();
    EXPECT_EQ(glm->index_heads(), 32u);
    EXPECT_EQ(glm->index_head_dim(), 128u);
    EXPECT_EQ(glm->topk(), 2048u);
    EXPECT_EQ(glm->page_block_size(), 64u);
    absl::StatusOr<v1::DsaIndexerSpec> ds = IndexerSpecFromPreset("deepseek-v3.2", tp);
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_EQ(ds->index_heads(), 64u);
  }
  EXPECT_TRUE(absl::StrContains(IndexerSpecFromPreset("glm-5", 3).status().message(),
                                "tensor_parallel: got 3, supported a divisor of 64"));
  EXPECT_TRUE(absl::StrContains(IndexerSpecFromPreset("llama", 1).status().message(),
                                "preset: got \"llama\", supported deepseek-v3.2, glm-5"));
}

TEST(IndexerSpecTest, SelectorWithTheIndexerKindResolvesToTheIndexerSpec) {
  v1::KernelSelector selector;
  selector.mutable_preset()->set_name("glm-5");
  selector.mutable_preset()->set_tensor_parallel(8);
  selector.mutable_preset()->set_kind(v1::ATTENTION_KIND_DSA_INDEXER);
  absl::StatusOr<v1::KernelSpec> spec = SpecOfSelector(selector);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->has_dsa_indexer());
  EXPECT_EQ(spec->dsa_indexer().index_heads(), 32u);
  selector.mutable_preset()->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  EXPECT_TRUE(absl::StrContains(SpecOfSelector(selector).status().message(),
                                "kv_cache_dtype: got fp8_ds_mla, supported unset"));
  // Without a kind, the attention preset as before.
  selector.mutable_preset()->clear_kind();
  selector.mutable_preset()->clear_kv_cache_dtype();
  spec = SpecOfSelector(selector);
  ASSERT_TRUE(spec.ok());
  EXPECT_TRUE(spec->has_sparse_mla_decode());
  EXPECT_EQ(spec->sparse_mla_decode().num_q_heads(), 8u);
  // A kind this build does not know is named.
  selector.mutable_preset()->set_kind(static_cast<v1::AttentionKind>(7));
  EXPECT_TRUE(absl::StrContains(SpecOfSelector(selector).status().message(), "kind: got 7"))
      << SpecOfSelector(selector).status();
}

TEST(IndexerSpecTest, ParsesKindNames) {
  EXPECT_EQ(*ParseAttentionKind("dsa-indexer"), v1::ATTENTION_KIND_DSA_INDEXER);
  EXPECT_EQ(*ParseAttentionKind("ATTENTION_KIND_DSA_INDEXER"), v1::ATTENTION_KIND_DSA_INDEXER);
  EXPECT_EQ(*ParseAttentionKind("sparse-mla"), v1::ATTENTION_KIND_SPARSE_MLA_DECODE);
  EXPECT_TRUE(absl::StrContains(ParseAttentionKind("mla").status().message(),
                                "kind: got \"mla\", supported sparse-mla, dsa-indexer"));
}

TEST(IndexerCodegenTest, PlanNamesTheModuleAndInstantiatesTheTraits) {
  const KernelCompiler compiler;
  absl::StatusOr<CompilePlan> plan =
      compiler.Plan(KernelSpecOf(*IndexerSpecFromPreset("glm-5", 8)), "sm_120a");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->module_name, "dsa_indexer_h32_d128_topk2048_pb64_sm120a");
  EXPECT_TRUE(absl::StrContains(plan->source, "kdi::IndexerTraits<32, 2048, false>"))
      << plan->source;
  EXPECT_TRUE(absl::StrContains(plan->source, "dsa_indexer_logits(const kdi::LogitsParams p)"));
  EXPECT_TRUE(absl::StrContains(plan->source, "dsa_indexer_topk(const kdi::TopkParams p)"));
  // Another top-k, another key and module.
  v1::DsaIndexerSpec other = *IndexerSpecFromPreset("glm-5", 8);
  other.set_topk(1024);
  absl::StatusOr<CompilePlan> plan2 = compiler.Plan(KernelSpecOf(other), "sm_120a");
  ASSERT_TRUE(plan2.ok());
  EXPECT_NE(plan2->key, plan->key);
  EXPECT_NE(plan2->module_name, plan->module_name);
  // The sparse MLA plan knobs do not apply.
  PlanOptions capped;
  capped.max_smem_per_block = 101376;
  EXPECT_EQ(compiler.Plan(KernelSpecOf(other), "sm_90a", capped).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// One variant carrying the indexer launch; the decode selector never
// picks it (it names why), and does not divide by its empty tiling.
TEST(IndexerCodegenTest, ManifestHasOneVariantTheSelectorNeverPicks) {
  const KernelCompiler compiler;
  const v1::DsaIndexerSpec spec = *IndexerSpecFromPreset("glm-5", 8);
  absl::StatusOr<v1::Manifest> m = BuildManifest(compiler, KernelSpecOf(spec), "sm_90a");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->variants_size(), 1);
  const v1::ManifestVariant& v = m->variants(0);
  EXPECT_EQ(v.module_name(), "dsa_indexer_h32_d128_topk2048_pb64_sm90a");
  // Its entries are listed with their roles, not in sparse MLA's fields.
  EXPECT_EQ(v.main_entry(), "");
  EXPECT_EQ(v.combine_entry(), "");
  ASSERT_EQ(v.entries_size(), 3);
  EXPECT_EQ(v.entries(0).name(), kIndexerLogitsEntry);
  EXPECT_EQ(v.entries(0).role(), v1::ENTRY_ROLE_INDEXER_LOGITS);
  EXPECT_EQ(v.entries(1).name(), kIndexerTopkEntry);
  EXPECT_EQ(v.entries(1).role(), v1::ENTRY_ROLE_INDEXER_TOPK);
  EXPECT_EQ(v.entries(2).name(), kIndexerTopkClusterEntry);
  EXPECT_EQ(v.entries(2).cluster_ctas(), static_cast<uint32_t>(dsa_indexer::kTopkClusterCtas));
  EXPECT_EQ(v.indexer().logits_block_threads(), 128u);  // one warpgroup
  EXPECT_EQ(v.key(), compiler.Plan(KernelSpecOf(spec), "sm_90a")->key);
  DeviceInfo device;
  device.arch = "sm_90a";
  device.sm_count = 132;
  RuntimeShape shape;
  shape.batch = 1;
  shape.s_q = 1;
  shape.num_q_heads = 32;
  shape.topk = 2048;
  shape.page_block_size = 64;
  shape.kv_dtype = v1::KV_CACHE_DTYPE_BF16;
  absl::StatusOr<Selection> sel = Select(*m, device, shape);
  EXPECT_FALSE(sel.ok());
  EXPECT_TRUE(absl::StrContains(sel.status().message(), "kind sparse_mla_decode (is dsa_indexer)"))
      << sel.status();
}

TEST(IndexerCodegenTest, LaunchFollowsConfig) {
  const v1::IndexerLaunch l =
      MakeIndexerLaunch(*IndexerSpecFromPreset("deepseek-v3.2", 1), *ParseArch("sm_120a"));
  EXPECT_EQ(l.logits_block_threads(), 128u);  // 4 warps of 16 heads
  EXPECT_EQ(l.logits_keys_per_cta(), 256u);
  EXPECT_EQ(l.logits_smem_bytes(),
            static_cast<uint32_t>(2 * dsa_indexer::IndexKeyPage::kBytes + 4 * 64 * 4));
  // Candidates, the histogram, the counters, a round's in-warp offsets,
  // the k = 2048 survivor positions.
  EXPECT_EQ(l.topk_smem_bytes(),
            static_cast<uint32_t>(
                dsa_indexer::kTopkCandidates * 8 + 2048 * 4 + dsa_indexer::kTopkCounters * 4 +
                dsa_indexer::kTopkUnroll * dsa_indexer::kTopkThreads * 4 + 2048 * 4));
  // The 99 KB parts (sm_120a / sm_121a, sm_86, sm_89) hold the cluster entry's.
  EXPECT_LE(l.topk_cluster().smem_bytes(), 99u * 1024);
  EXPECT_EQ(l.logits_params_bytes(), sizeof(dsa_indexer::LogitsParams));
  EXPECT_EQ(dsa_indexer::IndexKeyPage::kBytes, 64 * 132);
  // sm_90+: the top-k cluster entry, one more histogram of shared memory.
  EXPECT_EQ(l.topk_cluster().entry(), kIndexerTopkClusterEntry);
  EXPECT_EQ(l.topk_cluster().ctas(), static_cast<uint32_t>(dsa_indexer::kTopkClusterCtas));
  EXPECT_EQ(l.topk_cluster().smem_bytes(),
            l.topk_smem_bytes() + 2048 * 4 + dsa_indexer::kTopkClusterCtas * 4);
  EXPECT_EQ(l.topk_cluster().max_rows(), static_cast<uint32_t>(dsa_indexer::kTopkClusterMaxRows));
  EXPECT_EQ(l.topk_cluster().short_rows(),
            static_cast<uint32_t>(dsa_indexer::kTopkClusterShortRows));
  EXPECT_EQ(l.topk_cluster().long_context(),
            static_cast<uint32_t>(dsa_indexer::kTopkClusterLongContext));
  // Before sm_90: none, and no cluster entry in the source.
  const v1::DsaIndexerSpec spec = *IndexerSpecFromPreset("glm-5", 8);
  EXPECT_FALSE(MakeIndexerLaunch(spec, *ParseArch("sm_80")).has_topk_cluster());
  EXPECT_FALSE(absl::StrContains(GenerateIndexerSource(spec, *ParseArch("sm_89")).Whole(),
                                 kIndexerTopkClusterEntry));
  EXPECT_TRUE(absl::StrContains(GenerateIndexerSource(spec, *ParseArch("sm_90a")).Whole(),
                                kIndexerTopkClusterEntry));
}

TEST(IndexerCodegenTest, Sm90aLogitsRunOnWarpgroupMma) {
  const v1::DsaIndexerSpec spec = *IndexerSpecFromPreset("deepseek-v3.2", 1);
  const v1::IndexerLaunch l = MakeIndexerLaunch(spec, *ParseArch("sm_90a"));
  EXPECT_EQ(l.logits_block_threads(), 128u);  // one warpgroup
  EXPECT_EQ(l.logits_keys_per_cta(), 64u * dsa_indexer::kLogitsWgmmaPagesPerCta);
  EXPECT_EQ(l.logits_min_keys_per_cta(), 64u * dsa_indexer::kLogitsWgmmaMinPagesPerCta);
  // Q as f16 (64 heads x 256 bytes), the ring of pages and their
  // mbarriers, 64 weights, the CTA's page ids; 4 CTAs an SM in 227 KB.
  EXPECT_EQ(
      l.logits_smem_bytes(),
      static_cast<uint32_t>(
          64 * 256 + dsa_indexer::kLogitsWgmmaStages * (dsa_indexer::IndexKeyPage::kBytes + 8) +
          64 * 4 + dsa_indexer::kLogitsWgmmaPagesPerCta * 4));
  // The CTAs the entry's launch bounds promise an SM fit its 228 KB of
  // shared memory (1 KB reserved a CTA), for every head count.
  for (int heads = 1; heads <= dsa_indexer::kMaxIndexHeads; ++heads) {
    EXPECT_LE(dsa_indexer::LogitsMinBlocks(heads, true) *
                  (dsa_indexer::LogitsSmemBytes(heads, true) + 1024),
              228 * 1024)
        << heads;
  }
  EXPECT_TRUE(absl::StrContains(GenerateIndexerSource(spec, *ParseArch("sm_90a")).Whole(),
                                "kdi::IndexerTraits<64, 2048, true>"));
  // Not sm_90 (no wgmma without the arch-specific target), nor sm_100a.
  for (const char* arch : {"sm_90", "sm_100a"}) {
    EXPECT_TRUE(absl::StrContains(GenerateIndexerSource(spec, *ParseArch(arch)).Whole(),
                                  "kdi::IndexerTraits<64, 2048, false>"))
        << arch;
    EXPECT_EQ(MakeIndexerLaunch(spec, *ParseArch(arch)).logits_block_threads(), 128u) << arch;
    EXPECT_EQ(MakeIndexerLaunch(spec, *ParseArch(arch)).logits_min_keys_per_cta(), 0u) << arch;
  }
  // Head counts round up to a wgmma width.
  EXPECT_EQ(dsa_indexer::LogitsWgmmaN(1), 16);
  EXPECT_EQ(dsa_indexer::LogitsWgmmaN(20), 32);
  EXPECT_EQ(dsa_indexer::LogitsWgmmaN(64), 64);
  EXPECT_EQ(dsa_indexer::LogitsWgmmaN(65), 128);
  EXPECT_EQ(dsa_indexer::LogitsWgmmaN(128), 128);
}

}  // namespace
}  // namespace kforge
