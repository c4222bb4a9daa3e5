#include "compiler/codegen.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/launch.h"
#include "model/spec.h"
#include "templates/kforge/sparse_mla/common/kv_layout.h"
#include "templates/kforge/sparse_mla/common/params.h"
#include "templates/kforge/sparse_mla/common/tiling.h"

namespace kforge {
namespace {

struct TileConfig {
  int token_tile;
  int stages;
  int warps;
};

// Candidate pipelines per head tile, best first. Bigger token tiles amortise
// the barriers and the softmax; the smaller ones exist so the same head tile
// fits 163 KB (sm_80) and 99 KB (sm_86/89/120/121) parts. {16, 2, 2}, the
// smallest (16 tokens over warps_n = 2 warps), is a last resort for a
// smaller --max-smem-per-block; every supported arch fits an earlier one
// for bf16 and for fp8_ds_mla's staged pipeline.
const std::vector<TileConfig>& CandidatesFor(int head_tile) {
  static const std::vector<TileConfig> k64 = {{64, 2, 8}, {32, 2, 8}};
  static const std::vector<TileConfig> k32 = {{64, 2, 8}, {32, 2, 8}, {16, 2, 4}};
  static const std::vector<TileConfig> k16 = {{32, 2, 4}, {16, 2, 4}, {16, 2, 2}};
  if (head_tile == 16) return k16;
  if (head_tile == 32) return k32;
  return k64;  // 48 and 64
}

// The instantiation unit's name of the spec's KV format type (model/spec.h
// KvFormats: a type of templates/kforge/sparse_mla/kv_format.cuh); one that
// takes the scale format gets it as its template argument (kScalePow2).
std::string KvTypeName(const KvFormatInfo& kv, v1::KvScaleFormat scale_format) {
  if (!kv.takes_scale_format) return kv.device_type;
  return absl::StrCat(kv.device_type,
                      scale_format == v1::KV_SCALE_FORMAT_POW2 ? "<true>" : "<false>");
}

// The staging bytes per token of the spec's pipeline (config.h
// PipelineStagingBytes over its cache and its extra cache, if any).
int StagingBytes(const v1::AttentionSpec& spec) {
  const int d_qk = static_cast<int>(spec.kv_lora_rank() + spec.rope_dim());
  const KvFormatInfo& kv = KvFormatOf(spec);
  const KvFormatInfo* extra = ExtraKvFormatOf(spec);
  return sparse_mla::PipelineStagingBytes(
      kv.staging_bytes_per_token(d_qk), kv.bytes_per_token(d_qk),
      extra != nullptr ? extra->staging_bytes_per_token(d_qk) : 0,
      extra != nullptr ? extra->bytes_per_token(d_qk) : 0);
}

// Staged pipelines dequantise in the CTA (their Land), which costs the
// small-batch path more than the bf16 gather does.
bool StagedKv(const v1::AttentionSpec& spec) { return StagingBytes(spec) > 0; }

// The kernel's compile-time shape for a spec and a tiling candidate: the
// input of config.h's CheckDecodeTiling and MakeDecodeSmemLayout, the same
// functions DecodeTraits evaluates on the device.
sparse_mla::DecodeShape ShapeOf(const v1::AttentionSpec& spec, int head_tile, int heads_per_group,
                                int token_tile, int stages, int warps, bool wgmma,
                                int land_warps = 0) {
  sparse_mla::DecodeShape shape{};
  shape.d_v = static_cast<int>(spec.kv_lora_rank());
  shape.rope = static_cast<int>(spec.rope_dim());
  shape.head_tile = head_tile;
  shape.heads_per_group = heads_per_group;
  shape.token_tile = token_tile;
  shape.stages = stages;
  shape.warps = warps;
  shape.wgmma = wgmma;
  shape.kv_staging_bytes_per_token = StagingBytes(spec);
  shape.land_warps = land_warps;
  return shape;
}

// Whether the tiling rule accepts `shape` and its shared memory fits `arch`.
bool ShapeFits(const sparse_mla::DecodeShape& shape, const Arch& arch) {
  return sparse_mla::CheckDecodeTiling(shape) == sparse_mla::TilingError::kOk &&
         sparse_mla::MakeDecodeSmemLayout(shape).bytes <= arch.max_smem_per_block;
}

// Shrinks the warp count until every warp owns >= 16 output columns, then
// keeps the candidate if CheckDecodeTiling accepts it and its shared memory
// fits the arch, so codegen never emits a unit that fails to compile.
bool Fit(const v1::AttentionSpec& spec, int head_tile, int heads_per_group, TileConfig c,
         const Arch& arch, v1::KernelTiling* out) {
  const int dv = static_cast<int>(spec.kv_lora_rank());
  while (c.warps > 1 && dv / c.warps < 16) c.warps /= 2;
  const sparse_mla::DecodeShape shape =
      ShapeOf(spec, head_tile, heads_per_group, c.token_tile, c.stages, c.warps, false);
  if (!ShapeFits(shape, arch)) return false;
  out->set_head_tile(head_tile);
  out->set_heads_per_group(heads_per_group);
  out->set_token_tile(c.token_tile);
  out->set_stages(c.stages);
  out->set_warps(c.warps);
  return true;
}

int RoundUp16(int x) { return (x + 15) / 16 * 16; }

// The register pipeline's tile (config.h RegisterPipelineCovers): 32
// tokens, stages 1 (the next tile in registers), 4 warps.
constexpr TileConfig kRegisterPipelineTile = {32, 1, 4};

// Heads per group when `heads` are spread evenly over the fewest groups of
// at most `max_tile` (>= 1) heads each.
int HeadsPerGroup(int heads, int max_tile) {
  const int groups = (heads + max_tile - 1) / max_tile;
  return (heads + groups - 1) / groups;
}

// Keys per split below which splitting further stops paying. On the H200 at
// batch 1 (topk 2048) the fastest split count kept 128 keys per split with
// 32-token tiles (8 heads: 16 splits, BENCH.md 2026-11-29) and with 64-token
// tiles (64 and 128 heads, bf16 and fp8: 16 splits, BENCH.md 2026-12-01).
constexpr int kMinKeysPerSplit = 128;

// The small-batch path's floor: one 64-key tile per split. Its grid is a
// few dozen CTAs at most, so at batch 1..4 each split's serial tiles cost
// more than a wider combine: H200 sweeps (BENCH.md 2026-12-04, "the
// small-batch split floor") at top-k 256 / 512 / 1024, 8..128 heads, found
// one tile a split fastest at batch 1 and 2 in every format and head count
// (the 128-key floor was 9-29% slower: fp8 64 x 1 at top-k 512 15.8 against
// 12.5 us); above 16 such splits the 128-key floor (ChooseSmallBatchPath).
constexpr int kMinKeysPerSplitSmallBatch = 64;

// The small-batch path's CTA shapes, best first (BENCH.md 2026-12-01: at
// batch 1 on the H200, 16 x 64 x 2 stages x 4 warps beat 32-token tiles,
// 3 and 4 stages, 8 warps and 32-head tiles).
const TileConfig kSmallBatchCandidates[] = {{64, 2, 4}, {32, 2, 4}};

// The small-batch path runs while its grid has at most this many CTAs at
// one split (head groups x query tokens): where it stopped beating the
// throughput tiling on the H200 (BENCH.md 2026-12-01; bf16: 128 heads up to
// batch 4, 64 heads up to 8, 8 and 16 heads past 32; fp8_ds_mla, whose
// 4-warp dequantisation is slower: 128 heads at batch 1, 64 heads up to 2).
constexpr int kSmallBatchCtasBf16 = 32;
constexpr int kSmallBatchCtasStaged = 8;  // measured with fp8_ds_mla

// 16-CTA thread-block clusters (the cluster entries' size) the H200 runs
// at once (cuOccupancyMaxActiveClusters, BENCH.md 2026-12-02): the
// small-batch rule's guess of the device; the selector checks the real
// number (DeviceInfo::max_active_clusters) at every call.
constexpr int kSixteenCtaClustersH200 = 7;

// A cache dtype as a module name part; fp8_ds_mla names its scale
// convention too: fp8_ds_mla_pow2 / _arbitrary.
std::string DtypeTag(v1::KvCacheDtype dtype, v1::KvScaleFormat scale_format) {
  std::string tag = KvDtypeName(dtype);
  if (scale_format != v1::KV_SCALE_FORMAT_UNSPECIFIED) {
    absl::StrAppend(&tag, "_", KvScaleFormatName(scale_format));
  }
  return tag;
}

// The scale as a readable name part: the shortest decimal that reads back
// as the same float (%.9g always does; shorter forms are tried first), with
// '.' -> 'p' and '-' -> 'm': 0.0625 -> "0p0625", 0.135234 -> "0p135234",
// 1e-06 -> "1em06". Distinct floats give distinct tags.
std::string ScaleTag(float scale) {
  std::string text;
  for (int digits = 1; digits <= 9; ++digits) {
    text = absl::StrFormat("%.*g", digits, scale);
    if (std::strtof(text.c_str(), nullptr) == scale) break;
  }
  for (char& c : text) {
    if (c == '.') c = 'p';
    if (c == '-') c = 'm';
    if (c == '+') c = 'p';
  }
  return text;
}

}  // namespace

namespace {

// Sets what follows from a tiling's CTA shape: wgmma (sm_90a only; which
// shapes it covers is config.h's WgmmaCovers, the same rule DecodeTraits
// checks, and its layout, P unpadded but 1024-B aligned, must fit too) and
// the head group count.
void FinishTiling(const v1::AttentionSpec& spec, const Arch& arch, v1::KernelTiling* tiling) {
  sparse_mla::DecodeShape shape = DecodeShapeFor(spec, *tiling);
  shape.wgmma = true;
  tiling->set_wgmma(HasWgmma(arch) && sparse_mla::WgmmaCovers(shape) && ShapeFits(shape, arch));
  // The wgmma tiling of one cache of a format that measured faster with a
  // producer warpgroup (KvFormatInfo::warp_specialized) gets one where it
  // fits (config.h WarpSpecialized), and so does that of a crossover
  // format (KvFormatInfo::crossover) whose head groups pair up, which then
  // runs as crossover pairs (config.h PairCovers). Their producers (the
  // formats' register seam, bf16's row copies) read the main cache only.
  const int heads = static_cast<int>(spec.num_q_heads());
  const int per_group = static_cast<int>(tiling->heads_per_group());
  const int groups = (heads + per_group - 1) / per_group;
  const KvFormatInfo& kv = KvFormatOf(spec);
  const bool pairs = kv.crossover && groups % 2 == 0;
  tiling->set_crossover(false);
  if (tiling->wgmma() && tiling->land_warps() == 0 && (kv.warp_specialized || pairs) &&
      !spec.has_extra_kv()) {
    shape.land_warps = 4;
    if (sparse_mla::WarpSpecialized(shape) && ShapeFits(shape, arch)) {
      tiling->set_land_warps(4);
      tiling->set_crossover(pairs && sparse_mla::PairCovers(shape));
    }
  }
  tiling->set_num_head_groups(groups);
}

// The shape asked for by hand, checked by the same rules as a chosen one.
absl::StatusOr<v1::KernelTiling> RequestedTiling(const v1::AttentionSpec& spec, const Arch& arch,
                                                 const TilingRequest& r) {
  const int heads = static_cast<int>(spec.num_q_heads());
  const int per_group = HeadsPerGroup(heads, std::max(1, r.head_tile));
  const sparse_mla::DecodeShape shape =
      ShapeOf(spec, r.head_tile, per_group, r.token_tile, r.stages, r.warps, false);
  const sparse_mla::TilingError e = sparse_mla::CheckDecodeTiling(shape);
  if (e != sparse_mla::TilingError::kOk) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tiling %d,%d,%d,%d (head tile, token tile, stages, warps) for %d heads: the tiling "
        "rule rejects its %s (templates/kforge/sparse_mla/config.h, CheckDecodeTiling)",
        r.head_tile, r.token_tile, r.stages, r.warps, heads, sparse_mla::TilingErrorName(e)));
  }
  const int bytes = sparse_mla::MakeDecodeSmemLayout(shape).bytes;
  if (bytes > arch.max_smem_per_block) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tiling %d,%d,%d,%d needs %d bytes of shared memory per block; %s "
        "allows %d",
        r.head_tile, r.token_tile, r.stages, r.warps, bytes, arch.name, arch.max_smem_per_block));
  }
  v1::KernelTiling tiling;
  tiling.set_head_tile(r.head_tile);
  tiling.set_heads_per_group(per_group);
  tiling.set_token_tile(r.token_tile);
  tiling.set_stages(r.stages);
  tiling.set_warps(r.warps);
  FinishTiling(spec, arch, &tiling);
  return tiling;
}

}  // namespace

