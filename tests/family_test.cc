// The kernel-family registry (compiler/family.h) and the entries each
// family lists for its modules, from plans (no NVRTC; compile_matrix_test
// and indexer_compile_test check the lists against real cubins).
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "compiler/codegen.h"
#include "compiler/compiler.h"
#include "compiler/family.h"
#include "compiler/indexer_codegen.h"
#include "compiler/manifest.h"
#include "gtest/gtest.h"
#include "kforge/v1/artifact.pb.h"
#include "model/indexer_spec.h"
#include "model/spec.h"
#include "templates/kforge/dsa_indexer/config.h"
#include "templates/kforge/sparse_mla/common/params.h"

namespace kforge {
namespace {

// Every case of KernelSpec has exactly one family, found from a spec of
// that case.
TEST(FamilyRegistry, EveryKindOnce) {
  std::set<int> kinds;
  for (const KernelFamily* family : RegisteredFamilies()) {
    EXPECT_TRUE(kinds.insert(family->kind()).second) << family->kind() << " registered twice";
  }
  const google::protobuf::OneofDescriptor& cases = *v1::KernelSpec::descriptor()->oneof_decl(0);
  EXPECT_EQ(static_cast<int>(kinds.size()), cases.field_count());
  for (int i = 0; i < cases.field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = cases.field(i);
    EXPECT_TRUE(kinds.count(field->number())) << field->name() << " has no family";
    v1::KernelSpec spec;
    spec.GetReflection()->MutableMessage(&spec, field);  // the case set
    absl::StatusOr<const KernelFamily*> family = FamilyFor(spec);
    ASSERT_TRUE(family.ok()) << family.status();
    EXPECT_EQ((*family)->kind(), field->number());
  }
}

TEST(FamilyRegistry, ASpecWithoutACaseIsRefusedByName) {
  absl::StatusOr<const KernelFamily*> family = FamilyFor(v1::KernelSpec());
  ASSERT_FALSE(family.ok());
  EXPECT_EQ(family.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(family.status().message(),
                                "kind: got none, supported sparse_mla_decode or dsa_indexer"))
      << family.status();
  absl::StatusOr<CompilePlan> plan = KernelCompiler().Plan(v1::KernelSpec(), "sm_90a");
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "kind: got none")) << plan.status();
}

const v1::KernelEntry* Find(const v1::ManifestVariant& v, const std::string& name) {
  for (const v1::KernelEntry& e : v.entries()) {
    if (e.name() == name) return &e;
  }
  return nullptr;
}

// The entries agree with the fields the selector reads: one entry per
// named kernel, in a fixed order, with the role, tiling, epilogue and
// cluster size that field implies.
void ExpectSparseMlaEntries(const v1::ManifestVariant& v, const std::string& where) {
  std::set<std::string> names;
  for (const v1::KernelEntry& e : v.entries()) {
    EXPECT_TRUE(names.insert(e.name()).second) << where << ": " << e.name() << " twice";
    const bool combine = e.role() == v1::ENTRY_ROLE_COMBINE;
    EXPECT_TRUE(combine || e.role() == v1::ENTRY_ROLE_ATTENTION) << where;
    EXPECT_EQ(e.params_bytes(),
              combine ? sizeof(sparse_mla::CombineParams) : sizeof(sparse_mla::DecodeParams))
        << where << ": " << e.name();
    if (!combine) {
      EXPECT_NE(e.pipeline(), v1::PIPELINE_UNSPECIFIED) << where << ": " << e.name();
      EXPECT_NE(e.mma(), v1::MMA_UNSPECIFIED) << where << ": " << e.name();
    }
  }
  ASSERT_GE(v.entries_size(), 2) << where;
  EXPECT_EQ(v.entries(0).name(), kMainEntry) << where;
  EXPECT_EQ(v.entries(v.entries_size() - 1).name(), kCombineEntry) << where;
  const v1::KernelEntry* main = Find(v, kMainEntry);
  EXPECT_EQ(main->tiling(), v1::TILING_USE_THROUGHPUT) << where;
  EXPECT_EQ(main->epilogue(), v1::EPILOGUE_SPLIT) << where;
  EXPECT_EQ(main->cluster_ctas(), v.tiling().crossover() ? 2u : 0u) << where;
  EXPECT_EQ(main->mma(), v.tiling().wgmma() ? v1::MMA_WGMMA : v1::MMA_SYNC) << where;
  EXPECT_EQ(main->pipeline() == v1::PIPELINE_CROSSOVER_PAIR, v.tiling().crossover()) << where;
  int attention = 1;
  for (const auto& [name, splits, use] :
       {std::tuple{v.cluster().entry(), v.cluster().splits(), v1::TILING_USE_THROUGHPUT},
        std::tuple{v.cluster().wide_entry(), v.cluster().wide_splits(), v1::TILING_USE_THROUGHPUT},
        std::tuple{v.small_batch().cluster_entry(), v.small_batch().cluster_splits(),
                   v1::TILING_USE_LATENCY}}) {
    if (name.empty()) continue;
    ++attention;
    const v1::KernelEntry* e = Find(v, name);
    ASSERT_NE(e, nullptr) << where << ": " << name;
    EXPECT_EQ(e->epilogue(), v1::EPILOGUE_CLUSTER_MERGE) << where << ": " << name;
    EXPECT_EQ(e->cluster_ctas(), splits) << where << ": " << name;
    EXPECT_EQ(e->tiling(), use) << where << ": " << name;
    // Only the main entry runs as the crossover pair.
    EXPECT_NE(e->pipeline(), v1::PIPELINE_CROSSOVER_PAIR) << where << ": " << name;
  }
  if (!v.small_batch().entry().empty()) {
    ++attention;
    const v1::KernelEntry* small = Find(v, v.small_batch().entry());
    ASSERT_NE(small, nullptr) << where;
    EXPECT_EQ(small->tiling(), v1::TILING_USE_LATENCY) << where;
    EXPECT_EQ(small->epilogue(), v1::EPILOGUE_SPLIT) << where;
    EXPECT_EQ(small->cluster_ctas(), 0u) << where;
  }
  EXPECT_EQ(v.entries_size(), attention + 1) << where;
}

