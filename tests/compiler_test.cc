#include "compiler/compiler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "compiler/codegen.h"
#include "compiler/manifest.h"
#include "compiler/nvrtc.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/artifact_check.h"
#include "model/cubin.h"
#include "model/spec.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

using google::protobuf::util::MessageDifferencer;

v1::AttentionSpec Glm5Tp8() {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("glm-5", 8);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::AttentionSpec();
}

// deepseek-v3.2 at `tp` with a pow2-scaled fp8_ds_mla cache.
v1::KernelSpec DeepseekFp8(int tp) {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("deepseek-v3.2", tp);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return v1::KernelSpec();
  spec->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  spec->set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2);
  return KernelSpecOf(*spec);
}

CompilePlan MustPlan(const v1::AttentionSpec& spec, const std::string& arch,
                     const PlanOptions& options = {}) {
  absl::StatusOr<CompilePlan> plan = KernelCompiler().Plan(KernelSpecOf(spec), arch, options);
  EXPECT_TRUE(plan.ok()) << arch << ": " << plan.status();
  return plan.ok() ? *std::move(plan) : CompilePlan();
}

bool IsHexSha256(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

TEST(KernelCompilerPlan, Deterministic) {
  const CompilePlan a = MustPlan(Glm5Tp8(), "sm_120a");
  const CompilePlan b = MustPlan(Glm5Tp8(), "sm_120a");
  EXPECT_TRUE(IsHexSha256(a.key)) << a.key;
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.module_name, b.module_name);
  EXPECT_EQ(a.source, b.source);
  EXPECT_EQ(a.options, b.options);
  EXPECT_TRUE(MessageDifferencer::Equals(a.tiling, b.tiling));
  EXPECT_EQ(a.module_name,
            "sparse_mla_decode_h8_d512r64_topk2048_bf16_pb64_sc0p0625_"
            "lse_sm120a");
  EXPECT_EQ(a.arch.name, "sm_120a");
}

TEST(KernelCompilerPlan, ArchSpellingsShareAKey) {
  // "120a", "SM_120A" and " sm_120a " are the same target.
  const std::string key = MustPlan(Glm5Tp8(), "sm_120a").key;
  for (const char* spelling : {"120a", "SM_120A", " sm_120a "}) {
    EXPECT_EQ(MustPlan(Glm5Tp8(), spelling).key, key) << spelling;
  }
}

TEST(KernelCompilerPlan, KeyChangesWithEverySpecField) {
  const v1::AttentionSpec base = Glm5Tp8();
  const CompilePlan base_plan = MustPlan(base, "sm_90a");
  const std::vector<std::pair<const char*, std::function<void(v1::AttentionSpec&)>>> changes = {
      {"topk", [](v1::AttentionSpec& s) { s.set_topk(1024); }},
      {"page_block_size", [](v1::AttentionSpec& s) { s.set_page_block_size(1); }},
      {"softmax_scale",
       [](v1::AttentionSpec& s) {
         // One ulp away: the scale is baked into the kernel.
         s.set_softmax_scale(
             std::nextafter(s.softmax_scale(), std::numeric_limits<float>::infinity()));
       }},
      {"return_lse", [](v1::AttentionSpec& s) { s.set_return_lse(false); }},
      {"num_q_heads", [](v1::AttentionSpec& s) { s.set_num_q_heads(16); }},
      {"kv_lora_rank", [](v1::AttentionSpec& s) { s.set_kv_lora_rank(256); }},
      {"rope_dim", [](v1::AttentionSpec& s) { s.set_rope_dim(0); }},
  };
  std::set<std::string> keys = {base_plan.key};
  std::set<std::string> names = {base_plan.module_name};
  for (const auto& [field, change] : changes) {
    v1::AttentionSpec spec = base;
    change(spec);
    const CompilePlan plan = MustPlan(spec, "sm_90a");
    EXPECT_NE(plan.key, base_plan.key) << field;
    EXPECT_NE(plan.module_name, base_plan.module_name) << field;
    EXPECT_TRUE(keys.insert(plan.key).second) << field;
    EXPECT_TRUE(names.insert(plan.module_name).second) << field;
  }
  // s_q is not part of the kernel: every s_q (and none) is one key and name.
  for (uint32_t s_q : {0u, 1u, 2u, 4u}) {
    v1::AttentionSpec spec = base;
    spec.set_s_q(s_q);
    const CompilePlan plan = MustPlan(spec, "sm_90a");
    EXPECT_EQ(plan.key, base_plan.key) << "s_q " << s_q;
    EXPECT_EQ(plan.module_name, base_plan.module_name) << "s_q " << s_q;
  }
}

