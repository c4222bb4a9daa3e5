#ifndef KFORGE_COMPILER_CODEGEN_H_
#define KFORGE_COMPILER_CODEGEN_H_

#include <string>

#include "absl/status/statusor.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/arch.h"
#include "templates/kforge/sparse_mla/common/tiling.h"

namespace kforge {

// Entry points every sparse MLA module exports (extern "C", so unmangled).
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

// Picks the CTA shape for a valid spec on an arch: the largest head tile
// whose pipeline fits the arch's shared memory, heads spread evenly over the
// fewest groups so each group is padded by less than one 16-row MMA tile.
// With a request, that shape if the tiling rule (config.h) and the arch's
// shared memory admit it, else InvalidArgument saying which rule refused.
absl::StatusOr<v1::KernelTiling> ChooseTiling(const v1::AttentionSpec& spec, const Arch& arch,
                                              const TilingRequest& request = {});

// The module's small-batch path for the throughput tiling `main`: a 16-head
// tile with the deepest token tile that fits (64 tokens x 2 stages x 4
// warps on the H200, 32 on 99 KB parts), used up to max_tokens query tokens
// (BENCH.md 2026-12-01: it beats the 64-head tiling while the grid is small).
// entry empty when it would be `main` itself.
v1::SmallBatchPath ChooseSmallBatchPath(const v1::AttentionSpec& spec, const Arch& arch,
                                        const v1::KernelTiling& main);

// The throughput tiling's cluster entries (v1::ClusterPath): sm_90a and
// sm_100a, where the merge buffer fits and every split has a token tile;
// each entry empty otherwise (the 2-split one also for a tiling that is
// warp-specialised only for its crossover pairs, where the 16-split one
// may still be there; the 16-split one where its clusters could not run
// at once past `small`, the module's ChooseSmallBatchPath).
v1::ClusterPath ChooseMainCluster(const v1::AttentionSpec& spec, const Arch& arch,
                                  const v1::KernelTiling& main, const v1::SmallBatchPath& small);

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

// Readable, deterministic name built from every kernel-changing parameter,
// e.g. sparse_mla_decode_h8_d512r64_topk2048_bf16_pb64_sc0p0625_lse_sm120a.
std::string ModuleName(const v1::AttentionSpec& spec, const Arch& arch);

// The instantiation unit handed to NVRTC: includes, one traits struct with
// the spec's validated numbers, and the two extern "C" entry points; plus a
// second traits struct and the small-batch entry when small.entry is set.
// With cluster.entry set, the throughput tiling's cluster entry too.
// `launch` is the main tiling's rule (MakeLaunchRule): its ctas_per_sm is
// the throughput entries' __launch_bounds__ minimum, small.launch()'s the
// small-batch entries'.
std::string GenerateSource(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling,
                           const v1::LaunchRule& launch, const v1::SmallBatchPath& small = {},
                           const v1::ClusterPath& cluster = {});

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
