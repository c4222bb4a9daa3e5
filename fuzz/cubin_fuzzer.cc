// Cubin inspection (model/cubin.h, libelf): InspectCubin reads what servers,
// bundles and local copies hand an engine, so "hostile bytes are safe to
// pass" is its contract. Beyond no crash, UB or leak: a cubin that inspects
// gives an "sm_<n>[a]" arch and its kernels sorted by name, and inspecting
// the same bytes again gives the same answer.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_support.h"
#include "model/cubin.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kforge::fuzz::Check;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kforge::v1::CubinInfo> info = kforge::InspectCubin(bytes);
  if (!info.ok()) {
    Check(absl::IsInvalidArgument(info.status()),
          absl::StrCat("InspectCubin failed with other than InvalidArgument: ",
                       info.status().ToString()));
    return 0;
  }
  Check(absl::StartsWith(info->arch(), "sm_"), absl::StrCat("arch ", info->arch()));
  for (int i = 1; i < info->kernels_size(); ++i) {
    Check(info->kernels(i - 1).name() <= info->kernels(i).name(), "kernels not sorted by name");
  }
  absl::StatusOr<kforge::v1::CubinInfo> again = kforge::InspectCubin(bytes);
  Check(again.ok() && kforge::fuzz::SameMessage(*info, *again),
        "InspectCubin gives another answer for the same bytes");
  return 0;
}