absl::StatusOr<v1::KernelTiling> ChooseTiling(const v1::AttentionSpec& spec, const Arch& arch,
                                              const TilingRequest& request) {
  if (!request.empty()) return RequestedTiling(spec, arch, request);
  const int heads = static_cast<int>(spec.num_q_heads());
  // Try the largest group size first: spread the heads evenly over the
  // fewest groups of at most max_tile, round the group up to whole MMA rows
  // and take the first pipeline that fits. A rounded tile (e.g. 48 for 40 or
  // 80 heads) may have no pipeline on a small-smem part; then fall back to
  // the next smaller group size rather than fail.
  for (int max_tile : {64, 32, 16}) {
    const int per_group = HeadsPerGroup(heads, max_tile);
    const int head_tile = RoundUp16(per_group);
    v1::KernelTiling tiling;
    // A 16-head tile of a staged format that reads one cache takes the
    // register pipeline where it fits (config.h RegisterPipeline; H200, 16
    // heads x batch 32..128: 10-25% faster than the staged 16 x 32 tiling
    // for every record, BENCH.md "the register pipeline").
    const bool register_pipeline =
        head_tile == 16 && StagedKv(spec) && !spec.has_extra_kv() &&
        Fit(spec, head_tile, per_group, kRegisterPipelineTile, arch, &tiling);
    if (!register_pipeline) {
      for (const TileConfig& c : CandidatesFor(head_tile)) {
        if (Fit(spec, head_tile, per_group, c, arch, &tiling)) break;
      }
    }
    if (tiling.head_tile() == 0) continue;
    FinishTiling(spec, arch, &tiling);
    return tiling;
  }
  return absl::FailedPreconditionError(
      absl::StrFormat("%s: no sparse MLA tiling fits %d bytes of shared memory per block "
                      "for d_qk=%d",
                      arch.name, arch.max_smem_per_block, spec.kv_lora_rank() + spec.rope_dim()));
}

