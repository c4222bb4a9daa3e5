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

// The entries every answer holds, of an artifact or a variant (the same
// launch fields): sparse MLA's main and combine, the indexer's logits and
// top-k, those that are set.
template <typename Launch>
std::vector<const std::string*> RequiredEntries(const Launch& launch) {
  std::vector<const std::string*> required;
  for (const std::string* name :
       {&launch.main_entry(), &launch.combine_entry(), &launch.indexer().logits_entry(),
        &launch.indexer().topk_entry()}) {
    if (!name->empty()) required.push_back(name);
  }
  return required;
}

// The entries the launch fields name: the required ones, the optional main
// entries and the indexer's cluster top-k, those that are set.
template <typename Launch>
std::vector<const std::string*> NamedEntries(const Launch& launch) {
  std::vector<const std::string*> named = RequiredEntries(launch);
  if (const std::string& topk_cluster = launch.indexer().topk_cluster().entry();
      !topk_cluster.empty()) {
    named.push_back(&topk_cluster);
  }
  for (const std::string* main : OptionalMainEntries(launch.small_batch(), launch.cluster())) {
    named.push_back(main);
  }
  return named;
}

// OK when `names` (what the cubin exports, or what the artifact lists) are
// exactly the `named` entries; else `field` and the first named one
// missing (`missing`) or the first other one.
absl::Status ExactlyTheNamed(const v1::ManifestVariant& variant, const char* field,
                             const std::vector<const std::string*>& named,
                             const std::vector<const std::string*>& names, const char* missing) {
  auto has = [](const std::vector<const std::string*>& list, const std::string& name) {
    return std::any_of(list.begin(), list.end(), [&](const std::string* n) { return *n == name; });
  };
  for (const std::string* name : named) {
    if (!has(names, *name)) return Mismatch(variant, field, *name, missing);
  }
  // A kernel beside the named ones is code nobody asked for, reachable by
  // name once the module is loaded.
  for (const std::string* name : names) {
    if (!has(named, *name)) {
      return Mismatch(
          variant, field, "only the entries the artifact names",
          absl::StrCat("another entry ", absl::CHexEscape(AsAbsl(name->substr(0, 200)))));
    }
  }
  return absl::OkStatus();
}

// The cubin images themselves, read back from their ELF: a server or
// bundle could carry correct metadata around the wrong (or a damaged)
// binary, or route an entry to an image that does not hold it.
absl::Status CheckCubin(const v1::ManifestVariant& variant, const std::string& arch,
                        const v1::KernelArtifact& artifact) {
  if (artifact.cubin().empty()) return Mismatch(variant, "cubin", "non-empty", "empty");
  const size_t images = CubinImageCount(artifact);
  if (images > kMaxCubinImages) {
    return Mismatch(variant, "cubin images", absl::StrCat("at most ", kMaxCubinImages),
                    absl::StrCat(images));
  }
  const uint64_t bytes = CubinBytes(artifact);
  if (bytes > kMaxCubinBytes) {
    return Mismatch(variant, "cubin size", absl::StrCat("at most ", kMaxCubinBytes, " bytes"),
                    absl::StrCat(bytes, " bytes"));
  }
  // Every image's kernels, each with the image that exports it.
  v1::CubinInfo info;
  for (size_t i = 0; i < images; ++i) {
    const std::string& image = ImageOf(artifact, i);
    const std::string which = i == 0 ? "cubin" : absl::StrCat("more_cubins[", i - 1, "]");
    if (image.empty()) return Mismatch(variant, which, "non-empty", "empty");
    absl::StatusOr<v1::CubinInfo> read = InspectCubin(image);
    if (!read.ok()) {
      return absl::DataLossError(absl::StrCat("kernel artifact for ", variant.module_name(), ": ",
                                              which, " is unreadable: ", read.status().message()));
    }
    if (read->arch() != arch)
      return Mismatch(variant, absl::StrCat(which, " arch"), arch, read->arch());
    if (read->kernels().empty()) return Mismatch(variant, which, "an image with entries", "none");
    for (v1::KernelResources& k : *read->mutable_kernels()) {
      if (FindKernel(info, k.name()) != nullptr) {
        return Mismatch(variant, "cubin entries", "each entry in one image",
                        absl::StrCat(absl::CHexEscape(AsAbsl(k.name().substr(0, 200))), " in two"));
      }
      k.set_image(static_cast<uint32_t>(i));
      *info.add_kernels() = std::move(k);
    }
  }
  // Exactly the entries the artifact's launch fields name.
  std::vector<const std::string*> exported;
  for (const v1::KernelResources& kernel : info.kernels()) exported.push_back(&kernel.name());
  if (absl::Status s = ExactlyTheNamed(variant, "cubin entries", NamedEntries(artifact), exported,
                                       "no such entry");
      !s.ok()) {
    return s;
  }
  for (const v1::KernelResources& k : info.kernels()) {
    // The runtime loads an entry from the image cubin_info names.
    const v1::KernelResources* listed = FindKernel(artifact.cubin_info(), k.name());
    const std::string listed_image = listed == nullptr ? "none" : absl::StrCat(listed->image());
    if (listed == nullptr || listed->image() != k.image()) {
      return Mismatch(variant, absl::StrCat("cubin_info ", k.name(), " image"),
                      absl::StrCat(k.image()), listed_image);
    }
  }
  // Each listed entry takes the block the list says (CheckEntries holds
  // the list to the named entries and the host's structs).
  for (const v1::KernelEntry& e : artifact.entries()) {
    const v1::KernelResources* entry = FindKernel(info, e.name());
    if (entry != nullptr && entry->param_bytes() != e.params_bytes()) {
      return Mismatch(variant, absl::StrCat("cubin ", e.name(), " param_bytes"),
                      absl::StrCat(e.params_bytes()), absl::StrCat(entry->param_bytes()));
    }
  }
  return absl::OkStatus();
}

