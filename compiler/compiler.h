#ifndef KFORGE_COMPILER_COMPILER_H_
#define KFORGE_COMPILER_COMPILER_H_

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/codegen.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/arch.h"

namespace kforge {

// Everything known about a kernel before NVRTC runs: enough to look it up
// in a cache by key without compiling.
struct CompilePlan {
  v1::KernelSpec spec;  // normalized; a registered family's case
  Arch arch;
  v1::KernelTiling tiling;
  v1::LaunchRule launch;                      // the tiling's (MakeLaunchRule): the unit's
                                              // launch bounds, the artifact's and manifest's rule
  v1::SmallBatchPath small_batch;             // entry empty: none
  v1::ClusterPath cluster;                    // the throughput tiling's; entry empty: none
  std::vector<std::string> schedule_reasons;  // why (PlanSchedule)
  std::string module_name;
  std::string source;  // the instantiation unit, whole
  // What NVRTC compiles: the unit's entries in groups, one program and one
  // cubin image each (the first: the main entry's), compiled in parallel.
  std::vector<ProgramUnit> programs;
  std::vector<std::string> options;
  std::string key;
};

// Knobs that change what Plan produces (each one is part of the key).
struct PlanOptions {
  // When > 0, tile as if the arch allowed only this much shared memory per
  // block. Lets the 99 KB pipeline of sm_86/89/120 run on a 227 KB H200,
  // where its logic can be checked against a reference.
  int max_smem_per_block = 0;
  // When set, this CTA shape instead of the planner's (tuning sweeps); the
  // module name gains _tH_T_S_W.
  TilingRequest tiling;
};

// The spec -> codegen -> NVRTC -> inspection pipeline. Stateless and
// thread-safe.
class KernelCompiler {
 public:
  // Validates the spec (InvalidArgument naming the field) and the arch
  // (FailedPrecondition), chooses the tiling and computes the cache key.
  absl::StatusOr<CompilePlan> Plan(const v1::KernelSpec& spec, std::string_view arch,
                                   const PlanOptions& options = {}) const;

  // Compiles a plan and inspects the cubin. Internal with the NVRTC log on a
  // compile error; Internal if the cubin's arch or entries are not the ones
  // asked for. With `first`: the programs of FirstAnswerPrograms are
  // compiled first, and `first` gets their artifact (partial set) on the
  // thread that finished the last of them, while the rest compile; not
  // called where the module has no smaller answer or one of them failed.
  using FirstAnswerSink = std::function<void(v1::KernelArtifact)>;
  absl::StatusOr<v1::KernelArtifact> Build(const CompilePlan& plan,
                                           const FirstAnswerSink& first = nullptr) const;

  // Plan + Build.
  absl::StatusOr<v1::KernelArtifact> Compile(const v1::KernelSpec& spec, std::string_view arch,
                                             const PlanOptions& options = {}) const;
};

// The programs a first answer (KernelArtifact.partial) is made of: those
// holding the main and combine entries (an indexer: logits and top-k), in
// the plan's order. Empty where that is every program.
std::vector<size_t> FirstAnswerPrograms(const CompilePlan& plan);

// "0.1.0": project()'s VERSION in CMakeLists.txt.
std::string KforgeVersion();

// "kforge 0.1.0 / nvrtc 13.0".
std::string CompilerVersion();

// The artifact as indented JSON, without the cubin bytes (the description
// written beside a .cubin).
std::string ArtifactDescriptionJson(const v1::KernelArtifact& artifact);

// Writes an artifact as files: BASE.cubin (image 0), BASE.cubin.<i> for
// each of more_cubins (i from 1: a glob of *.cubin still finds one file a
// module), then BASE.json (the description), each atomically; then removes
// any BASE.cubin.<i> past the last image (left by an earlier module of the
// name). What `kforge compile` and `kforge get -o` write; the Python
// package's Kernel.from_files reads them back.
absl::Status WriteArtifactFiles(const std::string& base, const v1::KernelArtifact& artifact);

}  // namespace kforge

#endif  // KFORGE_COMPILER_COMPILER_H_
