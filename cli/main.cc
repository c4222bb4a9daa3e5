// kforge: one binary, one subcommand per job. Flags are parsed here and only
// here; everything else receives plain values.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/absl_compat.h"
#include "base/io.h"
#include "cli/deploy_cmds.h"
#include "cli/flags.h"
#include "cli/kernel_args.h"
#include "cli/runtime_cmds.h"
#include "cli/service_cmds.h"
#include "compiler/compiler.h"
#include "compiler/key.h"
#include "compiler/nvrtc.h"
#include "google/protobuf/message.h"
#include "model/arch.h"
#include "model/artifact_check.h"
#include "model/cubin.h"
#include "model/format.h"
#include "model/spec.h"
#include "service/compile_pool.h"
#include "service/kernel_store.h"

namespace kforge::cli {
namespace {

std::vector<FlagSpec> Concat(std::vector<FlagSpec> a, const std::vector<FlagSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<FlagSpec>& SpecFlags() {
  static const std::vector<FlagSpec> kFlags = Concat(
      KernelChoiceFlags(),
      {{"s-q", "N", "accepted for compatibility: a kernel serves every s_q (1..4)"},
       {"topk", "N", "override: indices per query token"},
       WithAlias({"page-block-size", "N", "override: tokens per KV cache page"}, "page-size"),
       {"lse", "BOOL", "override: also return log-sum-exp (true/false)"}});
  return kFlags;
}

// The field `name` of the spec's case (the message of its kind), or
// InvalidArgument naming the flag when that kind has no such field.
absl::StatusOr<const google::protobuf::FieldDescriptor*> CaseField(
    const google::protobuf::Message& message, std::string_view flag, std::string_view name,
    const v1::KernelSpec& spec) {
  const google::protobuf::FieldDescriptor* field =
      message.GetDescriptor()->FindFieldByName(std::string(name));
  if (field == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--", AsAbsl(flag), ": a ", KindCaseName(spec),
                                                   " spec has no ", AsAbsl(name)));
  }
  return field;
}

// Builds the spec from --preset/--tp or --spec, then applies overrides to
// the fields of its kind that have them.
absl::StatusOr<v1::KernelSpec> SpecFromArgs(const ParsedArgs& args) {
  absl::StatusOr<v1::KernelSelector> selector = SelectorFromArgs(args);
  if (!selector.ok()) return selector.status();
  absl::StatusOr<v1::KernelSpec> spec = KernelStore::Resolve(*selector);
  if (!spec.ok()) return spec.status();
  const google::protobuf::FieldDescriptor* kind =
      v1::KernelSpec::descriptor()->FindFieldByNumber(spec->kind_case());
  if (kind == nullptr) return spec;  // no case: Plan names it
  google::protobuf::Message& message = *spec->GetReflection()->MutableMessage(&*spec, kind);
  for (auto [flag, name] : {std::pair{"s-q", "s_q"}, std::pair{"topk", "topk"},
                            std::pair{"page-block-size", "page_block_size"}}) {
    if (!args.Has(flag)) continue;
    absl::StatusOr<long long> v = ParseIntFlag(flag, args.Get(flag));
    if (!v.ok()) return v.status();
    if (*v > 0xffffffffLL) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": too large"));
    }
    absl::StatusOr<const google::protobuf::FieldDescriptor*> field =
        CaseField(message, flag, name, *spec);
    if (!field.ok()) return field.status();
    message.GetReflection()->SetUInt32(&message, *field, static_cast<uint32_t>(*v));
  }
  if (args.Has("lse")) {
    const std::string v = args.Get("lse");
    if (v != "true" && v != "false") {
      return absl::InvalidArgumentError(
          absl::StrCat("--lse: got '", v, "', expected true or false"));
    }
    absl::StatusOr<const google::protobuf::FieldDescriptor*> field =
        CaseField(message, "lse", "return_lse", *spec);
    if (!field.ok()) return field.status();
    message.GetReflection()->SetBool(&message, *field, v == "true");
  }
  return spec;
}

// --tiling H,T,S,W: four positive integers.
absl::StatusOr<TilingRequest> ParseTilingFlag(const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, ',');
  int v[4] = {};
  bool ok = parts.size() == 4;
  for (size_t i = 0; ok && i < parts.size(); ++i) {
    absl::StatusOr<long long> n = ParseIntFlag("tiling", parts[i]);
    ok = n.ok() && *n >= 1 && *n <= 1024;
    if (ok) v[i] = static_cast<int>(*n);
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat("--tiling: got '", text,
                                                   "', expected HEAD_TILE,TOKEN_TILE,STAGES,WARPS, "
                                                   "four integers in 1..1024 (e.g. 16,32,4,4)"));
  }
  return TilingRequest{v[0], v[1], v[2], v[3]};
}

