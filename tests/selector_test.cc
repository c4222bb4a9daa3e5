// The selector: manifest tables per preset x TP x arch x batch, "nothing
// fits" reports and shape validation. Pure CPU (plans only, no compile).
#include "model/selector.h"

#include <cstdint>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "compiler/codegen.h"
#include "compiler/compiler.h"
#include "compiler/manifest.h"
#include "gtest/gtest.h"
#include "model/launch.h"
#include "model/launch_plan.h"
#include "model/spec.h"
#include "templates/kforge/sparse_mla/common/params.h"
#include "templates/kforge/sparse_mla/common/tiling.h"

namespace kforge {
namespace {

// gtest only (no gmock): substring checks with the haystack in the message.
#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "missing \"" << (needle) << "\" in:\n"                    \
      << (haystack)

constexpr int kSms = 132;

v1::Manifest MakeManifest(const std::string& preset, int tp, const std::string& arch) {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset(preset, tp);
  EXPECT_TRUE(spec.ok()) << spec.status();
  KernelCompiler compiler;
  absl::StatusOr<v1::Manifest> m = BuildManifest(compiler, KernelSpecOf(*spec), arch);
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

// `preset`'s manifest for `arch` with its KV cache in `dtype` (fp8_ds_mla
// with arbitrary scales, glm-5's convention) and, where topk > 0, that top-k.
absl::StatusOr<v1::Manifest> ManifestWithKv(const std::string& preset, int tp,
                                            v1::KvCacheDtype dtype, const std::string& arch,
                                            int topk = 0) {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset(preset, tp);
  if (!spec.ok()) return spec.status();
  spec->set_kv_cache_dtype(dtype);
  if (dtype == v1::KV_CACHE_DTYPE_FP8_DS_MLA) {
    spec->set_kv_scale_format(v1::KV_SCALE_FORMAT_ARBITRARY);
  }
  if (topk > 0) spec->set_topk(topk);
  return BuildManifest(KernelCompiler(), KernelSpecOf(*spec), arch);
}

RuntimeShape ShapeFor(const v1::AttentionSpec& spec, int batch, int s_q) {
  RuntimeShape shape;
  shape.batch = batch;
  shape.s_q = s_q;
  shape.num_q_heads = static_cast<int>(spec.num_q_heads());
  shape.topk = static_cast<int>(spec.topk());
  shape.kv_dtype = spec.kv_cache_dtype();
  shape.page_block_size = static_cast<int>(spec.page_block_size());
  return shape;
}

// Everything the launch rule promises about a selection.
void CheckSelection(const v1::Manifest& m, const Selection& sel, const RuntimeShape& shape,
                    int sm_count, int max_active_clusters = 0) {
  ASSERT_NE(sel.variant, nullptr);
  ASSERT_GE(sel.variant_index, 0);
  ASSERT_LT(sel.variant_index, m.variants_size());
  EXPECT_EQ(sel.variant, &m.variants(sel.variant_index));
  const v1::ManifestVariant& v = *sel.variant;
  // The small-batch path up to its max_tokens, the throughput one above.
  const bool small = !v.small_batch().entry().empty() &&
                     static_cast<uint32_t>(sel.num_tokens) <= v.small_batch().max_tokens();
  EXPECT_EQ(sel.small_batch, small);
  const v1::KernelTiling& t = small ? v.small_batch().tiling() : v.tiling();
  const v1::LaunchRule& l = small ? v.small_batch().launch() : v.launch();
  // The cluster entry where the small-batch rule splits exactly
  // cluster_splits ways and its clusters fit the device at once.
  const int rule_splits =
      NumSplits(v.spec().sparse_mla_decode(), t, l, shape.batch * shape.s_q, sm_count);
  const bool small_cluster =
      small && !v.small_batch().cluster_entry().empty() &&
      rule_splits == static_cast<int>(v.small_batch().cluster_splits()) &&
      static_cast<long long>(t.num_head_groups()) * shape.batch * shape.s_q <= max_active_clusters;
  // The throughput tiling's where the rule splits exactly its ways.
  const bool main_cluster = !small && !v.cluster().entry().empty() &&
                            rule_splits == static_cast<int>(v.cluster().splits());
  // Its wide one under the small-batch cluster entry's rule.
  const bool wide_cluster =
      !small && !v.cluster().wide_entry().empty() &&
      rule_splits == static_cast<int>(v.cluster().wide_splits()) &&
      static_cast<long long>(t.num_head_groups()) * shape.batch * shape.s_q <= max_active_clusters;
  const bool cluster = small_cluster || main_cluster || wide_cluster;
  EXPECT_EQ(sel.cluster, cluster);
  ASSERT_NE(sel.main_entry, nullptr);
  EXPECT_EQ(*sel.main_entry, small_cluster  ? v.small_batch().cluster_entry()
                             : main_cluster ? v.cluster().entry()
                             : wide_cluster ? v.cluster().wide_entry()
                             : small        ? v.small_batch().entry()
                                            : v.main_entry());
  EXPECT_EQ(sel.launch, &l);
  EXPECT_EQ(v.spec().sparse_mla_decode().s_q(), 0u);  // not part of the kernel: any s_q fits
  EXPECT_EQ(v.spec().sparse_mla_decode().num_q_heads(), static_cast<uint32_t>(shape.num_q_heads));
  EXPECT_EQ(sel.num_tokens, shape.batch * shape.s_q);
  EXPECT_GE(sel.num_splits, 1);
  // Split + combine launches only the rule's splits that hold keys.
  EXPECT_EQ(sel.num_splits, small_cluster ? static_cast<int>(v.small_batch().cluster_splits())
                            : cluster
                                ? rule_splits
                                : SplitsHoldingKeys(v.spec().sparse_mla_decode(), l, rule_splits));
  EXPECT_LE(sel.num_splits, rule_splits);
  EXPECT_EQ(sel.tokens_per_split, TokensPerSplit(v.spec().sparse_mla_decode(), l, sel.num_splits));
  EXPECT_EQ(sel.tokens_per_split % l.split_granularity_tokens(), 0u);
  EXPECT_GE(static_cast<long long>(sel.tokens_per_split) * sel.num_splits,
            v.spec().sparse_mla_decode().topk());
  // Splits never exceed the top-k tiles, and the grid stays within one wave
  // unless a single split already overflows it.
  const uint32_t tiles =
      (v.spec().sparse_mla_decode().topk() + t.token_tile() - 1) / t.token_tile();
  EXPECT_LE(static_cast<uint32_t>(sel.num_splits), tiles);
  if (sel.num_splits > 1) {
    EXPECT_LE(static_cast<long long>(t.num_head_groups()) * sel.num_splits * sel.num_tokens,
              static_cast<long long>(sm_count) * l.ctas_per_sm());
  }
  // Main kernel.
  EXPECT_EQ(sel.grid_x, t.num_head_groups());
  EXPECT_GE(t.num_head_groups() * t.heads_per_group(), v.spec().sparse_mla_decode().num_q_heads());
  EXPECT_EQ(sel.grid_y, static_cast<uint32_t>(sel.num_splits));
  EXPECT_EQ(sel.grid_z, static_cast<uint32_t>(sel.num_tokens));
  EXPECT_EQ(sel.block_threads, l.block_threads());
  EXPECT_EQ(sel.block_threads, (t.warps() + t.land_warps()) * 32);
  EXPECT_EQ(sel.dynamic_smem_bytes, l.dynamic_smem_bytes());
  EXPECT_GT(sel.dynamic_smem_bytes, 0u);
  // Combine and workspace.
  EXPECT_EQ(sel.needs_combine, sel.num_splits > 1 && !cluster);
  EXPECT_EQ(sel.workspace_bytes == 0, !sel.needs_combine);
  if (sel.needs_combine) {
    EXPECT_EQ(sel.combine_grid_x, static_cast<uint32_t>(sel.num_tokens));
    const uint32_t warps = l.combine_block_threads() / 32;
    // Column slices while the combine is small (<= 8 heads x tokens per SM).
    const bool few =
        static_cast<long long>(sel.num_tokens) * v.spec().sparse_mla_decode().num_q_heads() <=
        8LL * sm_count;
    const uint32_t slices = few ? static_cast<uint32_t>(sparse_mla::CombineSlices(static_cast<int>(
                                      v.spec().sparse_mla_decode().kv_lora_rank())))
                                : 1u;
    EXPECT_EQ(static_cast<uint32_t>(sel.combine_column_slices), slices);
    EXPECT_EQ(sel.combine_grid_y,
              (v.spec().sparse_mla_decode().num_q_heads() * slices + warps - 1) / warps);
    EXPECT_GE(sel.combine_grid_y * warps, v.spec().sparse_mla_decode().num_q_heads() * slices);
    EXPECT_EQ(sel.combine_block_threads, l.combine_block_threads());
    EXPECT_EQ(sel.workspace_bytes, static_cast<uint64_t>(sel.num_splits) * sel.num_tokens *
                                       l.workspace_bytes_per_split_token());
  } else {
    EXPECT_EQ(sel.combine_grid_x, 0u);
    EXPECT_EQ(sel.combine_grid_y, 0u);
    EXPECT_EQ(sel.combine_block_threads, 0u);
  }
}

class SelectorTable : public ::testing::TestWithParam<std::tuple<std::string, int, std::string>> {};

TEST_P(SelectorTable, EveryBatchGetsAConsistentLaunch) {
  const auto& [preset, tp, arch] = GetParam();
  const v1::Manifest m = MakeManifest(preset, tp, arch);
  // One variant: s_q does not change the kernel.
  ASSERT_EQ(m.variants_size(), 1);
  ASSERT_EQ(m.choice_order_size(), 1);
  EXPECT_EQ(m.arch(), arch);
  const v1::AttentionSpec& spec = m.variants(m.choice_order(0)).spec().sparse_mla_decode();
  EXPECT_EQ(spec.s_q(), 0u);
  int previous_splits = 1 << 30;
  bool previous_small = true;
  for (int batch : {1, 7, 32, 128}) {
    SCOPED_TRACE(absl::StrCat(preset, " tp", tp, " ", arch, " batch ", batch));
    const RuntimeShape shape = ShapeFor(spec, batch, 1);
    absl::StatusOr<Selection> sel = Select(m, DeviceInfo{arch, kSms}, shape);
    ASSERT_TRUE(sel.ok()) << sel.status();
    EXPECT_EQ(sel->variant_index, static_cast<int>(m.choice_order(0)));
    // Programmatic launches from sm_90 on (griddepcontrol), in the plan.
    EXPECT_EQ(sel->programmatic, arch != "sm_80");
    EXPECT_EQ(ToLaunchPlan(*sel).programmatic(), sel->programmatic);
    CheckSelection(m, *sel, shape, kSms);
    // On one path more tokens never mean more splits (leaving the small-
    // batch path may raise them: fewer, bigger head groups); once left, it
    // stays left. Batch 1 on 132 SMs always splits.
    if (sel->small_batch == previous_small) {
      EXPECT_LE(sel->num_splits, previous_splits);
    }
    EXPECT_TRUE(previous_small || !sel->small_batch);
    if (batch == 1) {
      EXPECT_TRUE(sel->needs_combine);  // no cluster capacity given: split + combine
    }
    previous_splits = sel->num_splits;
    previous_small = sel->small_batch;
  }
  // MTP shapes use the same kernel with batch * s_q tokens.
  for (int s_q : {2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat(preset, " tp", tp, " ", arch, " s_q ", s_q));
    const RuntimeShape shape = ShapeFor(spec, 7, s_q);
    absl::StatusOr<Selection> sel = Select(m, DeviceInfo{arch, kSms}, shape);
    ASSERT_TRUE(sel.ok()) << sel.status();
    CheckSelection(m, *sel, shape, kSms);
  }
}

// The H200's small-batch paths (BENCH.md 2026-12-01): a 16-head tile of 64
// tokens x 2 stages x 4 warps, up to 32 CTAs (bf16) or 8 (fp8_ds_mla) at one
// split; a spec whose throughput tiling is that tiling has none.
TEST(Select, SmallBatchPathUpToItsMaxTokens) {
  struct Case {
    const char* preset;
    int tp;
    v1::KvCacheDtype dtype;
    uint32_t max_tokens;  // 0: no small-batch path
    uint32_t head_tile;
  };
  for (const Case& c : {// 128 heads: 32-head tiles, batch 1 only (as the staged formats).
                        Case{"deepseek-v3.2", 1, v1::KV_CACHE_DTYPE_BF16, 1, 32},
                        Case{"glm-5", 1, v1::KV_CACHE_DTYPE_BF16, 8, 16},
                        Case{"glm-5", 8, v1::KV_CACHE_DTYPE_BF16, 32, 16},
                        // 128 heads of a staged format: 32-head tiles, batch 1 only.
                        Case{"deepseek-v3.2", 1, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 1, 32},
                        Case{"glm-5", 1, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 2, 16}}) {
    SCOPED_TRACE(absl::StrCat(c.preset, " tp", c.tp, " dtype ", c.dtype));
    absl::StatusOr<v1::Manifest> m = ManifestWithKv(c.preset, c.tp, c.dtype, "sm_90a");
    ASSERT_TRUE(m.ok()) << m.status();
    const v1::ManifestVariant& v = m->variants(0);
    EXPECT_EQ(v.small_batch().entry(), kSmallBatchEntry);
    EXPECT_EQ(v.small_batch().max_tokens(), c.max_tokens);
    EXPECT_EQ(v.small_batch().tiling().head_tile(), c.head_tile);
    EXPECT_EQ(v.small_batch().tiling().token_tile(), 64u);
    for (int batch : {1, 2, 4, 8, 16, 32, 33, 64}) {
      const RuntimeShape shape = ShapeFor(v.spec().sparse_mla_decode(), batch, 1);
      absl::StatusOr<Selection> sel = Select(*m, DeviceInfo{"sm_90a", kSms}, shape);
      ASSERT_TRUE(sel.ok()) << sel.status();
      EXPECT_EQ(sel->small_batch, static_cast<uint32_t>(batch) <= c.max_tokens) << batch;
      CheckSelection(*m, *sel, shape, kSms);
    }
  }
  // 99 KB parts: 8 heads already run the 16 x 32 tile, so no second kernel.
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("glm-5", 8);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<v1::Manifest> m = BuildManifest(KernelCompiler(), KernelSpecOf(*spec), "sm_120a");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->variants(0).has_small_batch());
}

// The small-batch path splits down to one 64-key tile each while 16 such
// splits cover the top-k, and keeps 128 keys a split above that (so top-k
// 2048 lands on the cluster entry), but for a staged format's lone head
// group (codegen.cc kMinKeysPerSplitSmallBatch; BENCH.md 2026-12-04).
TEST(Select, SmallBatchSplitsOneTileEach) {
  constexpr int kH200Clusters = 7;
  struct Case {
    const char* preset;
    int tp;
    v1::KvCacheDtype dtype;
    int topk, splits, keys;
    bool cluster;
  };
  const Case cases[] = {
      {"glm-5", 1, v1::KV_CACHE_DTYPE_BF16, 256, 4, 64, false},
      {"glm-5", 1, v1::KV_CACHE_DTYPE_BF16, 512, 8, 64, false},
      {"glm-5", 1, v1::KV_CACHE_DTYPE_BF16, 1024, 16, 64, true},
      {"glm-5", 1, v1::KV_CACHE_DTYPE_BF16, 1152, 9, 128, false},
      {"glm-5", 1, v1::KV_CACHE_DTYPE_BF16, 2048, 16, 128, true},
      {"glm-5", 1, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 512, 8, 64, false},
      {"glm-5", 1, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 2048, 16, 128, true},
      {"glm-5", 8, v1::KV_CACHE_DTYPE_BF16, 2048, 16, 128, true},
      {"glm-5", 8, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 1024, 16, 64, true},
      {"glm-5", 8, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 2048, 32, 64, false},
      {"glm-5", 8, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 1152, 18, 64, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.preset, " tp ", c.tp, " dtype ", c.dtype, " topk ", c.topk));
    absl::StatusOr<v1::Manifest> m = ManifestWithKv(c.preset, c.tp, c.dtype, "sm_90a", c.topk);
    ASSERT_TRUE(m.ok()) << m.status();
    const RuntimeShape shape = ShapeFor(m->variants(0).spec().sparse_mla_decode(), 1, 1);
    absl::StatusOr<Selection> sel = Select(*m, DeviceInfo{"sm_90a", kSms, 0, kH200Clusters}, shape);
    ASSERT_TRUE(sel.ok()) << sel.status();
    EXPECT_TRUE(sel->small_batch);
    EXPECT_EQ(sel->num_splits, c.splits);
    EXPECT_EQ(sel->tokens_per_split, c.keys);
    EXPECT_EQ(sel->cluster, c.cluster);
    CheckSelection(*m, *sel, shape, kSms, kH200Clusters);
  }
  // glm-5 TP8 (8 heads, one group) x batch 10: the rule's 13 splits take 3
  // of the 32 tiles each, so only 11 hold keys; split + combine launches 11.
  const v1::Manifest m = MakeManifest("glm-5", 8, "sm_90a");
  const RuntimeShape ten = ShapeFor(m.variants(0).spec().sparse_mla_decode(), 10, 1);
  const v1::SmallBatchPath& small = m.variants(0).small_batch();
  EXPECT_EQ(
      NumSplits(m.variants(0).spec().sparse_mla_decode(), small.tiling(), small.launch(), 10, kSms),
      13);
  absl::StatusOr<Selection> sel = Select(m, DeviceInfo{"sm_90a", kSms, 0, kH200Clusters}, ten);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_TRUE(sel->small_batch);
  EXPECT_EQ(sel->num_splits, 11);
  EXPECT_EQ(sel->tokens_per_split, 192u);
  EXPECT_TRUE(sel->needs_combine);
  CheckSelection(m, *sel, ten, kSms, kH200Clusters);
  // A forced count is launched as asked.
  absl::StatusOr<Selection> forced = Select(m, DeviceInfo{"sm_90a", kSms, 13, kH200Clusters}, ten);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(forced->num_splits, 13);
}

// A staged format's lone head group (8 or 16 heads) at top-k 2048: 32
// one-tile splits + combine up to two query tokens, the cluster entry's 16
// merged splits past them while its clusters fit, else 16 + combine
// (tuning lone_group_one_tile_max_tokens; BENCH.md "A lone head group past
// two query tokens"). Where the floor past them would not land on the
// cluster entry (top-k 1152: 18 tiles), or the arch has no cluster entry,
// one tile at every count, as before.
TEST(Select, LoneHeadGroupTakesTheClusterPastTwoTokens) {
  constexpr int kH200Clusters = 7;
  struct Case {
    int tp;
    v1::KvCacheDtype dtype;
    int tokens, splits;
    bool cluster;
  };
  const Case cases[] = {
      {8, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 1, 32, false},
      {8, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 2, 32, false},
      {8, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 3, 16, true},
      {8, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 6, 16, true},
      {8, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 7, 16, true},
      {8, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 8, 16, false},  // 8 clusters > 7: + combine
      {4, v1::KV_CACHE_DTYPE_NVFP4_DS_MLA, 2, 32, false},
      {4, v1::KV_CACHE_DTYPE_NVFP4_DS_MLA, 4, 16, true},
      // bf16 (a direct format) lands on the cluster entry at every count.
      {8, v1::KV_CACHE_DTYPE_BF16, 1, 16, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("glm-5 tp ", c.tp, " dtype ", c.dtype, " tokens ", c.tokens));
    absl::StatusOr<v1::Manifest> m = ManifestWithKv("glm-5", c.tp, c.dtype, "sm_90a", 2048);
    ASSERT_TRUE(m.ok()) << m.status();
    const RuntimeShape shape = ShapeFor(m->variants(0).spec().sparse_mla_decode(), c.tokens, 1);
    absl::StatusOr<Selection> sel = Select(*m, DeviceInfo{"sm_90a", kSms, 0, kH200Clusters}, shape);
    ASSERT_TRUE(sel.ok()) << sel.status();
    EXPECT_TRUE(sel->small_batch);
    EXPECT_EQ(sel->num_splits, c.splits);
    EXPECT_EQ(sel->cluster, c.cluster);
    EXPECT_EQ(sel->needs_combine, !c.cluster);
    CheckSelection(*m, *sel, shape, kSms, kH200Clusters);
  }
  // s_q counts: batch 2 x s_q 2 is four query tokens.
  {
    absl::StatusOr<v1::Manifest> m =
        ManifestWithKv("glm-5", 8, v1::KV_CACHE_DTYPE_FP8_DS_MLA, "sm_90a", 2048);
    ASSERT_TRUE(m.ok()) << m.status();
    const RuntimeShape shape = ShapeFor(m->variants(0).spec().sparse_mla_decode(), 2, 2);
    absl::StatusOr<Selection> sel = Select(*m, DeviceInfo{"sm_90a", kSms, 0, kH200Clusters}, shape);
    ASSERT_TRUE(sel.ok()) << sel.status();
    EXPECT_TRUE(sel->cluster);
  }
  // Unchanged: top-k 1152 (one tile at 3 tokens: 18 splits) and sm_120a
  // (no cluster entry: 32 one-tile splits at 4 tokens).
  for (const auto& [arch, topk, splits] :
       {std::tuple<const char*, int, int>{"sm_90a", 1152, 18}, {"sm_120a", 2048, 32}}) {
    SCOPED_TRACE(absl::StrCat(arch, " topk ", topk));
    absl::StatusOr<v1::Manifest> m =
        ManifestWithKv("glm-5", 8, v1::KV_CACHE_DTYPE_FP8_DS_MLA, arch, topk);
    ASSERT_TRUE(m.ok()) << m.status();
    const v1::LaunchRule& rule = m->variants(0).small_batch().launch();
    EXPECT_EQ(rule.min_tiles_max_tokens(), 0u);
    const RuntimeShape shape = ShapeFor(m->variants(0).spec().sparse_mla_decode(), 3, 1);
    absl::StatusOr<Selection> sel = Select(*m, DeviceInfo{arch, kSms, 0, 0}, shape);
    ASSERT_TRUE(sel.ok()) << sel.status();
    EXPECT_EQ(sel->num_splits, splits);
    EXPECT_FALSE(sel->cluster);
  }
}

// NumSplits' floor past min_tiles_max_tokens tokens.
TEST(NumSplits, FloorPastMaxTokens) {
  v1::AttentionSpec spec;
  spec.set_topk(2048);
  v1::KernelTiling tiling;
  tiling.set_num_head_groups(1);
  v1::LaunchRule rule;
  rule.set_split_granularity_tokens(64);
  rule.set_ctas_per_sm(1);
  rule.set_min_tiles_per_split(1);
  EXPECT_EQ(NumSplits(spec, tiling, rule, 4, 132), 32);  // no bound: one tile
  rule.set_min_tiles_max_tokens(2);
  rule.set_min_tiles_per_split_past(2);
  EXPECT_EQ(NumSplits(spec, tiling, rule, 1, 132), 32);
  EXPECT_EQ(NumSplits(spec, tiling, rule, 2, 132), 32);
  EXPECT_EQ(NumSplits(spec, tiling, rule, 3, 132), 16);
  EXPECT_EQ(NumSplits(spec, tiling, rule, 20, 132), 6);  // the one-wave fit still caps it
  rule.set_min_tiles_per_split_past(0);                  // a zero floor reads as one tile
  EXPECT_EQ(NumSplits(spec, tiling, rule, 3, 132), 32);
  // Hostile values from an artifact stay in 1..MaxSplits.
  rule.set_min_tiles_per_split_past(UINT32_MAX);
  EXPECT_EQ(NumSplits(spec, tiling, rule, 3, 132), 1);
  rule.set_min_tiles_max_tokens(UINT32_MAX);
  EXPECT_EQ(NumSplits(spec, tiling, rule, INT32_MAX, 132), 1);  // the fit: 0 -> 1
  EXPECT_EQ(NumSplits(spec, tiling, rule, 3, 132), 32);
}

// sm_90+: the small-batch path's cluster entry merges the splits in the
// kernel wherever the rule would split at least kClusterSplits ways; a
// forced split count, and archs without clusters, run split + combine.
TEST(Select, ClusterEntryReplacesSplitAndCombine) {
  constexpr int kH200Clusters = 7;  // 16-CTA clusters on the H200 (BENCH.md)
  for (const char* arch : {"sm_90a", "sm_100a"}) {
    SCOPED_TRACE(arch);
    const v1::Manifest m = MakeManifest("glm-5", 1, arch);  // 64 heads: 4 groups
    const v1::SmallBatchPath& small = m.variants(0).small_batch();
    EXPECT_EQ(small.cluster_entry(), kClusterEntry);
    EXPECT_EQ(small.cluster_splits(), static_cast<uint32_t>(sparse_mla::kClusterSplits));
    const RuntimeShape shape = ShapeFor(m.variants(0).spec().sparse_mla_decode(), 1, 1);
    const DeviceInfo device{arch, kSms, 0, kH200Clusters};
    absl::StatusOr<Selection> sel = Select(m, device, shape);
    ASSERT_TRUE(sel.ok()) << sel.status();
    EXPECT_TRUE(sel->cluster);
    EXPECT_EQ(*sel->main_entry, kClusterEntry);
    EXPECT_EQ(sel->num_splits, sparse_mla::kClusterSplits);
    EXPECT_EQ(sel->grid_y, static_cast<uint32_t>(sparse_mla::kClusterSplits));
    EXPECT_EQ(sel->tokens_per_split, 2048 / sparse_mla::kClusterSplits);
    EXPECT_FALSE(sel->needs_combine);
    EXPECT_EQ(sel->workspace_bytes, 0u);
    EXPECT_NE(DescribeSelection(*sel).find("merged in the kernel"), std::string::npos);
    CheckSelection(m, *sel, shape, kSms, kH200Clusters);
    // Unknown capacity (0): split + combine.
    absl::StatusOr<Selection> unknown = Select(m, DeviceInfo{arch, kSms}, shape);
    ASSERT_TRUE(unknown.ok()) << unknown.status();
    EXPECT_FALSE(unknown->cluster);
    EXPECT_TRUE(unknown->needs_combine);
    // Forced: split + combine at exactly that count, never the cluster.
    for (int forced : {1, 8, 16}) {
      absl::StatusOr<Selection> f = Select(m, DeviceInfo{arch, kSms, forced, kH200Clusters}, shape);
      ASSERT_TRUE(f.ok()) << f.status();
      EXPECT_FALSE(f->cluster);
      EXPECT_EQ(*f->main_entry, small.entry());
      EXPECT_EQ(f->num_splits, forced);
      EXPECT_EQ(f->needs_combine, forced > 1);
    }
    // 4 groups x 2 tokens = 8 clusters > 7 at once: split + combine.
    const RuntimeShape two = ShapeFor(m.variants(0).spec().sparse_mla_decode(), 2, 1);
    absl::StatusOr<Selection> wide = Select(m, device, two);
    ASSERT_TRUE(wide.ok()) << wide.status();
    EXPECT_FALSE(wide->cluster);
    CheckSelection(m, *wide, two, kSms, kH200Clusters);
    // ... unless the device holds 8.
    absl::StatusOr<Selection> roomy = Select(m, DeviceInfo{arch, kSms, 0, 8}, two);
    ASSERT_TRUE(roomy.ok()) << roomy.status();
    EXPECT_TRUE(roomy->cluster);
  }
  // A rule that splits more ways than the cluster (fp8, one head group: 32
  // one-tile splits) keeps split + combine.
  absl::StatusOr<v1::Manifest> fm =
      ManifestWithKv("glm-5", 8, v1::KV_CACHE_DTYPE_FP8_DS_MLA, "sm_90a");
  ASSERT_TRUE(fm.ok()) << fm.status();
  const RuntimeShape one = ShapeFor(fm->variants(0).spec().sparse_mla_decode(), 1, 1);
  absl::StatusOr<Selection> f = Select(*fm, DeviceInfo{"sm_90a", kSms, 0, kH200Clusters}, one);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->num_splits, 32);
  EXPECT_FALSE(f->cluster);
  CheckSelection(*fm, *f, one, kSms, kH200Clusters);
  // No 16-CTA clusters before sm_90, nor on the 99 KB Blackwell parts.
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_120a", "sm_121a"}) {
    const v1::Manifest m = MakeManifest("deepseek-v3.2", 1, arch);
    EXPECT_TRUE(m.variants(0).small_batch().cluster_entry().empty()) << arch;
  }
  // A top-k shorter than a tile per split has none either.
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("deepseek-v3.2", 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->set_topk(512);
  absl::StatusOr<v1::Manifest> short_topk =
      BuildManifest(KernelCompiler(), KernelSpecOf(*spec), "sm_90a");
  ASSERT_TRUE(short_topk.ok()) << short_topk.status();
  EXPECT_TRUE(short_topk->variants(0).small_batch().cluster_entry().empty());
  // A negative capacity is a caller's bug, named.
  absl::StatusOr<Selection> bad =
      Select(MakeManifest("glm-5", 1, "sm_90a"), DeviceInfo{"sm_90a", kSms, 0, -1}, one);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("device.max_active_clusters"), std::string::npos);
}