TEST(KernelCompilerPlan, KeyChangesWithArch) {
  std::set<std::string> keys;
  for (const Arch& arch : SupportedArchs()) {
    const CompilePlan plan = MustPlan(Glm5Tp8(), arch.name);
    EXPECT_TRUE(keys.insert(plan.key).second) << arch.name;
    EXPECT_EQ(plan.arch.name, arch.name);
  }
}

// PlanOptions{101376} on an H200 picks the sm_120a (99 KB) pipeline, under
// its own key and name so it never collides with the native sm_90a kernel.
TEST(KernelCompilerPlan, SmemCapIsPartOfTheKeyAndMatchesSm120Tiling) {
  for (int tp : {1, 2, 4, 8}) {
    for (const char* preset : {"deepseek-v3.2", "glm-5"}) {
      absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset(preset, tp);
      ASSERT_TRUE(spec.ok()) << spec.status();
      const CompilePlan native = MustPlan(*spec, "sm_90a");
      const CompilePlan capped =
          MustPlan(*spec, "sm_90a", PlanOptions{.max_smem_per_block = 101376, .tiling = {}});
      const CompilePlan sm120 = MustPlan(*spec, "sm_120a");
      EXPECT_NE(capped.key, native.key) << preset << " tp" << tp;
      EXPECT_NE(capped.module_name, native.module_name) << preset << " tp" << tp;
      EXPECT_EQ(capped.arch.name, "sm_90a");
      EXPECT_EQ(capped.arch.max_smem_per_block, 101376);
      EXPECT_TRUE(MessageDifferencer::Equals(capped.tiling, sm120.tiling))
          << preset << " tp" << tp << "\ncapped sm_90a: " << capped.tiling.ShortDebugString()
          << "\nsm_120a: " << sm120.tiling.ShortDebugString();
      EXPECT_LE(DecodeSmemBytesFor(capped.spec.sparse_mla_decode(), capped.tiling), 101376);
      // Same tiling and spec: the same instantiation unit.
      EXPECT_EQ(capped.source, sm120.source);
    }
  }
}

TEST(KernelCompilerPlan, CapAboveTheArchLimitDoesNotRaiseIt) {
  const CompilePlan plan =
      MustPlan(Glm5Tp8(), "sm_120a", PlanOptions{.max_smem_per_block = 1 << 20, .tiling = {}});
  EXPECT_EQ(plan.arch.max_smem_per_block, 99 * 1024);
}

TEST(KernelCompilerPlan, NegativeCapIsInvalid) {
  absl::StatusOr<CompilePlan> plan = KernelCompiler().Plan(
      KernelSpecOf(Glm5Tp8()), "sm_90a", PlanOptions{.max_smem_per_block = -1, .tiling = {}});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "max_smem_per_block")) << plan.status();
}

TEST(KernelCompilerPlan, BadSpecNamesTheField) {
  const std::vector<std::pair<const char*, std::function<void(v1::AttentionSpec&)>>> bad = {
      {"num_q_heads", [](v1::AttentionSpec& s) { s.set_num_q_heads(0); }},
      {"num_q_heads", [](v1::AttentionSpec& s) { s.set_num_q_heads(129); }},
      {"kv_lora_rank", [](v1::AttentionSpec& s) { s.set_kv_lora_rank(100); }},
      {"rope_dim", [](v1::AttentionSpec& s) { s.set_rope_dim(32); }},
      {"rope_dim", [](v1::AttentionSpec& s) { s.clear_rope_dim(); }},
      {"topk", [](v1::AttentionSpec& s) { s.set_topk(0); }},
      {"s_q", [](v1::AttentionSpec& s) { s.set_s_q(5); }},
      {"page_block_size", [](v1::AttentionSpec& s) { s.set_page_block_size(0); }},
      {"softmax_scale", [](v1::AttentionSpec& s) { s.set_softmax_scale(0.0f); }},
      {"softmax_scale",
       [](v1::AttentionSpec& s) { s.set_softmax_scale(std::numeric_limits<float>::quiet_NaN()); }},
      {"kv_cache_dtype",
       [](v1::AttentionSpec& s) { s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_UNSPECIFIED); }},
  };
  for (const auto& [field, change] : bad) {
    v1::AttentionSpec spec = Glm5Tp8();
    change(spec);
    absl::StatusOr<CompilePlan> plan = KernelCompiler().Plan(KernelSpecOf(spec), "sm_90a");
    ASSERT_FALSE(plan.ok()) << field;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument)
        << field << ": " << plan.status();
    EXPECT_TRUE(absl::StrContains(plan.status().message(), field))
        << field << ": " << plan.status();
  }
}

