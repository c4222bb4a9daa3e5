#ifndef KFORGE_BUNDLE_KERNEL_SOURCE_H_
#define KFORGE_BUNDLE_KERNEL_SOURCE_H_

#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/service.pb.h"
#include "model/artifact_check.h"

namespace kforge {

using ArtifactRef = std::shared_ptr<const v1::KernelArtifact>;

// Where an engine's runtime gets manifests and kernels from: a kforge server
// (ServiceClient, runtime/client.h) or a bundle directory with no server
// (BundleSource, runtime/bundle.h). Implementations are thread-safe.
class KernelSource {
 public:
  virtual ~KernelSource() = default;

  // The selection manifest for a model (spec or preset) on an arch; the
  // selector evaluates its launch rule for the device it runs on.
  virtual absl::StatusOr<v1::Manifest> GetManifest(const v1::KernelSelector& kernel,
                                                   std::string_view arch) = 0;

  // The compiled kernel of one manifest variant, cubin included. The answer
  // is checked with CheckArtifactForVariant before it is returned.
  virtual absl::StatusOr<ArtifactRef> GetKernel(const v1::ManifestVariant& variant,
                                                std::string_view arch) = 0;
};

// Fetches the kernel of every variant of `manifest` (in parallel, one thread
// per variant), so that at engine start every kernel a decode step may pick
// is already in the source's memory and no step waits on the network or a
// compile. The first failure in variant order, prefixed with the variant's
// module name; OK when every fetch succeeded.
absl::Status PrefetchKernels(KernelSource& source, const v1::Manifest& manifest,
                             std::string_view arch);

}  // namespace kforge

#endif  // KFORGE_BUNDLE_KERNEL_SOURCE_H_