// The throughput tiling's cluster entry takes over where the rule splits
// kMainClusterSplits ways (128 heads x 32 tokens on 132 SMs: 2), needing no
// device capacity (a portable size inside the one-wave rule).
TEST(Select, MainClusterEntryWhereTheRuleSplitsTwoWays) {
  const v1::Manifest m = MakeManifest("deepseek-v3.2", 1, "sm_90a");
  const v1::ManifestVariant& v = m.variants(0);
  EXPECT_EQ(v.cluster().entry(), kMainClusterEntry);
  EXPECT_EQ(v.cluster().splits(), static_cast<uint32_t>(sparse_mla::kMainClusterSplits));
  const RuntimeShape shape = ShapeFor(v.spec().sparse_mla_decode(), 32, 1);
  absl::StatusOr<Selection> sel = Select(m, DeviceInfo{"sm_90a", kSms}, shape);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_FALSE(sel->small_batch);
  EXPECT_TRUE(sel->cluster);
  EXPECT_EQ(*sel->main_entry, kMainClusterEntry);
  EXPECT_EQ(sel->num_splits, 2);
  EXPECT_FALSE(sel->needs_combine);
  EXPECT_EQ(sel->workspace_bytes, 0u);
  CheckSelection(m, *sel, shape, kSms);
  // Forced 2: split + combine.
  absl::StatusOr<Selection> forced = Select(m, DeviceInfo{"sm_90a", kSms, 2}, shape);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_FALSE(forced->cluster);
  EXPECT_TRUE(forced->needs_combine);
  // One split (batch 128) or more than two (batch 16): the plain kernels.
  for (int batch : {16, 128}) {
    const RuntimeShape other = ShapeFor(v.spec().sparse_mla_decode(), batch, 1);
    absl::StatusOr<Selection> o = Select(m, DeviceInfo{"sm_90a", kSms}, other);
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_FALSE(o->cluster) << batch;
  }
  for (const char* arch : {"sm_80", "sm_89", "sm_120a"}) {
    EXPECT_TRUE(MakeManifest("deepseek-v3.2", 1, arch).variants(0).cluster().entry().empty())
        << arch;
  }
  v1::Manifest bad = m;
  bad.mutable_variants(0)->mutable_cluster()->set_splits(4);
  absl::StatusOr<Selection> refused = Select(bad, DeviceInfo{"sm_90a", kSms}, shape);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("cluster.splits"), std::string::npos)
      << refused.status();
}

