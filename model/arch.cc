#include "model/arch.h"

#include <algorithm>

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/absl_compat.h"

namespace kforge {
namespace {

// Maximum opt-in shared memory per block
// (cudaDevAttrMaxSharedMemoryPerBlockOptin), from the CUDA C++ Programming
// Guide, "Technical Specifications per Compute Capability":
// 8.0: 163 KB; 8.6 / 8.9: 99 KB; 9.0: 227 KB; 10.x: 227 KB; 12.x: 99 KB.
constexpr int kSmem163KB = 163 * 1024;  // 166912
constexpr int kSmem99KB = 99 * 1024;    // 101376
constexpr int kSmem227KB = 227 * 1024;  // 232448

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
      MakeArch(10, 3, false, kSmem227KB),  // B300, portable path
      MakeArch(10, 3, true, kSmem227KB),   // B300 with tcgen05
      MakeArch(12, 0, false, kSmem99KB),   // RTX PRO 6000, RTX 50xx
      MakeArch(12, 0, true, kSmem99KB),   MakeArch(12, 1, false, kSmem99KB),  // GB10
      MakeArch(12, 1, true, kSmem99KB),
  };
}

std::string SupportedNames() {
  std::vector<absl::string_view> names;
  for (const Arch& arch : SupportedArchs()) names.push_back(arch.name);
  return absl::StrJoin(names, ", ");
}

// Parsing for CheckDeviceArch, which also takes family ("f") names of
// toolkits newer than the table above.
struct ParsedArch {
  int major = 0;
  int minor = 0;
  char suffix = 0;  // 'a', 'f' or 0
};

// "sm_90a" -> {9, 0, 'a'}; "sm_120" -> {12, 0, 0}. The last digit is the
// minor version, as in every sm_XY name.
absl::StatusOr<ParsedArch> ParseArchName(std::string_view arch) {
  absl::string_view rest = absl::StripAsciiWhitespace(AsAbsl(arch));
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "arch: got \"", AsAbsl(arch), "\", expected sm_<major><minor>[a|f] (e.g. sm_89, sm_90a)"));
  };
  if (!absl::ConsumePrefix(&rest, "sm_")) return bad();
  ParsedArch parsed;
  if (!rest.empty() && (rest.back() == 'a' || rest.back() == 'f')) {
    parsed.suffix = rest.back();
    rest.remove_suffix(1);
  }
  int digits = 0;
  if (rest.size() < 2 || rest.size() > 3 || !absl::SimpleAtoi(rest, &digits) ||
      !absl::ascii_isdigit(rest.front())) {
    return bad();
  }
  parsed.major = digits / 10;
  parsed.minor = digits % 10;
  return parsed;
}

// The message tail that tells the user what to ask kforge for instead.
std::string DeviceArchHint(int cc_major, int cc_minor) {
  absl::StatusOr<std::string> arch = ArchForComputeCapability(cc_major, cc_minor);
  return arch.ok() ? absl::StrCat("; this device needs kernels built for ", *arch) : "";
}

}  // namespace

const std::vector<Arch>& SupportedArchs() {
  static const std::vector<Arch>* const kArchs = new std::vector<Arch>(BuildSupportedArchs());
  return *kArchs;
}

// Shared memory per SM (the CUDA guide's "shared memory capacity per SM");
// each resident block also takes 1 KB reserved by the driver.
int SmemPerSm(int max_smem_per_block) {
  return max_smem_per_block + 1024;  // 164 / 100 / 228 KB
}

Arch WithSmemCap(Arch arch, int max_smem_per_block) {
  if (max_smem_per_block > 0 && max_smem_per_block < arch.max_smem_per_block) {
    arch.max_smem_per_block = max_smem_per_block;
    arch.smem_per_sm = std::min(arch.smem_per_sm, SmemPerSm(max_smem_per_block));
  }
  return arch;
}

absl::StatusOr<Arch> ParseArch(std::string_view name) {
  // Accept "sm_90a", "SM_90A", "90a" and surrounding spaces; everything maps
  // onto the canonical "sm_<digits>[a]" spelling.
  std::string canonical = absl::AsciiStrToLower(absl::StripAsciiWhitespace(AsAbsl(name)));
  if (!absl::StartsWith(canonical, "sm_")) {
    canonical = absl::StrCat("sm_", canonical);
  }
  for (const Arch& arch : SupportedArchs()) {
    if (arch.name == canonical) return arch;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("arch: got \"", AsAbsl(name), "\", supported ", SupportedNames()));
}

std::string CanonicalArchName(std::string_view name) {
  absl::StatusOr<Arch> arch = ParseArch(name);
  return arch.ok() ? arch->name : std::string(name);
}

absl::Status CheckDeviceArch(std::string_view arch, int cc_major, int cc_minor) {
  // ParseArch's spellings ("90a", "SM_90A") first; "f" names it does not
  // list are parsed as given.
  absl::StatusOr<ParsedArch> parsed = ParseArchName(CanonicalArchName(arch));
  if (!parsed.ok()) return parsed.status();
  const bool exact = parsed->major == cc_major && parsed->minor == cc_minor;
  std::string rule;
  if (parsed->suffix == 'a') {
    if (exact) return absl::OkStatus();
    rule = absl::StrFormat("arch-specific code runs only on compute capability %d.%d",
                           parsed->major, parsed->minor);
  } else {
    if (parsed->major == cc_major && cc_minor >= parsed->minor) {
      return absl::OkStatus();
    }
    rule = absl::StrFormat("it runs on compute capability %d.%d to %d.9 only", parsed->major,
                           parsed->minor, parsed->major);
  }
  return absl::FailedPreconditionError(
      absl::StrFormat("kernel built for %s cannot run on a compute capability %d.%d device (%s%s)",
                      arch, cc_major, cc_minor, rule, DeviceArchHint(cc_major, cc_minor)));
}

absl::StatusOr<std::string> ArchForComputeCapability(int cc_major, int cc_minor) {
  struct Row {
    int major, minor;
    const char* arch;
  };
  // Matches SupportedArchs above, preferring "a" variants.
  static constexpr Row kRows[] = {
      {8, 0, "sm_80"},    {8, 6, "sm_86"},    {8, 9, "sm_89"},    {9, 0, "sm_90a"},
      {10, 0, "sm_100a"}, {10, 3, "sm_103a"}, {12, 0, "sm_120a"}, {12, 1, "sm_121a"},
  };
  std::vector<std::string> known;
  for (const Row& row : kRows) {
    if (row.major == cc_major && row.minor == cc_minor) return std::string(row.arch);
    known.push_back(absl::StrFormat("%d.%d", row.major, row.minor));
  }
  return absl::FailedPreconditionError(
      absl::StrFormat("compute capability %d.%d: kforge builds kernels for %s only", cc_major,
                      cc_minor, absl::StrJoin(known, ", ")));
}

}  // namespace kforge
