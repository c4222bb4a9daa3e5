// Every compile-time number of one DSA indexer module, derived from the
// spec's index heads and top-k (config.h holds the rules the host shares).
#ifndef KFORGE_DSA_INDEXER_TRAITS_CUH_
#define KFORGE_DSA_INDEXER_TRAITS_CUH_

#include "kforge/dsa_indexer/config.h"

namespace kforge {
namespace dsa_indexer {

template <int kHeads_, int kTopk_, bool kWgmma_ = false>
struct IndexerTraits {
  static constexpr int kHeads = kHeads_;
  static constexpr int kTopk = kTopk_;
  static constexpr int kHeadDim = IndexKeyPage::kHeadDim;
  static constexpr int kPage = IndexKeyPage::kPageTokens;
  // Logits. mma.sync: one warp per 16 head rows (the m16n8k16 M), each
  // keeping its Q fragments in registers for the CTA's pages. wgmma
  // (sm_90a): warpgroups of 64 keys x kWgmmaN heads (config.h).
  static constexpr bool kWgmma = kWgmma_;
  static constexpr int kWarps = HeadRowTiles(kHeads);
  static constexpr int kWgmmaN = LogitsWgmmaN(kHeads);
  static constexpr int kThreads = LogitsThreads(kHeads, kWgmma);
  static constexpr int kPagesPerCta = LogitsPagesPerCta(kWgmma);
  static constexpr int kLogitsMinBlocks = LogitsMinBlocks(kHeads, kWgmma);
  static constexpr int kSmemBytes = LogitsSmemBytes(kHeads, kWgmma);
  // Top-k.
  static constexpr int kTopkThreads = dsa_indexer::kTopkThreads;
  // The top-k entries' __launch_bounds__ minimum: one CTA an SM is the aim
  // (without a minimum, ptxas chose 64 registers for sm_120a and spilled).
  static constexpr int kTopkMinBlocks = 1;
  static constexpr int kTopkSmemBytes = TopkSmemBytes(kTopk);

  static_assert(kHeads >= 1 && kHeads <= kMaxIndexHeads, "index heads: 1..128");
  static_assert(kTopk >= 1 && kTopk <= kMaxTopk, "top-k: 1..4096");
  // The fragment layout below reads a key row as 8 chunks of 16 bytes: 2
  // groups of 4 k-steps of 16 values.
  static_assert(kHeadDim == 128, "the index head dim is 128");
  static_assert(kPage == 64, "a page holds 64 keys: 8 n-tiles of 8");
  static_assert(kTopkThreads % 32 == 0 && kTopkBins % kTopkThreads == 0,
                "the top-k bin scan gives each thread whole bins");
  // The 99 KB parts (sm_86/89, sm_120/121) run both top-k entries.
  static_assert(TopkClusterSmemBytes(kTopk) <= 99 * 1024, "top-k shared memory fits 99 KB");
  static_assert(kTopkUnroll * kTopkThreads * 4 <= (1 << 14),
                "a top-k round's counts fit the 16-bit fields WriteSurvivors packs");
  static_assert(kTopkBins % kTopkClusterCtas == 0 && kTopkBins / kTopkClusterCtas >= 1,
                "each CTA of a top-k cluster sums whole bins");
};

}  // namespace dsa_indexer
}  // namespace kforge

#endif  // KFORGE_DSA_INDEXER_TRAITS_CUH_