sparse_mla::DecodeShape DecodeShapeFor(const v1::AttentionSpec& spec, const v1::KernelTiling& t) {
  return ShapeOf(spec, static_cast<int>(t.head_tile()), static_cast<int>(t.heads_per_group()),
                 static_cast<int>(t.token_tile()), static_cast<int>(t.stages()),
                 static_cast<int>(t.warps()), t.wgmma(), static_cast<int>(t.land_warps()));
}

int DecodeSmemBytesFor(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling) {
  return sparse_mla::MakeDecodeSmemLayout(DecodeShapeFor(spec, tiling)).bytes;
}

v1::LaunchRule MakeLaunchRule(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling,
                              const Arch& arch, EntryOccupancy occupancy) {
  v1::LaunchRule rule;
  const sparse_mla::DecodeShape shape = DecodeShapeFor(spec, tiling);
  const int cta_warps = sparse_mla::CtaWarps(shape);
  rule.set_block_threads(cta_warps * 32);
  rule.set_dynamic_smem_bytes(sparse_mla::MakeDecodeSmemLayout(shape).bytes);
  rule.set_combine_block_threads(sparse_mla::kCombineWarps * 32);
  rule.set_split_granularity_tokens(tiling.token_tile());
  rule.set_workspace_bytes_per_split_token(static_cast<uint64_t>(spec.num_q_heads()) *
                                           (spec.kv_lora_rank() + 1) * sizeof(float));
  const int per_block = static_cast<int>(rule.dynamic_smem_bytes()) + Arch::kReservedSmemPerBlock;
  // Resident CTAs: as many as shared memory holds, up to the warps per SM
  // the entries are compiled for. GenerateSource builds them with
  // __launch_bounds__(threads, ctas_per_sm), so the compiler keeps each
  // thread within 64K / (ctas_per_sm * threads) registers and the count is
  // the register file's too (the rule is made before the compile reports
  // the registers, so it must not rely on them).
  //  - Throughput entries (main and its cluster entry): up to 12 warps,
  //    168 registers a thread. Only the 16-head 4-warp tiles of the smaller
  //    records (V4, V4.1, nvfp4: ~70 KB) get three CTAs from it on the 227
  //    KB parts, with no spill (CompileMatrix); 16 x 128 on the H200: V4
  //    112 -> 100 us, V4.1 108 -> 98, nvfp4 120 -> 114 (BENCH.md
  //    2026-12-02). Every other tiling's count is shared memory's, as before.
  //  - Latency entries (the small-batch path): 8 warps, 255 registers,
  //    which its 16 x 64 x 4-warp tiling needs (at 168 it spilled).
  //  - The register pipeline (config.h RegisterPipeline) holds a tile's
  //    records, its quarter of Q and of O in registers: 8 warps.
  const bool reg_path = sparse_mla::RegisterPipeline(shape);
  const int warps_per_sm = occupancy == EntryOccupancy::kThroughput && !reg_path ? 12 : 8;
  const int by_registers = std::max(1, warps_per_sm / cta_warps);
  rule.set_ctas_per_sm(std::max(1, std::min(arch.smem_per_sm / per_block, by_registers)));
  rule.set_min_tiles_per_split(
      std::max(1, kMinKeysPerSplit / static_cast<int>(tiling.token_tile())));
  return rule;
}

