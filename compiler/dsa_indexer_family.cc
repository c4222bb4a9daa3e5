// The DSA lightning indexer family (KernelSpec.dsa_indexer): one shape
// per spec and arch (compiler/indexer_codegen.h), no tiling to choose; its
// module exports the logits, the top-k and, where the arch has clusters,
// the top-k over a cluster of CTAs.

#include <vector>

#include "absl/status/status.h"
#include "compiler/family.h"
#include "compiler/indexer_codegen.h"
#include "compiler/key.h"
#include "compiler/nvrtc.h"
#include "templates/kforge/dsa_indexer/config.h"

namespace kforge {
namespace {

class DsaIndexer final : public KernelFamily {
 public:
  DsaIndexer() : KernelFamily(v1::KernelSpec::kDsaIndexer) {}

  absl::Status Plan(const PlanOptions& options, CompilePlan& plan) const override {
    if (options.max_smem_per_block > 0 || !options.tiling.empty()) {
      return absl::InvalidArgumentError(
          "max_smem_per_block and tiling: supported only for sparse_mla_decode (the indexer's "
          "kernels have one shape)");
    }
    plan.module_name = IndexerModuleName(plan.spec.dsa_indexer(), plan.arch);
    const GeneratedUnit unit = GenerateIndexerSource(plan.spec.dsa_indexer(), plan.arch);
    plan.source = unit.Whole();
    plan.programs = unit.Programs();
    plan.options = BaseNvrtcOptions(plan.arch.name);
    plan.key = ComputeCacheKey(PlanKeyInputs(plan));
    return absl::OkStatus();
  }

  std::vector<v1::KernelEntry> Entries(const CompilePlan& plan) const override {
    std::vector<v1::KernelEntry> entries = {
        MakeEntry(kIndexerLogitsEntry, v1::ENTRY_ROLE_INDEXER_LOGITS,
                  sizeof(dsa_indexer::LogitsParams)),
        MakeEntry(kIndexerTopkEntry, v1::ENTRY_ROLE_INDEXER_TOPK, sizeof(dsa_indexer::TopkParams))};
    if (IndexerHasTopkCluster(plan.arch)) {
      entries.push_back(MakeEntry(kIndexerTopkClusterEntry, v1::ENTRY_ROLE_INDEXER_TOPK,
                                  sizeof(dsa_indexer::TopkParams), dsa_indexer::kTopkClusterCtas));
    }
    return entries;
  }

  // No tiling, launch rule or selection: the launch is the indexer's own,
  // and its entries are named there (IndexerLaunch), not in main_entry.
  void DescribeLaunch(const CompilePlan& plan, v1::ManifestVariant& v) const override {
    *v.mutable_indexer() = MakeIndexerLaunch(plan.spec.dsa_indexer(), plan.arch);
  }
};

}  // namespace

const KernelFamily& DsaIndexerFamily() {
  static const DsaIndexer* const family = new DsaIndexer;
  return *family;
}

}  // namespace kforge
