#include "compiler/manifest.h"

#include "compiler/codegen.h"
#include "compiler/indexer_codegen.h"
#include "model/format.h"

namespace kforge {

v1::ManifestVariant VariantOfPlan(const CompilePlan& plan) {
  v1::ManifestVariant v;
  v.set_module_name(plan.module_name);
  v.set_key(plan.key);
  *v.mutable_spec() = plan.spec;
  if (plan.spec.kind() == v1::ATTENTION_KIND_DSA_INDEXER) {
    // No selection: the launch is the indexer's own.
    *v.mutable_indexer() = MakeIndexerLaunch(plan.spec, plan.arch);
    v.set_main_entry(kIndexerLogitsEntry);
    v.set_combine_entry(kIndexerTopkEntry);
    return v;
  }
  *v.mutable_tiling() = plan.tiling;
  *v.mutable_launch() = plan.launch;
  v.set_main_entry(kMainEntry);
  v.set_combine_entry(kCombineEntry);
  if (!plan.small_batch.entry().empty()) *v.mutable_small_batch() = plan.small_batch;
  if (HasClusterEntries(plan.cluster)) *v.mutable_cluster() = plan.cluster;
  return v;
}

absl::StatusOr<v1::Manifest> BuildManifest(const KernelCompiler& compiler,
                                           const v1::AttentionSpec& spec, std::string_view arch) {
  absl::StatusOr<CompilePlan> plan = compiler.Plan(spec, arch);
  if (!plan.ok()) return plan.status();
  v1::Manifest manifest;
  manifest.set_format_version(kFormatVersion);
  manifest.set_arch(plan->arch.name);
  *manifest.add_variants() = VariantOfPlan(*plan);
  manifest.add_choice_order(0);
  return manifest;
}

}  // namespace kforge
