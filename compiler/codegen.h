#ifndef KFORGE_COMPILER_CODEGEN_H_
#define KFORGE_COMPILER_CODEGEN_H_

#include <string>

#include "absl/status/statusor.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/arch.h"
#include "templates/kforge/sparse_mla/config.h"

namespace kforge {

// Entry points every sparse MLA module exports (extern "C", so unmangled).
inline constexpr char kMainEntry[] = "sparse_mla_decode_main";
inline constexpr char kCombineEntry[] = "sparse_mla_decode_combine";

// Picks the CTA shape for a valid spec on an arch: the largest head tile
// whose pipeline fits the arch's shared memory, heads spread evenly over the
// fewest groups so each group is padded by less than one 16-row MMA tile.
absl::StatusOr<v1::KernelTiling> ChooseTiling(const v1::AttentionSpec& spec, const Arch& arch);

// How to launch a module built with `tiling` (see LaunchRule in
// artifact.proto).
v1::LaunchRule MakeLaunchRule(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling,
                              const Arch& arch);

// Readable, deterministic name built from every kernel-changing parameter,
// e.g. sparse_mla_decode_h8_d512r64_topk2048_bf16_pb64_sc0p0625_lse_sm120a.
std::string ModuleName(const v1::AttentionSpec& spec, const Arch& arch);

// The instantiation unit handed to NVRTC: includes, one traits struct with
// the spec's validated numbers, and the two extern "C" entry points.
std::string GenerateSource(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling);

// The main kernel's compile-time shape for a spec and a tiling: the input of
// the tiling rule and the shared-memory layout in
// templates/kforge/sparse_mla/config.h (CheckDecodeTiling,
// MakeDecodeSmemLayout), which DecodeTraits evaluates on the device too.
sparse_mla::DecodeShape DecodeShapeFor(const v1::AttentionSpec& spec,
                                       const v1::KernelTiling& tiling);

// Shared memory the main kernel needs for a tiling (bytes):
// MakeDecodeSmemLayout(DecodeShapeFor(spec, tiling)).bytes.
int DecodeSmemBytesFor(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling);

}  // namespace kforge

#endif  // KFORGE_COMPILER_CODEGEN_H_
