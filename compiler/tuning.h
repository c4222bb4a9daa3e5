#ifndef KFORGE_COMPILER_TUNING_H_
#define KFORGE_COMPILER_TUNING_H_

// What the sparse MLA planner (compiler/schedule.cc) learned by measuring,
// as data: one table per GPU it was measured on (compiler/tuning/*.cc),
// each value beside the BENCH.md section that measured it. The planner's
// rules (what fits, what the tiling rule admits) stay in code; the numbers
// that pick between fitting choices live here. A new GPU is a new table
// file and one line in TuningFor's list, not an edit of the planner.

#include <string_view>
#include <vector>

#include "kforge/v1/spec.pb.h"
#include "model/arch.h"

namespace kforge {

// A CTA shape the planner tries: KV tokens per tile, pipeline stages,
// warps that run the MMAs.
struct TileShape {
  int token_tile;
  int stages;
  int warps;
};

// What a KV format prefers on the wgmma tiling (sm_90a).
struct FormatTuning {
  v1::KvCacheDtype dtype;
  // Runs the warp-specialised pipeline (a producer warpgroup).
  bool warp_specialized;
  // Runs it as crossover pairs where its head groups pair up, even without
  // warp_specialized (then only as pairs: no 2-split cluster entry).
  bool crossover;
  // The warp-specialised producer prefetches each token's bytes into L2 two
  // tiles ahead (the format must have a RegPrefetch: kv_format.cuh).
  bool producer_prefetch_l2;
  // As crossover pairs, the producer loads the next tile's records before
  // converting this one's (else after).
  bool pair_load_ahead;
};

struct SparseMlaTuning {
  const char* arch;         // the table's arch, e.g. "sm_90a"
  const char* measured_on;  // the GPU its numbers come from, e.g. "H200"

  // Keys per split below which splitting further stops paying (the
  // throughput tiling's floor).
  int min_keys_per_split;
  // The small-batch path's floor (one 64-key tile a split).
  int min_keys_per_split_small_batch;
  // The small-batch path's CTA shapes (16-head tiles), best first.
  std::vector<TileShape> small_batch_tiles;
  // The small-batch path runs while its grid has at most this many CTAs at
  // one split (head groups x query tokens), for formats gathered straight
  // into the tile (bf16) and for staged (quantised) formats.
  int small_batch_ctas_direct;
  int small_batch_ctas_staged;
  // 16-CTA thread-block clusters the GPU runs at once: the planner's guess
  // of the device (the selector checks the real count at every call).
  int sixteen_cta_clusters;
  // Warps per SM an entry is compiled for (__launch_bounds__ minimum
  // blocks = these / the CTA's warps): throughput entries, and latency
  // entries and the register pipeline.
  int throughput_warps_per_sm;
  int latency_warps_per_sm;
  // Per-format pipeline preferences; a format not listed prefers neither.
  std::vector<FormatTuning> formats;
  // A staged format's lone head group (heads <= 16) on the small-batch
  // path: one 64-key tile a split up to this many query tokens, past them
  // the floor every other small-batch path has (so top-k 2048 lands on the
  // cluster entry's 16 merged splits). 0: one tile at every count.
  int lone_group_one_tile_max_tokens = 0;

  const FormatTuning& format(v1::KvCacheDtype dtype) const;
};

// The table the planner uses for `arch`: its own where one was measured,
// else the nearest measured one (`measured_on` then says which GPU).
const SparseMlaTuning& TuningFor(const Arch& arch);

// The tables, one per file in compiler/tuning/.
const SparseMlaTuning& Sm90Tuning();

}  // namespace kforge

#endif  // KFORGE_COMPILER_TUNING_H_