int Compile(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags =
      Concat(SpecFlags(),
             {{"arch", "ARCH[,ARCH]",
               "target(s): sm_80 sm_86 sm_89 sm_90a sm_100a sm_103a sm_120a sm_121a", "", 0, true},
              {"out", "DIR", "output directory", "out", 'o'},
              {"max-smem-per-block", "BYTES",
               "tile for at most this much shared memory (e.g. 101376 runs the "
               "99 KB sm_120 pipeline on an H200)"},
              {"tiling", "H,T,S,W",
               "tuning sweeps: this CTA shape (head tile, token tile, stages, warps) "
               "instead of the planner's, if the tiling rule admits it"},
              {"explain", "",
               "also print each module's schedule (pipelines, entries) and why the planner "
               "chose it"},
              {"source", "",
               "also write the instantiation unit NVRTC compiles, DIR/<module>.cu (its "
               "headers are templates/; bench/compile_phases.py times it)"},
              {"help", "", "show this help", "", 'h'}});
  absl::StatusOr<ParsedArgs> args = ParseFlags(flags, argv);
  if (!args.ok()) return Fail(args.status());
  if (args->Has("help")) {
    std::cout << "usage: kforge compile (--preset NAME [--tp N] | --spec FILE) "
                 "--arch ARCH [-o DIR]\n\n"
                 "Compiles one sparse MLA kernel module per arch and writes "
                 "DIR/<module>.cubin (and DIR/<module>.cubin.<i> for a module's\n"
                 "further images) and DIR/<module>.json.\n\n"
              << FlagsHelp(flags);
    return 0;
  }
  std::vector<std::string> archs;
  for (const std::string& a : args->GetAll("arch")) {
    for (absl::string_view part : absl::StrSplit(a, ',', absl::SkipEmpty())) {
      archs.emplace_back(part);
    }
  }
  if (archs.empty()) {
    return Fail(absl::InvalidArgumentError("--arch is required (e.g. --arch sm_90a)"));
  }
  absl::StatusOr<v1::KernelSpec> spec = SpecFromArgs(*args);
  if (!spec.ok()) return Fail(spec.status());
  const std::string out_dir = args->Get("out");
  PlanOptions plan_options;
  if (args->Has("max-smem-per-block")) {
    absl::StatusOr<long long> v =
        ParseIntFlag("max-smem-per-block", args->Get("max-smem-per-block"));
    if (!v.ok()) return Fail(v.status());
    plan_options.max_smem_per_block = static_cast<int>(*v);
  }
  if (args->Has("tiling")) {
    absl::StatusOr<TilingRequest> t = ParseTilingFlag(args->Get("tiling"));
    if (!t.ok()) return Fail(t.status());
    plan_options.tiling = *t;
  }
  KernelCompiler compiler;
  int failures = 0;
  for (const std::string& arch : archs) {
    absl::StatusOr<CompilePlan> plan = compiler.Plan(*spec, arch, plan_options);
    absl::StatusOr<v1::KernelArtifact> artifact =
        plan.ok() ? compiler.Build(*plan) : absl::StatusOr<v1::KernelArtifact>(plan.status());
    if (plan.ok() && args->Has("source")) {
      if (absl::Status s =
              WriteFileAtomic(absl::StrCat(out_dir, "/", plan->module_name, ".cu"), plan->source);
          !s.ok()) {
        return Fail(s);
      }
    }
    if (!artifact.ok()) {
      std::cerr << "kforge: " << arch << ": " << artifact.status().message() << "\n";
      ++failures;
      continue;
    }
    const std::string base = absl::StrCat(out_dir, "/", artifact->module_name());
    if (absl::Status s = WriteArtifactFiles(base, *artifact); !s.ok()) return Fail(s);
    const v1::KernelResources* main_k = nullptr;
    for (const auto& k : artifact->cubin_info().kernels()) {
      // The module's first entry: the main attention entry, or the logits.
      if (!artifact->entries().empty() && k.name() == artifact->entries(0).name()) main_k = &k;
    }
    std::cout << absl::StrFormat("%s.cubin  %s  %zu bytes  %d regs  %d B smem  %.2f s\n", base,
                                 artifact->arch(), CubinBytes(*artifact),
                                 main_k ? main_k->registers() : 0,
                                 artifact->has_indexer() ? artifact->indexer().logits_smem_bytes()
                                                         : artifact->launch().dynamic_smem_bytes(),
                                 artifact->compile_seconds());
    if (args->Has("explain")) std::cout << ExplainSchedule(*artifact);
  }
  return failures == 0 ? 0 : 1;
}