// What the host passes to an entry of `role`: its parameter struct's size
// (0 for a role this build does not know).
size_t HostParamsBytesOf(v1::EntryRole role) {
  switch (role) {
    case v1::ENTRY_ROLE_ATTENTION:
      return sizeof(sparse_mla::DecodeParams);
    case v1::ENTRY_ROLE_COMBINE:
      return sizeof(sparse_mla::CombineParams);
    case v1::ENTRY_ROLE_INDEXER_LOGITS:
      return sizeof(dsa_indexer::LogitsParams);
    case v1::ENTRY_ROLE_INDEXER_TOPK:
      return sizeof(dsa_indexer::TopkParams);
    default:
      return 0;
  }
}

// The host's block for the variant's first entry of `role`; 0 without one.
size_t HostParamsBytes(const v1::ManifestVariant& variant, v1::EntryRole role) {
  for (const v1::KernelEntry& entry : variant.entries()) {
    if (entry.role() == role) return HostParamsBytesOf(role);
  }
  return 0;
}

// The artifact lists the variant's entries, each taking the host's block
// for its role, and lists every entry its launch fields name.
absl::Status CheckEntries(const v1::ManifestVariant& variant, const v1::KernelArtifact& artifact) {
  if (variant.entries_size() != artifact.entries_size()) {
    return Mismatch(variant, "entries", absl::StrCat(variant.entries_size(), " entries"),
                    absl::StrCat(artifact.entries_size(), " entries"));
  }
  for (int i = 0; i < variant.entries_size(); ++i) {
    const v1::KernelEntry& want = variant.entries(i);
    const v1::KernelEntry& got = artifact.entries(i);
    if (!google::protobuf::util::MessageDifferencer::Equals(want, got)) {
      return Mismatch(variant, absl::StrCat("entries[", i, "]"), want.ShortDebugString(),
                      got.ShortDebugString());
    }
    if (got.params_bytes() != HostParamsBytesOf(got.role())) {
      return Mismatch(variant, absl::StrCat("entries[", i, "].params_bytes"),
                      absl::StrCat(HostParamsBytesOf(got.role())),
                      absl::StrCat(got.params_bytes()));
    }
  }
  // The list is the named entries, no more and no fewer.
  std::vector<const std::string*> listed;
  for (const v1::KernelEntry& e : artifact.entries()) listed.push_back(&e.name());
  return ExactlyTheNamed(variant, "entries", NamedEntries(artifact), listed, "not listed");
}

}  // namespace

const v1::KernelResources* FindKernel(const v1::CubinInfo& info, std::string_view name) {
  auto it = std::find_if(info.kernels().begin(), info.kernels().end(),
                         [&](const v1::KernelResources& k) { return k.name() == name; });
  return it == info.kernels().end() ? nullptr : &*it;
}

