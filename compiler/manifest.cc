#include "compiler/manifest.h"

#include <utility>

#include "compiler/family.h"
#include "model/format.h"

namespace kforge {

v1::ManifestVariant VariantOfPlan(const CompilePlan& plan) {
  v1::ManifestVariant v;
  v.set_module_name(plan.module_name);
  v.set_key(plan.key);
  *v.mutable_spec() = plan.spec;
  // A plan exists only for a registered family (KernelCompiler::Plan).
  absl::StatusOr<const KernelFamily*> family = FamilyFor(plan.spec);
  if (!family.ok()) return v;
  (*family)->DescribeLaunch(plan, v);
  for (v1::KernelEntry& entry : (*family)->Entries(plan)) *v.add_entries() = std::move(entry);
  return v;
}

absl::StatusOr<v1::Manifest> BuildManifest(const KernelCompiler& compiler,
                                           const v1::KernelSpec& spec, std::string_view arch) {
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
