#include "compiler/compiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/io.h"
#include "compiler/family.h"
#include "compiler/key.h"
#include "compiler/manifest.h"
#include "compiler/nvrtc.h"
#include "google/protobuf/util/json_util.h"
#include "model/artifact_check.h"
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

namespace {

// Compiles the programs of `plan` in the order `order` lists them (the
// first answer's first, then the plan's: the throughput entries come
// first) on up to `threads` threads; each program's result in its slot.
// `first_done` runs once, on the thread that finishes the last of the
// first `first_count` programs of `order`, while the others go on.
std::vector<absl::StatusOr<NvrtcResult>> CompilePrograms(
    const CompilePlan& plan, const std::vector<size_t>& order, size_t first_count, size_t threads,
    const std::function<void(const std::vector<absl::StatusOr<NvrtcResult>>&)>& first_done) {
  const size_t n = plan.programs.size();
  std::vector<absl::StatusOr<NvrtcResult>> results(n, absl::UnknownError("not compiled"));
  std::atomic<size_t> next{0};
  absl::Mutex mu;
  size_t first_left = first_count;
  auto work = [&] {
    for (size_t k = next++; k < n; k = next++) {
      const size_t i = order[k];
      NvrtcRequest request;
      request.source = plan.programs[i].source;
      request.program_name =
          n == 1 ? plan.module_name + ".cu" : absl::StrCat(plan.module_name, ".", i, ".cu");
      request.arch = plan.arch.name;
      absl::StatusOr<NvrtcResult> result = CompileWithNvrtc(request);
      bool last_of_first = false;
      {
        absl::MutexLock lock(&mu);
        results[i] = std::move(result);
        if (k < first_count) last_of_first = --first_left == 0;
      }
      // The first answer's slots are written and no thread writes them
      // again; the lock above ordered their writes before these reads.
      if (last_of_first && first_done) first_done(results);
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < std::min(threads, n); ++t) {
    // Where no thread can be had (a process or cgroup thread limit), the
    // threads already started and this one compile the rest.
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;
    }
  }
  work();
  for (std::thread& t : pool) t.join();
  return results;
}

// The artifact of `variant` made of the compiled `images` (program indices
// of `plan`, in the plan's order; the first holds the main entry), each
// result in `compiled`.
absl::StatusOr<v1::KernelArtifact> Assemble(
    const CompilePlan& plan, const v1::ManifestVariant& variant, const std::vector<size_t>& images,
    const std::vector<absl::StatusOr<NvrtcResult>>& compiled, double seconds) {
  for (size_t i : images) {
    if (!compiled[i].ok()) return compiled[i].status();
  }
  // Every image's kernels, each with its image; a program exports exactly
  // its own entries.
  v1::CubinInfo info;
  info.set_arch(plan.arch.name);
  for (size_t image = 0; image < images.size(); ++image) {
    const size_t i = images[image];
    absl::StatusOr<v1::CubinInfo> inspected = InspectCubin(compiled[i]->cubin);
    if (!inspected.ok()) {
      return absl::InternalError(
          absl::StrCat(plan.module_name, ": NVRTC produced a cubin (image ", i,
                       ") kforge cannot read: ", inspected.status().message()));
    }
    if (inspected->arch() != plan.arch.name) {
      return absl::InternalError(absl::StrCat(plan.module_name, ": cubin is for ",
                                              inspected->arch(), ", asked for ", plan.arch.name,
                                              "; refusing to serve it"));
    }
    info.set_elf_abi_version(inspected->elf_abi_version());
    std::vector<std::string> exported;
    for (v1::KernelResources& k : *inspected->mutable_kernels()) {
      exported.push_back(k.name());
      k.set_image(static_cast<uint32_t>(image));
      *info.add_kernels() = std::move(k);
    }
    std::vector<std::string> defined = plan.programs[i].entries;
    std::sort(exported.begin(), exported.end());
    std::sort(defined.begin(), defined.end());
    if (exported != defined) {
      return absl::InternalError(
          absl::StrCat(plan.module_name, ": image ", i, " exports ", absl::StrJoin(exported, ", "),
                       "; its program defines ", absl::StrJoin(plan.programs[i].entries, ", ")));
    }
  }
  // The module's entries and launch description, as its manifest variant
  // lists them (the family's); the images must export every entry.
  for (const v1::KernelEntry& entry : variant.entries()) {
    if (FindKernel(info, entry.name()) == nullptr) {
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
  *artifact.mutable_cubin_info() = std::move(info);
  artifact.set_compiler_version(CompilerVersion());
  // Every program is compiled with the same options.
  for (const std::string& o : compiled[images[0]]->options) artifact.add_nvrtc_options(o);
  artifact.set_template_digest(TemplateDigest());
  artifact.set_compile_seconds(seconds);
  artifact.set_cubin(compiled[images[0]]->cubin);
  for (size_t image = 1; image < images.size(); ++image) {
    artifact.add_more_cubins(compiled[images[image]]->cubin);
  }
  return artifact;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

std::vector<size_t> FirstAnswerPrograms(const CompilePlan& plan) {
  const v1::ManifestVariant variant = VariantOfPlan(plan);
  const std::vector<const std::string*> wanted = FirstAnswerEntries(variant);
  std::vector<size_t> first;
  for (size_t i = 0; i < plan.programs.size(); ++i) {
    const std::vector<std::string>& in = plan.programs[i].entries;
    const bool holds = std::any_of(wanted.begin(), wanted.end(), [&](const std::string* w) {
      return std::find(in.begin(), in.end(), *w) != in.end();
    });
    if (holds) first.push_back(i);
  }
  if (first.size() == plan.programs.size()) first.clear();
  return first;
}

absl::StatusOr<v1::KernelArtifact> KernelCompiler::Build(const CompilePlan& plan,
                                                         const FirstAnswerSink& first) const {
  if (plan.programs.empty() || plan.programs.size() > kMaxCubinImages) {
    return absl::InternalError(absl::StrCat(plan.module_name, ": the plan has ",
                                            plan.programs.size(), " programs, supported 1 to ",
                                            kMaxCubinImages));
  }
  const v1::ManifestVariant variant = VariantOfPlan(plan);
  std::vector<size_t> first_images = first ? FirstAnswerPrograms(plan) : std::vector<size_t>{};
  std::vector<size_t> order = first_images;
  for (size_t i = 0; i < plan.programs.size(); ++i) {
    if (std::find(first_images.begin(), first_images.end(), i) == first_images.end()) {
      order.push_back(i);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  auto first_done = [&](const std::vector<absl::StatusOr<NvrtcResult>>& compiled) {
    std::vector<std::string> present;
    for (size_t i : first_images) {
      for (const std::string& e : plan.programs[i].entries) present.push_back(e);
    }
    absl::StatusOr<v1::KernelArtifact> partial = Assemble(
        plan, FirstAnswerVariant(variant, present), first_images, compiled, SecondsSince(start));
    // A first answer that cannot be made is no answer: the final result
    // says why.
    if (!partial.ok()) return;
    partial->set_partial(true);
    first(*std::move(partial));
  };
  std::vector<absl::StatusOr<NvrtcResult>> compiled =
      CompilePrograms(plan, order, first_images.size(),
                      std::max(1u, std::thread::hardware_concurrency()), first_done);
  const double seconds = SecondsSince(start);
  for (const absl::StatusOr<NvrtcResult>& c : compiled) {
    if (!c.ok()) return c.status();
  }
  std::vector<size_t> all(plan.programs.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return Assemble(plan, variant, all, compiled, seconds);
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
  description.clear_more_cubins();
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Printing a valid message cannot fail.
  (void)google::protobuf::util::MessageToJsonString(description, &json, options);
  return json;
}

absl::Status WriteArtifactFiles(const std::string& base, const v1::KernelArtifact& artifact) {
  for (size_t i = 0; i < CubinImageCount(artifact); ++i) {
    const std::string path = i == 0 ? base + ".cubin" : absl::StrCat(base, ".cubin.", i);
    if (absl::Status s = WriteFileAtomic(path, ImageOf(artifact, i)); !s.ok()) return s;
  }
  if (absl::Status s = WriteFileAtomic(base + ".json", ArtifactDescriptionJson(artifact));
      !s.ok()) {
    return s;
  }
  // Images an earlier module of this name left beside it (a module of
  // more programs) would read as this one's.
  for (size_t i = CubinImageCount(artifact); i < kMaxCubinImages; ++i) {
    std::error_code ignored;
    std::filesystem::remove(absl::StrCat(base, ".cubin.", i), ignored);
  }
  return absl::OkStatus();
}

}  // namespace kforge