uint64_t CubinBytes(const v1::KernelArtifact& artifact) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < CubinImageCount(artifact); ++i) bytes += ImageOf(artifact, i).size();
  return bytes;
}

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
  return CheckAnswerForVariant(variant, arch, artifact, /*accept_partial=*/false);
}

absl::Status CheckAnswerForVariant(const v1::ManifestVariant& full, std::string_view arch,
                                   const v1::KernelArtifact& artifact, bool accept_partial) {
  if (artifact.partial() && !accept_partial) {
    return absl::DataLossError(
        "kernel artifact is a first answer (partial: some of the module's entries left out) "
        "where the whole module was wanted");
  }
  v1::ManifestVariant trimmed;
  if (artifact.partial()) {
    std::vector<std::string> present;
    for (const v1::KernelResources& k : artifact.cubin_info().kernels()) {
      present.push_back(k.name());
    }
    trimmed = FirstAnswerVariant(full, present);
  }
  const v1::ManifestVariant& variant = artifact.partial() ? trimmed : full;
  // Checked first, so no later message quotes a hostile name unescaped.
  for (const auto& [field, name] :
       {std::pair<const char*, const std::string*>{"module_name", &variant.module_name()},
        {"key", &variant.key()}}) {
    if (absl::Status s = CheckFileStem(field, *name); !s.ok()) {
      return absl::DataLossError(absl::StrCat("kernel artifact: manifest variant ", s.message()));
    }
  }
  const std::string canonical_arch = CanonicalArchName(arch);
  if (artifact.format_version() != kFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kernel artifact ", variant.module_name(), " is format ", artifact.format_version(),
        ", this kforge reads format ", kFormatVersion,
        " (from format 3 an artifact lists its entries and their roles): rebuild the bundle "
        "with this kforge (`kforge prebuild`), ask a server of this version, or use the "
        "kforge that wrote it"));
  }
  // The parameter blocks this runtime fills are the host's structs, by
  // entry role; a kernel built from other templates would read them at the
  // wrong offsets.
  const size_t params_bytes = HostParamsBytes(variant, v1::ENTRY_ROLE_ATTENTION);
  const size_t combine_params_bytes = HostParamsBytes(variant, v1::ENTRY_ROLE_COMBINE);
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
  if (absl::Status s = CheckCubin(variant, canonical_arch, artifact); !s.ok()) return s;
  return CheckEntries(variant, artifact);
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

v1::ManifestVariant FirstAnswerVariant(const v1::ManifestVariant& variant,
                                       const std::vector<std::string>& present) {
  auto has = [&present](const std::string& name) {
    return std::find(present.begin(), present.end(), name) != present.end();
  };
  v1::ManifestVariant out = variant;
  if (out.has_small_batch()) {
    if (!has(out.small_batch().entry())) {
      out.clear_small_batch();
    } else if (!out.small_batch().cluster_entry().empty() &&
               !has(out.small_batch().cluster_entry())) {
      out.mutable_small_batch()->clear_cluster_entry();
      out.mutable_small_batch()->clear_cluster_splits();
    }
  }
  if (out.has_cluster()) {
    v1::ClusterPath& cluster = *out.mutable_cluster();
    if (!cluster.wide_entry().empty() && !has(cluster.wide_entry())) {
      cluster.clear_wide_entry();
      cluster.clear_wide_splits();
    }
    if (!cluster.entry().empty() && !has(cluster.entry())) {
      cluster.clear_entry();
      cluster.clear_splits();
    }
    if (cluster.entry().empty() && cluster.wide_entry().empty()) out.clear_cluster();
  }
  if (out.indexer().has_topk_cluster() && !has(out.indexer().topk_cluster().entry())) {
    out.mutable_indexer()->clear_topk_cluster();
  }
  // The list keeps the entries the trimmed launch still names.
  const std::vector<const std::string*> named = NamedEntries(out);
  out.clear_entries();
  for (const v1::KernelEntry& entry : variant.entries()) {
    if (std::any_of(named.begin(), named.end(),
                    [&](const std::string* n) { return *n == entry.name(); })) {
      *out.add_entries() = entry;
    }
  }
  return out;
}

std::vector<const std::string*> FirstAnswerEntries(const v1::ManifestVariant& variant) {
  return RequiredEntries(variant);
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
  *variant.mutable_entries() = artifact.entries();
  return variant;
}

}  // namespace kforge
