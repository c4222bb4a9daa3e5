// Bundle reading and verification (bundle/bundle.h): VerifyBundle (`kforge
// verify`) and BundleSource (engines with no server, `serve --warm-from`)
// over a bundle directory written from the input (layout in
// fuzz_support.h), every manifest's variants fetched with GetKernel and
// looked up again with GetManifest. Beyond no crash, UB or leak:
//   - a bundle that VerifyBundle passes opens, and every variant of every
//     manifest in it is served (what verify accepts, an engine can use);
//   - what GetKernel serves is the kernel the variant names (key, and an
//     arch that is the manifest's);
//   - a manifest that BundleSource read is found again by GetManifest for
//     its first choice's spec on its arch.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bundle/bundle.h"
#include "fuzz/fuzz_support.h"
#include "model/arch.h"
#include "model/selector.h"
#include "model/spec.h"

namespace {

using kforge::fuzz::Check;

std::string Problems(const std::vector<kforge::BundleProblem>& problems) {
  std::vector<std::string> lines;
  for (const kforge::BundleProblem& p : problems) lines.push_back(p.path + ": " + p.message);
  return absl::StrJoin(lines, "\n");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = kforge::fuzz::ScratchDir();
  kforge::fuzz::EmptyDir(dir);
  kforge::fuzz::WriteBundleArchive(
      kforge::fuzz::DecodeBundleArchive({reinterpret_cast<const char*>(data), size}), dir);

  const std::vector<kforge::BundleProblem> problems = kforge::VerifyBundle(dir);
  absl::StatusOr<std::unique_ptr<kforge::BundleSource>> source = kforge::BundleSource::Open(dir);
  Check(source.ok() || !problems.empty(),
        absl::StrCat("verify passes a bundle BundleSource refuses: ", source.status().ToString()));
  if (!source.ok()) return 0;

  for (const kforge::v1::Manifest& manifest : (*source)->manifests()) {
    for (const kforge::v1::ManifestVariant& variant : manifest.variants()) {
      absl::StatusOr<kforge::ArtifactRef> kernel = (*source)->GetKernel(variant, manifest.arch());
      Check(kernel.ok() || !problems.empty(),
            absl::StrCat("verify passes a bundle whose variant ", variant.module_name(),
                         " is not served: ", kernel.status().ToString()));
      if (!kernel.ok()) continue;
      Check((*kernel)->key() == variant.key(),
            absl::StrCat("GetKernel for key ", variant.key(), " served key ", (*kernel)->key()));
      Check(
          kforge::CanonicalArchName((*kernel)->arch()) ==
              kforge::CanonicalArchName(manifest.arch()),
          absl::StrCat("GetKernel for arch ", manifest.arch(), " served arch ", (*kernel)->arch()));
    }
    kforge::v1::KernelSelector selector;
    *selector.mutable_spec() = kforge::FirstChoice(manifest).spec();
    absl::StatusOr<kforge::v1::Manifest> found = (*source)->GetManifest(selector, manifest.arch());
    // A manifest can hold a spec or an arch no selector asks for (NotFound
    // or an invalid spec is then the answer); verify names such a bundle.
    Check(found.ok() || !problems.empty(),
          absl::StrCat("verify passes a bundle whose manifest for ", manifest.arch(),
                       " is not found: ", found.status().ToString(), "\n", Problems(problems)));
  }
  return 0;
}
