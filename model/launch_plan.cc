#include "model/launch_plan.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/artifact_check.h"
#include "model/format.h"
#include "model/launch.h"

namespace kforge {

v1::LaunchPlan ToLaunchPlan(const Selection& sel) {
  v1::LaunchPlan plan;
  const v1::ManifestVariant& v = *sel.variant;
  plan.set_variant_index(static_cast<uint32_t>(sel.variant_index));
  plan.set_module_name(v.module_name());
  plan.set_key(v.key());
  plan.set_main_entry(sel.main_entry != nullptr ? *sel.main_entry : v.main_entry());
  plan.set_small_batch(sel.small_batch);
  plan.set_cluster(sel.cluster);
  plan.set_programmatic(sel.programmatic);
  plan.set_combine_entry(v.combine_entry());
  plan.set_num_tokens(static_cast<uint32_t>(sel.num_tokens));
  plan.set_num_splits(static_cast<uint32_t>(sel.num_splits));
  plan.set_tokens_per_split(static_cast<uint32_t>(sel.tokens_per_split));
  plan.set_max_splits(static_cast<uint32_t>(
      MaxSplits(v.spec().sparse_mla_decode(), sel.launch != nullptr ? *sel.launch : v.launch())));
  plan.set_grid_x(sel.grid_x);
  plan.set_grid_y(sel.grid_y);
  plan.set_grid_z(sel.grid_z);
  plan.set_block_threads(sel.block_threads);
  plan.set_dynamic_smem_bytes(sel.dynamic_smem_bytes);
  plan.set_needs_combine(sel.needs_combine);
  plan.set_combine_grid_x(sel.combine_grid_x);
  plan.set_combine_grid_y(sel.combine_grid_y);
  plan.set_combine_block_threads(sel.combine_block_threads);
  plan.set_workspace_bytes(sel.workspace_bytes);
  return plan;
}

v1::LaunchPlan ToLaunchPlan(const DecodeLaunch& launch) {
  v1::LaunchPlan plan = ToLaunchPlan(launch.selection);
  plan.set_main_params(
      std::string(reinterpret_cast<const char*>(&launch.main), sizeof(launch.main)));
  if (launch.selection.needs_combine) {
    plan.set_combine_params(
        std::string(reinterpret_cast<const char*>(&launch.combine), sizeof(launch.combine)));
  }
  return plan;
}

absl::StatusOr<v1::Manifest> ManifestForArtifact(const v1::KernelArtifact& artifact) {
  struct Required {
    const char* field;
    const std::string& value;
  };
  for (const Required& r :
       {Required{"key", artifact.key()}, Required{"module_name", artifact.module_name()},
        Required{"arch", artifact.arch()}, Required{"main_entry", artifact.main_entry()},
        Required{"combine_entry", artifact.combine_entry()}}) {
    if (r.value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("kernel artifact: ", r.field,
                                                     " is empty; expected an artifact "
                                                     "written by `kforge compile` or a server"));
    }
  }
  v1::Manifest manifest;
  manifest.set_format_version(kFormatVersion);
  manifest.set_arch(artifact.arch());
  *manifest.add_variants() = VariantOfArtifact(artifact);
  manifest.add_choice_order(0);
  return manifest;
}

}  // namespace kforge
