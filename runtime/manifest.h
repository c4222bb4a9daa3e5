#ifndef KFORGE_RUNTIME_MANIFEST_H_
#define KFORGE_RUNTIME_MANIFEST_H_

#include <cstdint>
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

}  // namespace kforge

#endif  // KFORGE_RUNTIME_MANIFEST_H_
