// Compiles the DSA indexer modules of both presets for every supported arch
// through NVRTC and checks the cubins: the arch asked for, both entries,
// their parameter blocks and no local memory (no register spills).
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "compiler/compiler.h"
#include "compiler/indexer_codegen.h"
#include "gtest/gtest.h"
#include "kforge/v1/artifact.pb.h"
#include "model/arch.h"
#include "model/indexer_spec.h"
#include "model/spec.h"
#include "templates/kforge/dsa_indexer/config.h"

namespace kforge {
namespace {

TEST(IndexerCompileTest, EveryPresetOnEveryArch) {
  const KernelCompiler compiler;
  int built = 0;
  for (const IndexerPresetInfo& preset : IndexerPresets()) {
    absl::StatusOr<v1::DsaIndexerSpec> spec = IndexerSpecFromPreset(preset.name, 1);
    ASSERT_TRUE(spec.ok()) << spec.status();
    for (const char* arch :
         {"sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a", "sm_121a"}) {
      SCOPED_TRACE(absl::StrCat(preset.name, " ", arch));
      absl::StatusOr<v1::KernelArtifact> a = compiler.Compile(KernelSpecOf(*spec), arch);
      ASSERT_TRUE(a.ok()) << a.status();
      EXPECT_EQ(a->cubin_info().arch(), arch);
      EXPECT_EQ(a->indexer().logits_entry(), kIndexerLogitsEntry);
      int entries = 0;
      for (const v1::KernelResources& k : a->cubin_info().kernels()) {
        EXPECT_EQ(k.local_bytes(), 0u) << k.name() << " spills";
        if (k.name() == kIndexerLogitsEntry) {
          ++entries;
          EXPECT_EQ(k.param_bytes(), sizeof(dsa_indexer::LogitsParams));
          EXPECT_EQ(k.max_threads(), a->indexer().logits_block_threads());
        }
        if (k.name() == kIndexerTopkEntry) {
          ++entries;
          EXPECT_EQ(k.param_bytes(), sizeof(dsa_indexer::TopkParams));
          EXPECT_EQ(k.max_threads(), a->indexer().topk_block_threads());
        }
      }
      EXPECT_EQ(entries, 2);
      // The entry list names exactly the cubin's kernels, with their
      // blocks; the indexer leaves sparse MLA's entry fields unset.
      ASSERT_EQ(a->entries_size(), a->cubin_info().kernels_size());
      for (const v1::KernelEntry& e : a->entries()) {
        const auto k =
            std::find_if(a->cubin_info().kernels().begin(), a->cubin_info().kernels().end(),
                         [&](const v1::KernelResources& r) { return r.name() == e.name(); });
        ASSERT_NE(k, a->cubin_info().kernels().end()) << e.name();
        EXPECT_EQ(k->param_bytes(), e.params_bytes()) << e.name();
      }
      EXPECT_EQ(a->main_entry(), "");
      EXPECT_EQ(a->params_bytes(), 0u);
      ++built;
    }
  }
  EXPECT_EQ(built, 14);
}

// The largest shapes the family admits still compile without spills.
TEST(IndexerCompileTest, LimitsCompile) {
  const KernelCompiler compiler;
  v1::DsaIndexerSpec spec = *IndexerSpecFromPreset("deepseek-v3.2", 1);
  spec.set_index_heads(128);
  spec.set_topk(4096);
  for (const char* arch : {"sm_80", "sm_90a", "sm_120a"}) {
    absl::StatusOr<v1::KernelArtifact> a = compiler.Compile(KernelSpecOf(spec), arch);
    ASSERT_TRUE(a.ok()) << a.status();
    for (const v1::KernelResources& k : a->cubin_info().kernels()) {
      EXPECT_EQ(k.local_bytes(), 0u) << arch << " " << k.name();
    }
  }
}

}  // namespace
}  // namespace kforge