int Inspect(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = {{"json", "", "print JSON instead of a table"},
                                       {"help", "", "show this help", "", 'h'}};
  absl::StatusOr<ParsedArgs> args = ParseFlags(flags, argv);
  if (!args.ok()) return Fail(args.status());
  if (args->Has("help") || args->positional.size() != 1) {
    std::cout << "usage: kforge inspect [--json] FILE.cubin\n\n"
                 "Reads a cubin's ELF: SM arch, kernel entries, registers, "
                 "static shared memory, parameter and local bytes. For a module's\n"
                 "FILE.cubin that `kforge compile` wrote, its further images beside it "
                 "(FILE.cubin.1, ...) too, each kernel with its image.\n\n"
              << FlagsHelp(flags);
    return args->Has("help") ? 0 : 2;
  }
  const std::string& path = args->positional[0];
  // The file, then the module's further images beside it where it is an
  // image 0 (FILE.cubin; its images are FILE.cubin.1, ...).
  std::vector<std::string> paths = {path};
  for (size_t i = 1; absl::EndsWith(path, ".cubin") && i < kMaxCubinImages; ++i) {
    const std::string next = absl::StrCat(path, ".", i);
    if (!std::filesystem::exists(next)) break;
    paths.push_back(next);
  }
  v1::CubinInfo info;
  for (size_t i = 0; i < paths.size(); ++i) {
    absl::StatusOr<std::string> bytes =
        ReadFile(paths[i], kMaxArtifactFileBytes, Symlinks::kFollow);
    if (!bytes.ok()) return Fail(bytes.status());
    absl::StatusOr<v1::CubinInfo> image = InspectCubin(*bytes);
    if (!image.ok()) {
      return Fail(absl::Status(image.status().code(),
                               absl::StrCat(paths[i], ": ", image.status().message())));
    }
    if (i > 0 && image->arch() != info.arch()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          paths[i], ": for ", image->arch(), ", but ", path, " is for ", info.arch())));
    }
    info.set_arch(image->arch());
    info.set_elf_abi_version(image->elf_abi_version());
    for (v1::KernelResources& k : *image->mutable_kernels()) {
      k.set_image(static_cast<uint32_t>(i));
      *info.add_kernels() = std::move(k);
    }
  }
  if (args->Has("json")) {
    v1::KernelArtifact wrapper;
    *wrapper.mutable_cubin_info() = info;
    std::string json = ArtifactDescriptionJson(wrapper);
    std::cout << json;
    return 0;
  }
  std::cout << absl::StrFormat("%s: %s (ELF ABI %d), %d kernels", path, info.arch(),
                               info.elf_abi_version(), info.kernels_size());
  if (paths.size() > 1) {
    std::vector<std::string> beside;
    for (size_t i = 1; i < paths.size(); ++i) {
      beside.push_back(std::filesystem::path(paths[i]).filename().string());
    }
    std::cout << absl::StrFormat(" in %d images (and %s beside it)", paths.size(),
                                 absl::StrJoin(beside, ", "));
  }
  std::cout << "\n";
  // The name column as wide as the longest entry name (at least 32).
  int width = 32;
  for (const v1::KernelResources& k : info.kernels()) {
    width = std::max(width, static_cast<int>(std::min<size_t>(k.name().size(), 128)));
  }
  std::cout << absl::StrFormat("  %-*s %5s %10s %7s %7s %8s %5s\n", width, "kernel", "regs",
                               "smem(B)", "param", "local", "maxthr", "image");
  for (const v1::KernelResources& k : info.kernels()) {
    std::cout << absl::StrFormat("  %-*s %5d %10d %7d %7d %8d %5d\n", width, k.name(),
                                 k.registers(), k.static_smem_bytes(), k.param_bytes(),
                                 k.local_bytes(), k.max_threads(), k.image());
  }
  return 0;
}

