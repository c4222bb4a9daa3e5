// The DSA indexer's call plan: argument checks with their messages, the
// launches from the module's recorded launch, the parameter blocks, and the
// byte layout python/kforge/dsa_indexer.py packs.
#include <cstddef>
#include <string>

#include "absl/strings/match.h"
#include "compiler/indexer_codegen.h"
#include "gtest/gtest.h"
#include "model/indexer_plan.h"
#include "model/indexer_spec.h"
#include "templates/kforge/dsa_indexer/config.h"

namespace kforge {
namespace {

using dsa_indexer::kTopkClusterCtas;
using dsa_indexer::kTopkClusterLongContext;
using dsa_indexer::kTopkClusterMaxRows;
using dsa_indexer::kTopkClusterShortRows;
using dsa_indexer::kTopkThreads;
using dsa_indexer::LogitsParams;
using dsa_indexer::TopkClusterSmemBytes;
using dsa_indexer::TopkParams;

// The parameter blocks are plain structs the device reads by value; their
// layout is fixed here so a change to config.h is a decision, not an
// accident (a compiled module records the sizes it was built with).
static_assert(offsetof(LogitsParams, q_row_stride) == 48);
static_assert(offsetof(LogitsParams, query_start) == 88);
static_assert(offsetof(LogitsParams, batch) == 96);
static_assert(offsetof(LogitsParams, max_context) == 108);
static_assert(sizeof(LogitsParams) == 112);
static_assert(offsetof(TopkParams, logits_stride) == 40);
static_assert(offsetof(TopkParams, query_start) == 72);
static_assert(offsetof(TopkParams, batch) == 80);
static_assert(offsetof(TopkParams, slot_page_size) == 92);
static_assert(offsetof(TopkParams, max_context) == 96);
static_assert(sizeof(TopkParams) == 104);

struct Module {
  v1::DsaIndexerSpec spec = *IndexerSpecFromPreset("deepseek-v3.2", 1);
  v1::IndexerLaunch launch = MakeIndexerLaunch(spec, *ParseArch("sm_90a"));
};

IndexerLogitsArgs GoodLogits() {
  IndexerLogitsArgs a;
  a.q = 0x10000;
  a.weights = 0x20000;
  a.index_cache = 0x30000;
  a.block_table = 0x40000;
  a.context_lens = 0x50000;
  a.logits = 0x60000;
  a.q_row_stride = 64 * 128;
  a.weights_row_stride = 64;
  a.page_stride = 64 * 132;
  a.block_table_cols = 513;
  a.block_table_stride = 513;
  a.max_context = 32768;
  a.logits_cols = 32768;
  a.logits_stride = 32772;
  a.batch = 128;
  a.s_q = 2;
  return a;
}

IndexerTopkArgs GoodTopk() {
  IndexerTopkArgs a;
  a.logits = 0x60000;
  a.context_lens = 0x50000;
  a.indices = 0x70000;
  a.block_table = 0x80000;
  a.slots = 0x90000;
  a.logits_stride = 32772;
  a.indices_stride = 2048;
  a.block_table_stride = 600;
  a.slots_stride = 2048;
  a.batch = 128;
  a.s_q = 2;
  a.slot_page_size = 64;
  a.max_context = 32768;
  return a;
}

// sm_90a's logits kernel takes its chunk from the grid: 32 pages a CTA
// while the grid has kLogitsTargetCtas CTAs, halved down to 8 below that; a
// fixed-chunk module (mma.sync) keeps its own.
TEST(IndexerPlanTest, LogitsChunkFollowsTheRows) {
  const Module m;
  ASSERT_EQ(m.launch.logits_keys_per_cta(), 2048u);
  ASSERT_EQ(m.launch.logits_min_keys_per_cta(), 512u);
  IndexerLogitsArgs a = GoodLogits();  // 256 rows x 32768
  absl::StatusOr<IndexerKernelLaunch<LogitsParams>> l = PlanIndexerLogits(m.spec, m.launch, a);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->grid_x, 16u);  // 4096 CTAs of 32 pages
  a.batch = 1;
  a.s_q = 1;
  a.max_context = 131072;
  a.logits_cols = a.logits_stride = 131072;
  a.block_table_cols = a.block_table_stride = 2048;
  l = PlanIndexerLogits(m.spec, m.launch, a);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->grid_x, 256u);  // 8 pages: 64 of 32 and 128 of 16 would be under 1024
  EXPECT_EQ(dsa_indexer::LogitsChunkPages(a.max_context, 256), 8);
  // The kernel's chunk from any grid the rule gives covers max_context.
  for (int ctx : {1, 63, 64, 65, 1000, 8191, 20 * 64, 131072}) {
    for (int pages : {8, 16, 32}) {
      const int gx = static_cast<int>(dsa_indexer::LogitsGridX(ctx, pages));
      const int chunk = dsa_indexer::LogitsChunkPages(ctx, gx);
      EXPECT_LE(chunk, pages) << ctx;
      EXPECT_GE(int64_t{gx} * chunk * 64, ctx) << ctx;
    }
  }
  // A fixed-chunk module: 4 pages whatever the rows.
  const v1::IndexerLaunch fixed = MakeIndexerLaunch(m.spec, *ParseArch("sm_90"));
  l = PlanIndexerLogits(m.spec, fixed, a);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->grid_x, 131072u / 256);
  // A chunk this build has no kernel for is refused.
  v1::IndexerLaunch odd = m.launch;
  odd.set_logits_min_keys_per_cta(64);
  l = PlanIndexerLogits(m.spec, odd, a);
  EXPECT_FALSE(l.ok());
  EXPECT_TRUE(absl::StrContains(l.status().message(), "logits_min_keys_per_cta")) << l.status();
  odd = m.launch;
  odd.set_logits_keys_per_cta(0);
  EXPECT_FALSE(PlanIndexerLogits(m.spec, odd, a).ok());
}