// A crossover tiling's main entry launches as 2-CTA clusters over head
// groups: a manifest that pairs an odd number of them is refused, not
// launched.
TEST(Select, CrossoverNeedsAnEvenHeadGroupCount) {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("deepseek-v3.2", 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_MXFP8_DS_MLA_V41);
  spec->set_kv_scale_format(v1::KV_SCALE_FORMAT_UNSPECIFIED);
  spec->set_rope_dim(0);
  absl::StatusOr<v1::Manifest> m = BuildManifest(KernelCompiler(), KernelSpecOf(*spec), "sm_90a");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->variants(0).tiling().crossover());
  ASSERT_EQ(m->variants(0).tiling().num_head_groups(), 2u);
  // V4.1 runs the warp-specialised pipeline only as pairs: no 2-split
  // cluster, but the 16-split one, which the manifest carries and batch 2
  // takes on a 7-cluster H200.
  EXPECT_TRUE(m->variants(0).cluster().entry().empty());
  EXPECT_EQ(m->variants(0).cluster().wide_entry(), kMainWideClusterEntry);
  absl::StatusOr<Selection> two = Select(*m, DeviceInfo{"sm_90a", kSms, 0, 7},
                                         ShapeFor(m->variants(0).spec().sparse_mla_decode(), 2, 1));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two->main_entry, kMainWideClusterEntry);
  const RuntimeShape shape = ShapeFor(m->variants(0).spec().sparse_mla_decode(), 64, 1);
  absl::StatusOr<Selection> sel = Select(*m, DeviceInfo{"sm_90a", kSms}, shape);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_FALSE(sel->small_batch);
  EXPECT_EQ(sel->grid_x, 2u);
  m->mutable_variants(0)->mutable_tiling()->set_num_head_groups(3);
  sel = Select(*m, DeviceInfo{"sm_90a", kSms}, shape);
  ASSERT_FALSE(sel.ok());
  EXPECT_NE(sel.status().message().find("crossover needs an even num_head_groups, got 3"),
            std::string::npos)
      << sel.status();
}

