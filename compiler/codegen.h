#ifndef KFORGE_COMPILER_CODEGEN_H_
#define KFORGE_COMPILER_CODEGEN_H_

// The sparse MLA instantiation unit: what the planner chose
// (compiler/schedule.h), written as the CUDA C++ NVRTC compiles.

#include <string>

#include "compiler/schedule.h"
#include "compiler/unit.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/arch.h"

namespace kforge {

// Readable, deterministic name built from every kernel-changing parameter,
// e.g. sparse_mla_decode_h8_d512r64_topk2048_bf16_pb64_sc0p0625_lse_sm120a.
std::string ModuleName(const v1::AttentionSpec& spec, const Arch& arch);

// The instantiation unit handed to NVRTC (as the programs of
// GeneratedUnit::Programs): includes, one traits struct with
// the spec's validated numbers, and the two extern "C" entry points; plus a
// second traits struct and the small-batch entry when small.entry is set.
// With cluster.entry set, the throughput tiling's cluster entry too.
// `launch` is the main tiling's rule (MakeLaunchRule): its ctas_per_sm is
// the throughput entries' __launch_bounds__ minimum, small.launch()'s the
// small-batch entries'.
GeneratedUnit GenerateSource(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling,
                             const v1::LaunchRule& launch, const v1::SmallBatchPath& small = {},
                             const v1::ClusterPath& cluster = {});

}  // namespace kforge

#endif  // KFORGE_COMPILER_CODEGEN_H_