TEST(IndexerPlanTest, LogitsLaunchAndParams) {
  const Module m;
  absl::StatusOr<IndexerKernelLaunch<LogitsParams>> l =
      PlanIndexerLogits(m.spec, m.launch, GoodLogits());
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->entry, kIndexerLogitsEntry);
  EXPECT_EQ(l->grid_x, 32768u / m.launch.logits_keys_per_cta());
  EXPECT_EQ(l->grid_y, 256u);  // 128 requests x 2 rows
  EXPECT_EQ(l->block_threads, m.launch.logits_block_threads());
  EXPECT_EQ(l->dynamic_smem_bytes, m.launch.logits_smem_bytes());
  EXPECT_EQ(reinterpret_cast<uint64_t>(l->params.kv), 0x30000u);
  EXPECT_EQ(l->params.logits_stride, 32772);
  EXPECT_EQ(l->params.s_q, 2);
  EXPECT_EQ(l->params.max_context, 32768);
}

TEST(IndexerPlanTest, TopkLaunchAndParams) {
  const Module m;
  absl::StatusOr<IndexerKernelLaunch<TopkParams>> l = PlanIndexerTopk(m.spec, m.launch, GoodTopk());
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->entry, kIndexerTopkEntry);
  EXPECT_EQ(l->grid_x, 256u);
  EXPECT_EQ(l->block_threads, 512u);
  EXPECT_EQ(reinterpret_cast<uint64_t>(l->params.slots), 0x90000u);
  EXPECT_EQ(l->params.slot_page_size, 64);
  EXPECT_EQ(l->params.max_context, 32768);
  // No slots: both null.
  IndexerTopkArgs a = GoodTopk();
  a.block_table = 0;
  a.slots = 0;
  EXPECT_TRUE(PlanIndexerTopk(m.spec, m.launch, a).ok());
}