namespace {

// More 16-head groups than the H200 runs 16-CTA clusters at once (above
// 112 heads): the 16-head small-batch tiling's cluster entry never fits.
bool SixteenHeadClustersOverflow(const v1::AttentionSpec& spec) {
  return (static_cast<int>(spec.num_q_heads()) + 15) / 16 > kSixteenCtaClustersH200;
}

// A cluster entry of `splits` CTAs for `tiling`: thread-block clusters
// (sm_90a and sm_100a: see the callers), a merge buffer that fits
// (ClusterMergeFits) and at least one token tile per split.
bool ClusterFits(const v1::AttentionSpec& spec, const Arch& arch, const v1::KernelTiling& tiling,
                 int splits) {
  return (arch.major == 9 || arch.major == 10) &&
         sparse_mla::ClusterMergeFits(DecodeShapeFor(spec, tiling), splits) &&
         KeySpanOf(spec, tiling.token_tile()) >= static_cast<int64_t>(splits) * tiling.token_tile();
}

}  // namespace

v1::ClusterPath ChooseMainCluster(const v1::AttentionSpec& spec, const Arch& arch,
                                  const v1::KernelTiling& main, const v1::SmallBatchPath& small) {
  v1::ClusterPath path;
  // A format whose tiling is warp-specialised only for its crossover pairs
  // gets no 2-split cluster (it runs the pipeline without the pair, which
  // spilled and ran slower for it): H200 nvfp4_ds_mla 128 x 32, 2 merged
  // splits 91.3 us, the pair's 2 splits + combine 82.8 (BENCH.md,
  // "crossover pairs").
  const bool pair_only = main.crossover() && !KvFormatOf(spec).warp_specialized;
  if (!pair_only && ClusterFits(spec, arch, main, sparse_mla::kMainClusterSplits)) {
    path.set_entry(kMainClusterEntry);
    path.set_splits(sparse_mla::kMainClusterSplits);
  }
  // The warp-specialised pipeline's 16-split entry, where it can be taken:
  // its clusters at the first token count past the small-batch path fit
  // the device at once (the selector's test, with the H200's count). There
  // 16 splits merged in the kernel beat 16 + combine: H200 fp8_ds_mla 128 x
  // 2 23.4 -> 19.0 us, 64 x 4 24.3 -> 18.2-18.8 (BENCH.md, "the wide cluster
  // entry"); bf16 128 x 2 17.7-18.2 -> 16.2-16.4, 128 x 3 23.2-24.0 ->
  // 16.5-16.7, past its 32-head batch-1 tiles (BENCH.md, "bf16 at 128
  // heads: one launch at batch 1..3"). bf16 below 113 heads keeps its
  // 16-head small-batch path to batch 4 or more, past which these clusters
  // no longer fit: no entry.
  const int first_tokens = small.entry().empty() ? 1 : static_cast<int>(small.max_tokens()) + 1;
  if (sparse_mla::WarpSpecialized(DecodeShapeFor(spec, main)) &&
      static_cast<int>(main.num_head_groups()) * first_tokens <= kSixteenCtaClustersH200 &&
      ClusterFits(spec, arch, main, sparse_mla::kClusterSplits)) {
    path.set_wide_entry(kMainWideClusterEntry);
    path.set_wide_splits(sparse_mla::kClusterSplits);
  }
  return path;
}

