#include "model/artifact_check.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"
#include "google/protobuf/util/message_differencer.h"
#include "model/arch.h"
#include "model/cubin.h"
#include "model/format.h"
#include "templates/kforge/dsa_indexer/config.h"
#include "templates/kforge/sparse_mla/common/params.h"

namespace kforge {
namespace {

// What one check compares: a field name and the two values as text.
struct Expectation {
  const char* field;
  std::string expected;
  std::string got;
};

absl::Status Mismatch(const v1::ManifestVariant& variant, std::string_view field,
                      std::string_view expected, std::string_view got) {
  return absl::DataLossError(absl::StrCat("kernel artifact is not the one manifest variant ",
                                          variant.module_name(), " names: ", AsAbsl(field),
                                          ": expected \"", AsAbsl(expected), "\", got \"",
                                          AsAbsl(got), "\""));
}

const v1::KernelResources* FindEntry(const v1::CubinInfo& info, const std::string& name) {
  auto it = std::find_if(info.kernels().begin(), info.kernels().end(),
                         [&](const v1::KernelResources& k) { return k.name() == name; });
  return it == info.kernels().end() ? nullptr : &*it;
}

// The cubin itself, read back from its ELF: a server or bundle could carry
// correct metadata around the wrong (or a damaged) binary.
absl::Status CheckCubin(const v1::ManifestVariant& variant, const std::string& arch,
                        const v1::KernelArtifact& artifact) {
  if (artifact.cubin().empty()) return Mismatch(variant, "cubin", "non-empty", "empty");
  if (artifact.cubin().size() > kMaxCubinBytes) {
    return Mismatch(variant, "cubin size", absl::StrCat("at most ", kMaxCubinBytes, " bytes"),
                    absl::StrCat(artifact.cubin().size(), " bytes"));
  }
  absl::StatusOr<v1::CubinInfo> info = InspectCubin(artifact.cubin());
  if (!info.ok()) {
    return absl::DataLossError(absl::StrCat("kernel artifact for ", variant.module_name(),
                                            ": cubin is unreadable: ", info.status().message()));
  }
  if (info->arch() != arch) return Mismatch(variant, "cubin arch", arch, info->arch());
  std::vector<std::pair<const std::string*, uint32_t>> entries = {
      {&artifact.main_entry(), artifact.params_bytes()},
      {&artifact.combine_entry(), artifact.combine_params_bytes()}};
  for (const std::string* main : OptionalMainEntries(artifact.small_batch(), artifact.cluster())) {
    entries.emplace_back(main, artifact.params_bytes());
  }
  // An indexer's cluster top-k takes the top-k's parameters.
  if (const std::string& topk = artifact.indexer().topk_cluster().entry(); !topk.empty()) {
    entries.emplace_back(&topk, artifact.combine_params_bytes());
  }
  // Exactly the entries the artifact names: a kernel beside them is code
  // nobody asked for, reachable by name once the module is loaded.
  for (const auto& [name, params_bytes] : entries) {
    if (FindEntry(*info, *name) == nullptr) {
      return Mismatch(variant, "cubin entries", *name, "no such entry");
    }
  }
  for (const v1::KernelResources& kernel : info->kernels()) {
    const bool named = std::any_of(entries.begin(), entries.end(),
                                   [&](const auto& e) { return *e.first == kernel.name(); });
    if (!named) {
      return Mismatch(
          variant, "cubin entries", "only the entries the artifact names",
          absl::StrCat("another entry ", absl::CHexEscape(AsAbsl(kernel.name().substr(0, 200)))));
    }
  }
  for (const auto& [name, params_bytes] : entries) {
    const v1::KernelResources* entry = FindEntry(*info, *name);
    if (entry->param_bytes() != params_bytes) {
      return Mismatch(variant, absl::StrCat("cubin ", *name, " param_bytes"),
                      absl::StrCat(params_bytes), absl::StrCat(entry->param_bytes()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string ArtifactSourceName(v1::ArtifactSource source) {
  constexpr absl::string_view kPrefix = "ARTIFACT_SOURCE_";
  if (!v1::ArtifactSource_IsValid(source)) return "unknown";
  const absl::string_view name = v1::ArtifactSource_Name(source);
  if (!absl::StartsWith(name, kPrefix)) return "unknown";
  return absl::AsciiStrToLower(name.substr(kPrefix.size()));
}

absl::Status CheckFileStem(std::string_view field, std::string_view name) {
  const bool safe =
      !name.empty() && name.front() != '.' && std::all_of(name.begin(), name.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ||
               c == '.';
      });
  if (safe) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(AsAbsl(field), ": got \"", absl::CHexEscape(AsAbsl(name)),
                   "\", a file name must be non-empty letters, digits, '_', '-', '.'"));
}

absl::Status CheckArtifactForVariant(const v1::ManifestVariant& variant, std::string_view arch,
                                     const v1::KernelArtifact& artifact) {
  // Checked first, so no later message quotes a hostile name unescaped.
  for (const auto& [field, name] :
       {std::pair<const char*, const std::string*>{"module_name", &variant.module_name()},
        {"key", &variant.key()}}) {
    if (absl::Status s = CheckFileStem(field, *name); !s.ok()) {
      return absl::DataLossError(absl::StrCat("kernel artifact: manifest variant ", s.message()));
    }
  }
  const std::string canonical_arch = CanonicalArchName(arch);
  // The parameter blocks this runtime fills are the host's structs; a kernel
  // built from other templates would read them at the wrong offsets.
  const bool indexer = variant.spec().kind() == v1::ATTENTION_KIND_DSA_INDEXER;
  const size_t params_bytes =
      indexer ? sizeof(dsa_indexer::LogitsParams) : sizeof(sparse_mla::DecodeParams);
  const size_t combine_params_bytes =
      indexer ? sizeof(dsa_indexer::TopkParams) : sizeof(sparse_mla::CombineParams);
  const Expectation checks[] = {
      {"key", variant.key(), artifact.key()},
      {"module_name", variant.module_name(), artifact.module_name()},
      {"arch", canonical_arch, artifact.arch()},
      {"main_entry", variant.main_entry(), artifact.main_entry()},
      {"combine_entry", variant.combine_entry(), artifact.combine_entry()},
      {"params_bytes", absl::StrCat(params_bytes), absl::StrCat(artifact.params_bytes())},
      {"combine_params_bytes", absl::StrCat(combine_params_bytes),
       absl::StrCat(artifact.combine_params_bytes())},
  };
  for (const Expectation& c : checks) {
    if (c.expected != c.got) return Mismatch(variant, c.field, c.expected, c.got);
  }
  // The launch is computed from the variant's spec, tiling and launch rule;
  // a kernel built with others would be launched with the wrong grid or
  // shared memory even under the right key.
  const std::pair<const char*,
                  std::pair<const google::protobuf::Message*, const google::protobuf::Message*>>
      messages[] = {{"spec", {&variant.spec(), &artifact.spec()}},
                    {"tiling", {&variant.tiling(), &artifact.tiling()}},
                    {"launch", {&variant.launch(), &artifact.launch()}},
                    {"small_batch", {&variant.small_batch(), &artifact.small_batch()}},
                    {"cluster", {&variant.cluster(), &artifact.cluster()}},
                    {"indexer", {&variant.indexer(), &artifact.indexer()}}};
  for (const auto& [field, pair] : messages) {
    if (!google::protobuf::util::MessageDifferencer::Equals(*pair.first, *pair.second)) {
      return Mismatch(variant, field, pair.first->ShortDebugString(),
                      pair.second->ShortDebugString());
    }
  }
  return CheckCubin(variant, canonical_arch, artifact);
}

std::vector<const std::string*> OptionalMainEntries(const v1::SmallBatchPath& small,
                                                    const v1::ClusterPath& cluster) {
  std::vector<const std::string*> entries;
  for (const std::string* entry :
       {&small.entry(), &small.cluster_entry(), &cluster.entry(), &cluster.wide_entry()}) {
    if (!entry->empty()) entries.push_back(entry);
  }
  return entries;
}

v1::ManifestVariant VariantOfArtifact(const v1::KernelArtifact& artifact) {
  v1::ManifestVariant variant;
  variant.set_module_name(artifact.module_name());
  variant.set_key(artifact.key());
  *variant.mutable_spec() = artifact.spec();
  *variant.mutable_tiling() = artifact.tiling();
  *variant.mutable_launch() = artifact.launch();
  variant.set_main_entry(artifact.main_entry());
  variant.set_combine_entry(artifact.combine_entry());
  if (artifact.has_small_batch()) *variant.mutable_small_batch() = artifact.small_batch();
  if (artifact.has_cluster()) *variant.mutable_cluster() = artifact.cluster();
  if (artifact.has_indexer()) *variant.mutable_indexer() = artifact.indexer();
  return variant;
}

}  // namespace kforge
