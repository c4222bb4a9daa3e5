// The sparse MLA planner's measured choices on Hopper (sm_90a), from the
// H200 (141 GB HBM3e, 132 SMs). Each value names the BENCH.md section that
// measured it.

#include "compiler/tuning.h"

namespace kforge {

const SparseMlaTuning& Sm90Tuning() {
  static const SparseMlaTuning kTable = {
      .arch = "sm_90a",
      .measured_on = "H200",
      // BENCH.md "Split floor of 128 keys per split, and the Python eager
      // call": at batch 1 (topk 2048) the fastest split count kept 128 keys a
      // split, 32- and 64-token tiles, 8 to 128 heads, bf16 and fp8.
      .min_keys_per_split = 128,
      // BENCH.md "what bounds the register pipeline; two more levers, the
      // gather ceiling, the split rule at small batch": one 64-key tile a
      // split was fastest at batch 1 and 2 for every format and head count.
      .min_keys_per_split_small_batch = 64,
      // BENCH.md "small-batch kernel, combine, programmatic
      // launch": 16 x 64 x 2 stages x 4 warps beat 32-token tiles, 3 and 4
      // stages, 8 warps and 32-head tiles at batch 1.
      .small_batch_tiles = {{64, 2, 4}, {32, 2, 4}},
      // Same section: where the small-batch path stopped beating the
      // throughput tiling (bf16: 128 heads to batch 4, 64 heads to 8;
      // fp8_ds_mla, whose 4-warp dequantisation is slower: 128 heads at
      // batch 1, 64 heads to 2).
      .small_batch_ctas_direct = 32,
      .small_batch_ctas_staged = 8,
      // BENCH.md "splits merged inside the kernel (thread-block
      // clusters)": cuOccupancyMaxActiveClusters for 16-CTA clusters.
      .sixteen_cta_clusters = 7,
      // BENCH.md "three 16-head CTAs per SM for the smaller
      // records": 12 warps (168 registers) gave the 16-head 4-warp tilings of
      // V4, V4.1 and nvfp4 a third resident CTA without spilling; the
      // small-batch tiling needs 255 registers (8 warps).
      .throughput_warps_per_sm = 12,
      .latency_warps_per_sm = 8,
      // Which formats get the producer warpgroup: BENCH.md "the
      // warp-specialised pipeline for the 64-head wgmma tiling"
      // (fp8_ds_mla), "bf16 on the warp-specialised pipeline" and "crossover
      // pairs for the record formats" (V4, V4.1, nvfp4: the pair only, the
      // plain pipeline spilled and ran slower for them). The producer's L2
      // prefetch two tiles ahead: faster for the V4 records, 2% slower at
      // 128 x 32 and 64 x 64 for fp8_ds_mla (BENCH.md "L2 prefetch"). The
      // pair's producer loading ahead: faster for nvfp4, slower for V4 and
      // V4.1 (BENCH.md "crossover pairs for the record formats"; still so
      // with the pair at CTA scope, and the pair's producer prefetching
      // into L2 too was 11-32% slower: BENCH.md "the staged pair
      // experiments run").
      // fp8_ds_mla stays unpaired: paired, loading ahead and spill-free, it
      // ran 128 x 128 23% slower on an H100 (BENCH.md "Issue 45: the fp8
      // producer's instructions"), and still 12-20% slower with the pair's
      // barriers at CTA scope (BENCH.md "Crossover pairs at CTA scope").
      // {dtype, warp_specialized, crossover, producer_prefetch_l2,
      //  pair_load_ahead}
      .formats =
          {
              {v1::KV_CACHE_DTYPE_BF16, true, false, false, false},
              {v1::KV_CACHE_DTYPE_FP8_DS_MLA, true, false, false, false},
              {v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4, true, true, true, false},
              {v1::KV_CACHE_DTYPE_MXFP8_DS_MLA_V41, false, true, true, false},
              {v1::KV_CACHE_DTYPE_NVFP4_DS_MLA, false, true, false, true},
          },
      // BENCH.md "A lone head group past two query tokens" (H100): a staged
      // format's 8- or 16-head module at top-k 2048, 32 one-tile splits +
      // combine against the cluster entry's 16 merged splits: one tile won
      // at 1 and 2 query tokens (by 0.5-1.9 us), the merged splits from 3
      // (16 heads; 8 heads from 4, 0.4-0.8 us slower at 3) and by 10-22% at
      // 4 to 6.
      .lone_group_one_tile_max_tokens = 2,
  };
  return kTable;
}

}  // namespace kforge
