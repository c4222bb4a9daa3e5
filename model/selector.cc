#include "model/selector.h"

#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/absl_compat.h"
#include "model/arch.h"
#include "model/launch.h"
#include "model/spec.h"
#include "templates/kforge/sparse_mla/common/params.h"
#include "templates/kforge/sparse_mla/common/tiling.h"

namespace kforge {
namespace {

// CUDA's limit on gridDim.y and gridDim.z.
constexpr long long kMaxGridYZ = 65535;

absl::Status Invalid(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(AsAbsl(field), ": ", AsAbsl(why)));
}

absl::Status ValidateInputs(const v1::Manifest& manifest, const DeviceInfo& device,
                            const RuntimeShape& shape) {
  if (device.arch.empty()) return Invalid("device.arch", "empty");
  if (device.sm_count < 1) {
    return Invalid("device.sm_count", absl::StrCat("must be >= 1, got ", device.sm_count));
  }
  if (device.max_active_clusters < 0) {
    return Invalid("device.max_active_clusters",
                   absl::StrCat("must be >= 0, got ", device.max_active_clusters));
  }
  struct Positive {
    const char* name;
    int value;
  };
  for (const Positive& p :
       {Positive{"batch", shape.batch}, Positive{"s_q", shape.s_q},
        Positive{"num_q_heads", shape.num_q_heads}, Positive{"topk", shape.topk},
        Positive{"page_block_size", shape.page_block_size}}) {
    if (p.value < 1) {
      return Invalid(absl::StrCat("shape.", p.name), absl::StrCat("must be >= 1, got ", p.value));
    }
  }
  if (shape.kv_dtype == v1::KV_CACHE_DTYPE_UNSPECIFIED ||
      !v1::KvCacheDtype_IsValid(shape.kv_dtype)) {
    return Invalid("shape.kv_dtype",
                   absl::StrCat("must be a KvCacheDtype value (bf16 = 1, ...), got ",
                                static_cast<int>(shape.kv_dtype)));
  }
  const long long tokens = static_cast<long long>(shape.batch) * shape.s_q;
  if (tokens > kMaxGridYZ) {
    return Invalid("shape.batch",
                   absl::StrCat("batch * s_q = ", tokens, " exceeds the grid limit ", kMaxGridYZ));
  }
  for (int i = 0; i < manifest.choice_order_size(); ++i) {
    if (manifest.choice_order(i) >= static_cast<uint32_t>(manifest.variants_size())) {
      return Invalid(absl::StrCat("manifest.choice_order[", i, "]"),
                     absl::StrCat(manifest.choice_order(i), " is out of range (",
                                  manifest.variants_size(), " variants)"));
    }
  }
  return absl::OkStatus();
}

std::string Supports(const v1::Manifest& m, const v1::KernelSpec& spec) {
  if (!spec.has_sparse_mla_decode()) {
    return absl::StrFormat("arch %s, kind %s", m.arch(), KindCaseName(spec));
  }
  const v1::AttentionSpec& s = spec.sparse_mla_decode();
  return absl::StrFormat("arch %s, heads %d, dtype %s, topk %d, page size %d", m.arch(),
                         s.num_q_heads(), KvDtypeName(s.kv_cache_dtype()), s.topk(),
                         s.page_block_size());
}

// Names of the features a variant's spec (in a manifest for
// `manifest_arch`) lacks.
std::vector<std::string> Missing(const std::string& manifest_arch, const v1::KernelSpec& spec,
                                 const std::string& device_arch, const RuntimeShape& shape) {
  std::vector<std::string> missing;
  auto num = [&](const char* name, long long want, long long has) {
    if (want != has) {
      missing.push_back(absl::StrFormat("%s=%d (supports %d)", name, want, has));
    }
  };
  if (manifest_arch != device_arch) {
    missing.push_back(absl::StrFormat("arch %s (is %s)", device_arch, manifest_arch));
  }
  if (!spec.has_sparse_mla_decode()) {
    // Another family's module (the indexer's is launched from its own
    // IndexerLaunch), never selected for decode.
    missing.push_back(absl::StrCat("kind sparse_mla_decode (is ", KindCaseName(spec), ")"));
    return missing;
  }
  const v1::AttentionSpec& s = spec.sparse_mla_decode();
  num("heads", shape.num_q_heads, s.num_q_heads());
  if (shape.kv_dtype != s.kv_cache_dtype()) {
    missing.push_back(absl::StrFormat("dtype=%s (supports %s)", KvDtypeName(shape.kv_dtype),
                                      KvDtypeName(s.kv_cache_dtype())));
  }
  num("topk", shape.topk, s.topk());
  num("page_size", shape.page_block_size, s.page_block_size());
  return missing;
}

uint32_t CeilDiv(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

// A cluster entry's size is compiled into it (tiling.h `constant`): a
// manifest that says another is refused by name rather than launched with
// a grid that merges wrongly. An empty entry (none) passes; the message
// names the field, not the manifest's entry string.
absl::Status CheckCompiledSplits(int index, std::string_view field, const std::string& entry,
                                 uint32_t splits, int compiled, std::string_view constant) {
  if (entry.empty() || splits == static_cast<uint32_t>(compiled)) return absl::OkStatus();
  return Invalid(
      absl::StrCat("manifest.variants[", index, "].", AsAbsl(field)),
      absl::StrCat("got ", splits, "; its cluster entry is compiled for ", compiled,
                   " (templates/kforge/sparse_mla/common/tiling.h ", AsAbsl(constant), ")"));
}

}  // namespace

absl::StatusOr<Selection> Select(const v1::Manifest& manifest, const DeviceInfo& device,
                                 const RuntimeShape& shape) {
  if (absl::Status s = ValidateInputs(manifest, device, shape); !s.ok()) return s;
  const std::string device_arch = CanonicalArchName(device.arch);
  // An unknown arch fits no variant (Missing says so), so false is moot.
  const absl::StatusOr<Arch> parsed_arch = ParseArch(device_arch);
  const bool programmatic = parsed_arch.ok() && LaunchesProgrammatically(*parsed_arch);
  const std::string manifest_arch = CanonicalArchName(manifest.arch());

  std::vector<int> order;
  for (uint32_t i : manifest.choice_order()) order.push_back(static_cast<int>(i));
  if (order.empty()) {
    for (int i = 0; i < manifest.variants_size(); ++i) order.push_back(i);
  }

  // Variants that do not fit and what each lacks, for the report; it is
  // formatted only when nothing fits (a decode call plans on every launch).
  std::vector<std::pair<int, std::vector<std::string>>> misfits;
  for (int index : order) {
    const v1::ManifestVariant& v = manifest.variants(index);
    std::vector<std::string> missing = Missing(manifest_arch, v.spec(), device_arch, shape);
    if (!missing.empty()) {
      misfits.emplace_back(index, std::move(missing));
      continue;
    }
    const v1::AttentionSpec& spec = v.spec().sparse_mla_decode();  // Missing checked the case
    const int num_tokens = shape.batch * shape.s_q;
    // The small-batch path (v1::SmallBatchPath) up to its max_tokens.
    const bool small = !v.small_batch().entry().empty() &&
                       static_cast<uint32_t>(num_tokens) <= v.small_batch().max_tokens();
    const v1::KernelTiling& tiling = small ? v.small_batch().tiling() : v.tiling();
    const v1::LaunchRule& launch = small ? v.small_batch().launch() : v.launch();
    // The cluster entries the chosen path may take.
    const v1::ClusterPath& c = v.cluster();
    if (small) {
      if (absl::Status s = CheckCompiledSplits(
              index, "small_batch.cluster_splits", v.small_batch().cluster_entry(),
              v.small_batch().cluster_splits(), sparse_mla::kClusterSplits, "kClusterSplits");
          !s.ok()) {
        return s;
      }
    } else {
      if (absl::Status s =
              CheckCompiledSplits(index, "cluster.splits", c.entry(), c.splits(),
                                  sparse_mla::kMainClusterSplits, "kMainClusterSplits");
          !s.ok()) {
        return s;
      }
      if (absl::Status s =
              CheckCompiledSplits(index, "cluster.wide_splits", c.wide_entry(), c.wide_splits(),
                                  sparse_mla::kClusterSplits, "kClusterSplits");
          !s.ok()) {
        return s;
      }
    }
    if (tiling.num_head_groups() == 0 || launch.block_threads() == 0) {
      return Invalid(absl::StrCat("manifest.variants[", index, "]", small ? ".small_batch" : ""),
                     "tiling.num_head_groups and launch.block_threads must be > 0");
    }
    // A crossover tiling's main entry is compiled as 2-CTA clusters over
    // head groups: an odd count cannot launch.
    if (!small && tiling.crossover() && tiling.num_head_groups() % 2 != 0) {
      return Invalid(
          absl::StrCat("manifest.variants[", index, "].tiling"),
          absl::StrCat("crossover needs an even num_head_groups, got ", tiling.num_head_groups()));
    }
    Selection sel;
    sel.variant_index = index;
    sel.variant = &v;
    sel.small_batch = small;
    sel.main_entry = small ? &v.small_batch().entry() : &v.main_entry();
    sel.launch = &launch;
    sel.num_tokens = num_tokens;
    if (device.forced_num_splits != 0) {
      const int max_splits = MaxSplits(spec, launch);
      if (device.forced_num_splits < 1 || device.forced_num_splits > max_splits) {
        return Invalid("device.forced_num_splits",
                       absl::StrCat("got ", device.forced_num_splits, ", supported 1..", max_splits,
                                    " for ", v.module_name()));
      }
      sel.num_splits = device.forced_num_splits;
    } else {
      sel.num_splits = NumSplits(spec, tiling, launch, sel.num_tokens, device.sm_count);
      // The cluster entry (SmallBatchPath.cluster_entry) replaces the split
      // and the combine where the rule splits exactly cluster_splits ways
      // (fewer splits in a cluster cost more than the combine) and its
      // clusters fit the device at once (clusters that wait for a second
      // wave lost to split + combine; BENCH.md "splits merged inside the
      // kernel"). A forced split count always runs split + combine.
      const uint32_t cluster = v.small_batch().cluster_splits();
      if (small && !v.small_batch().cluster_entry().empty() &&
          static_cast<uint32_t>(sel.num_splits) == cluster &&
          static_cast<long long>(tiling.num_head_groups()) * num_tokens <=
              device.max_active_clusters) {
        sel.cluster = true;
        sel.main_entry = &v.small_batch().cluster_entry();
        sel.num_splits = static_cast<int>(cluster);
      }
      // The throughput tiling's cluster entry (v1::ClusterPath) where the
      // rule splits exactly its ways: a portable size, which the one-wave
      // rule behind num_splits already fits.
      if (!small && !v.cluster().entry().empty() &&
          static_cast<uint32_t>(sel.num_splits) == v.cluster().splits()) {
        sel.cluster = true;
        sel.main_entry = &v.cluster().entry();
      }
      // Its wide cluster entry where the rule splits exactly wide_splits
      // ways and, a non-portable size, the clusters fit the device at once
      // (as the small-batch cluster entry).
      if (!small && !v.cluster().wide_entry().empty() &&
          static_cast<uint32_t>(sel.num_splits) == v.cluster().wide_splits() &&
          static_cast<long long>(tiling.num_head_groups()) * num_tokens <=
              device.max_active_clusters) {
        sel.cluster = true;
        sel.main_entry = &v.cluster().wide_entry();
      }
    }
    // Split + combine launches no split without keys: the rule's count can
    // leave the last ones empty (glm-5 TP8 x batch 10: 13 splits of 3 of
    // the 32 tiles, 11 of them holding keys). Empty splits cost time (BENCH.md
    // "the split rule at small batch"). Cluster entries keep their compiled
    // split count, forced counts their own.
    if (!sel.cluster && device.forced_num_splits == 0) {
      sel.num_splits = SplitsHoldingKeys(spec, launch, sel.num_splits);
    }
    sel.tokens_per_split = TokensPerSplit(spec, launch, sel.num_splits);
    if (sel.num_splits > kMaxGridYZ) {
      return absl::InternalError(
          absl::StrCat("split count ", sel.num_splits, " exceeds the grid limit"));
    }
    sel.grid_x = tiling.num_head_groups();
    sel.grid_y = static_cast<uint32_t>(sel.num_splits);
    sel.grid_z = static_cast<uint32_t>(sel.num_tokens);
    sel.block_threads = launch.block_threads();
    sel.dynamic_smem_bytes = launch.dynamic_smem_bytes();
    sel.needs_combine = sel.num_splits > 1 && !sel.cluster;
    sel.programmatic = programmatic;
    if (sel.needs_combine) {
      const uint32_t warps = launch.combine_block_threads() / 32;
      if (warps == 0) {
        return Invalid(absl::StrCat("manifest.variants[", index, "]"),
                       "launch.combine_block_threads must be >= 32");
      }
      sel.combine_grid_x = static_cast<uint32_t>(sel.num_tokens);
      // One warp per (token, head, column slice): templates' params.h.
      sel.combine_column_slices =
          sparse_mla::CombineColumnSlices(static_cast<int>(spec.kv_lora_rank()), sel.num_tokens,
                                          static_cast<int>(spec.num_q_heads()), device.sm_count);
      sel.combine_grid_y =
          CeilDiv(spec.num_q_heads() * static_cast<uint32_t>(sel.combine_column_slices), warps);
      sel.combine_block_threads = launch.combine_block_threads();
      sel.workspace_bytes = static_cast<uint64_t>(sel.num_splits) *
                            static_cast<uint64_t>(sel.num_tokens) *
                            launch.workspace_bytes_per_split_token();
    }
    return sel;
  }
  std::string report = absl::StrFormat(
      "no kernel variant fits: required arch %s, heads %d, dtype %s, "
      "topk %d, page size %d",
      device_arch, shape.num_q_heads, KvDtypeName(shape.kv_dtype), shape.topk,
      shape.page_block_size);
  if (order.empty()) absl::StrAppend(&report, "\n  (the manifest has no variants)");
  for (const auto& [index, missing] : misfits) {
    const v1::ManifestVariant& v = manifest.variants(index);
    absl::StrAppend(&report, "\n  variant ", index, " ", v.module_name(), ": supports ",
                    Supports(manifest, v.spec()), "; missing ", absl::StrJoin(missing, ", "));
  }
  return absl::NotFoundError(report);
}

std::string DescribeSelection(const Selection& sel) {
  const v1::ManifestVariant& v = *sel.variant;
  const v1::AttentionSpec& spec = v.spec().sparse_mla_decode();  // Select chose it
  std::string out = absl::StrFormat(
      "variant %d: %s\n"
      "  key            %s\n"
      "  supports       heads %d, dtype %s, topk %d, page size %d\n"
      "  tokens         %d (batch * s_q)\n"
      "  splits         %d (%d keys each)\n"
      "  main           %s%s%s grid (%u, %u, %u) block %u dynamic smem %u B\n",
      sel.variant_index, v.module_name(), v.key(), spec.num_q_heads(),
      KvDtypeName(spec.kv_cache_dtype()), spec.topk(), spec.page_block_size(), sel.num_tokens,
      sel.num_splits, sel.tokens_per_split,
      sel.main_entry != nullptr ? *sel.main_entry : v.main_entry(),
      sel.small_batch ? " (small-batch path)" : "",
      sel.cluster
          ? absl::StrFormat(" (clusters of %d splits, merged in the kernel)", sel.num_splits)
          : std::string(),
      sel.grid_x, sel.grid_y, sel.grid_z, sel.block_threads, sel.dynamic_smem_bytes);
  if (sel.needs_combine) {
    absl::StrAppend(&out, absl::StrFormat("  combine        %s grid (%u, %u) block %u\n"
                                          "  workspace      %u B\n",
                                          v.combine_entry(), sel.combine_grid_x, sel.combine_grid_y,
                                          sel.combine_block_threads, sel.workspace_bytes));
  } else {
    absl::StrAppend(&out,
                    sel.cluster ? "  combine        none (merged in the cluster)\n"
                                : "  combine        none (one split)\n",
                    "  workspace      0 B\n");
  }
  return out;
}

const v1::ManifestVariant& FirstChoice(const v1::Manifest& manifest) {
  const bool in_range = manifest.choice_order_size() > 0 &&
                        manifest.choice_order(0) < static_cast<uint32_t>(manifest.variants_size());
  return manifest.variants(in_range ? static_cast<int>(manifest.choice_order(0)) : 0);
}

}  // namespace kforge
