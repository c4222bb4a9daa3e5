#ifndef KFORGE_SERVICE_WARM_H_
#define KFORGE_SERVICE_WARM_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bundle/bundle.h"
#include "service/kernel_store.h"

namespace kforge {

struct WarmReport {
  int kernels = 0;         // distinct kernels the bundle's manifests name
  int loaded = 0;          // put into the cache by this warm-up
  int already_cached = 0;  // were in the cache before
  // "module_name: why" for each kernel that could not be loaded (damaged
  // file, built by another compiler version); the server compiles those on
  // demand.
  std::vector<std::string> skipped;
  double seconds = 0;
};

// `kforge serve --warm-from`: loads every kernel named by the bundle's
// manifests into the store's memory and disk tiers. Each kernel file is
// checked against the bundle's checksums and its manifest variant
// (BundleSource) and against the key this server computes (Preload) before
// it is cached, its entry recording `origin` (EntryOrigin::kSignedBundle
// only for a bundle whose signature was checked). Stops early, with what it
// did so far, once *stop is true.
WarmReport WarmFromBundle(KernelStore& store, BundleSource& bundle, EntryOrigin origin,
                          const std::atomic<bool>& stop);

}  // namespace kforge

#endif  // KFORGE_SERVICE_WARM_H_