// The warp-specialised tiling (fp8_ds_mla and V4 on sm_90a) has a second,
// 16-CTA cluster entry: taken where the throughput rule splits 16 ways and
// the clusters fit the device at once (128 heads x batch 2 and 3, 64 heads x
// batch 3..7 on a 7-cluster H200), never otherwise; other tilings and
// archs have none.
TEST(Select, WideMainClusterEntryForTheWarpSpecialisedTiling) {
  constexpr int kH200Clusters = 7;
  for (const char* preset : {"deepseek-v3.2", "glm-5"}) {
    SCOPED_TRACE(preset);
    absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset(preset, 1);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
    spec->set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2);
    absl::StatusOr<v1::Manifest> m = BuildManifest(KernelCompiler(), KernelSpecOf(*spec), "sm_90a");
    ASSERT_TRUE(m.ok()) << m.status();
    const v1::ManifestVariant& v = m->variants(0);
    ASSERT_EQ(v.tiling().land_warps(), 4u);  // the warp-specialised pipeline
    EXPECT_EQ(v.cluster().wide_entry(), kMainWideClusterEntry);
    EXPECT_EQ(v.cluster().wide_splits(), static_cast<uint32_t>(sparse_mla::kClusterSplits));
    const int groups = static_cast<int>(v.tiling().num_head_groups());
    int wide = 0;
    for (int batch = 1; batch <= 64; ++batch) {
      SCOPED_TRACE(batch);
      const RuntimeShape shape = ShapeFor(v.spec().sparse_mla_decode(), batch, 1);
      absl::StatusOr<Selection> sel =
          Select(*m, DeviceInfo{"sm_90a", kSms, 0, kH200Clusters}, shape);
      ASSERT_TRUE(sel.ok()) << sel.status();
      CheckSelection(*m, *sel, shape, kSms, kH200Clusters);
      if (*sel->main_entry != kMainWideClusterEntry) continue;
      ++wide;
      EXPECT_FALSE(sel->small_batch);
      EXPECT_EQ(sel->num_splits, sparse_mla::kClusterSplits);
      EXPECT_LE(groups * batch, kH200Clusters);
      EXPECT_FALSE(sel->needs_combine);
      EXPECT_EQ(sel->workspace_bytes, 0u);
      // Unknown capacity, or a forced split count: split + combine.
      absl::StatusOr<Selection> unknown = Select(*m, DeviceInfo{"sm_90a", kSms}, shape);
      ASSERT_TRUE(unknown.ok()) << unknown.status();
      EXPECT_FALSE(unknown->cluster);
      EXPECT_TRUE(unknown->needs_combine);
      absl::StatusOr<Selection> forced =
          Select(*m, DeviceInfo{"sm_90a", kSms, sparse_mla::kClusterSplits, kH200Clusters}, shape);
      ASSERT_TRUE(forced.ok()) << forced.status();
      EXPECT_FALSE(forced->cluster);
    }
    EXPECT_GE(wide, 1);
    // Its size is compiled in: another is refused by name.
    v1::Manifest bad = *m;
    bad.mutable_variants(0)->mutable_cluster()->set_wide_splits(8);
    absl::StatusOr<Selection> refused = Select(bad, DeviceInfo{"sm_90a", kSms, 0, kH200Clusters},
                                               ShapeFor(v.spec().sparse_mla_decode(), 32, 1));
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("cluster.wide_splits"), std::string::npos)
        << refused.status();
  }
  // The bf16 tiling has one only above 112 heads, where its small-batch path
  // serves batch 1 alone: 128 heads x batch 2 and 3 take it, batch 4 (8
  // clusters) runs split + combine.
  EXPECT_TRUE(MakeManifest("glm-5", 1, "sm_90a").variants(0).cluster().wide_entry().empty());
  const v1::Manifest bf16 = MakeManifest("deepseek-v3.2", 1, "sm_90a");
  EXPECT_EQ(bf16.variants(0).cluster().wide_entry(), kMainWideClusterEntry);
  for (int batch = 1; batch <= 4; ++batch) {
    SCOPED_TRACE(batch);
    const RuntimeShape shape = ShapeFor(bf16.variants(0).spec().sparse_mla_decode(), batch, 1);
    absl::StatusOr<Selection> sel =
        Select(bf16, DeviceInfo{"sm_90a", kSms, 0, kH200Clusters}, shape);
    ASSERT_TRUE(sel.ok()) << sel.status();
    CheckSelection(bf16, *sel, shape, kSms, kH200Clusters);
    EXPECT_EQ(*sel->main_entry == kMainWideClusterEntry, batch == 2 || batch == 3);
    EXPECT_EQ(sel->needs_combine, batch == 4);
  }
  // fp8_ds_mla off sm_90a has none.
  absl::StatusOr<v1::AttentionSpec> fp8 = SpecFromPreset("deepseek-v3.2", 1);
  ASSERT_TRUE(fp8.ok());
  fp8->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  fp8->set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2);
  for (const char* arch : {"sm_80", "sm_100a", "sm_120a"}) {
    absl::StatusOr<v1::Manifest> m = BuildManifest(KernelCompiler(), KernelSpecOf(*fp8), arch);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(m->variants(0).cluster().wide_entry().empty()) << arch;
  }
}

