// The planner names its schedule and says why (compiler/schedule.h), from
// the arch's tuning table (compiler/tuning.h).

#include "compiler/schedule.h"

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_join.h"
#include "compiler/compiler.h"
#include "compiler/tuning.h"
#include "gtest/gtest.h"
#include "model/arch.h"
#include "model/spec.h"

namespace kforge {
namespace {

v1::AttentionSpec Preset(const char* name, int tp, v1::KvCacheDtype dtype) {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset(name, tp, dtype);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::AttentionSpec();
}

// A 512 + 0 spec of a record format (V4 / V4.1 need rope 0).
v1::AttentionSpec Record(v1::KvCacheDtype dtype, int heads) {
  v1::AttentionSpec spec = Preset("glm-5", 1, v1::KV_CACHE_DTYPE_BF16);
  spec.set_kv_cache_dtype(dtype);
  spec.clear_kv_scale_format();
  spec.set_num_q_heads(heads);
  spec.set_topk(512);
  if (dtype != v1::KV_CACHE_DTYPE_NVFP4_DS_MLA) spec.set_rope_dim(0);
  return spec;
}

Arch ArchNamed(const char* name) {
  absl::StatusOr<Arch> arch = ParseArch(name);
  EXPECT_TRUE(arch.ok()) << arch.status();
  return arch.ok() ? *arch : Arch();
}

Schedule Plan(const v1::AttentionSpec& spec, const char* arch, ScheduleOptions options = {}) {
  absl::StatusOr<Schedule> s = PlanSchedule(spec, ArchNamed(arch), options);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Schedule();
}

std::string Reasons(const Schedule& s) { return absl::StrJoin(s.reasons, "\n"); }

TEST(PlanSchedule, NamesThePipelineOfEachTiling) {
  // sm_90a, 128 heads, fp8_ds_mla: the 64-head wgmma tiling with a producer
  // warpgroup; its 32-head small-batch tiling is lockstep wgmma.
  Schedule s = Plan(Preset("deepseek-v3.2", 1, v1::KV_CACHE_DTYPE_FP8_DS_MLA), "sm_90a");
  EXPECT_EQ(s.tiling.pipeline(), v1::PIPELINE_WARP_SPECIALIZED);
  EXPECT_EQ(s.tiling.mma(), v1::MMA_WGMMA);
  ASSERT_FALSE(s.small_batch.entry().empty());
  EXPECT_NE(s.small_batch.tiling().pipeline(), v1::PIPELINE_UNSPECIFIED);
  // The same spec on sm_120a: mma.sync, lockstep.
  s = Plan(Preset("deepseek-v3.2", 1, v1::KV_CACHE_DTYPE_FP8_DS_MLA), "sm_120a");
  EXPECT_EQ(s.tiling.pipeline(), v1::PIPELINE_LOCKSTEP);
  EXPECT_EQ(s.tiling.mma(), v1::MMA_SYNC);
  EXPECT_TRUE(s.cluster.entry().empty() && s.cluster.wide_entry().empty());
  // glm-5 TP4, 16 heads of fp8_ds_mla: the register pipeline.
  s = Plan(Preset("glm-5", 4, v1::KV_CACHE_DTYPE_FP8_DS_MLA), "sm_90a");
  EXPECT_EQ(s.tiling.pipeline(), v1::PIPELINE_REGISTER);
  EXPECT_EQ(s.tiling.mma(), v1::MMA_SYNC);
  // nvfp4 at 128 heads (two 64-head groups): crossover pairs.
  s = Plan(Record(v1::KV_CACHE_DTYPE_NVFP4_DS_MLA, 128), "sm_90a");
  EXPECT_EQ(s.tiling.pipeline(), v1::PIPELINE_CROSSOVER_PAIR);
  EXPECT_TRUE(s.tiling.crossover());
  // The producer's tuned choices ride on the tiling: nvfp4's pair loads
  // ahead, the V4 records prefetch into L2, fp8_ds_mla does neither.
  EXPECT_TRUE(s.tiling.pair_load_ahead());
  EXPECT_FALSE(s.tiling.producer_prefetch_l2());
  s = Plan(Record(v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4, 128), "sm_90a");
  EXPECT_EQ(s.tiling.pipeline(), v1::PIPELINE_CROSSOVER_PAIR);
  EXPECT_TRUE(s.tiling.producer_prefetch_l2());
  EXPECT_FALSE(s.tiling.pair_load_ahead());
  s = Plan(Preset("deepseek-v3.2", 1, v1::KV_CACHE_DTYPE_FP8_DS_MLA), "sm_90a");
  EXPECT_FALSE(s.tiling.producer_prefetch_l2() || s.tiling.pair_load_ahead());
  // Off the producer pipelines they are never set.
  s = Plan(Record(v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4, 128), "sm_120a");
  EXPECT_FALSE(s.tiling.producer_prefetch_l2() || s.tiling.pair_load_ahead());
}

TEST(PlanSchedule, PipelineOfAgreesWithTheShape) {
  for (const char* arch : {"sm_80", "sm_90a", "sm_100a", "sm_120a"}) {
    for (v1::KvCacheDtype dtype : {v1::KV_CACHE_DTYPE_BF16, v1::KV_CACHE_DTYPE_FP8_DS_MLA}) {
      for (int tp : {1, 2, 4, 8}) {
        const Schedule s = Plan(Preset("deepseek-v3.2", tp, dtype), arch);
        const sparse_mla::DecodeShape shape =
            DecodeShapeFor(Preset("deepseek-v3.2", tp, dtype), s.tiling);
        const bool ws = sparse_mla::WarpSpecialized(shape);
        EXPECT_EQ(ws, s.tiling.pipeline() == v1::PIPELINE_WARP_SPECIALIZED ||
                          s.tiling.pipeline() == v1::PIPELINE_CROSSOVER_PAIR)
            << arch << " tp" << tp;
        EXPECT_EQ(sparse_mla::RegisterPipeline(shape), s.tiling.pipeline() == v1::PIPELINE_REGISTER)
            << arch << " tp" << tp;
        EXPECT_EQ(s.tiling.wgmma(), s.tiling.mma() == v1::MMA_WGMMA) << arch << " tp" << tp;
      }
    }
  }
}

TEST(PlanSchedule, SaysWhy) {
  const Schedule s = Plan(Preset("deepseek-v3.2", 1, v1::KV_CACHE_DTYPE_FP8_DS_MLA), "sm_90a");
  const std::string why = Reasons(s);
  EXPECT_NE(why.find("tuning: the sm_90a table (measured on the H200)"), std::string::npos) << why;
  EXPECT_NE(why.find("producer warpgroup"), std::string::npos) << why;
  EXPECT_NE(why.find("small batch"), std::string::npos) << why;
  EXPECT_NE(why.find("cluster"), std::string::npos) << why;
  // An arch without its own table says whose numbers it uses.
  const std::string other = Reasons(Plan(Preset("glm-5", 8, v1::KV_CACHE_DTYPE_BF16), "sm_120a"));
  EXPECT_NE(other.find("sm_120a has no table of its own"), std::string::npos) << other;
  EXPECT_NE(other.find("wgmma is sm_90a only"), std::string::npos) << other;
}

TEST(PlanSchedule, ACapOrARequestLeavesNoClusters) {
  ScheduleOptions capped;
  capped.smem_capped = true;
  const v1::AttentionSpec spec = Preset("deepseek-v3.2", 1, v1::KV_CACHE_DTYPE_BF16);
  absl::StatusOr<Schedule> s = PlanSchedule(spec, WithSmemCap(ArchNamed("sm_90a"), 101376), capped);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->cluster.entry().empty() && s->cluster.wide_entry().empty());
  EXPECT_TRUE(s->small_batch.cluster_entry().empty());
  ScheduleOptions requested;
  requested.tiling = TilingRequest{64, 64, 2, 8};
  s = PlanSchedule(spec, ArchNamed("sm_90a"), requested);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->small_batch.entry().empty());
  EXPECT_NE(Reasons(*s).find("asked for by hand"), std::string::npos);
  requested.tiling = TilingRequest{16, 64, 4, 4};
  EXPECT_EQ(PlanSchedule(spec, ArchNamed("sm_90a"), requested).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Tuning, EveryArchHasATableAndEveryFormatAPreference) {
  for (const char* name :
       {"sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_103a", "sm_120a", "sm_121a"}) {
    const SparseMlaTuning& t = TuningFor(ArchNamed(name));
    EXPECT_GT(t.min_keys_per_split, 0) << name;
    EXPECT_GT(t.min_keys_per_split_small_batch, 0) << name;
    EXPECT_FALSE(t.small_batch_tiles.empty()) << name;
    EXPECT_GT(t.sixteen_cta_clusters, 0) << name;
  }
  // Every format kforge builds has a row in the measured table.
  for (const KvFormatInfo& kv : KvFormats()) {
    bool found = false;
    for (const FormatTuning& f : Sm90Tuning().formats) found |= f.dtype == kv.dtype;
    EXPECT_TRUE(found) << kv.name;
  }
}

TEST(ExplainSchedule, PrintsTheEntriesAndTheReasons) {
  // A real compile: the artifact carries the entries and the reasons.
  KernelCompiler compiler;
  absl::StatusOr<v1::KernelArtifact> a = compiler.Compile(
      KernelSpecOf(Preset("deepseek-v3.2", 1, v1::KV_CACHE_DTYPE_FP8_DS_MLA)), "sm_90a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_GT(a->schedule_reasons_size(), 3);
  const std::string text = ExplainSchedule(*a);
  EXPECT_NE(text.find("warp-specialized"), std::string::npos) << text;
  EXPECT_NE(text.find(kMainEntry), std::string::npos) << text;
  EXPECT_NE(text.find(kCombineEntry), std::string::npos) << text;
  EXPECT_NE(text.find(kMainWideClusterEntry), std::string::npos) << text;
  EXPECT_NE(text.find("splits merged in the cluster, clusters of 16 CTAs"), std::string::npos)
      << text;
  EXPECT_NE(text.find("why:"), std::string::npos) << text;
  // Six programs (three warp-specialised entries alone, the small-batch
  // pair, the combine): each entry names its image.
  EXPECT_EQ(a->more_cubins_size(), 4);
  EXPECT_NE(text.find("merges split partials; image 4"), std::string::npos) << text;
  EXPECT_NE(text.find("; image 0\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace kforge