TEST(KernelCompilerPlan, UnknownArchIsFailedPrecondition) {
  for (const char* arch : {"sm_75", "sm_70", "sm_999", "compute_90", "", "gpu"}) {
    absl::StatusOr<CompilePlan> plan = KernelCompiler().Plan(KernelSpecOf(Glm5Tp8()), arch);
    ASSERT_FALSE(plan.ok()) << arch;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition)
        << arch << ": " << plan.status();
    // Lists what is supported.
    EXPECT_TRUE(absl::StrContains(plan.status().message(), "sm_90a")) << plan.status();
  }
}

TEST(KernelCompilerPlan, Fp8CacheNeedsAScaleFormatAndPlansTheFp8Format) {
  v1::AttentionSpec spec = Glm5Tp8();
  spec.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  absl::StatusOr<CompilePlan> plan = KernelCompiler().Plan(KernelSpecOf(spec), "sm_90a");
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "kv_scale_format")) << plan.status();

  spec.set_kv_scale_format(v1::KV_SCALE_FORMAT_ARBITRARY);
  plan = KernelCompiler().Plan(KernelSpecOf(spec), "sm_90a");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(absl::StrContains(plan->source, "ks::KvFp8DsMla<false>")) << plan->source;
}

TEST(KernelCompilerPlan, PlanCarriesTheNormalizedSpecAndCodegenOutputs) {
  const v1::AttentionSpec spec = Glm5Tp8();
  const CompilePlan plan = MustPlan(spec, "sm_120a");
  EXPECT_TRUE(MessageDifferencer::Equals(plan.spec, KernelSpecOf(spec)));
  absl::StatusOr<Arch> arch = ParseArch("sm_120a");
  ASSERT_TRUE(arch.ok());
  absl::StatusOr<v1::KernelTiling> tiling = ChooseTiling(spec, *arch);
  ASSERT_TRUE(tiling.ok());
  EXPECT_TRUE(MessageDifferencer::Equals(plan.tiling, *tiling));
  EXPECT_EQ(plan.source,
            GenerateSource(spec, *tiling, MakeLaunchRule(spec, *tiling, *arch)).Whole());
  EXPECT_EQ(plan.module_name, ModuleName(spec, *arch));
  EXPECT_FALSE(plan.options.empty());
}

// One real compile: the artifact matches its plan and the JSON description
// has everything but the cubin bytes.
TEST(KernelCompilerBuild, ArtifactAndDescription) {
  const KernelCompiler compiler;
  const CompilePlan plan = MustPlan(Glm5Tp8(), "sm_120a");
  absl::StatusOr<v1::KernelArtifact> artifact = compiler.Build(plan);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  EXPECT_EQ(artifact->key(), plan.key);
  EXPECT_EQ(artifact->module_name(), plan.module_name);
  EXPECT_EQ(artifact->arch(), "sm_120a");
  EXPECT_FALSE(artifact->cubin().empty());
  EXPECT_TRUE(MessageDifferencer::Equals(artifact->tiling(), plan.tiling));
  EXPECT_TRUE(MessageDifferencer::Equals(
      artifact->launch(), MakeLaunchRule(plan.spec.sparse_mla_decode(), plan.tiling, plan.arch)));

  const std::string json = ArtifactDescriptionJson(*artifact);
  for (const char* field :
       {"\"module_name\"", "\"key\"", "\"launch\"", "\"tiling\"", "\"cubin_info\"", "\"spec\""}) {
    EXPECT_TRUE(absl::StrContains(json, field)) << field << "\n" << json;
  }
  EXPECT_TRUE(absl::StrContains(json, plan.key));
  EXPECT_TRUE(absl::StrContains(json, plan.module_name));
  // No cubin bytes: not as base64, and the description is small.
  const std::string b64 = absl::Base64Escape(artifact->cubin().substr(0, 48));
  EXPECT_FALSE(absl::StrContains(json, b64.substr(0, 32)));
  EXPECT_LT(json.size(), artifact->cubin().size());

  // It reads back as the same artifact, less the cubin.
  v1::KernelArtifact parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  EXPECT_TRUE(parsed.cubin().empty());
  EXPECT_TRUE(parsed.more_cubins().empty());
  v1::KernelArtifact expected = *artifact;
  expected.clear_cubin();
  expected.clear_more_cubins();
  EXPECT_TRUE(MessageDifferencer::Equals(parsed, expected)) << parsed.ShortDebugString();
}