// The cluster size is compiled into the entry: a manifest that says another
// is refused by name rather than launched with a grid that merges wrongly.
TEST(Select, ClusterSplitsOtherThanTheTemplatesAreRefused) {
  v1::Manifest m = MakeManifest("glm-5", 8, "sm_90a");
  ASSERT_FALSE(m.variants(0).small_batch().cluster_entry().empty());
  m.mutable_variants(0)->mutable_small_batch()->set_cluster_splits(sparse_mla::kClusterSplits / 2);
  absl::StatusOr<Selection> sel = Select(m, DeviceInfo{"sm_90a", kSms, 0, 7},
                                         ShapeFor(m.variants(0).spec().sparse_mla_decode(), 1, 1));
  ASSERT_FALSE(sel.ok());
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sel.status().message().find("small_batch.cluster_splits"), std::string::npos)
      << sel.status();
  EXPECT_NE(sel.status().message().find(absl::StrCat("got ", sparse_mla::kClusterSplits / 2)),
            std::string::npos)
      << sel.status();
}

INSTANTIATE_TEST_SUITE_P(AllPresets, SelectorTable,
                         ::testing::Combine(::testing::Values("deepseek-v3.2", "glm-5"),
                                            ::testing::Values(1, 2, 4, 8),
                                            ::testing::Values("sm_80", "sm_90a", "sm_120a")),
                         [](const auto& info) {
                           std::string name =
                               absl::StrCat(std::get<0>(info.param), "_tp", std::get<1>(info.param),
                                            "_", std::get<2>(info.param));
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

TEST(BuildManifest, OneVariantServesEverySqAndTheSelectorEvaluatesSplits) {
  absl::StatusOr<v1::AttentionSpec> asked = SpecFromPreset("glm-5", 8);
  ASSERT_TRUE(asked.ok()) << asked.status();
  asked->set_s_q(3);
  absl::StatusOr<v1::Manifest> with_sq =
      BuildManifest(KernelCompiler(), KernelSpecOf(*asked), "sm_90a");
  ASSERT_TRUE(with_sq.ok()) << with_sq.status();
  const v1::Manifest m = MakeManifest("glm-5", 8, "sm_90a");
  // Asking with an s_q gives the same manifest, byte for byte.
  EXPECT_EQ(with_sq->SerializeAsString(), m.SerializeAsString());
  ASSERT_EQ(m.variants_size(), 1);
  EXPECT_EQ(m.variants(m.choice_order(0)).spec().sparse_mla_decode().s_q(), 0u);
  // The selector evaluates it for a concrete device.
  const RuntimeShape shape = ShapeFor(m.variants(0).spec().sparse_mla_decode(), 32, 3);
  absl::StatusOr<Selection> sel = Select(m, DeviceInfo{"sm_90a", kSms}, shape);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->variant_index, static_cast<int>(m.choice_order(0)));
  CheckSelection(m, *sel, shape, kSms);
}

TEST(Select, FollowsChoiceOrderAndAcceptsShortArchNames) {
  v1::Manifest m = MakeManifest("deepseek-v3.2", 8, "sm_90a");
  const RuntimeShape shape = ShapeFor(m.variants(0).spec().sparse_mla_decode(), 4, 2);
  absl::StatusOr<Selection> sel = Select(m, DeviceInfo{"90a", kSms}, shape);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->num_tokens, 8);
  // An empty choice order falls back to variant order.
  m.clear_choice_order();
  sel = Select(m, DeviceInfo{"sm_90a", kSms}, shape);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->variant_index, 0);
}

