// The sparse MLA decode family (ATTENTION_KIND_SPARSE_MLA_DECODE): the
// planner's tiling and paths (compiler/codegen.h), its instantiation unit,
// and the entries a module exports: up to five attention entries and the
// combine.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/codegen.h"
#include "compiler/family.h"
#include "compiler/key.h"
#include "compiler/nvrtc.h"
#include "model/spec.h"

namespace kforge {
namespace {

struct Schedule {
  v1::Pipeline pipeline;
  v1::Mma mma;
};

// The schedule of a tiling's entries: the tiling's named pipeline and MMA
// where the planner set them, else read from its shape (wgmma with four
// land warps: warp-specialised; one stage: the register pipeline; else
// lockstep). Only a crossover tiling's main entry is compiled as the pair
// (GenerateSource); its cluster entries run the warp-specialised pipeline.
// TODO(planner): the provisional reading goes once KernelTiling.pipeline
// and .mma are always set.
Schedule ScheduleOf(const v1::KernelTiling& tiling, bool paired) {
  Schedule s{tiling.pipeline(), tiling.mma()};
  if (s.pipeline == v1::PIPELINE_UNSPECIFIED) {
    if (tiling.crossover()) {
      s.pipeline = v1::PIPELINE_CROSSOVER_PAIR;
    } else if (tiling.wgmma() && tiling.land_warps() == 4) {
      s.pipeline = v1::PIPELINE_WARP_SPECIALIZED;
    } else if (tiling.stages() == 1) {
      s.pipeline = v1::PIPELINE_REGISTER;
    } else {
      s.pipeline = v1::PIPELINE_LOCKSTEP;
    }
  }
  if (!paired && s.pipeline == v1::PIPELINE_CROSSOVER_PAIR) {
    s.pipeline = v1::PIPELINE_WARP_SPECIALIZED;
  }
  if (s.mma == v1::MMA_UNSPECIFIED) s.mma = tiling.wgmma() ? v1::MMA_WGMMA : v1::MMA_SYNC;
  return s;
}

v1::KernelEntry AttentionEntry(const std::string& name, v1::TilingUse use,
                               const v1::KernelTiling& tiling, v1::Epilogue epilogue,
                               uint32_t cluster_ctas, bool paired = false) {
  v1::KernelEntry e =
      MakeEntry(name, v1::ENTRY_ROLE_ATTENTION, sizeof(sparse_mla::DecodeParams), cluster_ctas);
  e.set_tiling(use);
  const Schedule s = ScheduleOf(tiling, paired);
  e.set_pipeline(s.pipeline);
  e.set_mma(s.mma);
  e.set_epilogue(epilogue);
  return e;
}

class SparseMlaDecode final : public KernelFamily {
 public:
  SparseMlaDecode() : KernelFamily(v1::ATTENTION_KIND_SPARSE_MLA_DECODE, &NormalizeSpec) {}

  absl::Status Plan(const PlanOptions& options, CompilePlan& plan) const override {
    absl::StatusOr<v1::KernelTiling> tiling = ChooseTiling(plan.spec, plan.arch, options.tiling);
    if (!tiling.ok()) return tiling.status();
    plan.tiling = *std::move(tiling);
    plan.module_name = ModuleName(plan.spec, plan.arch);
    if (options.max_smem_per_block > 0) {
      absl::StrAppend(&plan.module_name, "_smem", plan.arch.max_smem_per_block);
    }
    const TilingRequest& t = options.tiling;
    if (!t.empty()) {
      absl::StrAppend(&plan.module_name, "_t", t.head_tile, "_", t.token_tile, "_", t.stages, "_",
                      t.warps);
    }
    // A requested tiling is measured alone: no second kernel beside it.
    if (t.empty()) {
      plan.small_batch = ChooseSmallBatchPath(plan.spec, plan.arch, plan.tiling);
      plan.cluster = ChooseMainCluster(plan.spec, plan.arch, plan.tiling, plan.small_batch);
    }
    // A shared-memory cap stands in for a smaller part (101376: sm_120's 99
    // KB on an H200), whose modules have no cluster entries: the capped
    // module is that part's, kernel for kernel.
    if (options.max_smem_per_block > 0) {
      plan.small_batch.clear_cluster_entry();
      plan.small_batch.clear_cluster_splits();
      plan.cluster.Clear();
    }
    plan.launch = MakeLaunchRule(plan.spec, plan.tiling, plan.arch);
    plan.source =
        GenerateSource(plan.spec, plan.tiling, plan.launch, plan.small_batch, plan.cluster);
    plan.options = BaseNvrtcOptions(plan.arch.name);

    KeyInputs key = PlanKeyInputs(plan);
    key.max_smem_per_block = options.max_smem_per_block;
    if (!t.empty()) {
      key.tiling_request =
          absl::StrCat(t.head_tile, ",", t.token_tile, ",", t.stages, ",", t.warps);
    }
    plan.key = ComputeCacheKey(key);
    return absl::OkStatus();
  }

  std::vector<v1::KernelEntry> Entries(const CompilePlan& plan) const override {
    const v1::KernelTiling& main = plan.tiling;
    const v1::SmallBatchPath& small = plan.small_batch;
    const v1::ClusterPath& cluster = plan.cluster;
    std::vector<v1::KernelEntry> entries;
    // A crossover tiling's main entry is a 2-CTA pair (__cluster_dims__(2)).
    entries.push_back(AttentionEntry(kMainEntry, v1::TILING_USE_THROUGHPUT, main,
                                     v1::EPILOGUE_SPLIT, main.crossover() ? 2 : 0,
                                     /*paired=*/true));
    if (!cluster.entry().empty()) {
      entries.push_back(AttentionEntry(cluster.entry(), v1::TILING_USE_THROUGHPUT, main,
                                       v1::EPILOGUE_CLUSTER_MERGE, cluster.splits()));
    }
    if (!cluster.wide_entry().empty()) {
      entries.push_back(AttentionEntry(cluster.wide_entry(), v1::TILING_USE_THROUGHPUT, main,
                                       v1::EPILOGUE_CLUSTER_MERGE, cluster.wide_splits()));
    }
    if (!small.entry().empty()) {
      entries.push_back(AttentionEntry(small.entry(), v1::TILING_USE_LATENCY, small.tiling(),
                                       v1::EPILOGUE_SPLIT, 0));
      if (!small.cluster_entry().empty()) {
        entries.push_back(AttentionEntry(small.cluster_entry(), v1::TILING_USE_LATENCY,
                                         small.tiling(), v1::EPILOGUE_CLUSTER_MERGE,
                                         small.cluster_splits()));
      }
    }
    entries.push_back(
        MakeEntry(kCombineEntry, v1::ENTRY_ROLE_COMBINE, sizeof(sparse_mla::CombineParams)));
    return entries;
  }

  void DescribeLaunch(const CompilePlan& plan, v1::ManifestVariant& v) const override {
    *v.mutable_tiling() = plan.tiling;
    *v.mutable_launch() = plan.launch;
    v.set_main_entry(kMainEntry);
    v.set_combine_entry(kCombineEntry);
    if (!plan.small_batch.entry().empty()) *v.mutable_small_batch() = plan.small_batch;
    if (HasClusterEntries(plan.cluster)) *v.mutable_cluster() = plan.cluster;
  }
};

}  // namespace

const KernelFamily& SparseMlaDecodeFamily() {
  static const SparseMlaDecode* const family = new SparseMlaDecode;
  return *family;
}

}  // namespace kforge
