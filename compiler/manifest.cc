#include "compiler/manifest.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/codegen.h"
#include "compiler/key.h"
#include "model/launch.h"

namespace kforge {

absl::StatusOr<v1::Manifest> BuildManifest(const KernelCompiler& compiler,
                                           const v1::AttentionSpec& spec,
                                           std::string_view arch,
                                           uint32_t sm_count) {
  v1::Manifest manifest;
  manifest.set_format_version(kFormatVersion);
  manifest.set_sm_count(sm_count);
  // One variant per s_q (1 = plain decode, 2..4 = MTP); the asked-for s_q
  // comes first in the choice order.
  int asked = -1;
  for (uint32_t s_q = 1; s_q <= 4; ++s_q) {
    v1::AttentionSpec variant_spec = spec;
    variant_spec.set_s_q(s_q);
    absl::StatusOr<CompilePlan> plan = compiler.Plan(variant_spec, arch);
    if (!plan.ok()) return plan.status();
    manifest.set_arch(plan->arch.name);
    v1::ManifestVariant* v = manifest.add_variants();
    v->set_module_name(plan->module_name);
    v->set_key(plan->key);
    *v->mutable_spec() = plan->spec;
    *v->mutable_tiling() = plan->tiling;
    *v->mutable_launch() = MakeLaunchRule(plan->spec, plan->tiling, plan->arch);
    v->set_main_entry(kMainEntry);
    v->set_combine_entry(kCombineEntry);
    if (sm_count > 0) {
      for (uint32_t tokens = 1; tokens <= 256; tokens *= 2) {
        (*v->mutable_num_splits_by_tokens())[tokens] = NumSplits(
            plan->spec, plan->tiling, v->launch(), static_cast<int>(tokens),
            static_cast<int>(sm_count));
      }
    }
    if (s_q == spec.s_q()) asked = manifest.variants_size() - 1;
  }
  if (asked >= 0) manifest.add_choice_order(asked);
  for (int i = 0; i < manifest.variants_size(); ++i) {
    if (i != asked) manifest.add_choice_order(i);
  }
  return manifest;
}

absl::StatusOr<v1::Manifest> KeepQueryLengths(const v1::Manifest& manifest,
                                              const std::set<uint32_t>& s_q_values) {
  v1::Manifest kept = manifest;
  kept.clear_variants();
  kept.clear_choice_order();
  std::vector<int> new_index(manifest.variants_size(), -1);
  std::vector<uint32_t> held;
  for (int i = 0; i < manifest.variants_size(); ++i) {
    const v1::ManifestVariant& variant = manifest.variants(i);
    held.push_back(variant.spec().s_q());
    if (s_q_values.count(variant.spec().s_q()) == 0) continue;
    new_index[i] = kept.variants_size();
    *kept.add_variants() = variant;
  }
  if (kept.variants_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keeping s_q {", absl::StrJoin(s_q_values, ", "), "} of the manifest for ",
        manifest.arch(), ": it has variants for s_q {", absl::StrJoin(held, ", "),
        "}, none kept; a manifest needs at least one variant"));
  }
  // An out-of-range entry names no variant; it has nothing to map to.
  for (uint32_t choice : manifest.choice_order()) {
    if (choice < new_index.size() && new_index[choice] >= 0) {
      kept.add_choice_order(static_cast<uint32_t>(new_index[choice]));
    }
  }
  return kept;
}

}  // namespace kforge
