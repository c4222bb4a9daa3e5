#ifndef KFORGE_MODEL_ARCH_H_
#define KFORGE_MODEL_ARCH_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kforge {

// A GPU target kforge can compile for, with the limits the codegen tiles by.
struct Arch {
  std::string name;            // canonical: "sm_80", "sm_90a", "sm_120a"
  int major = 0;               // compute capability major
  int minor = 0;               // compute capability minor
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

// Shared memory of an SM whose blocks may opt into max_smem_per_block bytes
// (the arch table's relation: 164 / 100 / 228 KB).
int SmemPerSm(int max_smem_per_block);

// `arch` standing in for a part with at most max_smem_per_block per block
// (kforge compile --max-smem-per-block: 101376 runs sm_120's 99 KB tilings
// on an H200): both the per-block limit and the SM's capacity are that
// part's, so tilings and resident-CTA counts are too. 0 or a larger value
// leaves `arch` as it is.
Arch WithSmemCap(Arch arch, int max_smem_per_block);

// Parses "sm_90a", "90a", "sm_120a", ... Unknown or unsupported targets give
// FailedPrecondition listing the supported ones.
absl::StatusOr<Arch> ParseArch(std::string_view name);

// The canonical name when `name` parses ("90a" -> "sm_90a"), else `name`
// as given, so that any accepted spelling compares equal to the canonical
// one and an unknown one is reported as the mismatch it is.
std::string CanonicalArchName(std::string_view name);

// Whether kernels built for `arch` are launched with programmatic stream
// serialization (sm_90+: the templates' ptx::WaitForPriorGrids and
// AllowDependentLaunch), so each is scheduled while the one before it in
// the stream finishes. The selector puts it in every plan; the loaders only
// read it.
inline bool LaunchesProgrammatically(const Arch& arch) { return arch.major >= 9; }

// Whether the arch has warpgroup MMA (wgmma): sm_90a only (sm_90 lacks the
// arch-specific target, sm_100a has tcgen05 instead).
inline bool HasWgmma(const Arch& arch) { return arch.arch_specific && arch.major == 9; }

// Every target kforge builds for, in ascending order.
const std::vector<Arch>& SupportedArchs();

// Whether a cubin built for `arch` ("sm_80", "sm_90a", "sm_100f", ...) runs
// on a device of compute capability major.minor, by NVIDIA's rules for SASS
// (no PTX is embedded, so nothing is JIT-compiled for a newer device):
//   - "a" (arch-specific, e.g. wgmma in sm_90a) runs only on exactly that
//     compute capability;
//   - "f" (family-specific) and plain targets run on the same major with a
//     minor >= theirs (sm_80 on 8.0/8.6/8.9, never on 9.0: SASS does not
//     carry across majors).
// InvalidArgument for a malformed arch; FailedPrecondition, naming both,
// when the device cannot run it.
absl::Status CheckDeviceArch(std::string_view arch, int cc_major, int cc_minor);

// The arch kforge builds for a device of compute capability major.minor:
// 8.0 -> sm_80, 8.6 -> sm_86, 8.9 -> sm_89, 9.0 -> sm_90a, 10.0 -> sm_100a,
// 10.3 -> sm_103a, 12.0 -> sm_120a, 12.1 -> sm_121a (the arch-specific variant wherever one
// exists: it unlocks wgmma and friends). FailedPrecondition for any other.
absl::StatusOr<std::string> ArchForComputeCapability(int cc_major, int cc_minor);

}  // namespace kforge

#endif  // KFORGE_MODEL_ARCH_H_
