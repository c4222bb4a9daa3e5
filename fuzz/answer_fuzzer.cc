// Answer decoding: the checks every client (`kforge get`, the C++
// ServiceClient, the Python package through the C ABI) runs on a server's
// answers before it uses them or names a file after them. The GetManifest
// answer is decoded as a client stub decodes it, checked with
// BundleManifestPath (a variant, an in-range first choice) and its first
// choice taken (FirstChoice); the GetKernel answer is decoded the same way
// and its artifact checked as a client that asked for a first answer checks
// it (CheckAnswerForVariant with accept_partial: a whole module, or a
// partial one against FirstAnswerVariant) for the arch the client asked
// (sm_90a, the seeds' arch). Input layout: fuzz_support.h ServerAnswer.
// Beyond no crash, UB or leak, an accepted answer has:
//   - a module name and a key that, joined to an output directory as
//     `kforge get` and the local copies do, name a file directly inside it;
//   - the variant's key and module name, the arch asked, and cubin images
//     that each inspect as an ELF of that arch and together export every
//     listed entry exactly once;
//   - the variant's main and combine entries (an indexer's logits and
//     top-k), and no entry the variant does not list;
//   - when it is not partial, CheckArtifactForVariant's verdict too (what a
//     client that asked for the whole module takes);
//   - the same verdict against the variant it describes itself
//     (VariantOfArtifact): what is accepted is the artifact, not a phrasing
//     of the manifest.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bundle/bundle.h"
#include "fuzz/fuzz_support.h"
#include "fuzz/wire.h"
#include "kforge/v1/service.pb.h"
#include "model/artifact_check.h"
#include "model/cubin.h"
#include "model/selector.h"

namespace {

using kforge::fuzz::Check;

constexpr char kClientArch[] = "sm_90a";

// `name` + `suffix` joined to a directory stays directly inside it.
bool StaysInside(const std::string& name, const std::string& suffix) {
  const std::filesystem::path dir = "/out";
  const std::filesystem::path joined = (dir / (name + suffix)).lexically_normal();
  return joined.parent_path() == dir && joined.filename() == name + suffix;
}

bool Exports(const kforge::v1::CubinInfo& info, const std::string& entry) {
  for (const kforge::v1::KernelResources& k : info.kernels()) {
    if (k.name() == entry) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kforge::fuzz::ServerAnswer answer =
      kforge::fuzz::DecodeServerAnswer(std::string_view(reinterpret_cast<const char*>(data), size));
  kforge::v1::Manifest manifest;
  if (!kforge::fuzz::DecodeFromWire(reinterpret_cast<const uint8_t*>(answer.manifest.data()),
                                    answer.manifest.size(), &manifest)) {
    return 0;
  }
  if (!kforge::BundleManifestPath(manifest).ok()) return 0;
  const kforge::v1::ManifestVariant& variant = kforge::FirstChoice(manifest);
  kforge::v1::GetKernelResponse response;
  if (!kforge::fuzz::DecodeFromWire(reinterpret_cast<const uint8_t*>(answer.kernel.data()),
                                    answer.kernel.size(), &response)) {
    return 0;
  }
  const kforge::v1::KernelArtifact& artifact = response.artifact();
  if (!kforge::CheckAnswerForVariant(variant, kClientArch, artifact, true).ok()) return 0;
  Check(artifact.partial() || kforge::CheckArtifactForVariant(variant, kClientArch, artifact).ok(),
        "accepted a whole module as a first answer that the whole-module check refuses");
  for (const std::string* required : kforge::FirstAnswerEntries(variant)) {
    Check(Exports(artifact.cubin_info(), *required),
          absl::StrCat("accepted an answer without the variant's entry ", *required));
  }
  for (const kforge::v1::KernelEntry& e : artifact.entries()) {
    Check(std::any_of(variant.entries().begin(), variant.entries().end(),
                      [&](const kforge::v1::KernelEntry& v) { return v.name() == e.name(); }),
          absl::StrCat("accepted an answer listing an entry the variant does not: ", e.name()));
  }

  Check(
      StaysInside(artifact.module_name(), ".cubin") && StaysInside(artifact.module_name(), ".json"),
      absl::StrCat("accepted module name escapes the output directory: ", artifact.module_name()));
  Check(StaysInside(artifact.key(), ".kfa"),
        absl::StrCat("accepted key escapes the kernels directory: ", artifact.key()));
  Check(artifact.key() == variant.key() && artifact.module_name() == variant.module_name(),
        "accepted an artifact with another key or module name than the variant");
  Check(artifact.arch() == kClientArch, absl::StrCat("accepted arch ", artifact.arch()));
  // Every cubin image an ELF of the arch; every listed entry in exactly one.
  std::vector<kforge::v1::CubinInfo> images;
  for (size_t i = 0; i < kforge::CubinImageCount(artifact); ++i) {
    absl::StatusOr<kforge::v1::CubinInfo> info = kforge::InspectCubin(kforge::ImageOf(artifact, i));
    Check(info.ok() && info->arch() == kClientArch,
          absl::StrCat("accepted a cubin image ", i, " that is not an ELF for the arch asked"));
    images.push_back(*std::move(info));
  }
  Check(!artifact.entries().empty() &&
            std::all_of(artifact.entries().begin(), artifact.entries().end(),
                        [&](const kforge::v1::KernelEntry& e) {
                          return std::count_if(images.begin(), images.end(),
                                               [&](const kforge::v1::CubinInfo& info) {
                                                 return Exports(info, e.name());
                                               }) == 1;
                        }),
        "accepted cubin images that do not export every listed entry exactly once");
  const absl::Status self = kforge::CheckAnswerForVariant(kforge::VariantOfArtifact(artifact),
                                                          kClientArch, artifact, true);
  Check(self.ok(),
        absl::StrCat("accepted for the manifest's variant but not for its own: ", self.ToString()));
  return 0;
}
