#ifndef KFORGE_MODEL_ARTIFACT_CHECK_H_
#define KFORGE_MODEL_ARTIFACT_CHECK_H_

#include <string_view>

#include "absl/status/status.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/service.pb.h"

namespace kforge {

// OK when `artifact` is the kernel `variant` names for `arch`: same key,
// module, arch, entry points and parameter sizes, a non-empty cubin whose
// inspected arch is `arch` and which exports both entries. Otherwise
// DataLoss naming the first mismatch (a server or bundle answered with
// something else).
// The manifest variant a compiled artifact is: its module, key, spec,
// tiling, launch rule and entry names.
v1::ManifestVariant VariantOfArtifact(const v1::KernelArtifact& artifact);

absl::Status CheckArtifactForVariant(const v1::ManifestVariant& variant, std::string_view arch,
                                     const v1::KernelArtifact& artifact);

}  // namespace kforge

#endif  // KFORGE_MODEL_ARTIFACT_CHECK_H_