TEST(Select, SplitsShrinkAsTheBatchGrows) {
  const v1::Manifest m = MakeManifest("deepseek-v3.2", 1, "sm_90a");
  const v1::AttentionSpec& spec = m.variants(0).spec().sparse_mla_decode();
  int previous = 1 << 30;
  bool previous_small = true;
  for (int batch = 1; batch <= 256; batch *= 2) {
    absl::StatusOr<Selection> sel = Select(m, DeviceInfo{"sm_90a", kSms}, ShapeFor(spec, batch, 1));
    ASSERT_TRUE(sel.ok()) << sel.status();
    // Within a path (the small-batch one at batch 1, then the 64-head one).
    if (sel->small_batch == previous_small) {
      EXPECT_LE(sel->num_splits, previous) << batch;
    }
    EXPECT_EQ(sel->small_batch, batch <= 1) << "batch " << batch;
    previous = sel->num_splits;
    previous_small = sel->small_batch;
  }
}

class NothingFits : public ::testing::Test {
 protected:
  void SetUp() override {
    m_ = MakeManifest("glm-5", 8, "sm_90a");
    shape_ = ShapeFor(m_.variants(0).spec().sparse_mla_decode(), 4, 1);
  }
  // Selects and expects NotFound whose report names every `needle`.
  std::string ExpectReport(const DeviceInfo& device, const RuntimeShape& shape) {
    absl::StatusOr<Selection> sel = Select(m_, device, shape);
    EXPECT_EQ(sel.status().code(), absl::StatusCode::kNotFound) << sel.status();
    const std::string report(sel.status().message());
    EXPECT_CONTAINS(report, ("no kernel variant fits: required arch"));
    for (int i = 0; i < m_.variants_size(); ++i) {
      EXPECT_CONTAINS(
          report, (absl::StrCat("variant ", i, " ", m_.variants(i).module_name(), ": supports")));
    }
    return report;
  }
  v1::Manifest m_;
  RuntimeShape shape_;
};