TEST(SparseMlaFamily, EntriesOfEveryPresetArchAndFormat) {
  const KernelCompiler compiler;
  int planned = 0;
  for (const char* preset : {"deepseek-v3.2", "glm-5"}) {
    for (int tp : {1, 2, 4, 8}) {
      for (v1::KvCacheDtype dtype : {v1::KV_CACHE_DTYPE_BF16, v1::KV_CACHE_DTYPE_FP8_DS_MLA,
                                     v1::KV_CACHE_DTYPE_NVFP4_DS_MLA}) {
        absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset(preset, tp, dtype);
        ASSERT_TRUE(spec.ok()) << spec.status();
        for (const char* arch : {"sm_80", "sm_90a", "sm_100a", "sm_120a"}) {
          absl::StatusOr<CompilePlan> plan = compiler.Plan(KernelSpecOf(*spec), arch);
          ASSERT_TRUE(plan.ok()) << plan.status();
          const v1::ManifestVariant v = VariantOfPlan(*plan);
          ExpectSparseMlaEntries(v, plan->module_name);
          ++planned;
        }
      }
    }
  }
  EXPECT_EQ(planned, 96);
}

TEST(SparseMlaFamily, ACappedModuleListsNoClusterEntries) {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("deepseek-v3.2", 1);
  ASSERT_TRUE(spec.ok());
  PlanOptions options;
  options.max_smem_per_block = 101376;
  absl::StatusOr<CompilePlan> plan = KernelCompiler().Plan(KernelSpecOf(*spec), "sm_90a", options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const v1::ManifestVariant v = VariantOfPlan(*plan);
  ExpectSparseMlaEntries(v, plan->module_name);
  for (const v1::KernelEntry& e : v.entries()) {
    EXPECT_NE(e.epilogue(), v1::EPILOGUE_CLUSTER_MERGE) << e.name();
  }
}

TEST(DsaIndexerFamily, EntriesByArch) {
  absl::StatusOr<v1::DsaIndexerSpec> spec = IndexerSpecFromPreset("deepseek-v3.2", 1);
  ASSERT_TRUE(spec.ok());
  for (const char* arch : {"sm_80", "sm_90a", "sm_120a"}) {
    absl::StatusOr<CompilePlan> plan = KernelCompiler().Plan(KernelSpecOf(*spec), arch);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const v1::ManifestVariant v = VariantOfPlan(*plan);
    const bool clusters = IndexerHasTopkCluster(plan->arch);
    ASSERT_EQ(v.entries_size(), clusters ? 3 : 2) << arch;
    EXPECT_EQ(v.entries(0).name(), kIndexerLogitsEntry);
    EXPECT_EQ(v.entries(0).role(), v1::ENTRY_ROLE_INDEXER_LOGITS);
    EXPECT_EQ(v.entries(0).params_bytes(), sizeof(dsa_indexer::LogitsParams));
    EXPECT_EQ(v.entries(1).name(), kIndexerTopkEntry);
    EXPECT_EQ(v.entries(1).role(), v1::ENTRY_ROLE_INDEXER_TOPK);
    EXPECT_EQ(v.entries(1).params_bytes(), sizeof(dsa_indexer::TopkParams));
    if (clusters) {
      EXPECT_EQ(v.entries(2).name(), v.indexer().topk_cluster().entry());
      EXPECT_EQ(v.entries(2).role(), v1::ENTRY_ROLE_INDEXER_TOPK);
      EXPECT_EQ(v.entries(2).cluster_ctas(), v.indexer().topk_cluster().ctas());
    }
    for (const v1::KernelEntry& e : v.entries()) {
      EXPECT_EQ(e.pipeline(), v1::PIPELINE_UNSPECIFIED);
      EXPECT_EQ(e.tiling(), v1::TILING_USE_UNSPECIFIED);
    }
    // No reuse of sparse MLA's fields.
    EXPECT_EQ(v.main_entry(), "");
    EXPECT_EQ(v.combine_entry(), "");
    EXPECT_FALSE(v.has_tiling());
    EXPECT_FALSE(v.has_launch());
  }
}

}  // namespace
}  // namespace kforge
