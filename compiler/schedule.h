#ifndef KFORGE_COMPILER_SCHEDULE_H_
#define KFORGE_COMPILER_SCHEDULE_H_

// The sparse MLA planner: which schedule a spec gets on an arch, and why.
// PlanSchedule is the one entry: it picks the throughput tiling (head
// groups, CTA shape, pipeline, MMA), the small-batch path, the cluster
// entries and the launch rule, and says why at each choice. What fits is
// decided by the tiling rule the kernels assert
// (templates/kforge/sparse_mla/common/tiling.h); what is faster among fitting
// choices comes from the arch's tuning table (compiler/tuning.h).
//
// The pipelines (v1::Pipeline, docs/KERNEL.md "Pipelines"):
//   LOCKSTEP          every tiling that is none of the below
//   REGISTER          a quantised format's 16-head tile (stages 1)
//   WARP_SPECIALIZED  sm_90a wgmma tilings of formats the tuning table
//                     marks warp_specialized (a producer warpgroup)
//   CROSSOVER_PAIR    the same, as 2-CTA clusters over paired head groups,
//                     for formats marked crossover where the groups pair up

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/arch.h"
#include "templates/kforge/sparse_mla/common/tiling.h"

namespace kforge {

// Entry points a sparse MLA module exports (extern "C", so unmangled).
inline constexpr char kMainEntry[] = "sparse_mla_decode_main";
inline constexpr char kCombineEntry[] = "sparse_mla_decode_combine";
// The small-batch main kernel (v1::SmallBatchPath), where a module has one.
inline constexpr char kSmallBatchEntry[] = "sparse_mla_decode_small";
// The small-batch tiling as a thread-block cluster of the splits, merged in
// the kernel (v1::SmallBatchPath.cluster_entry; sm_90+ only).
inline constexpr char kClusterEntry[] = "sparse_mla_decode_cluster";
// The throughput tiling as a cluster of kMainClusterSplits splits
// (v1::ClusterPath; sm_90a and sm_100a).
inline constexpr char kMainClusterEntry[] = "sparse_mla_decode_main_cluster";
// The warp-specialised throughput tiling as a cluster of kClusterSplits
// splits (v1::ClusterPath.wide_entry; sm_90a).
inline constexpr char kMainWideClusterEntry[] = "sparse_mla_decode_main_wide_cluster";

// A CTA shape asked for by hand (`kforge compile --tiling`), so a sweep can
// measure shapes the planner does not pick. All zero: none.
struct TilingRequest {
  int head_tile = 0;
  int token_tile = 0;
  int stages = 0;
  int warps = 0;
  bool empty() const { return head_tile == 0 && token_tile == 0 && stages == 0 && warps == 0; }
};

// What the planner decided for one spec on one arch.
struct Schedule {
  v1::KernelTiling tiling;           // the throughput tiling (pipeline, mma named)
  v1::LaunchRule launch;             // its launch rule
  v1::SmallBatchPath small_batch;    // entry empty: none
  v1::ClusterPath cluster;           // entries empty: none
  std::vector<std::string> reasons;  // one decision a line, in order
};

struct ScheduleOptions {
  TilingRequest tiling;  // a shape asked for by hand: measured alone, no
                         // small-batch path or cluster entries beside it
  // The arch stands in for a smaller part (WithSmemCap): no cluster entries,
  // as that part's modules have none.
  bool smem_capped = false;
};

// The schedule of a valid, normalized sparse MLA spec on `arch`.
// FailedPrecondition when no tiling fits the arch's shared memory;
// InvalidArgument for a requested tiling the rules refuse.
absl::StatusOr<Schedule> PlanSchedule(const v1::AttentionSpec& spec, const Arch& arch,
                                      const ScheduleOptions& options = {});

// A module's schedule and the planner's reasons as text, for people
// (`kforge compile --explain`): the throughput tiling, the small-batch path
// and the cluster entries by name, then one reason a line.
std::string ExplainSchedule(const v1::KernelArtifact& artifact);

// The pieces PlanSchedule is made of, for tests and sweeps. `why`, when
// given, gets the reasons appended.

// The throughput tiling: the largest head tile whose pipeline fits the
// arch's shared memory, heads spread evenly over the fewest groups so each
// group is padded by less than one 16-row MMA tile; pipeline and mma set.
// With a request, that shape if the tiling rule (tiling.h) and the arch's
// shared memory admit it, else InvalidArgument saying which rule refused.
absl::StatusOr<v1::KernelTiling> ChooseTiling(const v1::AttentionSpec& spec, const Arch& arch,
                                              const TilingRequest& request = {},
                                              std::vector<std::string>* why = nullptr);

// The small-batch path for the throughput tiling `main`: a 16-head tile
// (32-head where 16-head clusters would overflow the GPU) used up to
// max_tokens query tokens; entry empty when it would be `main` itself.
v1::SmallBatchPath ChooseSmallBatchPath(const v1::AttentionSpec& spec, const Arch& arch,
                                        const v1::KernelTiling& main,
                                        std::vector<std::string>* why = nullptr);

// The throughput tiling's cluster entries (v1::ClusterPath): sm_90a and
// sm_100a, where the merge buffer fits and every split has a token tile;
// each entry empty otherwise (the 2-split one also for a tiling that is
// warp-specialised only for its crossover pairs; the 16-split one where
// its clusters could not run at once past `small`).
v1::ClusterPath ChooseMainCluster(const v1::AttentionSpec& spec, const Arch& arch,
                                  const v1::KernelTiling& main, const v1::SmallBatchPath& small,
                                  std::vector<std::string>* why = nullptr);

// Whether `path` has either entry (what an artifact and a manifest variant
// then carry).
inline bool HasClusterEntries(const v1::ClusterPath& path) {
  return !path.entry().empty() || !path.wide_entry().empty();
}

// What an entry is compiled for: many resident CTAs (throughput: the main
// kernel and its cluster entry) or registers (latency: the small-batch
// path). MakeLaunchRule says how.
enum class EntryOccupancy { kThroughput, kLatency };

// How to launch a module built with `tiling` (see LaunchRule in
// artifact.proto); its ctas_per_sm is also the entries' __launch_bounds__
// minimum (GenerateSource).
v1::LaunchRule MakeLaunchRule(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling,
                              const Arch& arch,
                              EntryOccupancy occupancy = EntryOccupancy::kThroughput);

// The tiling's pipeline and MMA by name, from its shape (the one rule; the
// codegen emits the same names).
v1::Pipeline PipelineOf(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling);
inline v1::Mma MmaOf(const v1::KernelTiling& tiling) {
  return tiling.wgmma() ? v1::MMA_WGMMA : v1::MMA_SYNC;
}
// The pipeline an entry compiled with `tiling` runs: the tiling's, except
// that only the paired entry (the main entry) of a crossover tiling runs as
// the pair; its cluster entries run the warp-specialised pipeline unpaired.
// The codegen and the module's entry list both use it.
v1::Pipeline EntryPipeline(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling,
                           bool paired_entry);
// "warp-specialized", "lockstep", ...: the names explain output uses.
const char* PipelineName(v1::Pipeline pipeline);

// The main kernel's compile-time shape for a spec and a tiling: the input of
// the tiling rule and the shared-memory layout in
// templates/kforge/sparse_mla/common/tiling.h (CheckDecodeTiling,
// MakeDecodeSmemLayout), which DecodeTraits evaluates on the device too.
sparse_mla::DecodeShape DecodeShapeFor(const v1::AttentionSpec& spec,
                                       const v1::KernelTiling& tiling);

// Shared memory the main kernel needs for a tiling (bytes):
// MakeDecodeSmemLayout(DecodeShapeFor(spec, tiling)).bytes.
int DecodeSmemBytesFor(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling);

}  // namespace kforge

#endif  // KFORGE_COMPILER_SCHEDULE_H_
