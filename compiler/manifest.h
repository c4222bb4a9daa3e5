#ifndef KFORGE_COMPILER_MANIFEST_H_
#define KFORGE_COMPILER_MANIFEST_H_

#include <cstdint>
#include <set>
#include <string_view>

#include "absl/status/statusor.h"
#include "compiler/compiler.h"
#include "kforge/v1/service.pb.h"
#include "kforge/v1/spec.pb.h"

namespace kforge {

// The selection manifest for a spec on an arch: one variant per s_q (1 =
// plain decode, 2..4 = MTP), the asked-for s_q first in choice_order. Each
// variant carries its normalized spec, tiling, launch rule and, when
// sm_count > 0, num_splits for 1, 2, 4, ..., 256 query tokens. Plans only
// (no compile, no cache): errors are the compiler's Plan errors.
absl::StatusOr<v1::Manifest> BuildManifest(const KernelCompiler& compiler,
                                           const v1::AttentionSpec& spec,
                                           std::string_view arch,
                                           uint32_t sm_count);

// The manifest with only the variants whose spec.s_q is in `s_q_values`,
// choice_order remapped to the kept variants in the same relative order.
// A bundle holds exactly the s_q values its deployment matrix names (a
// kernel per s_q costs a compile and disk space, and `kforge warm` builds
// the same set), so its manifests must not list variants it lacks.
// InvalidArgument, naming the manifest's s_q values, when none is kept.
absl::StatusOr<v1::Manifest> KeepQueryLengths(const v1::Manifest& manifest,
                                              const std::set<uint32_t>& s_q_values);

}  // namespace kforge

#endif  // KFORGE_COMPILER_MANIFEST_H_
