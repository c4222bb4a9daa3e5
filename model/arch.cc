#include "model/arch.h"

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "base/absl_compat.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace kforge {
namespace {

// Maximum opt-in shared memory per block
// (cudaDevAttrMaxSharedMemoryPerBlockOptin), from the CUDA C++ Programming
// Guide, "Technical Specifications per Compute Capability":
// 8.0: 163 KB; 8.6 / 8.9: 99 KB; 9.0: 227 KB; 10.0: 227 KB; 12.x: 99 KB.
constexpr int kSmem163KB = 163 * 1024;  // 166912
constexpr int kSmem99KB = 99 * 1024;    // 101376
constexpr int kSmem227KB = 227 * 1024;  // 232448

// Shared memory per SM (same guide, "shared memory capacity per SM"); each
// resident block also takes 1 KB reserved by the driver.
int SmemPerSm(int max_smem_per_block) {
  return max_smem_per_block + 1024;  // 164 / 100 / 228 KB
}

Arch MakeArch(int major, int minor, bool arch_specific, int smem) {
  Arch arch;
  arch.name = absl::StrCat("sm_", major * 10 + minor, arch_specific ? "a" : "");
  arch.major = major;
  arch.minor = minor;
  arch.arch_specific = arch_specific;
  arch.max_smem_per_block = smem;
  arch.smem_per_sm = SmemPerSm(smem);
  return arch;
}

std::vector<Arch> BuildSupportedArchs() {
  // Every entry is accepted by NVRTC 13.0 as -arch=<name> (checked with
  // nvrtcGetSupportedArchs: 75 80 86 87 88 89 90 100 103 110 120 121, and
  // by compiling a trivial kernel for each name). sm_80/86/89 have no
  // arch-specific ("a") variant.
  return {
      MakeArch(8, 0, false, kSmem163KB),   // A100
      MakeArch(8, 6, false, kSmem99KB),    // A10, RTX 3090
      MakeArch(8, 9, false, kSmem99KB),    // L40, RTX 4090
      MakeArch(9, 0, false, kSmem227KB),   // H100/H200, portable PTX path
      MakeArch(9, 0, true, kSmem227KB),    // H100/H200 with wgmma/TMA
      MakeArch(10, 0, false, kSmem227KB),  // B200, portable path
      MakeArch(10, 0, true, kSmem227KB),   // B200 with tcgen05
      MakeArch(12, 0, false, kSmem99KB),   // RTX PRO 6000, RTX 50xx
      MakeArch(12, 0, true, kSmem99KB),
      MakeArch(12, 1, false, kSmem99KB),  // GB10
      MakeArch(12, 1, true, kSmem99KB),
  };
}

std::string SupportedNames() {
  std::vector<absl::string_view> names;
  for (const Arch& arch : SupportedArchs()) names.push_back(arch.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace

const std::vector<Arch>& SupportedArchs() {
  static const std::vector<Arch>* const kArchs =
      new std::vector<Arch>(BuildSupportedArchs());
  return *kArchs;
}

absl::StatusOr<Arch> ParseArch(std::string_view name) {
  // Accept "sm_90a", "SM_90A", "90a" and surrounding spaces; everything maps
  // onto the canonical "sm_<digits>[a]" spelling.
  std::string canonical =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(AsAbsl(name)));
  if (!absl::StartsWith(canonical, "sm_")) {
    canonical = absl::StrCat("sm_", canonical);
  }
  for (const Arch& arch : SupportedArchs()) {
    if (arch.name == canonical) return arch;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "arch: got \"", AsAbsl(name), "\", supported ", SupportedNames()));
}

std::string CanonicalArchName(std::string_view name) {
  absl::StatusOr<Arch> arch = ParseArch(name);
  return arch.ok() ? arch->name : std::string(name);
}

}  // namespace kforge