// Few rows take the cluster entry (sm_90+): kTopkClusterCtas CTAs per row;
// up to kTopkClusterShortRows rows of any length, up to kTopkClusterMaxRows
// of a long context.
TEST(IndexerPlanTest, FewRowsTakeTheTopkClusterEntry) {
  const Module m;
  IndexerTopkArgs a = GoodTopk();       // max_context 32768
  a.batch = kTopkClusterShortRows / 2;  // s_q 2
  absl::StatusOr<IndexerKernelLaunch<TopkParams>> l = PlanIndexerTopk(m.spec, m.launch, a);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->entry, kIndexerTopkClusterEntry);
  a.batch += 1;  // short rows past kTopkClusterShortRows: one CTA each
  l = PlanIndexerTopk(m.spec, m.launch, a);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->entry, kIndexerTopkEntry);
  a.max_context = a.logits_stride = kTopkClusterLongContext;
  a.batch = kTopkClusterMaxRows / 2;  // long rows: up to kTopkClusterMaxRows
  l = PlanIndexerTopk(m.spec, m.launch, a);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->entry, kIndexerTopkClusterEntry);
  EXPECT_EQ(l->grid_x, static_cast<uint32_t>(kTopkClusterMaxRows * kTopkClusterCtas));
  EXPECT_EQ(l->block_threads, static_cast<uint32_t>(kTopkThreads));
  EXPECT_EQ(l->dynamic_smem_bytes, static_cast<uint32_t>(TopkClusterSmemBytes(2048)));
  EXPECT_EQ(l->params.rows, kTopkClusterMaxRows);
  EXPECT_TRUE(l->programmatic);  // sm_90+: scheduled while the logits finish
  a.batch += 1;                  // one CTA per row above
  l = PlanIndexerTopk(m.spec, m.launch, a);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->entry, kIndexerTopkEntry);
  EXPECT_EQ(l->grid_x, static_cast<uint32_t>(kTopkClusterMaxRows + 2));
  // Before sm_90 there is no cluster entry: one CTA per row always.
  const v1::IndexerLaunch sm89 = MakeIndexerLaunch(m.spec, *ParseArch("sm_89"));
  EXPECT_FALSE(sm89.has_topk_cluster());
  a.batch = 1;
  l = PlanIndexerTopk(m.spec, sm89, a);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->entry, kIndexerTopkEntry);
  EXPECT_EQ(l->grid_x, 2u);
  EXPECT_FALSE(l->programmatic);
  EXPECT_FALSE(PlanIndexerLogits(m.spec, sm89, GoodLogits())->programmatic);
  EXPECT_TRUE(PlanIndexerLogits(m.spec, m.launch, GoodLogits())->programmatic);
}

// A launch whose cluster or block differs from this build's config.h (an
// old or forged manifest) is refused: the kernel splits rows by the cluster
// size and strides by the block it was compiled with.
TEST(IndexerPlanTest, ALaunchNotOfThisBuildIsRefused) {
  Module m;
  m.launch.mutable_topk_cluster()->set_ctas(16);
  absl::Status s = PlanIndexerTopk(m.spec, m.launch, GoodTopk()).status();
  EXPECT_TRUE(absl::StrContains(s.message(), "launch.topk_cluster: got 16 CTAs")) << s;
  m = Module();
  m.launch.set_topk_block_threads(256);
  s = PlanIndexerTopk(m.spec, m.launch, GoodTopk()).status();
  EXPECT_TRUE(absl::StrContains(s.message(), "launch.topk_block_threads: got 256")) << s;
}

void ExpectLogitsProblem(const IndexerLogitsArgs& a, const std::string& text) {
  const Module m;
  absl::Status s = PlanIndexerLogits(m.spec, m.launch, a).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
  EXPECT_TRUE(absl::StrContains(s.message(), text)) << s << " lacks " << text;
}

TEST(IndexerPlanTest, LogitsProblemsNameTheField) {
  IndexerLogitsArgs a = GoodLogits();
  a.s_q = 5;
  ExpectLogitsProblem(a, "s_q: got 5, supported 1..4");
  a = GoodLogits();
  a.q = 0;
  ExpectLogitsProblem(a, "q: got null, supported a device address");
  a = GoodLogits();
  a.q += 8;
  ExpectLogitsProblem(a, "supported a multiple of 16");
  a = GoodLogits();
  a.q_row_stride = 32 * 128;
  ExpectLogitsProblem(a, "q_row_stride: got 4096, supported >= 8192");
  a = GoodLogits();
  a.page_stride = 64 * 128;
  ExpectLogitsProblem(a, "page_stride: got 8192, supported >= 8448");
  a = GoodLogits();
  a.block_table_cols = 100;
  ExpectLogitsProblem(a, "block_table_cols: got 100, supported >= 512");
  a = GoodLogits();
  a.logits_cols = 1000;
  ExpectLogitsProblem(a, "logits_cols: got 1000, supported >= 32768");
  a = GoodLogits();
  a.batch = 40000;
  ExpectLogitsProblem(a, "batch * s_q: got 80000, supported 1..65535");
}