// Every entry's machine code (.text.<entry>) in a set of cubin images.
std::map<std::string, std::string> EntryCode(const std::vector<std::string>& images) {
  std::map<std::string, std::string> out;
  for (const std::string& cubin : images) {
    for (const ::kforge::testing::TextSection& text : ::kforge::testing::TextSections(cubin)) {
      out[text.name] = cubin.substr(text.offset, text.size);
    }
  }
  return out;
}

// A module is compiled as several programs, one image each (compiler/
// unit.h): each program exports its own entries, each image's kernels are
// recorded with it, and every entry's machine code is what the whole unit
// compiled as one program makes. The modules: warp-specialised entries
// alone (deepseek-v3.2 TP2 fp8_ds_mla, 64 heads), lockstep entries of one
// traits struct together (glm-5 TP8 bf16, 8 heads, on sm_90a), the 99 KB
// tilings (sm_120a) and an indexer.
TEST(KernelCompilerBuild, ProgramsKeepEveryEntrysMachineCode) {
  const KernelCompiler compiler;
  const v1::KernelSpec indexer = testing::Indexer64Spec();
  const std::vector<std::pair<v1::KernelSpec, std::string>> modules = {
      {DeepseekFp8(2), "sm_90a"},
      {KernelSpecOf(Glm5Tp8()), "sm_90a"},
      {KernelSpecOf(Glm5Tp8()), "sm_120a"},
      {indexer, "sm_90a"}};
  for (const auto& [spec, arch] : modules) {
    absl::StatusOr<CompilePlan> plan = compiler.Plan(spec, arch);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::string& where = plan->module_name;
    EXPECT_GT(plan->programs.size(), 1u) << where;
    absl::StatusOr<v1::KernelArtifact> artifact = compiler.Build(*plan);
    ASSERT_TRUE(artifact.ok()) << artifact.status();
    ASSERT_EQ(static_cast<size_t>(artifact->more_cubins_size()) + 1, plan->programs.size())
        << where;
    std::vector<std::string> images = {artifact->cubin()};
    images.insert(images.end(), artifact->more_cubins().begin(), artifact->more_cubins().end());
    for (size_t i = 0; i < images.size(); ++i) {
      absl::StatusOr<v1::CubinInfo> info = InspectCubin(images[i]);
      ASSERT_TRUE(info.ok()) << info.status();
      std::vector<std::string> exported;
      for (const v1::KernelResources& k : info->kernels()) exported.push_back(k.name());
      std::vector<std::string> wanted = plan->programs[i].entries;
      std::sort(exported.begin(), exported.end());
      std::sort(wanted.begin(), wanted.end());
      EXPECT_EQ(exported, wanted) << where << " image " << i;
    }
    for (const v1::KernelResources& k : artifact->cubin_info().kernels()) {
      ASSERT_LT(k.image(), plan->programs.size()) << where;
      const std::vector<std::string>& in = plan->programs[k.image()].entries;
      EXPECT_NE(std::find(in.begin(), in.end(), k.name()), in.end()) << where << " " << k.name();
    }
    NvrtcRequest whole;
    whole.source = plan->source;
    whole.program_name = where + ".cu";
    whole.arch = plan->arch.name;
    absl::StatusOr<NvrtcResult> one = CompileWithNvrtc(whole);
    ASSERT_TRUE(one.ok()) << one.status();
    const std::map<std::string, std::string> want = EntryCode({one->cubin});
    EXPECT_GE(want.size(), static_cast<size_t>(artifact->entries_size())) << where;
    EXPECT_TRUE(EntryCode(images) == want) << where << ": an entry's machine code changed";
  }
}

