// Warm (Prebuild) request decoding: the bytes of a PrebuildRequest as the
// server takes them off the wire (gRPC's GenericDeserialize), then
// ExpandPrebuildRequest, which must refuse before expanding anything a
// request whose kernels x archs exceed the job cap (a
// request once expanded before that check).
// No compile runs. Beyond no crash, UB or leak:
//   - an accepted request expands to at most kMaxJobs jobs, exactly
//     kernels x archs of them, each with an arch kforge builds for and a
//     valid spec;
//   - a request over the cap is refused whatever else it holds.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_support.h"
#include "fuzz/wire.h"
#include "kforge/v1/service.pb.h"
#include "model/arch.h"
#include "model/spec.h"
#include "service/prebuild_fanout.h"

namespace {

using kforge::fuzz::Check;

// Small, so that inputs of a few hundred bytes reach the cap.
constexpr int kMaxJobs = 64;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kforge::v1::PrebuildRequest request;
  if (!kforge::fuzz::DecodeFromWire(data, size, &request)) return 0;

  absl::StatusOr<std::vector<kforge::PrebuildJob>> jobs =
      kforge::ExpandPrebuildRequest(request, kMaxJobs);
  const long long asked = static_cast<long long>(request.kernels_size()) * request.archs_size();
  if (asked > kMaxJobs) {
    Check(!jobs.ok(), absl::StrCat(asked, " jobs were expanded past the cap of ", kMaxJobs));
  }
  if (!jobs.ok()) return 0;
  Check(static_cast<long long>(jobs->size()) == asked && !jobs->empty(),
        absl::StrCat("expanded ", jobs->size(), " jobs for ", request.kernels_size(), " kernels x ",
                     request.archs_size(), " archs"));
  for (const kforge::PrebuildJob& job : *jobs) {
    Check(kforge::ParseArch(job.arch).ok(), absl::StrCat("a job for an unknown arch: ", job.arch));
    Check(kforge::NormalizeKernelSpec(job.spec).ok(), "a job whose spec does not validate");
  }
  return 0;
}
