#include "compiler/compiler.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/family.h"
#include "compiler/key.h"
#include "compiler/manifest.h"
#include "compiler/nvrtc.h"
#include "google/protobuf/util/json_util.h"
#include "model/cubin.h"
#include "model/format.h"
#include "model/spec.h"

namespace kforge {

std::string KforgeVersion() { return KFORGE_VERSION; }

std::string CompilerVersion() {
  return absl::StrCat("kforge ", KFORGE_VERSION, " / nvrtc ", NvrtcVersion());
}

absl::StatusOr<CompilePlan> KernelCompiler::Plan(const v1::KernelSpec& spec, std::string_view arch,
                                                 const PlanOptions& options) const {
  absl::StatusOr<const KernelFamily*> family = FamilyFor(spec);
  if (!family.ok()) return family.status();
  CompilePlan plan;
  absl::StatusOr<v1::KernelSpec> normalized = NormalizeKernelSpec(spec);
  if (!normalized.ok()) return normalized.status();
  plan.spec = *std::move(normalized);
  absl::StatusOr<Arch> parsed = ParseArch(arch);
  if (!parsed.ok()) return parsed.status();
  plan.arch = *std::move(parsed);
  if (options.max_smem_per_block < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_smem_per_block: got ", options.max_smem_per_block,
                     ", supported 0 (the arch's own limit) or a positive byte count"));
  }
  plan.arch = WithSmemCap(plan.arch, options.max_smem_per_block);
  if (absl::Status s = (*family)->Plan(options, plan); !s.ok()) return s;
  return plan;
}

absl::StatusOr<v1::KernelArtifact> KernelCompiler::Build(const CompilePlan& plan) const {
  NvrtcRequest request;
  request.source = plan.source;
  request.program_name = plan.module_name + ".cu";
  request.arch = plan.arch.name;
  absl::StatusOr<NvrtcResult> compiled = CompileWithNvrtc(request);
  if (!compiled.ok()) return compiled.status();

  absl::StatusOr<v1::CubinInfo> info = InspectCubin(compiled->cubin);
  if (!info.ok()) {
    return absl::InternalError(
        absl::StrCat(plan.module_name,
                     ": NVRTC produced a cubin kforge cannot read: ", info.status().message()));
  }
  if (info->arch() != plan.arch.name) {
    return absl::InternalError(absl::StrCat(plan.module_name, ": cubin is for ", info->arch(),
                                            ", asked for ", plan.arch.name,
                                            "; refusing to serve it"));
  }
  // The module's entries and launch description, as its manifest variant
  // lists them (the family's); the cubin must export every entry.
  const v1::ManifestVariant variant = VariantOfPlan(plan);
  for (const v1::KernelEntry& entry : variant.entries()) {
    const bool found =
        std::any_of(info->kernels().begin(), info->kernels().end(),
                    [&](const v1::KernelResources& k) { return k.name() == entry.name(); });
    if (!found) {
      return absl::InternalError(
          absl::StrCat(plan.module_name, ": cubin has no entry ", entry.name()));
    }
  }

  v1::KernelArtifact artifact;
  artifact.set_format_version(kFormatVersion);
  artifact.set_module_name(plan.module_name);
  artifact.set_key(plan.key);
  artifact.set_arch(plan.arch.name);
  *artifact.mutable_spec() = plan.spec;
  if (variant.has_tiling()) *artifact.mutable_tiling() = variant.tiling();
  if (variant.has_launch()) *artifact.mutable_launch() = variant.launch();
  artifact.set_main_entry(variant.main_entry());
  artifact.set_combine_entry(variant.combine_entry());
  if (variant.has_small_batch()) *artifact.mutable_small_batch() = variant.small_batch();
  if (variant.has_cluster()) *artifact.mutable_cluster() = variant.cluster();
  if (variant.has_indexer()) *artifact.mutable_indexer() = variant.indexer();
  *artifact.mutable_entries() = variant.entries();
  for (const std::string& reason : plan.schedule_reasons) artifact.add_schedule_reasons(reason);
  // The attention and combine entries' parameter blocks (0: the module has
  // no such entry).
  for (const v1::KernelEntry& entry : variant.entries()) {
    if (entry.role() == v1::ENTRY_ROLE_ATTENTION && artifact.params_bytes() == 0) {
      artifact.set_params_bytes(entry.params_bytes());
    }
    if (entry.role() == v1::ENTRY_ROLE_COMBINE && artifact.combine_params_bytes() == 0) {
      artifact.set_combine_params_bytes(entry.params_bytes());
    }
  }
  *artifact.mutable_cubin_info() = *std::move(info);
  artifact.set_compiler_version(CompilerVersion());
  for (const std::string& o : compiled->options) artifact.add_nvrtc_options(o);
  artifact.set_template_digest(TemplateDigest());
  artifact.set_compile_seconds(compiled->seconds);
  artifact.set_cubin(std::move(compiled->cubin));
  return artifact;
}

absl::StatusOr<v1::KernelArtifact> KernelCompiler::Compile(const v1::KernelSpec& spec,
                                                           std::string_view arch,
                                                           const PlanOptions& options) const {
  absl::StatusOr<CompilePlan> plan = Plan(spec, arch, options);
  if (!plan.ok()) return plan.status();
  return Build(*plan);
}

std::string ArtifactDescriptionJson(const v1::KernelArtifact& artifact) {
  v1::KernelArtifact description = artifact;
  description.clear_cubin();
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Printing a valid message cannot fail.
  (void)google::protobuf::util::MessageToJsonString(description, &json, options);
  return json;
}

}  // namespace kforge
