#include "service/warm.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kforge {

WarmReport WarmFromBundle(KernelStore& store, BundleSource& bundle, EntryOrigin origin,
                          const std::atomic<bool>& stop) {
  const absl::Time start = absl::Now();
  WarmReport report;
  std::set<std::string> seen;  // manifests of one model share variants
  for (const v1::Manifest& manifest : bundle.manifests()) {
    for (const v1::ManifestVariant& variant : manifest.variants()) {
      if (stop.load()) break;
      if (!seen.insert(variant.key()).second) continue;
      ++report.kernels;
      absl::StatusOr<ArtifactRef> artifact = bundle.GetKernel(variant, manifest.arch());
      absl::StatusOr<bool> cached =
          artifact.ok() ? store.Preload(*artifact, origin) : artifact.status();
      if (!cached.ok()) {
        report.skipped.push_back(
            absl::StrCat(variant.module_name(), ": ", cached.status().message()));
      } else if (*cached) {
        ++report.already_cached;
      } else {
        ++report.loaded;
      }
    }
  }
  report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return report;
}

}  // namespace kforge