// s_q only multiplies the tokens: a kernel serves any s_q (MTP, or many
// query tokens per request as in sparse prefill).
TEST_F(NothingFits, AnySqFits) {
  for (int s_q : {1, 2, 4, 5, 64}) {
    shape_.s_q = s_q;
    absl::StatusOr<Selection> sel = Select(m_, {"sm_90a", kSms}, shape_);
    ASSERT_TRUE(sel.ok()) << sel.status();
    EXPECT_EQ(sel->num_tokens, shape_.batch * s_q);
    CheckSelection(m_, *sel, shape_, kSms);
  }
}

TEST_F(NothingFits, WrongHeads) {
  shape_.num_q_heads = 16;
  const std::string r = ExpectReport({"sm_90a", kSms}, shape_);
  EXPECT_CONTAINS(r, ("heads 16"));
  EXPECT_CONTAINS(r, ("missing heads=16 (supports 8)"));
}

TEST_F(NothingFits, WrongTopk) {
  shape_.topk = 1024;
  const std::string r = ExpectReport({"sm_90a", kSms}, shape_);
  EXPECT_CONTAINS(r, ("topk=1024 (supports 2048)"));
}

TEST_F(NothingFits, WrongArch) {
  const std::string r = ExpectReport({"sm_120a", kSms}, shape_);
  EXPECT_CONTAINS(r, ("required arch sm_120a"));
  EXPECT_CONTAINS(r, ("missing arch sm_120a (is sm_90a)"));
}

