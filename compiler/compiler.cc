#include "compiler/compiler.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/codegen.h"
#include "compiler/indexer_codegen.h"
#include "compiler/key.h"
#include "compiler/nvrtc.h"
#include "google/protobuf/util/json_util.h"
#include "model/artifact_check.h"
#include "model/cubin.h"
#include "model/spec.h"
#include "templates/kforge/sparse_mla/common/params.h"

namespace kforge {

std::string KforgeVersion() { return KFORGE_VERSION; }

std::string CompilerVersion() {
  return absl::StrCat("kforge ", KFORGE_VERSION, " / nvrtc ", NvrtcVersion());
}

namespace {

// The key inputs every plan shares: its normalized spec, the templates,
// the compiler, its options and the arch (the caller adds the rest).
KeyInputs PlanKeyInputs(const CompilePlan& plan) {
  KeyInputs key;
  key.spec = plan.spec;
  key.template_digest = TemplateDigest();
  key.nvrtc_version = NvrtcBuildIdentity();
  key.options = plan.options;
  key.arch = plan.arch.name;
  return key;
}

// Plan's indexer half (ATTENTION_KIND_DSA_INDEXER): no tiling to choose,
// the module name, instantiation unit and key.
absl::StatusOr<CompilePlan> PlanIndexer(CompilePlan plan, const PlanOptions& options) {
  if (options.max_smem_per_block > 0 || !options.tiling.empty()) {
    return absl::InvalidArgumentError(
        "max_smem_per_block and tiling: supported only for ATTENTION_KIND_SPARSE_MLA_DECODE "
        "(the indexer's kernels have one shape)");
  }
  plan.module_name = IndexerModuleName(plan.spec, plan.arch);
  plan.source = GenerateIndexerSource(plan.spec, plan.arch);
  plan.options = BaseNvrtcOptions(plan.arch.name);
  plan.key = ComputeCacheKey(PlanKeyInputs(plan));
  return plan;
}

}  // namespace

absl::StatusOr<CompilePlan> KernelCompiler::Plan(const v1::AttentionSpec& spec,
                                                 std::string_view arch,
                                                 const PlanOptions& options) const {
  CompilePlan plan;
  absl::StatusOr<v1::AttentionSpec> normalized = NormalizeSpec(spec);
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
  if (plan.spec.kind() == v1::ATTENTION_KIND_DSA_INDEXER) return PlanIndexer(plan, options);
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
  // KB on an H200), whose modules have no cluster entries: the capped module
  // is that part's, kernel for kernel.
  if (options.max_smem_per_block > 0) {
    plan.small_batch.clear_cluster_entry();
    plan.small_batch.clear_cluster_splits();
    plan.cluster.Clear();
  }
  plan.launch = MakeLaunchRule(plan.spec, plan.tiling, plan.arch);
  plan.source = GenerateSource(plan.spec, plan.tiling, plan.launch, plan.small_batch, plan.cluster);
  plan.options = BaseNvrtcOptions(plan.arch.name);

  KeyInputs key = PlanKeyInputs(plan);
  key.max_smem_per_block = options.max_smem_per_block;
  if (!t.empty()) {
    key.tiling_request = absl::StrCat(t.head_tile, ",", t.token_tile, ",", t.stages, ",", t.warps);
  }
  plan.key = ComputeCacheKey(key);
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
  const bool indexer = plan.spec.kind() == v1::ATTENTION_KIND_DSA_INDEXER;
  std::vector<std::string> entries = {kMainEntry, kCombineEntry};
  if (indexer) {
    entries = {kIndexerLogitsEntry, kIndexerTopkEntry};
    if (IndexerHasTopkCluster(plan.arch)) entries.push_back(kIndexerTopkClusterEntry);
  }
  for (const std::string* entry : OptionalMainEntries(plan.small_batch, plan.cluster)) {
    entries.push_back(*entry);
  }
  for (const std::string& entry : entries) {
    const bool found = std::any_of(info->kernels().begin(), info->kernels().end(),
                                   [&](const v1::KernelResources& k) { return k.name() == entry; });
    if (!found) {
      return absl::InternalError(absl::StrCat(plan.module_name, ": cubin has no entry ", entry));
    }
  }

  v1::KernelArtifact artifact;
  artifact.set_format_version(kFormatVersion);
  artifact.set_module_name(plan.module_name);
  artifact.set_key(plan.key);
  artifact.set_arch(plan.arch.name);
  *artifact.mutable_spec() = plan.spec;
  *artifact.mutable_tiling() = plan.tiling;
  if (!indexer) *artifact.mutable_launch() = plan.launch;
  artifact.set_main_entry(kMainEntry);
  artifact.set_combine_entry(kCombineEntry);
  if (!plan.small_batch.entry().empty()) *artifact.mutable_small_batch() = plan.small_batch;
  if (HasClusterEntries(plan.cluster)) *artifact.mutable_cluster() = plan.cluster;
  *artifact.mutable_cubin_info() = *std::move(info);
  artifact.set_compiler_version(CompilerVersion());
  for (const std::string& o : compiled->options) artifact.add_nvrtc_options(o);
  artifact.set_template_digest(TemplateDigest());
  artifact.set_compile_seconds(compiled->seconds);
  artifact.set_params_bytes(sizeof(sparse_mla::DecodeParams));
  artifact.set_combine_params_bytes(sizeof(sparse_mla::CombineParams));
  artifact.set_cubin(std::move(compiled->cubin));
  if (indexer) {
    // The indexer has no tiling or split rule: its launch is IndexerLaunch.
    artifact.clear_tiling();
    *artifact.mutable_indexer() = MakeIndexerLaunch(plan.spec, plan.arch);
    artifact.set_main_entry(kIndexerLogitsEntry);
    artifact.set_combine_entry(kIndexerTopkEntry);
    artifact.set_params_bytes(artifact.indexer().logits_params_bytes());
    artifact.set_combine_params_bytes(artifact.indexer().topk_params_bytes());
  }
  return artifact;
}

absl::StatusOr<v1::KernelArtifact> KernelCompiler::Compile(const v1::AttentionSpec& spec,
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
