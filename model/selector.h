#ifndef KFORGE_MODEL_SELECTOR_H_
#define KFORGE_MODEL_SELECTOR_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kforge/v1/service.pb.h"
#include "kforge/v1/spec.pb.h"

namespace kforge {

// The GPU a manifest is evaluated for.
struct DeviceInfo {
  std::string arch;  // "sm_90a", "sm_120a", ...
  int sm_count = 0;
  // 0: the launch rule's split count. Otherwise that many splits, 1..
  // MaxSplits (model/launch.h), for tests and sweeps that must exercise the
  // combine kernel at a given count; InvalidArgument outside that range.
  int forced_num_splits = 0;
  // Thread-block clusters of the module's 16-CTA cluster entries
  // (SmallBatchPath.cluster_entry, ClusterPath.wide_entry) the device runs
  // at once, as the loader read it (cuOccupancyMaxActiveClusters; 7 on the
  // H200); 0: unknown, or the device cannot run them, so neither is chosen.
  int max_active_clusters = 0;
};

// One decode call's shape.
struct RuntimeShape {
  int batch = 0;
  int s_q = 0;
  int num_q_heads = 0;
  int topk = 0;
  v1::KvCacheDtype kv_dtype = v1::KV_CACHE_DTYPE_UNSPECIFIED;
  int page_block_size = 0;
};

// The chosen variant and how to launch it (see LaunchRule in artifact.proto).
struct Selection {
  int variant_index = -1;                        // into manifest.variants()
  const v1::ManifestVariant* variant = nullptr;  // points into the manifest
  // The variant's small-batch path (v1::SmallBatchPath) was chosen: its
  // entry, tiling and launch rule give everything below.
  bool small_batch = false;
  // main_entry is a cluster entry (the small-batch path's or the throughput
  // tiling's, v1::ClusterPath): the num_splits CTAs of a cluster merge in
  // the kernel, so no combine and no workspace.
  bool cluster = false;
  const std::string* main_entry = nullptr;  // the main kernel to launch (into the manifest)
  const v1::LaunchRule* launch = nullptr;   // its launch rule (into the manifest)
  int num_tokens = 0;                       // batch * s_q
  int num_splits = 1;
  int tokens_per_split = 0;                     // DecodeParams.tokens_per_split
  uint32_t grid_x = 0, grid_y = 0, grid_z = 0;  // head groups, splits, tokens
  uint32_t block_threads = 0;
  uint32_t dynamic_smem_bytes = 0;
  bool needs_combine = false;  // num_splits > 1 and not cluster
  // Launch both kernels with programmatic stream serialization
  // (LaunchesProgrammatically in model/arch.h).
  bool programmatic = false;
  uint32_t combine_grid_x = 0, combine_grid_y = 0, combine_block_threads = 0;
  int combine_column_slices = 0;  // warps per (token, head); 0 without combine
  uint64_t workspace_bytes = 0;   // 0 when !needs_combine
};

// Walks manifest.choice_order() (variant order when it is empty) and picks
// the first variant whose spec supports the shape exactly (heads, KV
// dtype, topk, page size) and whose manifest arch is the device's; then
// evaluates its launch rule for batch * s_q tokens on device.sm_count SMs.
// InvalidArgument naming the field for a bad shape, device or manifest;
// NotFound with a report (required features, what each variant supports and
// which features it misses) when nothing fits.
absl::StatusOr<Selection> Select(const v1::Manifest& manifest, const DeviceInfo& device,
                                 const RuntimeShape& shape);

// The manifest's first choice: variants(choice_order(0)), or variants(0)
// when the choice order is empty or out of range. The manifest must have a
// variant. Every variant serves the same model, so its spec stands for it.
const v1::ManifestVariant& FirstChoice(const v1::Manifest& manifest);

// Multi-line readable description of a selection (for `kforge select`).
std::string DescribeSelection(const Selection& selection);

}  // namespace kforge

#endif  // KFORGE_MODEL_SELECTOR_H_
