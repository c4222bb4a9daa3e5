#include "compiler/schedule.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compiler/tuning.h"
#include "model/artifact_check.h"
#include "model/launch.h"
#include "model/spec.h"
#include "templates/kforge/sparse_mla/common/kv_layout.h"
#include "templates/kforge/sparse_mla/common/params.h"

namespace kforge {
namespace {

// Appends one reason when the caller asked for them.
template <typename... Args>
void Why(std::vector<std::string>* why, const absl::FormatSpec<Args...>& format,
         const Args&... args) {
  if (why != nullptr) why->push_back(absl::StrFormat(format, args...));
}

// Candidate pipelines per head tile, best first. Bigger token tiles amortise
// the barriers and the softmax; the smaller ones exist so the same head tile
// fits 163 KB (sm_80) and 99 KB (sm_86/89/120/121) parts. {16, 2, 2}, the
// smallest (16 tokens over warps_n = 2 warps), is a last resort for a
// smaller --max-smem-per-block; every supported arch fits an earlier one
// for bf16 and for fp8_ds_mla's staged pipeline.
const std::vector<TileShape>& CandidatesFor(int head_tile) {
  static const std::vector<TileShape> k64 = {{64, 2, 8}, {32, 2, 8}};
  static const std::vector<TileShape> k32 = {{64, 2, 8}, {32, 2, 8}, {16, 2, 4}};
  static const std::vector<TileShape> k16 = {{32, 2, 4}, {16, 2, 4}, {16, 2, 2}};
  if (head_tile == 16) return k16;
  if (head_tile == 32) return k32;
  return k64;  // 48 and 64
}

// The register pipeline's tile (tiling.h RegisterPipelineCovers): 32
// tokens, stages 1 (the next tile in registers), 4 warps.
constexpr TileShape kRegisterPipelineTile = {32, 1, 4};

// The staging bytes per token of the spec's pipeline (kv_layout.h
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
// input of tiling.h's CheckDecodeTiling and MakeDecodeSmemLayout, the same
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
bool Fit(const v1::AttentionSpec& spec, int head_tile, int heads_per_group, TileShape c,
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

// Heads per group when `heads` are spread evenly over the fewest groups of
// at most `max_tile` (>= 1) heads each.
int HeadsPerGroup(int heads, int max_tile) {
  const int groups = (heads + max_tile - 1) / max_tile;
  return (heads + groups - 1) / groups;
}

// "64 x 64 x 2 stages x 8 warps (+4 land), wgmma, warp-specialized"
std::string Describe(const v1::AttentionSpec& spec, const v1::KernelTiling& t) {
  return absl::StrFormat(
      "%d-head tile (%d heads x %d group%s) x %d tokens x %d stage%s x %d warps%s, "
      "%s, %s, %d B shared memory",
      t.head_tile(), t.heads_per_group(), t.num_head_groups(), t.num_head_groups() == 1 ? "" : "s",
      t.token_tile(), t.stages(), t.stages() == 1 ? "" : "s", t.warps(),
      t.land_warps() > 0 ? absl::StrCat(" + ", t.land_warps(), " land") : "",
      t.wgmma() ? "wgmma" : "mma.sync", PipelineName(EntryPipeline(spec, t, /*paired_entry=*/true)),
      DecodeSmemBytesFor(spec, t));
}

// Names the tiling's schedule (the last step of every tiling the planner
// makes, after its shape is final).
void NameSchedule(const v1::AttentionSpec& spec, const Arch& arch, v1::KernelTiling* tiling) {
  tiling->set_pipeline(PipelineOf(spec, *tiling));
  tiling->set_mma(MmaOf(*tiling));
  // The producer's choices, for the pipelines that have one.
  const bool producer = tiling->pipeline() == v1::PIPELINE_WARP_SPECIALIZED ||
                        tiling->pipeline() == v1::PIPELINE_CROSSOVER_PAIR;
  const FormatTuning& f = TuningFor(arch).format(spec.kv_cache_dtype());
  tiling->set_producer_prefetch_l2(producer && f.producer_prefetch_l2);
  tiling->set_pair_load_ahead(producer && tiling->crossover() && f.pair_load_ahead);
}

// Sets what follows from a tiling's CTA shape: wgmma (sm_90a only; which
// shapes it covers is tiling.h's WgmmaCovers, the same rule DecodeTraits
// checks, and its layout, P unpadded but 1024-B aligned, must fit too), the
// producer warpgroup where the arch's tuning prefers it, and the head group
// count.
void FinishTiling(const v1::AttentionSpec& spec, const Arch& arch, v1::KernelTiling* tiling,
                  std::vector<std::string>* why = nullptr) {
  sparse_mla::DecodeShape shape = DecodeShapeFor(spec, *tiling);
  shape.wgmma = true;
  tiling->set_wgmma(HasWgmma(arch) && sparse_mla::WgmmaCovers(shape) && ShapeFits(shape, arch));
  // The wgmma tiling of one cache of a format that measured faster with a
  // producer warpgroup (FormatTuning::warp_specialized) gets one where it
  // fits (tiling.h WarpSpecialized), and so does that of a crossover
  // format (FormatTuning::crossover) whose head groups pair up, which then
  // runs as crossover pairs (tiling.h PairCovers). Their producers (the
  // formats' register seam, bf16's row copies) read the main cache only.
  const int heads = static_cast<int>(spec.num_q_heads());
  const int per_group = static_cast<int>(tiling->heads_per_group());
  const int groups = (heads + per_group - 1) / per_group;
  const SparseMlaTuning& tuning = TuningFor(arch);
  const FormatTuning& prefers = tuning.format(spec.kv_cache_dtype());
  const bool pairs = prefers.crossover && groups % 2 == 0;
  tiling->set_crossover(false);
  const std::string format = KvDtypeName(spec.kv_cache_dtype());
  if (!tiling->wgmma()) {
    Why(why, "mma.sync: %s",
        HasWgmma(arch) ? "wgmma does not cover this tile or its layout "
                         "does not fit (tiling.h WgmmaCovers)"
                       : "wgmma is sm_90a only");
  } else if (tiling->land_warps() == 0 && (prefers.warp_specialized || pairs) &&
             !spec.has_extra_kv()) {
    shape.land_warps = 4;
    if (sparse_mla::WarpSpecialized(shape) && ShapeFits(shape, arch)) {
      tiling->set_land_warps(4);
      tiling->set_crossover(pairs && sparse_mla::PairCovers(shape));
      Why(why, "wgmma with a producer warpgroup: the %s table (%s) marks %s %s", tuning.arch,
          tuning.measured_on, format,
          tiling->crossover() ? "crossover (its head groups pair up: crossover pairs)"
                              : "warp_specialized");
    } else {
      Why(why, "wgmma, lockstep: a producer warpgroup does not fit (tiling.h WarpSpecialized)");
    }
  } else if (tiling->land_warps() == 0) {
    Why(why, "wgmma, lockstep: %s",
        spec.has_extra_kv()
            ? "an extra cache (the producers read the main cache only)"
            : absl::StrCat("the ", tuning.arch, " table (", tuning.measured_on, ") prefers it for ",
                           format, pairs || !prefers.crossover ? "" : " with an odd group count"));
  }
  tiling->set_num_head_groups(groups);
}

// The shape asked for by hand, checked by the same rules as a chosen one.
absl::StatusOr<v1::KernelTiling> RequestedTiling(const v1::AttentionSpec& spec, const Arch& arch,
                                                 const TilingRequest& r,
                                                 std::vector<std::string>* why) {
  const int heads = static_cast<int>(spec.num_q_heads());
  const int per_group = HeadsPerGroup(heads, std::max(1, r.head_tile));
  const sparse_mla::DecodeShape shape =
      ShapeOf(spec, r.head_tile, per_group, r.token_tile, r.stages, r.warps, false);
  const sparse_mla::TilingError e = sparse_mla::CheckDecodeTiling(shape);
  if (e != sparse_mla::TilingError::kOk) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tiling %d,%d,%d,%d (head tile, token tile, stages, warps) for %d heads: the tiling "
        "rule rejects its %s (templates/kforge/sparse_mla/common/tiling.h, CheckDecodeTiling)",
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
  Why(why, "tiling %d,%d,%d,%d asked for by hand (--tiling); the rules admit it", r.head_tile,
      r.token_tile, r.stages, r.warps);
  FinishTiling(spec, arch, &tiling, why);
  NameSchedule(spec, arch, &tiling);
  return tiling;
}

// More 16-head groups than the GPU runs 16-CTA clusters at once (above
// 112 heads on the H200): the 16-head small-batch tiling's cluster entry
// never fits.
bool SixteenHeadClustersOverflow(const v1::AttentionSpec& spec, const SparseMlaTuning& tuning) {
  return (static_cast<int>(spec.num_q_heads()) + 15) / 16 > tuning.sixteen_cta_clusters;
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

// The templates' names and the proto's are one list (tiling.h, artifact.proto).
static_assert(static_cast<int>(sparse_mla::Pipeline::kLockstep) == v1::PIPELINE_LOCKSTEP &&
              static_cast<int>(sparse_mla::Pipeline::kRegister) == v1::PIPELINE_REGISTER &&
              static_cast<int>(sparse_mla::Pipeline::kWarpSpecialized) ==
                  v1::PIPELINE_WARP_SPECIALIZED &&
              static_cast<int>(sparse_mla::Pipeline::kCrossoverPair) ==
                  v1::PIPELINE_CROSSOVER_PAIR);
static_assert(static_cast<int>(sparse_mla::Mma::kMmaSync) == v1::MMA_SYNC &&
              static_cast<int>(sparse_mla::Mma::kWgmma) == v1::MMA_WGMMA);
static_assert(static_cast<int>(sparse_mla::Epilogue::kSplit) == v1::EPILOGUE_SPLIT &&
              static_cast<int>(sparse_mla::Epilogue::kClusterMerge) == v1::EPILOGUE_CLUSTER_MERGE);

v1::Pipeline PipelineOf(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling) {
  return static_cast<v1::Pipeline>(
      sparse_mla::PipelineOf(DecodeShapeFor(spec, tiling), tiling.crossover()));
}

v1::Pipeline EntryPipeline(const v1::AttentionSpec& spec, const v1::KernelTiling& tiling,
                           bool paired_entry) {
  const v1::Pipeline named =
      tiling.pipeline() != v1::PIPELINE_UNSPECIFIED ? tiling.pipeline() : PipelineOf(spec, tiling);
  if (!paired_entry && named == v1::PIPELINE_CROSSOVER_PAIR) return v1::PIPELINE_WARP_SPECIALIZED;
  return named;
}

const char* PipelineName(v1::Pipeline pipeline) {
  switch (pipeline) {
    case v1::PIPELINE_LOCKSTEP:
      return "lockstep";
    case v1::PIPELINE_REGISTER:
      return "register";
    case v1::PIPELINE_WARP_SPECIALIZED:
      return "warp-specialized";
    case v1::PIPELINE_CROSSOVER_PAIR:
      return "crossover-pair";
    default:
      return "unspecified";
  }
}

absl::StatusOr<v1::KernelTiling> ChooseTiling(const v1::AttentionSpec& spec, const Arch& arch,
                                              const TilingRequest& request,
                                              std::vector<std::string>* why) {
  if (!request.empty()) return RequestedTiling(spec, arch, request, why);
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
    // register pipeline where it fits (tiling.h RegisterPipeline; H200, 16
    // heads x batch 32..128: faster than the staged 16 x 32 tiling for
    // every record, BENCH.md "the register pipeline for 16-head tiles").
    const bool register_pipeline =
        head_tile == 16 && StagedKv(spec) && !spec.has_extra_kv() &&
        Fit(spec, head_tile, per_group, kRegisterPipelineTile, arch, &tiling);
    if (!register_pipeline) {
      for (const TileShape& c : CandidatesFor(head_tile)) {
        if (Fit(spec, head_tile, per_group, c, arch, &tiling)) break;
      }
    }
    if (tiling.head_tile() == 0) {
      Why(why, "no %d-head pipeline fits %d B of shared memory: smaller head groups", head_tile,
          arch.max_smem_per_block);
      continue;
    }
    Why(why,
        "%d heads in groups of at most %d: the largest head tile whose pipeline fits %s's %d B",
        heads, max_tile, arch.name, arch.max_smem_per_block);
    if (register_pipeline) {
      Why(why, "register pipeline: a 16-head tile of a quantised format (%s) reading one cache",
          KvDtypeName(spec.kv_cache_dtype()));
    }
    FinishTiling(spec, arch, &tiling, why);
    NameSchedule(spec, arch, &tiling);
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
  const SparseMlaTuning& tuning = TuningFor(arch);
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
  //  - Throughput entries (main and its cluster entry): the tuning's
  //    throughput_warps_per_sm. Only the 16-head 4-warp tiles of the smaller
  //    records (V4, V4.1, nvfp4) get three CTAs from it on the 227 KB parts,
  //    with no spill; every other tiling's count is shared memory's.
  //  - Latency entries (the small-batch path) and the register pipeline
  //    (a tile's records, its quarter of Q and of O in registers): the
  //    tuning's latency_warps_per_sm.
  const bool reg_path = sparse_mla::RegisterPipeline(shape);
  const int warps_per_sm = occupancy == EntryOccupancy::kThroughput && !reg_path
                               ? tuning.throughput_warps_per_sm
                               : tuning.latency_warps_per_sm;
  const int by_registers = std::max(1, warps_per_sm / cta_warps);
  rule.set_ctas_per_sm(std::max(1, std::min(arch.smem_per_sm / per_block, by_registers)));
  rule.set_min_tiles_per_split(
      std::max(1, tuning.min_keys_per_split / static_cast<int>(tiling.token_tile())));
  return rule;
}

v1::ClusterPath ChooseMainCluster(const v1::AttentionSpec& spec, const Arch& arch,
                                  const v1::KernelTiling& main, const v1::SmallBatchPath& small,
                                  std::vector<std::string>* why) {
  const SparseMlaTuning& tuning = TuningFor(arch);
  v1::ClusterPath path;
  // A format whose tiling is warp-specialised only for its crossover pairs
  // gets no 2-split cluster: it would run the pipeline without the pair,
  // which spilled and ran slower for it (BENCH.md "crossover pairs for the
  // record formats").
  const bool pair_only = main.crossover() && !tuning.format(spec.kv_cache_dtype()).warp_specialized;
  if (!pair_only && ClusterFits(spec, arch, main, sparse_mla::kMainClusterSplits)) {
    path.set_entry(kMainClusterEntry);
    path.set_splits(sparse_mla::kMainClusterSplits);
    Why(why, "throughput cluster entry: %d splits merged in the kernel", path.splits());
  } else if (pair_only) {
    Why(why, "no 2-split cluster entry: the format runs the producer warpgroup only as pairs");
  }
  // The warp-specialised pipeline's 16-split entry, where it can be taken:
  // its clusters at the first token count past the small-batch path fit
  // the device at once (the selector's test, with the tuning's count).
  // There 16 splits merged in the kernel beat 16 + combine for fp8_ds_mla
  // and bf16 (BENCH.md "the wide cluster entry" and "bf16 at 128 heads: one
  // launch at batch 1..3"). bf16 below 113 heads keeps its 16-head
  // small-batch path to batch 4 or more, past which these clusters no
  // longer fit: no entry.
  const int first_tokens = small.entry().empty() ? 1 : static_cast<int>(small.max_tokens()) + 1;
  if (sparse_mla::WarpSpecialized(DecodeShapeFor(spec, main)) &&
      static_cast<int>(main.num_head_groups()) * first_tokens <= tuning.sixteen_cta_clusters &&
      ClusterFits(spec, arch, main, sparse_mla::kClusterSplits)) {
    path.set_wide_entry(kMainWideClusterEntry);
    path.set_wide_splits(sparse_mla::kClusterSplits);
    Why(why,
        "wide cluster entry: %d splits; %d head groups x %d tokens fit the %d 16-CTA clusters "
        "the %s runs at once",
        path.wide_splits(), main.num_head_groups(), first_tokens, tuning.sixteen_cta_clusters,
        tuning.measured_on);
  }
  return path;
}

v1::SmallBatchPath ChooseSmallBatchPath(const v1::AttentionSpec& spec, const Arch& arch,
                                        const v1::KernelTiling& main,
                                        std::vector<std::string>* why) {
  const SparseMlaTuning& tuning = TuningFor(arch);
  v1::SmallBatchPath path;
  const int heads = static_cast<int>(spec.num_q_heads());
  // sm_90a, more 16-head groups than the GPU runs 16-CTA clusters at once:
  // 32-head tiles of 8 MMA warps, so batch 1 runs as clusters in one launch
  // rather than 16 splits + combine (BENCH.md "A 32-head small-batch tiling
  // at 128 heads"; at 64 heads, where the 16-head clusters fit, 32-head
  // tiles lost). Only where those tiles fit with their cluster entry (not
  // under a --max-smem-per-block cap, which has no clusters).
  v1::KernelTiling tiling;
  bool wide_heads = false;
  if (HasWgmma(arch) && SixteenHeadClustersOverflow(spec, tuning) &&
      Fit(spec, 32, HeadsPerGroup(heads, 32), TileShape{64, 2, 8}, arch, &tiling)) {
    FinishTiling(spec, arch, &tiling);
    wide_heads = ClusterFits(spec, arch, tiling, sparse_mla::kClusterSplits);
    if (!wide_heads) tiling = v1::KernelTiling();
  }
  if (!wide_heads) {
    for (const TileShape& c : tuning.small_batch_tiles) {
      if (Fit(spec, 16, HeadsPerGroup(heads, 16), c, arch, &tiling)) break;
    }
  }
  if (tiling.head_tile() == 0) {
    Why(why, "no small-batch path: no 16-head tile fits");
    return path;
  }
  FinishTiling(spec, arch, &tiling);
  if (tiling.head_tile() == main.head_tile() && tiling.token_tile() == main.token_tile() &&
      tiling.stages() == main.stages() && tiling.warps() == main.warps() &&
      tiling.wgmma() == main.wgmma()) {
    Why(why, "no small-batch path: it would be the throughput tiling itself");
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
  NameSchedule(spec, arch, &tiling);
  path.set_entry(kSmallBatchEntry);
  *path.mutable_launch() = std::move(launch);
  const bool staged = StagedKv(spec);
  const int ctas = staged ? tuning.small_batch_ctas_staged : tuning.small_batch_ctas_direct;
  // The 32-head tiles serve batch 1 only: at batch 2 their clusters no
  // longer fit either, and the throughput tiling's wide cluster entry takes
  // over.
  path.set_max_tokens(wide_heads ? 1u
                                 : static_cast<uint32_t>(std::max(
                                       1, ctas / static_cast<int>(tiling.num_head_groups()))));
  if (wide_heads) {
    Why(why,
        "small batch: 32-head tiles at batch 1, as 16-CTA clusters (%d 16-head groups would "
        "overflow the %d clusters the %s runs at once)",
        (heads + 15) / 16, tuning.sixteen_cta_clusters, tuning.measured_on);
  } else {
    Why(why, "small batch: %s, up to %d query tokens (a grid of at most %d CTAs for a %s format)",
        Describe(spec, tiling), path.max_tokens(), ctas, staged ? "quantised" : "bf16");
  }
  // The cluster entry: sm_90a and sm_100a, whose GPCs run 16-CTA clusters
  // once a kernel opts into non-portable sizes (measured on the H200; the
  // 99 KB parts, sm_120/121, promise only 8, and 8 merged splits lost to 16
  // + combine there too).
  if (ClusterFits(spec, arch, tiling, sparse_mla::kClusterSplits)) {
    path.set_cluster_entry(kClusterEntry);
    path.set_cluster_splits(sparse_mla::kClusterSplits);
    Why(why, "small-batch cluster entry: %d splits merged in the kernel", path.cluster_splits());
  }
  // Splits down to one 64-key tile each (min_keys_per_split_small_batch)
  // while 16 of them (kClusterSplits) cover the keys; past that the floor
  // of the throughput tiling (min_keys_per_split), so the rule lands on the
  // cluster entry at top-k 2048, whose 16 merged splits of two tiles beat 32
  // of one + combine. A staged format's lone head group takes one tile up
  // to the tuning's lone_group_one_tile_max_tokens query tokens, and at
  // every count where that is 0 or the path has no cluster entry: its 32
  // one-tile splits + combine beat 16 merged ones at batch 1 and 2
  // (BENCH.md "the split rule at small batch") and lose to them from batch
  // 3 or 4 on, as does 16 + combine at batch 5 to 8 (BENCH.md "A lone head
  // group past two query tokens").
  const long long token_tile = tiling.token_tile();
  const long long one_tile = std::max(1LL, tuning.min_keys_per_split_small_batch / token_tile);
  // The rule's granularity is the token tile: one tile a split at most.
  const long long tiles = MaxSplits(spec, path.launch());
  const long long by_clusters =
      (tiles + sparse_mla::kClusterSplits - 1) / sparse_mla::kClusterSplits;
  const long long floor =
      std::clamp(by_clusters, one_tile, std::max(one_tile, tuning.min_keys_per_split / token_tile));
  v1::LaunchRule& rule = *path.mutable_launch();
  if (tiling.num_head_groups() == 1 && staged) {
    rule.set_min_tiles_per_split(static_cast<uint32_t>(one_tile));
    // Only where the floor past them lands on the cluster entry (exactly
    // kClusterSplits splits, e.g. top-k 1921..2048 in 64-key tiles), the
    // case measured.
    const bool to_cluster = !path.cluster_entry().empty() && floor != one_tile &&
                            (tiles + floor - 1) / floor == sparse_mla::kClusterSplits;
    if (tuning.lone_group_one_tile_max_tokens > 0 && to_cluster) {
      rule.set_min_tiles_max_tokens(static_cast<uint32_t>(tuning.lone_group_one_tile_max_tokens));
      rule.set_min_tiles_per_split_past(static_cast<uint32_t>(floor));
      Why(why,
          "small batch, a lone head group of a quantised format: one-tile splits up to %d "
          "query tokens, then %lld tiles a split (the cluster entry's %d)",
          tuning.lone_group_one_tile_max_tokens, floor, sparse_mla::kClusterSplits);
    }
  } else {
    rule.set_min_tiles_per_split(static_cast<uint32_t>(floor));
  }
  *path.mutable_tiling() = std::move(tiling);
  return path;
}

absl::StatusOr<Schedule> PlanSchedule(const v1::AttentionSpec& spec, const Arch& arch,
                                      const ScheduleOptions& options) {
  Schedule s;
  const SparseMlaTuning& tuning = TuningFor(arch);
  s.reasons.push_back(absl::StrFormat(
      "tuning: the %s table (measured on the %s)%s", tuning.arch, tuning.measured_on,
      std::string_view(tuning.arch) == arch.name
          ? ""
          : absl::StrCat("; ", arch.name, " has no table of its own")));
  absl::StatusOr<v1::KernelTiling> tiling = ChooseTiling(spec, arch, options.tiling, &s.reasons);
  if (!tiling.ok()) return tiling.status();
  s.tiling = *std::move(tiling);
  s.reasons.push_back(absl::StrCat("throughput: ", Describe(spec, s.tiling)));
  // A requested tiling is measured alone: no second kernel beside it.
  if (options.tiling.empty()) {
    s.small_batch = ChooseSmallBatchPath(spec, arch, s.tiling, &s.reasons);
    s.cluster = ChooseMainCluster(spec, arch, s.tiling, s.small_batch, &s.reasons);
  }
  // A shared-memory cap stands in for a smaller part (101376: sm_120's 99
  // KB on an H200), whose modules have no cluster entries: the capped module
  // is that part's, kernel for kernel.
  if (options.smem_capped) {
    s.small_batch.clear_cluster_entry();
    s.small_batch.clear_cluster_splits();
    s.cluster.Clear();
    s.reasons.push_back("no cluster entries: the shared-memory cap stands in for a part without");
  }
  s.launch = MakeLaunchRule(spec, s.tiling, arch);
  return s;
}

namespace {

const char* EpilogueName(v1::Epilogue e) {
  switch (e) {
    case v1::EPILOGUE_SPLIT:
      return "split (+ combine past one split)";
    case v1::EPILOGUE_CLUSTER_MERGE:
      return "splits merged in the cluster";
    default:
      return "";
  }
}

// "sparse_mla_decode_main: throughput tiling, warp-specialized, wgmma, ...",
// and the cubin image (the NVRTC program) it is in where `image` >= 0.
std::string DescribeEntry(const v1::KernelEntry& e, int image) {
  std::string what;
  switch (e.role()) {
    case v1::ENTRY_ROLE_ATTENTION:
      what = absl::StrFormat("%s tiling, %s, %s, %s",
                             e.tiling() == v1::TILING_USE_LATENCY ? "small-batch" : "throughput",
                             PipelineName(e.pipeline()),
                             e.mma() == v1::MMA_WGMMA ? "wgmma" : "mma.sync",
                             EpilogueName(e.epilogue()));
      break;
    case v1::ENTRY_ROLE_COMBINE:
      what = "merges split partials";
      break;
    case v1::ENTRY_ROLE_INDEXER_LOGITS:
      what = "indexer logits";
      break;
    case v1::ENTRY_ROLE_INDEXER_TOPK:
      what = "indexer top-k";
      break;
    default:
      what = "unknown role";
  }
  if (e.cluster_ctas() > 0) absl::StrAppend(&what, ", clusters of ", e.cluster_ctas(), " CTAs");
  if (image >= 0) absl::StrAppend(&what, "; image ", image);
  return absl::StrFormat("    %-36s %s\n", e.name(), what);
}

}  // namespace

std::string ExplainSchedule(const v1::KernelArtifact& a) {
  std::string text = absl::StrFormat("%s (%s)\n", a.module_name(), a.arch());
  // Only sparse MLA modules have tilings (an indexer's spec case is
  // another; its tiling and small batch are unset).
  const v1::AttentionSpec& spec = a.spec().sparse_mla_decode();
  if (a.has_tiling() && a.tiling().head_tile() > 0) {
    absl::StrAppend(&text, "  throughput: ", Describe(spec, a.tiling()), "\n");
  }
  if (!a.small_batch().entry().empty()) {
    const v1::SmallBatchPath& small = a.small_batch();
    absl::StrAppendFormat(&text, "  small batch (up to %d query token%s): %s\n", small.max_tokens(),
                          small.max_tokens() == 1 ? "" : "s", Describe(spec, small.tiling()));
  }
  absl::StrAppend(&text, "  entries:\n");
  for (const v1::KernelEntry& e : a.entries()) {
    // Which image holds it, where the module has several (compiler/unit.h).
    const v1::KernelResources* k = FindKernel(a.cubin_info(), e.name());
    const int image = a.more_cubins_size() > 0 && k != nullptr ? static_cast<int>(k->image()) : -1;
    absl::StrAppend(&text, DescribeEntry(e, image));
  }
  if (a.schedule_reasons_size() > 0) absl::StrAppend(&text, "  why:\n");
  for (const std::string& reason : a.schedule_reasons()) {
    absl::StrAppend(&text, "    - ", reason, "\n");
  }
  return text;
}

}  // namespace kforge
