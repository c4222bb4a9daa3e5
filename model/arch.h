#ifndef KFORGE_MODEL_ARCH_H_
#define KFORGE_MODEL_ARCH_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kforge {

// A GPU target kforge can compile for, with the limits the codegen tiles by.
struct Arch {
  std::string name;  // canonical: "sm_80", "sm_90a", "sm_120a"
  int major = 0;     // compute capability major
  int minor = 0;     // compute capability minor
  bool arch_specific = false;  // the "a" suffix (wgmma, tcgen05, ...)
  // Largest dynamic shared memory one block may opt into
  // (cudaDevAttrMaxSharedMemoryPerBlockOptin), in bytes.
  int max_smem_per_block = 0;
  // Shared memory of one SM, shared by its resident blocks (bytes).
  int smem_per_sm = 0;
  // Driver-reserved shared memory per resident block (bytes).
  static constexpr int kReservedSmemPerBlock = 1024;
  int sm_version() const { return major * 10 + minor; }
};

// Parses "sm_90a", "90a", "sm_120a", ... Unknown or unsupported targets give
// FailedPrecondition listing the supported ones.
absl::StatusOr<Arch> ParseArch(std::string_view name);

// The canonical name when `name` parses ("90a" -> "sm_90a"), else `name`
// as given, so that any accepted spelling compares equal to the canonical
// one and an unknown one is reported as the mismatch it is.
std::string CanonicalArchName(std::string_view name);

// Every target kforge builds for, in ascending order.
const std::vector<Arch>& SupportedArchs();

}  // namespace kforge

#endif  // KFORGE_MODEL_ARCH_H_