// A first answer is the whole module's images of its main and combine
// entries, byte for byte, launched through the variant less the paths it
// lacks; clients take it only when they asked for one.
TEST(KernelCompilerBuild, FirstAnswerIsTheWholeModulesMainAndCombineImages) {
  const KernelCompiler compiler;
  const v1::KernelSpec indexer = testing::Indexer64Spec();
  for (const v1::KernelSpec& spec : {DeepseekFp8(1), indexer}) {
    absl::StatusOr<CompilePlan> plan = compiler.Plan(spec, "sm_90a");
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::string& where = plan->module_name;
    const std::vector<size_t> first_programs = FirstAnswerPrograms(*plan);
    ASSERT_FALSE(first_programs.empty()) << where;
    ASSERT_LT(first_programs.size(), plan->programs.size()) << where;
    EXPECT_EQ(first_programs[0], 0u) << where << ": image 0 holds the main entry";
    std::vector<v1::KernelArtifact> firsts;
    absl::StatusOr<v1::KernelArtifact> whole =
        compiler.Build(*plan, [&](v1::KernelArtifact a) { firsts.push_back(std::move(a)); });
    ASSERT_TRUE(whole.ok()) << whole.status();
    ASSERT_EQ(firsts.size(), 1u) << where;
    const v1::KernelArtifact& first = firsts[0];
    EXPECT_TRUE(first.partial());
    EXPECT_FALSE(whole->partial());
    ASSERT_EQ(static_cast<size_t>(first.more_cubins_size()) + 1, first_programs.size()) << where;
    for (size_t i = 0; i < first_programs.size(); ++i) {
      EXPECT_TRUE(ImageOf(first, i) == ImageOf(*whole, first_programs[i])) << where << " " << i;
    }
    EXPECT_LT(first.entries_size(), whole->entries_size()) << where;
    const v1::ManifestVariant variant = VariantOfPlan(*plan);
    EXPECT_TRUE(CheckAnswerForVariant(variant, "sm_90a", first, true).ok())
        << CheckAnswerForVariant(variant, "sm_90a", first, true);
    EXPECT_TRUE(CheckAnswerForVariant(variant, "sm_90a", *whole, true).ok());
    // Not asked for, or as a whole module, a first answer is refused.
    EXPECT_EQ(CheckArtifactForVariant(variant, "sm_90a", first).code(),
              absl::StatusCode::kDataLoss);
    v1::KernelArtifact unflagged = first;
    unflagged.set_partial(false);
    EXPECT_EQ(CheckAnswerForVariant(variant, "sm_90a", unflagged, true).code(),
              absl::StatusCode::kDataLoss);
    // One without its main image is no answer either.
    v1::KernelArtifact headless = first;
    headless.set_cubin(headless.more_cubins(0));
    headless.mutable_more_cubins()->DeleteSubrange(0, 1);
    for (v1::KernelResources& k : *headless.mutable_cubin_info()->mutable_kernels()) {
      k.set_image(k.image() == 0 ? 99 : k.image() - 1);
    }
    EXPECT_EQ(CheckAnswerForVariant(variant, "sm_90a", headless, true).code(),
              absl::StatusCode::kDataLoss);
    // What it launches: the main and combine entries; no path it lacks.
    const v1::ManifestVariant launched = VariantOfArtifact(first);
    EXPECT_EQ(launched.main_entry(), variant.main_entry());
    EXPECT_EQ(launched.combine_entry(), variant.combine_entry());
    EXPECT_EQ(launched.indexer().logits_entry(), variant.indexer().logits_entry());
    EXPECT_EQ(launched.indexer().topk_entry(), variant.indexer().topk_entry());
    for (const std::string* entry :
         OptionalMainEntries(launched.small_batch(), launched.cluster())) {
      EXPECT_NE(FindKernel(first.cubin_info(), *entry), nullptr) << where << " " << *entry;
    }
    if (spec.has_dsa_indexer()) {
      EXPECT_TRUE(variant.indexer().has_topk_cluster()) << where;
      EXPECT_FALSE(launched.indexer().has_topk_cluster()) << where;
    } else {
      EXPECT_FALSE(variant.cluster().entry().empty()) << where;
      EXPECT_FALSE(launched.has_cluster()) << where;
    }
  }
  // A module whose programs all hold the main or combine entry (no
  // small-batch or cluster path: glm-5 TP8 bf16 on sm_120a) has no smaller
  // answer: the sink is never called.
  absl::StatusOr<CompilePlan> glm = compiler.Plan(KernelSpecOf(Glm5Tp8()), "sm_120a");
  ASSERT_TRUE(glm.ok());
  EXPECT_TRUE(FirstAnswerPrograms(*glm).empty());
  int calls = 0;
  ASSERT_TRUE(compiler.Build(*glm, [&](v1::KernelArtifact) { ++calls; }).ok());
  EXPECT_EQ(calls, 0);
}

TEST(KernelCompilerBuild, CompileIsPlanPlusBuild) {
  const KernelCompiler compiler;
  absl::StatusOr<v1::KernelArtifact> artifact = compiler.Compile(KernelSpecOf(Glm5Tp8()), "sm_90a");
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  EXPECT_EQ(artifact->key(), MustPlan(Glm5Tp8(), "sm_90a").key);
  EXPECT_EQ(artifact->cubin_info().arch(), "sm_90a");
}

TEST(CompilerVersion, NamesKforgeAndNvrtc) {
  const std::string v = CompilerVersion();
  EXPECT_TRUE(absl::StartsWith(v, "kforge ")) << v;
  EXPECT_TRUE(absl::StrContains(v, " / nvrtc ")) << v;
}

}  // namespace
}  // namespace kforge
