#ifndef KFORGE_MODEL_LAUNCH_PLAN_H_
#define KFORGE_MODEL_LAUNCH_PLAN_H_

// The selector's and the decode plan's answers as data (v1::LaunchPlan), for
// callers in other languages (capi/kforge_capi.h) and for tests that compare
// plans across them; and a manifest for a single compiled kernel, so a
// module written by `kforge compile` is selected and planned like any other.

#include "absl/status/statusor.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/service.pb.h"
#include "model/decode_plan.h"
#include "model/selector.h"

namespace kforge {

// Every field but the parameter blocks (main_params, combine_params empty).
v1::LaunchPlan ToLaunchPlan(const Selection& selection);

// The selection's fields plus both parameter blocks as the bytes of
// sparse_mla::DecodeParams / CombineParams (combine_params only with a
// combine).
v1::LaunchPlan ToLaunchPlan(const DecodeLaunch& launch);

// A manifest with `artifact` as its only variant (choice order [0],
// sm_count 0), built from what the artifact records (spec, tiling, launch
// rule, entries). InvalidArgument when the artifact lacks a key, module
// name, arch or entry.
absl::StatusOr<v1::Manifest> ManifestForArtifact(const v1::KernelArtifact& artifact);

}  // namespace kforge

#endif  // KFORGE_MODEL_LAUNCH_PLAN_H_
