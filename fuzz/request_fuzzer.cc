// Request decoding: the bytes of a GetKernel request as the server takes
// them off the wire (gRPC's GenericDeserialize into GetKernelRequest, as
// service/kernel_service.cc does), then the selector -> spec -> plan path
// every GetKernel runs before any cache or compile (KernelStore::Resolve,
// KernelCompiler::Plan: validation, arch, tiling, module name, source, key),
// and the same bytes as a GetManifestRequest (field-compatible) through
// BuildManifest. No NVRTC compile runs. Beyond no crash, UB or leak:
//   - a plan's key is 64 lower-case hex digits and its module name is made
//     of [a-z0-9_] only (both become file names on servers and clients);
//   - planning the plan's own (normalized) spec gives the same key;
//   - the manifest for the request has the plan's key and module name as
//     its first choice.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "compiler/compiler.h"
#include "compiler/manifest.h"
#include "fuzz/fuzz_support.h"
#include "fuzz/wire.h"
#include "kforge/v1/service.pb.h"
#include "model/selector.h"
#include "service/kernel_store.h"

namespace {

using kforge::fuzz::Check;

bool OnlyChars(const std::string& s, bool (*ok)(char)) {
  for (char c : s) {
    if (!ok(c)) return false;
  }
  return !s.empty();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kforge::v1::GetKernelRequest request;
  if (!kforge::fuzz::DecodeFromWire(data, size, &request)) return 0;

  static const kforge::KernelCompiler compiler;
  absl::StatusOr<kforge::v1::KernelSpec> spec = kforge::KernelStore::Resolve(request.kernel());
  if (!spec.ok()) return 0;
  absl::StatusOr<kforge::CompilePlan> plan = compiler.Plan(*spec, request.arch());
  if (!plan.ok()) return 0;
  Check(OnlyChars(plan->key,
                  [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }) &&
            plan->key.size() == 64,
        absl::StrCat("plan key ", plan->key));
  Check(OnlyChars(
            plan->module_name,
            [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '_'; }),
        absl::StrCat("module name ", plan->module_name));
  absl::StatusOr<kforge::CompilePlan> again = compiler.Plan(plan->spec, plan->arch.name);
  Check(again.ok() && again->key == plan->key,
        absl::StrCat("planning the normalized spec gives another key: ",
                     again.ok() ? again->key : again.status().ToString()));

  kforge::v1::GetManifestRequest manifest_request;
  Check(manifest_request.ParseFromArray(data, static_cast<int>(size)),
        "a GetKernelRequest does not parse as a GetManifestRequest");
  absl::StatusOr<kforge::v1::KernelSpec> manifest_spec =
      kforge::KernelStore::Resolve(manifest_request.kernel());
  Check(manifest_spec.ok(), "the selector resolves for GetKernel but not for GetManifest");
  absl::StatusOr<kforge::v1::Manifest> manifest =
      kforge::BuildManifest(compiler, *manifest_spec, manifest_request.arch());
  Check(manifest.ok(),
        absl::StrCat("a request that plans has no manifest: ", manifest.status().ToString()));
  const kforge::v1::ManifestVariant& first = kforge::FirstChoice(*manifest);
  Check(first.key() == plan->key && first.module_name() == plan->module_name,
        "the manifest's first choice is not the kernel GetKernel plans");
  return 0;
}