// `kforge --version` / `kforge version [--json]`: what decides which
// kernels this binary builds and serves (a cache key covers all of it).
int Version(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = {{"json", "", "print one JSON object"},
                                       {"help", "", "show this help", "", 'h'}};
  absl::StatusOr<ParsedArgs> args = ParseFlags(flags, argv);
  if (!args.ok()) return Fail(args.status());
  if (args->Has("help") || !args->positional.empty()) {
    std::cout << "usage: kforge version [--json]\n\n"
                 "Prints the kforge version, the NVRTC build, the template digest, the "
                 "artifact format version and the supported archs.\n\n"
              << FlagsHelp(flags);
    return args->Has("help") ? 0 : 2;
  }
  std::vector<std::string> archs;
  for (const kforge::Arch& arch : kforge::SupportedArchs()) archs.push_back(arch.name);
  if (args->Has("json")) {
    std::cout << absl::StrFormat(
        "{\"kforge\": \"%s\", \"nvrtc\": \"%s\", \"nvrtc_build\": \"%s\", "
        "\"template_digest\": \"%s\", \"format_version\": %d, \"archs\": [\"%s\"]}\n",
        kforge::KforgeVersion(), kforge::NvrtcVersion(), kforge::NvrtcBuildIdentity(),
        kforge::TemplateDigest(), kforge::kFormatVersion, absl::StrJoin(archs, "\", \""));
    return 0;
  }
  std::cout << "kforge " << kforge::KforgeVersion() << "\n"
            << "nvrtc " << kforge::NvrtcBuildIdentity() << "\n"
            << "templates " << kforge::TemplateDigest() << "\n"
            << "format " << kforge::kFormatVersion << "\n"
            << "archs " << absl::StrJoin(archs, " ") << "\n";
  return 0;
}

void Usage() {
  std::cout << "usage: kforge <command> [flags]\n\n"
               "commands:\n"
               "  compile   compile a sparse MLA kernel module for one or more archs\n"
               "  inspect   show what a cubin holds (arch, kernels, resources)\n"
               "  serve     run the gRPC kernel server\n"
               "  get       fetch one kernel from a server\n"
               "  stats     print a server's counters as JSON\n"
               "  health    ask a server's health service (exit 0 when SERVING)\n"
               "  manifest  print the selection manifest for a preset as JSON\n"
               "  select    pick the variant and launch configuration for a shape\n"
               "  warm      have a server compile every kernel of a deployment matrix\n"
               "  prebuild  compile every kernel of a deployment matrix into a bundle\n"
               "  verify    check a bundle's checksums, kernels and manifests (and signature)\n"
               "  keygen    make an Ed25519 key pair for signing bundles\n"
               "  version   print the versions that decide the kernels (also --version)\n"
               "  doctor    check what kforge serve would run with, and the GPU\n\n"
               "Run 'kforge <command> --help' for its flags.\n";
}

}  // namespace
}  // namespace kforge::cli

int main(int argc, char** argv) {
  using namespace kforge::cli;
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    Usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  if (cmd == "compile") return Compile(rest);
  if (cmd == "inspect") return Inspect(rest);
  if (cmd == "serve") return Serve(rest);
  if (cmd == "get") return Get(rest);
  if (cmd == "stats") return Stats(rest);
  if (cmd == "health") return Health(rest);
  if (cmd == "manifest") return Manifest(rest);
  if (cmd == "select") return Select(rest);
  if (cmd == "warm") return Warm(rest);
  if (cmd == "prebuild") return Prebuild(rest);
  if (cmd == "verify") return Verify(rest);
  if (cmd == "keygen") return Keygen(rest);
  if (cmd == "version") return Version(rest);
  if (cmd == "doctor") return Doctor(rest);
  if (cmd == "--version") return Version({});
  if (cmd == "compile-worker") {
    // Run by the compile pool, never by hand: `compile-worker PID [faults]`.
    absl::StatusOr<kforge::WorkerFaults> faults = kforge::WorkerFaults::FromArgs(
        rest.size() > 1 ? std::vector<std::string>(rest.begin() + 1, rest.end())
                        : std::vector<std::string>{});
    if (!faults.ok()) return Fail(faults.status());
    return kforge::RunCompileWorker(rest.empty() ? 0 : std::atoi(rest[0].c_str()), *faults);
  }
  std::cerr << "kforge: unknown command '" << cmd << "'\n";
  Usage();
  return 2;
}
