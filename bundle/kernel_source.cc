#include "bundle/kernel_source.h"

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kforge {

absl::Status PrefetchKernels(KernelSource& source, const v1::Manifest& manifest,
                             std::string_view arch) {
  // One thread per variant (a manifest has a handful): a server compiles
  // them in parallel, so a cold start waits for the slowest, not the sum.
  std::vector<absl::Status> results(manifest.variants_size());
  std::vector<std::thread> threads;
  threads.reserve(results.size());
  for (int i = 0; i < manifest.variants_size(); ++i) {
    threads.emplace_back(
        [&, i] { results[i] = source.GetKernel(manifest.variants(i), arch).status(); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < manifest.variants_size(); ++i) {
    if (!results[i].ok()) {
      return absl::Status(results[i].code(),
                          absl::StrCat("prefetching ", manifest.variants(i).module_name(), ": ",
                                       results[i].message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace kforge
