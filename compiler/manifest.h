#ifndef KFORGE_COMPILER_MANIFEST_H_
#define KFORGE_COMPILER_MANIFEST_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "compiler/compiler.h"
#include "kforge/v1/service.pb.h"
#include "kforge/v1/spec.pb.h"

namespace kforge {

// The selection manifest for a spec on an arch: the kernel variants that
// serve it (today one: the spec's own kernel, which serves any s_q), each
// with its normalized spec, key, tiling, launch rule and entry names, and
// the choice order. The split count is not evaluated here: the selector
// does it for the GPU it runs on (model/launch.h). Plans only (no compile,
// no cache): errors are the compiler's Plan errors.
// The manifest variant of one planned kernel: what a client checks the
// kernel it is served against (model::CheckArtifactForVariant), and what
// the server checks a kernel from its cache tiers against before serving it.
v1::ManifestVariant VariantOfPlan(const CompilePlan& plan);

absl::StatusOr<v1::Manifest> BuildManifest(const KernelCompiler& compiler,
                                           const v1::KernelSpec& spec, std::string_view arch);

}  // namespace kforge

#endif  // KFORGE_COMPILER_MANIFEST_H_
