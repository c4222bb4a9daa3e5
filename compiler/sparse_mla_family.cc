// The sparse MLA decode family (KernelSpec.sparse_mla_decode): the
// planner's schedule (compiler/schedule.h), its instantiation unit,
// and the entries a module exports: up to five attention entries and the
// combine.

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/codegen.h"
#include "compiler/family.h"
#include "compiler/key.h"
#include "compiler/nvrtc.h"
#include "model/spec.h"
#include "templates/kforge/sparse_mla/common/params.h"

namespace kforge {
namespace {

v1::KernelEntry AttentionEntry(const v1::AttentionSpec& spec, const std::string& name,
                               v1::TilingUse use, const v1::KernelTiling& tiling,
                               v1::Epilogue epilogue, uint32_t cluster_ctas, bool paired = false) {
  v1::KernelEntry e =
      MakeEntry(name, v1::ENTRY_ROLE_ATTENTION, sizeof(sparse_mla::DecodeParams), cluster_ctas);
  e.set_tiling(use);
  e.set_pipeline(EntryPipeline(spec, tiling, paired));
  e.set_mma(tiling.mma());
  e.set_epilogue(epilogue);
  return e;
}

class SparseMlaDecode final : public KernelFamily {
 public:
  SparseMlaDecode() : KernelFamily(v1::KernelSpec::kSparseMlaDecode) {}

  absl::Status Plan(const PlanOptions& options, CompilePlan& plan) const override {
    const v1::AttentionSpec& spec = plan.spec.sparse_mla_decode();
    ScheduleOptions schedule_options;
    schedule_options.tiling = options.tiling;
    schedule_options.smem_capped = options.max_smem_per_block > 0;
    absl::StatusOr<Schedule> schedule = PlanSchedule(spec, plan.arch, schedule_options);
    if (!schedule.ok()) return schedule.status();
    plan.tiling = std::move(schedule->tiling);
    plan.launch = std::move(schedule->launch);
    plan.small_batch = std::move(schedule->small_batch);
    plan.cluster = std::move(schedule->cluster);
    plan.schedule_reasons = std::move(schedule->reasons);
    plan.module_name = ModuleName(spec, plan.arch);
    if (options.max_smem_per_block > 0) {
      absl::StrAppend(&plan.module_name, "_smem", plan.arch.max_smem_per_block);
    }
    const TilingRequest& t = options.tiling;
    if (!t.empty()) {
      absl::StrAppend(&plan.module_name, "_t", t.head_tile, "_", t.token_tile, "_", t.stages, "_",
                      t.warps);
    }
    const GeneratedUnit unit =
        GenerateSource(spec, plan.tiling, plan.launch, plan.small_batch, plan.cluster);
    plan.source = unit.Whole();
    plan.programs = unit.Programs();
    plan.options = BaseNvrtcOptions(plan.arch.name);

    KeyInputs key = PlanKeyInputs(plan);
    key.max_smem_per_block = options.max_smem_per_block;
    if (!t.empty()) {
      key.tiling_request =
          absl::StrCat(t.head_tile, ",", t.token_tile, ",", t.stages, ",", t.warps);
    }
    const v1::LaunchRule& small_rule = plan.small_batch.launch();
    if (small_rule.min_tiles_max_tokens() > 0) {
      key.small_batch_floor = absl::StrCat(small_rule.min_tiles_max_tokens(), ",",
                                           small_rule.min_tiles_per_split_past());
    }
    plan.key = ComputeCacheKey(key);
    return absl::OkStatus();
  }

  std::vector<v1::KernelEntry> Entries(const CompilePlan& plan) const override {
    const v1::KernelTiling& main = plan.tiling;
    const v1::SmallBatchPath& small = plan.small_batch;
    const v1::ClusterPath& cluster = plan.cluster;
    const v1::AttentionSpec& spec = plan.spec.sparse_mla_decode();
    std::vector<v1::KernelEntry> entries;
    // A crossover tiling's main entry is a 2-CTA pair (__cluster_dims__(2)).
    entries.push_back(AttentionEntry(spec, kMainEntry, v1::TILING_USE_THROUGHPUT, main,
                                     v1::EPILOGUE_SPLIT, main.crossover() ? 2 : 0,
                                     /*paired=*/true));
    if (!cluster.entry().empty()) {
      entries.push_back(AttentionEntry(spec, cluster.entry(), v1::TILING_USE_THROUGHPUT, main,
                                       v1::EPILOGUE_CLUSTER_MERGE, cluster.splits()));
    }
    if (!cluster.wide_entry().empty()) {
      entries.push_back(AttentionEntry(spec, cluster.wide_entry(), v1::TILING_USE_THROUGHPUT, main,
                                       v1::EPILOGUE_CLUSTER_MERGE, cluster.wide_splits()));
    }
    if (!small.entry().empty()) {
      entries.push_back(AttentionEntry(spec, small.entry(), v1::TILING_USE_LATENCY, small.tiling(),
                                       v1::EPILOGUE_SPLIT, 0));
      if (!small.cluster_entry().empty()) {
        entries.push_back(AttentionEntry(spec, small.cluster_entry(), v1::TILING_USE_LATENCY,
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