TEST_F(NothingFits, WrongDtype) {
  shape_.kv_dtype = v1::KV_CACHE_DTYPE_FP8_DS_MLA;
  const std::string r = ExpectReport({"sm_90a", kSms}, shape_);
  EXPECT_CONTAINS(r, ("dtype fp8_ds_mla"));
  EXPECT_CONTAINS(r, ("dtype=fp8_ds_mla (supports bf16)"));
}

TEST_F(NothingFits, WrongPageSizeAndSeveralFeaturesAtOnce) {
  shape_.page_block_size = 32;
  shape_.topk = 1024;
  const std::string r = ExpectReport({"sm_120a", kSms}, shape_);
  EXPECT_CONTAINS(r, ("page_size=32 (supports 64)"));
  EXPECT_CONTAINS(r, ("missing arch sm_120a (is sm_90a), topk=1024 (supports 2048), "
                      "page_size=32 (supports 64)"));
}

TEST_F(NothingFits, EmptyManifest) {
  m_.clear_variants();
  m_.clear_choice_order();
  absl::StatusOr<Selection> sel = Select(m_, {"sm_90a", kSms}, shape_);
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kNotFound);
  EXPECT_CONTAINS(std::string(sel.status().message()), ("no variants"));
}

// A manifest whose small-batch path is broken fails like a broken main path,
// naming it, and only for the batches that would take it.
TEST(SelectInvalid, BrokenSmallBatchPathIsNamed) {
  v1::Manifest m = MakeManifest("deepseek-v3.2", 1, "sm_90a");
  ASSERT_FALSE(m.variants(0).small_batch().entry().empty());
  m.mutable_variants(0)->mutable_small_batch()->mutable_tiling()->set_num_head_groups(0);
  const v1::AttentionSpec& spec = m.variants(0).spec().sparse_mla_decode();
  absl::StatusOr<Selection> sel = Select(m, DeviceInfo{"sm_90a", kSms}, ShapeFor(spec, 1, 1));
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(sel.status().message(), "manifest.variants[0].small_batch");
  sel = Select(m, DeviceInfo{"sm_90a", kSms}, ShapeFor(spec, 64, 1));
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_FALSE(sel->small_batch);
}

TEST(SelectInvalid, ShapeDeviceAndManifestFieldsAreNamed) {
  const v1::Manifest m = MakeManifest("glm-5", 8, "sm_90a");
  const RuntimeShape good = ShapeFor(m.variants(0).spec().sparse_mla_decode(), 4, 1);
  ASSERT_TRUE(Select(m, {"sm_90a", kSms}, good).ok());
  struct Case {
    const char* field;
    RuntimeShape shape;
    DeviceInfo device;
  };
  auto with = [&](auto mutate) {
    RuntimeShape s = good;
    mutate(s);
    return s;
  };
  const Case cases[] = {
      {"shape.batch", with([](RuntimeShape& s) { s.batch = 0; }), {"sm_90a", kSms}},
      {"shape.batch", with([](RuntimeShape& s) { s.batch = -3; }), {"sm_90a", kSms}},
      {"shape.batch",
       with([](RuntimeShape& s) {
         s.batch = 40000;
         s.s_q = 2;
       }),
       {"sm_90a", kSms}},
      {"shape.s_q", with([](RuntimeShape& s) { s.s_q = 0; }), {"sm_90a", kSms}},
      {"shape.num_q_heads", with([](RuntimeShape& s) { s.num_q_heads = 0; }), {"sm_90a", kSms}},
      {"shape.topk", with([](RuntimeShape& s) { s.topk = -1; }), {"sm_90a", kSms}},
      {"shape.page_block_size",
       with([](RuntimeShape& s) { s.page_block_size = 0; }),
       {"sm_90a", kSms}},
      {"shape.kv_dtype",
       with([](RuntimeShape& s) { s.kv_dtype = v1::KV_CACHE_DTYPE_UNSPECIFIED; }),
       {"sm_90a", kSms}},
      {"device.sm_count", good, {"sm_90a", 0}},
      {"device.arch", good, {"", kSms}},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Selection> sel = Select(m, c.device, c.shape);
    EXPECT_EQ(sel.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_CONTAINS(std::string(sel.status().message()), (c.field));
  }
  v1::Manifest bad = m;
  bad.add_choice_order(9);
  absl::StatusOr<Selection> sel = Select(bad, {"sm_90a", kSms}, good);
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(std::string(sel.status().message()), ("manifest.choice_order[1]"));
}

}  // namespace
}  // namespace kforge