// Prefill: query_start's ragged rows, `rows` of them, s_q 0.
TEST(IndexerPlanTest, PrefillLaunchesOneRowPerQueryToken) {
  const Module m;
  IndexerLogitsArgs a = GoodLogits();
  a.query_start = 0xA0000;
  a.s_q = 0;
  a.rows = 3000;
  absl::StatusOr<IndexerKernelLaunch<LogitsParams>> l = PlanIndexerLogits(m.spec, m.launch, a);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->grid_y, 3000u);
  EXPECT_EQ(reinterpret_cast<uint64_t>(l->params.query_start), 0xA0000u);
  EXPECT_EQ(l->params.rows, 3000);
  EXPECT_EQ(l->params.s_q, 0);
  IndexerTopkArgs t = GoodTopk();
  t.query_start = 0xA0000;
  t.s_q = 0;
  t.rows = 3000;
  absl::StatusOr<IndexerKernelLaunch<TopkParams>> k = PlanIndexerTopk(m.spec, m.launch, t);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->grid_x, 3000u);
  EXPECT_EQ(reinterpret_cast<uint64_t>(k->params.query_start), 0xA0000u);
  EXPECT_EQ(k->params.rows, 3000);
  // Decode carries no row map, and its rows are batch * s_q.
  l = PlanIndexerLogits(m.spec, m.launch, GoodLogits());
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->params.query_start, nullptr);
  EXPECT_EQ(l->params.rows, 256);
}

TEST(IndexerPlanTest, PrefillProblemsNameTheField) {
  IndexerLogitsArgs a = GoodLogits();
  a.query_start = 0xA0000;
  a.s_q = 2;
  a.rows = 10;
  ExpectLogitsProblem(a, "s_q: got 2, supported 0 with query_start");
  a.s_q = 0;
  a.rows = 0;
  ExpectLogitsProblem(a, "rows: got 0, supported 1..65535");
  a.rows = 70000;
  ExpectLogitsProblem(a, "rows: got 70000, supported 1..65535");
  a.rows = 10;
  a.query_start = 0xA0002;
  ExpectLogitsProblem(a, "query_start: got 655362, supported a multiple of 4");
  // Decode: rows, when given, must be batch * s_q.
  a = GoodLogits();
  a.rows = 7;
  ExpectLogitsProblem(a, "rows: got 7, supported 0 or batch * s_q = 256");
  a = GoodLogits();
  a.s_q = 0;
  ExpectLogitsProblem(a, "s_q: got 0, supported 1..4 (or query_start for prefill)");
  const Module m;
  IndexerTopkArgs t = GoodTopk();
  t.query_start = 0xA0000;
  t.rows = 5;
  EXPECT_TRUE(absl::StrContains(PlanIndexerTopk(m.spec, m.launch, t).status().message(),
                                "s_q: got 2, supported 0 with query_start"));
}

TEST(IndexerPlanTest, TopkProblemsNameTheField) {
  const Module m;
  IndexerTopkArgs a = GoodTopk();
  a.slots = 0;
  EXPECT_TRUE(absl::StrContains(PlanIndexerTopk(m.spec, m.launch, a).status().message(),
                                "both block_table and slots, or neither"));
  a = GoodTopk();
  a.indices_stride = 100;
  EXPECT_TRUE(absl::StrContains(PlanIndexerTopk(m.spec, m.launch, a).status().message(),
                                "indices_stride: got 100, supported >= 2048"));
  a = GoodTopk();
  a.logits_stride = 1000;
  EXPECT_TRUE(absl::StrContains(PlanIndexerTopk(m.spec, m.launch, a).status().message(),
                                "logits_stride: got 1000, supported >= 32768"));
  a = GoodTopk();
  a.indices = 0;
  EXPECT_TRUE(absl::StrContains(PlanIndexerTopk(m.spec, m.launch, a).status().message(),
                                "indices: got null"));
}

}  // namespace
}  // namespace kforge