v1::SmallBatchPath ChooseSmallBatchPath(const v1::AttentionSpec& spec, const Arch& arch,
                                        const v1::KernelTiling& main) {
  v1::SmallBatchPath path;
  const int heads = static_cast<int>(spec.num_q_heads());
  // sm_90a, more 16-head groups than the H200 runs 16-CTA clusters at once
  // (above 112 heads): 32-head tiles of 8 MMA warps, so batch 1 runs as
  // clusters (4 at 128 heads) in one launch rather than 16 splits +
  // combine. H200 128 x 1: fp8_ds_mla 18.1 -> 16.8-17.1 us, V4 17.5 ->
  // 16.6-16.7; at 64 heads, where the 16-head clusters fit, 32-head tiles
  // lost (BENCH.md, "a 32-head small-batch tiling"). bf16 128 x 1: 13.9-14.5
  // -> 14.7-14.9 us of GPU time for one launch (the C++ Run 9.2 -> 4.7 us
  // of host time), with batch 2 and 3 on the wide main entry; batch 4 then
  // runs the 64-head tiling's split + combine, 26.1-26.5 -> 28.2-28.4
  // (BENCH.md, "bf16 at 128 heads: one launch at batch 1..3").
  // Only where those tiles fit with their cluster entry (not under a
  // --max-smem-per-block cap, which has no clusters).
  v1::KernelTiling tiling;
  bool wide_heads = false;
  if (HasWgmma(arch) && SixteenHeadClustersOverflow(spec) &&
      Fit(spec, 32, HeadsPerGroup(heads, 32), TileConfig{64, 2, 8}, arch, &tiling)) {
    FinishTiling(spec, arch, &tiling);
    wide_heads = ClusterFits(spec, arch, tiling, sparse_mla::kClusterSplits);
    if (!wide_heads) tiling = v1::KernelTiling();
  }
  if (!wide_heads) {
    for (const TileConfig& c : kSmallBatchCandidates) {
      if (Fit(spec, 16, HeadsPerGroup(heads, 16), c, arch, &tiling)) break;
    }
  }
  if (tiling.head_tile() == 0) return path;
  FinishTiling(spec, arch, &tiling);
  if (tiling.head_tile() == main.head_tile() && tiling.token_tile() == main.token_tile() &&
      tiling.stages() == main.stages() && tiling.warps() == main.warps() &&
      tiling.wgmma() == main.wgmma()) {
    return path;
  }
  // A staged format dequantises each tile in the CTA (Land) on the
  // latency path: land-only warps spread it over twice the warps, where
  // they cost no resident CTA (their registers would otherwise be idle).
  // The 32-head tiles have 8 warps already (8 + 8 spilled and ran no
  // faster).
  v1::LaunchRule launch = MakeLaunchRule(spec, tiling, arch, EntryOccupancy::kLatency);
  if (StagedKv(spec) && !wide_heads) {
    v1::KernelTiling with = tiling;
    with.set_land_warps(tiling.warps());
    if (sparse_mla::CheckDecodeTiling(DecodeShapeFor(spec, with)) == sparse_mla::TilingError::kOk) {
      v1::LaunchRule with_launch = MakeLaunchRule(spec, with, arch, EntryOccupancy::kLatency);
      if (with_launch.ctas_per_sm() >= launch.ctas_per_sm()) {
        tiling = std::move(with);
        launch = std::move(with_launch);
      }
    }
  }
  path.set_entry(kSmallBatchEntry);
  *path.mutable_launch() = std::move(launch);
  const int ctas = StagedKv(spec) ? kSmallBatchCtasStaged : kSmallBatchCtasBf16;
  // The 32-head tiles serve batch 1 only: at batch 2 their clusters no
  // longer fit either, and the throughput tiling's wide cluster entry takes
  // over (fp8 128 x 2: 23.1 us as 32-head split + combine, 18.4 there).
  path.set_max_tokens(wide_heads ? 1u
                                 : static_cast<uint32_t>(std::max(
                                       1, ctas / static_cast<int>(tiling.num_head_groups()))));
  // The cluster entry: sm_90a and sm_100a, whose GPCs run 16-CTA clusters
  // once a kernel opts into non-portable sizes (measured on the H200; the
  // 99 KB parts, sm_120/121, promise only 8, and 8 merged splits lost to 16
  // + combine there too: BENCH.md 2026-12-02).
  if (ClusterFits(spec, arch, tiling, sparse_mla::kClusterSplits)) {
    path.set_cluster_entry(kClusterEntry);
    path.set_cluster_splits(sparse_mla::kClusterSplits);
  }
  // Splits down to one 64-key tile each (kMinKeysPerSplitSmallBatch) while
  // 16 of them (kClusterSplits) cover the keys; past that the 128-key floor
  // of the throughput tiling (kMinKeysPerSplit), so the rule lands on the
  // cluster entry at top-k 2048, whose 16 merged splits of two tiles beat 32
  // of one + combine (H200 bf16 64 x 1 13.0 us against 14.8, fp8 15.3
  // against 18.1, bf16 8 x 4 11.8 against 13.9; without the cluster, 16 +
  // combine: bf16 64 x 1 13.7). A staged format's lone head group takes one
  // tile throughout: its 32 one-tile splits + combine beat 16 merged ones at
  // batch 1 and 2 (fp8 8 x 1 12.6 against 14.4, 16 x 1 13.8 against 15.2;
  // BENCH.md 2026-12-04, "the small-batch split floor").
  const long long token_tile = tiling.token_tile();
  const long long one_tile = std::max(1LL, kMinKeysPerSplitSmallBatch / token_tile);
  long long min_tiles = one_tile;
  if (!(tiling.num_head_groups() == 1 && StagedKv(spec))) {
    // The rule's granularity is the token tile: one tile a split at most.
    const long long tiles = MaxSplits(spec, path.launch());
    const long long by_clusters =
        (tiles + sparse_mla::kClusterSplits - 1) / sparse_mla::kClusterSplits;
    min_tiles =
        std::clamp(by_clusters, one_tile, std::max(one_tile, kMinKeysPerSplit / token_tile));
  }
  path.mutable_launch()->set_min_tiles_per_split(static_cast<uint32_t>(min_tiles));
  *path.mutable_tiling() = std::move(tiling);
  return path;
}

std::string ModuleName(const v1::AttentionSpec& spec, const Arch& arch) {
  std::string arch_tag = arch.name;
  arch_tag.erase(std::remove(arch_tag.begin(), arch_tag.end(), '_'), arch_tag.end());
  // An extra cache: "_x" + its topk, dtype and page size.
  std::string extra;
  if (spec.has_extra_kv()) {
    const v1::ExtraKvCache& x = spec.extra_kv();
    extra = absl::StrFormat("_xtopk%d_%s_pb%d", x.topk(),
                            DtypeTag(x.kv_cache_dtype(), x.kv_scale_format()), x.page_block_size());
  }
  return absl::StrFormat("sparse_mla_decode_h%d_d%dr%d_topk%d_%s_pb%d%s_sc%s%s_%s",
                         spec.num_q_heads(), spec.kv_lora_rank(), spec.rope_dim(), spec.topk(),
                         DtypeTag(spec.kv_cache_dtype(), spec.kv_scale_format()),
                         spec.page_block_size(), extra, ScaleTag(spec.softmax_scale()),
                         spec.return_lse() ? "_lse" : "", arch_tag);
}

std::string GenerateSource(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling,
                           const v1::LaunchRule& launch, const v1::SmallBatchPath& small,
                           const v1::ClusterPath& cluster) {
  // softmax_scale * log2(e), rounded once to float; %a prints it exactly.
  const float scale_log2 =
      static_cast<float>(static_cast<double>(spec.softmax_scale()) * 1.4426950408889634);
  // The schedule's names as the unit spells them (templates/kforge/
  // sparse_mla/common/tiling.h Pipeline, Mma, Epilogue).
  auto pipeline_name = [](sparse_mla::Pipeline p) -> const char* {
    switch (p) {
      case sparse_mla::Pipeline::kLockstep:
        return "ks::Pipeline::kLockstep";
      case sparse_mla::Pipeline::kRegister:
        return "ks::Pipeline::kRegister";
      case sparse_mla::Pipeline::kWarpSpecialized:
        return "ks::Pipeline::kWarpSpecialized";
      case sparse_mla::Pipeline::kCrossoverPair:
        return "ks::Pipeline::kCrossoverPair";
    }
    return "?";
  };
  auto mma_name = [](sparse_mla::Mma m) -> const char* {
    return m == sparse_mla::Mma::kWgmma ? "ks::Mma::kWgmma" : "ks::Mma::kMmaSync";
  };
  // The pipeline a tiling's entries run: its own (PipelineOf, the rule
  // DecodeTraits checks), the crossover pair for the main entry of a
  // crossover tiling (KernelTiling.crossover), the warp-specialised
  // pipeline unpaired for every other entry.
  auto pipeline_of = [&](const v1::KernelTiling& t, bool pair) {
    return sparse_mla::PipelineOf(DecodeShapeFor(spec, t), pair);
  };
  std::string src;
  absl::StrAppend(&src,
                  "// Generated by kforge codegen: one sparse MLA module.\n"
                  "#include \"kforge/sparse_mla/common/decode.cuh\"\n"
                  "#include \"kforge/sparse_mla/common/combine.cuh\"\n\n"
                  "namespace ks = kforge::sparse_mla;\n\n");
  // A named config (DecodeTraits reads it by name) and the traits over it.
  auto traits = [&](const char* name, const v1::KernelTiling& t) {
    const sparse_mla::DecodeShape shape = DecodeShapeFor(spec, t);
    absl::StrAppendFormat(&src,
                          "struct %sConfig {\n"
                          "  static constexpr int kNumHeads = %d;\n"
                          "  static constexpr int kDv = %d;\n"
                          "  static constexpr int kRope = %d;\n"
                          "  static constexpr int kTopk = %d;\n"
                          "  static constexpr int kPageBlock = %d;\n"
                          "  static constexpr bool kReturnLse = %s;\n"
                          "  using Kv = %s;\n",
                          name, spec.num_q_heads(), spec.kv_lora_rank(), spec.rope_dim(),
                          spec.topk(), spec.page_block_size(), spec.return_lse() ? "true" : "false",
                          KvTypeName(KvFormatOf(spec), spec.kv_scale_format()));
    if (const KvFormatInfo* x = ExtraKvFormatOf(spec); x != nullptr) {
      absl::StrAppendFormat(&src,
                            "  static constexpr int kExtraTopk = %d;\n"
                            "  static constexpr int kExtraPageBlock = %d;\n"
                            "  using ExtraKv = %s;\n",
                            spec.extra_kv().topk(), spec.extra_kv().page_block_size(),
                            KvTypeName(*x, spec.extra_kv().kv_scale_format()));
    }
    absl::StrAppendFormat(&src,
                          "  static constexpr int kHeadTile = %d;\n"
                          "  static constexpr int kHeadsPerGroup = %d;\n"
                          "  static constexpr int kTokenTile = %d;\n"
                          "  static constexpr int kStages = %d;\n"
                          "  static constexpr int kWarps = %d;\n"
                          "  static constexpr int kLandWarps = %d;\n"
                          "  static constexpr ks::Pipeline kPipeline = %s;\n"
                          "  static constexpr ks::Mma kMma = %s;\n"
                          "};\n\n"
                          "struct %s : ks::DecodeTraits<%sConfig> {\n"
                          "  // softmax_scale %.9g times log2(e)\n"
                          "  static constexpr float kScaleLog2 = %af;\n"
                          "};\n\n",
                          t.head_tile(), t.heads_per_group(), t.token_tile(), t.stages(), t.warps(),
                          t.land_warps(), pipeline_name(pipeline_of(t, t.crossover())),
                          mma_name(sparse_mla::MmaOf(shape)), name, name, spec.softmax_scale(),
                          scale_log2);
  };
  // Each entry's minimum resident CTAs is its launch rule's ctas_per_sm
  // (MakeLaunchRule), which bounds its registers.
  auto min_blocks = [](const v1::LaunchRule& rule) {
    return std::max<uint32_t>(1, rule.ctas_per_sm());
  };
  // An entry with the split epilogue; a crossover pair's is a 2-CTA
  // cluster over head groups.
  auto main_entry = [&](const char* traits_name, const char* entry, uint32_t blocks,
                        sparse_mla::Pipeline pipeline) {
    const bool pair = pipeline == sparse_mla::Pipeline::kCrossoverPair;
    absl::StrAppendFormat(&src,
                          "extern \"C\" __global__ void %s__launch_bounds__(%s::kThreads, %d)\n"
                          "%s(const ks::DecodeParams p) {\n"
                          "  ks::DecodeMain<%s, %s, ks::Epilogue::kSplit>(p);\n"
                          "}\n\n",
                          pair ? "__cluster_dims__(2, 1, 1)\n" : "", traits_name, blocks, entry,
                          traits_name, pipeline_name(pipeline));
  };
  traits("Traits", tiling);
  const bool with_small = !small.entry().empty();
  if (with_small) traits("SmallBatchTraits", small.tiling());
  // An entry whose `splits` CTAs along grid.y are one cluster that merges
  // them (the cluster-merge epilogue).
  auto cluster_entry = [&](const char* traits_name, const char* entry, uint32_t splits,
                           uint32_t blocks, sparse_mla::Pipeline pipeline) {
    absl::StrAppendFormat(&src,
                          "extern \"C\" __global__ void __cluster_dims__(1, %d, 1)\n"
                          "__launch_bounds__(%s::kThreads, %d)\n"
                          "%s(const ks::DecodeParams p) {\n"
                          "  ks::DecodeMain<%s, %s, ks::Epilogue::kClusterMerge, %d>(p);\n"
                          "}\n\n",
                          splits, traits_name, blocks, entry, traits_name, pipeline_name(pipeline),
                          splits);
  };
  main_entry("Traits", kMainEntry, min_blocks(launch), pipeline_of(tiling, tiling.crossover()));
  if (!cluster.entry().empty()) {
    cluster_entry("Traits", kMainClusterEntry, cluster.splits(), min_blocks(launch),
                  pipeline_of(tiling, false));
  }
  if (!cluster.wide_entry().empty()) {
    cluster_entry("Traits", kMainWideClusterEntry, cluster.wide_splits(), min_blocks(launch),
                  pipeline_of(tiling, false));
  }
  if (with_small) {
    main_entry("SmallBatchTraits", kSmallBatchEntry, min_blocks(small.launch()),
               pipeline_of(small.tiling(), false));
  }
  if (with_small && !small.cluster_entry().empty()) {
    cluster_entry("SmallBatchTraits", kClusterEntry, small.cluster_splits(),
                  min_blocks(small.launch()), pipeline_of(small.tiling(), false));
  }
  absl::StrAppendFormat(&src,
                        "extern \"C\" __global__ void __launch_bounds__(ks::kCombineWarps * 32)\n"
                        "%s(const ks::CombineParams p) {\n"
                        "  ks::Combine<Traits>(p);\n"
                        "}\n",
                        kCombineEntry);
  return src;
}

}  // namespace kforge
