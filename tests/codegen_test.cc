#include "compiler/codegen.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/arch.h"
#include "model/spec.h"
#include "templates/kforge/sparse_mla/common/kv_layout.h"
#include "templates/kforge/sparse_mla/common/params.h"
#include "templates/kforge/sparse_mla/common/tiling.h"

#ifndef KFORGE_SOURCE_DIR
#error "KFORGE_SOURCE_DIR must name the source tree (see tests/CMakeLists.txt)"
#endif

namespace kforge {
namespace {

v1::AttentionSpec Preset(const char* name, int tp) {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset(name, tp);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::AttentionSpec();
}

Arch ArchNamed(const char* name) {
  absl::StatusOr<Arch> arch = ParseArch(name);
  EXPECT_TRUE(arch.ok()) << arch.status();
  return arch.ok() ? *arch : Arch();
}

// A valid spec with everything but the listed dimensions from glm-5.
v1::AttentionSpec SpecWith(int heads, int kv_lora_rank, int rope_dim) {
  v1::AttentionSpec spec = Preset("glm-5", 1);
  spec.set_num_q_heads(heads);
  spec.set_kv_lora_rank(kv_lora_rank);
  spec.set_rope_dim(rope_dim);
  return spec;
}

// ---------------------------------------------------------------------------
// Golden files

std::string GoldenPath(const std::string& name) {
  return absl::StrCat(KFORGE_SOURCE_DIR, "/tests/golden/", name);
}

// Threads of a CTA of tiling t: its MMA warps and its land-only warps.
uint32_t CtaThreads(const v1::KernelTiling& t) { return (t.warps() + t.land_warps()) * 32; }

bool UpdateGolden() {
  const char* v = std::getenv("KFORGE_UPDATE_GOLDEN");
  return v != nullptr && std::string(v) == "1";
}

// Compares `actual` with the golden file byte for byte, or rewrites the file
// when KFORGE_UPDATE_GOLDEN=1.
void ExpectMatchesGolden(const std::string& actual, const std::string& name) {
  const std::string path = GoldenPath(name);
  if (UpdateGolden()) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << actual;
    ASSERT_TRUE(out.good()) << "cannot write " << path;
    std::cout << "rewrote golden file " << path << "\n";
    return;
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in.good()) << "missing golden file " << path
                         << "\nCreate it with: KFORGE_UPDATE_GOLDEN=1 ./codegen_test "
                            "--gtest_filter='CodegenGolden.*' (then review the diff).";
  const std::string expected((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  EXPECT_EQ(actual, expected)
      << "generated source differs from " << path
      << ".\nIf the change is intended, regenerate with: "
         "KFORGE_UPDATE_GOLDEN=1 ./codegen_test --gtest_filter='CodegenGolden.*'"
         " and review the diff before committing.";
}

// The unit the compiler hands NVRTC: the planned tiling plus the
// small-batch path where the spec has one.
std::string SourceFor(const v1::AttentionSpec& spec, const Arch& arch) {
  absl::StatusOr<v1::KernelTiling> tiling = ChooseTiling(spec, arch);
  EXPECT_TRUE(tiling.ok()) << tiling.status();
  if (!tiling.ok()) return "";
  return GenerateSource(spec, *tiling, MakeLaunchRule(spec, *tiling, arch),
                        ChooseSmallBatchPath(spec, arch, *tiling))
      .Whole();
}

TEST(CodegenGolden, DeepseekTp1Sm90a) {
  ExpectMatchesGolden(SourceFor(Preset("deepseek-v3.2", 1), ArchNamed("sm_90a")),
                      "codegen_deepseek_tp1_sm90a.cu");
}

TEST(CodegenGolden, Glm5Tp8Sm120a) {
  ExpectMatchesGolden(SourceFor(Preset("glm-5", 8), ArchNamed("sm_120a")),
                      "codegen_glm5_tp8_sm120a.cu");
}

TEST(CodegenSource, NamesBothEntries) {
  const std::string src = SourceFor(Preset("glm-5", 8), ArchNamed("sm_120a"));
  EXPECT_NE(src.find(kMainEntry), std::string::npos);
  EXPECT_NE(src.find(kCombineEntry), std::string::npos);
  EXPECT_EQ(src.find(kSmallBatchEntry), std::string::npos);  // 16 x 32 already
}

// A 64-head tile gets a small-batch kernel beside it, on every arch with
// the shared memory for a 16 x 64 or 16 x 32 tile: 16-head tiles, or on
// sm_90a above 112 heads (8 groups of 16 would be more 16-CTA clusters
// than the H200 runs at once) 32-head tiles for batch 1.
TEST(CodegenSource, SmallBatchEntryBesideAThroughputTiling) {
  for (const char* arch : {"sm_80", "sm_90a", "sm_120a"}) {
    SCOPED_TRACE(arch);
    const v1::AttentionSpec spec = Preset("deepseek-v3.2", 1);
    absl::StatusOr<v1::KernelTiling> tiling = ChooseTiling(spec, ArchNamed(arch));
    ASSERT_TRUE(tiling.ok()) << tiling.status();
    const v1::SmallBatchPath path = ChooseSmallBatchPath(spec, ArchNamed(arch), *tiling);
    ASSERT_EQ(path.entry(), kSmallBatchEntry);
    const bool wide_heads = std::string(arch) == "sm_90a";
    EXPECT_EQ(path.tiling().head_tile(), wide_heads ? 32u : 16u);
    EXPECT_EQ(path.tiling().num_head_groups(), wide_heads ? 4u : 8u);
    EXPECT_EQ(path.max_tokens() == 1u, wide_heads);
    EXPECT_NE(path.tiling().head_tile(), tiling->head_tile());
    EXPECT_EQ(path.launch().block_threads(), CtaThreads(path.tiling()));
    EXPECT_GE(path.max_tokens(), 1u);
    const std::string src =
        GenerateSource(spec, *tiling, MakeLaunchRule(spec, *tiling, ArchNamed(arch)), path).Whole();
    EXPECT_NE(src.find(absl::StrCat(kSmallBatchEntry, "(const ks::DecodeParams p)")),
              std::string::npos);
    EXPECT_NE(src.find("ks::DecodeMain<SmallBatchTraits, ks::Pipeline::kLockstep, "
                       "ks::Epilogue::kSplit>(p)"),
              std::string::npos);
  }
}

TEST(ChooseTiling, ARequestedTilingIsCheckedByTheSameRules) {
  const v1::AttentionSpec spec = Preset("deepseek-v3.2", 1);
  absl::StatusOr<v1::KernelTiling> t =
      ChooseTiling(spec, ArchNamed("sm_90a"), TilingRequest{16, 32, 4, 4});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->head_tile(), 16u);
  EXPECT_EQ(t->num_head_groups(), 8u);
  EXPECT_EQ(t->stages(), 4u);
  EXPECT_FALSE(t->wgmma());
  t = ChooseTiling(spec, ArchNamed("sm_90a"), TilingRequest{64, 64, 2, 8});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->wgmma());
  // Too much shared memory, and a shape the tiling rule refuses.
  t = ChooseTiling(spec, ArchNamed("sm_90a"), TilingRequest{16, 64, 4, 4});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("bytes of shared memory"), std::string::npos);
  t = ChooseTiling(spec, ArchNamed("sm_90a"), TilingRequest{16, 16, 2, 4});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("S columns per warp"), std::string::npos) << t.status();
}

TEST(CodegenSource, Deterministic) {
  const v1::AttentionSpec spec = Preset("deepseek-v3.2", 2);
  const Arch arch = ArchNamed("sm_89");
  EXPECT_EQ(SourceFor(spec, arch), SourceFor(spec, arch));
}

// Replaces every C preprocessing number (decimal, hex float, exponent forms)
// with "N", every bool literal with "B" and every pipeline and MMA name (an
// enumerator of the templates' own enums) with "E".
std::string Skeleton(const std::string& src) {
  static const std::regex kNumber(R"(\.?[0-9](?:[eEpP][+-]|[0-9A-Za-z_.])*)");
  static const std::regex kBool(R"(\b(?:true|false)\b)");
  static const std::regex kSchedule(R"(\bks::(?:Pipeline|Mma)::k[A-Za-z]+)");
  return std::regex_replace(std::regex_replace(std::regex_replace(src, kNumber, "N"), kBool, "B"),
                            kSchedule, "E");
}

// The unit carries the spec only as numbers, bools and schedule names: no
// text from the spec (or anything derived from it) can reach the compiler,
// so the skeleton is the same fixed template text for every spec and arch.
TEST(CodegenSource, OnlyNumbersVaryWithTheSpec) {
  const std::string reference = Skeleton(SourceFor(Preset("glm-5", 8), ArchNamed("sm_120a")));
  ASSERT_FALSE(reference.empty());
  std::vector<v1::AttentionSpec> specs;
  specs.push_back(Preset("deepseek-v3.2", 1));
  specs.push_back(Preset("glm-5", 2));
  specs.push_back(SpecWith(3, 64, 0));
  specs.push_back(SpecWith(100, 256, 64));
  v1::AttentionSpec odd = Preset("glm-5", 4);
  odd.set_softmax_scale(1e-5f);  // prints with an exponent
  odd.set_return_lse(false);
  odd.set_s_q(3);
  odd.set_topk(777);
  odd.set_page_block_size(1);
  specs.push_back(odd);
  for (const Arch& arch : SupportedArchs()) {
    for (const v1::AttentionSpec& spec : specs) {
      // The throughput kernel alone (the small-batch one repeats its shape).
      absl::StatusOr<v1::KernelTiling> tiling = ChooseTiling(spec, arch);
      ASSERT_TRUE(tiling.ok()) << tiling.status();
      const std::string src =
          GenerateSource(spec, *tiling, MakeLaunchRule(spec, *tiling, arch)).Whole();
      for (char c : src) {
        ASSERT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f))
            << "non-printable byte " << static_cast<int>(c) << " on " << arch.name;
      }
      EXPECT_EQ(Skeleton(src), reference) << arch.name << " " << spec.ShortDebugString();
    }
  }
}

// ---------------------------------------------------------------------------
// ModuleName

TEST(ModuleName, ExactNames) {
  EXPECT_EQ(ModuleName(Preset("glm-5", 8), ArchNamed("sm_120a")),
            "sparse_mla_decode_h8_d512r64_topk2048_bf16_pb64_sc0p0625_"
            "lse_sm120a");
  // The shortest decimal that reads back as the same float.
  EXPECT_EQ(ModuleName(Preset("deepseek-v3.2", 1), ArchNamed("sm_90a")),
            "sparse_mla_decode_h128_d512r64_topk2048_bf16_pb64_sc0p135234_"
            "lse_sm90a");
  v1::AttentionSpec spec = SpecWith(3, 256, 0);
  spec.set_s_q(2);
  spec.set_topk(512);
  spec.set_page_block_size(1);
  spec.set_softmax_scale(1.0f);
  spec.set_return_lse(false);
  EXPECT_EQ(ModuleName(spec, ArchNamed("sm_80")),
            "sparse_mla_decode_h3_d256r0_topk512_bf16_pb1_sc1_sm80");
  // s_q is not in the name (it does not change the kernel); a scale with
  // an exponent and a sign-free tag stay readable and distinct.
  spec.set_s_q(1);
  EXPECT_EQ(ModuleName(spec, ArchNamed("sm_80")),
            "sparse_mla_decode_h3_d256r0_topk512_bf16_pb1_sc1_sm80");
  spec.set_softmax_scale(1e-6f);
  EXPECT_EQ(ModuleName(spec, ArchNamed("sm_80")),
            "sparse_mla_decode_h3_d256r0_topk512_bf16_pb1_sc1em06_sm80");
  spec.set_softmax_scale(std::nextafter(0.0625f, 1.0f));
  EXPECT_NE(ModuleName(spec, ArchNamed("sm_80")),
            ModuleName(Preset("glm-5", 8), ArchNamed("sm_80")));
}

TEST(ModuleName, DistinctAndDeterministic) {
  std::vector<v1::AttentionSpec> specs;
  const v1::AttentionSpec base = Preset("glm-5", 8);
  specs.push_back(base);
  auto with = [&](auto&& mutate) {
    v1::AttentionSpec s = base;
    mutate(s);
    specs.push_back(s);
  };
  with([](v1::AttentionSpec& s) { s.set_num_q_heads(16); });
  with([](v1::AttentionSpec& s) { s.set_kv_lora_rank(256); });
  with([](v1::AttentionSpec& s) { s.set_rope_dim(0); });
  with([](v1::AttentionSpec& s) { s.set_topk(1024); });
  with([](v1::AttentionSpec& s) { s.set_page_block_size(1); });
  with([](v1::AttentionSpec& s) { s.set_softmax_scale(0.0625001f); });
  with([](v1::AttentionSpec& s) { s.set_return_lse(false); });
  std::set<std::string> names;
  size_t count = 0;
  for (const Arch& arch : SupportedArchs()) {
    for (const v1::AttentionSpec& spec : specs) {
      const std::string name = ModuleName(spec, arch);
      EXPECT_EQ(name, ModuleName(spec, arch));
      // Usable as a file and directory name on any system.
      for (char c : name) {
        EXPECT_TRUE((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_') << name;
      }
      names.insert(name);
      ++count;
    }
  }
  EXPECT_EQ(names.size(), count);
}

// ---------------------------------------------------------------------------
// ChooseTiling

bool Is99KB(const Arch& arch) { return arch.max_smem_per_block == 99 * 1024; }

// Every chosen tiling passes the rule DecodeTraits static_asserts (the same
// function), so the whole table is checked without compiling each entry.
void ExpectTraitsHold(const v1::AttentionSpec& spec, const v1::KernelTiling& t,
                      const std::string& where) {
  const sparse_mla::TilingError error = sparse_mla::CheckDecodeTiling(DecodeShapeFor(spec, t));
  EXPECT_EQ(error, sparse_mla::TilingError::kOk)
      << where << ": " << sparse_mla::TilingErrorName(error);
}

TEST(ChooseTiling, TableOverArchsHeadsAndDims) {
  // Specs with no tiling, grouped by (arch, rank, rope) and reported once at
  // the end rather than as one failure each.
  std::map<std::string, std::pair<std::vector<int>, std::string>> no_tiling;
  int no_tiling_count = 0;
  for (const Arch& arch : SupportedArchs()) {
    for (int rank : {64, 128, 256, 512}) {
      for (int rope : {0, 64}) {
        for (int heads = 1; heads <= 128; ++heads) {
          const v1::AttentionSpec spec = SpecWith(heads, rank, rope);
          const std::string where =
              absl::StrCat(arch.name, " heads=", heads, " rank=", rank, " rope=", rope);
          absl::StatusOr<v1::KernelTiling> tiling = ChooseTiling(spec, arch);
          if (!tiling.ok()) {
            auto& entry = no_tiling[absl::StrCat(arch.name, " rank=", rank, " rope=", rope)];
            entry.first.push_back(heads);
            if (entry.second.empty()) entry.second = tiling.status().ToString();
            ++no_tiling_count;
            continue;
          }
          const v1::KernelTiling& t = *tiling;
          const int head_tile = static_cast<int>(t.head_tile());
          const int per_group = static_cast<int>(t.heads_per_group());
          const int groups = static_cast<int>(t.num_head_groups());
          EXPECT_EQ(head_tile % 16, 0) << where;
          EXPECT_GE(per_group, 1) << where;
          EXPECT_LE(per_group, head_tile) << where;
          EXPECT_LT(head_tile - per_group, 16) << where << ": padded beyond one MMA tile";
          EXPECT_GE(groups * per_group, heads) << where;
          EXPECT_LT((groups - 1) * per_group, heads) << where << ": an empty head group";
          EXPECT_LE(DecodeSmemBytesFor(spec, t), arch.max_smem_per_block) << where;
          ExpectTraitsHold(spec, t, where);
          if (rank == 512 && rope == 64) {
            if (Is99KB(arch)) {
              EXPECT_LE(head_tile, 32) << where;
            }
            if (arch.name == "sm_90a" || arch.name == "sm_100a") {
              // 64 heads per CTA: one group for glm-5 tp1, two for
              // deepseek-v3.2 tp1.
              EXPECT_EQ(groups, (heads + 63) / 64) << where;
            }
          }
        }
      }
    }
  }
  std::string listed;
  for (const auto& [config, failed] : no_tiling) {
    absl::StrAppend(&listed, "\n  ", config, " heads {", absl::StrJoin(failed.first, ","),
                    "}: ", failed.second);
  }
  EXPECT_EQ(no_tiling_count, 0) << "specs with no tiling:" << listed;
}

// A staged format whose heads fit one 16-row tile runs the register
// pipeline (16 x 32, stages 1, 4 warps) on every arch; more heads, the
// shared-memory pipeline. Returns whether t is the register pipeline.
bool ExpectRegisterPipelineIfSixteenHeads(const v1::AttentionSpec& spec, const v1::KernelTiling& t,
                                          const std::string& where) {
  const bool reg = sparse_mla::RegisterPipeline(DecodeShapeFor(spec, t));
  EXPECT_EQ(reg, spec.num_q_heads() <= 16) << where;
  if (reg) {
    EXPECT_EQ(t.head_tile(), 16u) << where;
    EXPECT_EQ(t.token_tile(), 32u) << where;
    EXPECT_EQ(t.warps(), 4u) << where;
    EXPECT_FALSE(t.wgmma()) << where;
  }
  return reg;
}

v1::AttentionSpec Fp8Spec(int heads, int rope, v1::KvScaleFormat scales) {
  v1::AttentionSpec spec = SpecWith(heads, 512, rope);
  spec.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  spec.set_kv_scale_format(scales);
  return spec;
}

// fp8_ds_mla stages whole records (656 B per token, 528 without rope) in one
// buffer beside one bf16 tile: every head count still has a tiling on every
// arch, inside the arch's shared memory, with the regions the kernel carves.
TEST(ChooseTiling, Fp8DsMlaTableOverArchsAndHeads) {
  for (const Arch& arch : SupportedArchs()) {
    for (int rope : {0, 64}) {
      for (int heads = 1; heads <= 128; ++heads) {
        const v1::AttentionSpec spec = Fp8Spec(heads, rope, v1::KV_SCALE_FORMAT_ARBITRARY);
        const std::string where = absl::StrCat(arch.name, " fp8 heads=", heads, " rope=", rope);
        absl::StatusOr<v1::KernelTiling> t = ChooseTiling(spec, arch);
        ASSERT_TRUE(t.ok()) << where << ": " << t.status();
        EXPECT_LE(DecodeSmemBytesFor(spec, *t), arch.max_smem_per_block) << where;
        ExpectTraitsHold(spec, *t, where);
        const sparse_mla::DecodeShape shape = DecodeShapeFor(spec, *t);
        EXPECT_EQ(shape.kv_staging_bytes_per_token, rope == 64 ? 656 : 528) << where;
        EXPECT_TRUE(sparse_mla::StagedPipeline(shape)) << where;
        if (ExpectRegisterPipelineIfSixteenHeads(spec, *t, where)) continue;
        const sparse_mla::DecodeSmemLayout l = sparse_mla::MakeDecodeSmemLayout(shape);
        const int tokens = static_cast<int>(t->token_tile());
        // The 64-head wgmma tiling (sm_90a): a producer warpgroup, two
        // bf16 tiles and no staging buffer.
        const bool ws = t->wgmma() && t->head_tile() == 64;
        EXPECT_EQ(sparse_mla::WarpSpecialized(shape), ws) << where;
        EXPECT_EQ(t->land_warps(), ws ? 4u : 0u) << where;
        if (ws) {
          EXPECT_EQ(l.kv_staging - l.kv, 2 * tokens * (512 + rope) * 2) << where;
          EXPECT_EQ(l.p, l.kv_staging) << where;
          EXPECT_EQ(l.bytes, l.bar + 6 * 8) << where;  // full[2], empty[2], P's two
          continue;
        }
        EXPECT_EQ(l.kv_staging - l.kv, tokens * (512 + rope) * 2) << where;  // one bf16 tile
        EXPECT_GE(l.p - l.kv_staging, tokens * (rope == 64 ? 656 : 528)) << where;
        EXPECT_LT(l.p - l.kv_staging, tokens * (rope == 64 ? 656 : 528) + 1024) << where;
      }
    }
  }
}

// The small-batch path of a staged format takes land-only warps (as many as
// its MMA warps) where they cost no resident CTA: the 16 x 64 tilings of
// the 163 KB+ parts hold one CTA an SM either way; on the 99 KB parts only
// where shared memory holds one too. bf16 has nothing to land.
TEST(ChooseSmallBatchPath, LandWarpsForStagedFormatsWhereTheyCostNoCta) {
  for (const Arch& arch : SupportedArchs()) {
    for (int heads : {8, 16, 64, 128}) {
      const std::string where = absl::StrCat(arch.name, " heads=", heads);
      const v1::AttentionSpec fp8 = Fp8Spec(heads, 64, v1::KV_SCALE_FORMAT_POW2);
      absl::StatusOr<v1::KernelTiling> t = ChooseTiling(fp8, arch);
      ASSERT_TRUE(t.ok()) << where << ": " << t.status();
      const v1::SmallBatchPath small = ChooseSmallBatchPath(fp8, arch, *t);
      if (small.entry().empty()) continue;
      const v1::KernelTiling& st = small.tiling();
      const int by_smem =
          arch.smem_per_sm / (DecodeSmemBytesFor(fp8, st) + Arch::kReservedSmemPerBlock);
      if (st.head_tile() == 32) {
        // sm_90a above 112 heads: 32-head tiles of 8 MMA warps, batch 1
        // only (ChooseSmallBatchPath), with their cluster entry.
        EXPECT_EQ(arch.name, std::string("sm_90a")) << where;
        EXPECT_GT(heads, 112) << where;
        EXPECT_EQ(st.warps(), 8u) << where;
        EXPECT_EQ(st.land_warps(), 0u) << where;
        EXPECT_EQ(small.max_tokens(), 1u) << where;
        EXPECT_EQ(small.cluster_entry(), kClusterEntry) << where;
      } else if (arch.max_smem_per_block >= 160 * 1024) {
        EXPECT_EQ(st.land_warps(), st.warps()) << where;
      } else {
        EXPECT_EQ(st.land_warps(), by_smem == 1 ? st.warps() : 0u) << where;
      }
      if (st.land_warps() > 0) {
        EXPECT_EQ(small.launch().ctas_per_sm(), 1u) << where;
      }
      EXPECT_EQ(small.launch().block_threads(), CtaThreads(st)) << where;
      ExpectTraitsHold(fp8, st, where);
      const v1::AttentionSpec bf16 = SpecWith(heads, 512, 64);
      absl::StatusOr<v1::KernelTiling> tb = ChooseTiling(bf16, arch);
      ASSERT_TRUE(tb.ok()) << where;
      EXPECT_EQ(ChooseSmallBatchPath(bf16, arch, *tb).tiling().land_warps(), 0u) << where;
      // The throughput tiling: a producer warpgroup where it is the
      // warp-specialised pipeline (64-head wgmma tiles), else none.
      EXPECT_EQ(t->land_warps(), t->wgmma() && t->head_tile() == 64 ? 4u : 0u) << where;
    }
  }
}

// The issue-15 records: every head count has a tiling on every arch, with
// a staging row of the format's size (page-blocked ones: data row + scale
// row, padded to 16-byte chunks) beside one bf16 tile.
TEST(ChooseTiling, NewRecordsTableOverArchsAndHeads) {
  struct Format {
    v1::KvCacheDtype dtype;
    int rope, staging;
  };
  for (const Format& f : {Format{v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4, 0, 592},
                          Format{v1::KV_CACHE_DTYPE_MXFP8_DS_MLA_V41, 0, 528},
                          Format{v1::KV_CACHE_DTYPE_NVFP4_DS_MLA, 64, 352}}) {
    for (const Arch& arch : SupportedArchs()) {
      for (int heads = 1; heads <= 128; ++heads) {
        v1::AttentionSpec spec = SpecWith(heads, 512, f.rope);
        spec.set_kv_cache_dtype(f.dtype);
        spec.set_topk(1152);
        const std::string where =
            absl::StrCat(arch.name, " ", KvDtypeName(f.dtype), " heads=", heads);
        ASSERT_TRUE(ValidateSpec(spec).ok()) << where << ": " << ValidateSpec(spec);
        absl::StatusOr<v1::KernelTiling> t = ChooseTiling(spec, arch);
        ASSERT_TRUE(t.ok()) << where << ": " << t.status();
        EXPECT_LE(DecodeSmemBytesFor(spec, *t), arch.max_smem_per_block) << where;
        ExpectTraitsHold(spec, *t, where);
        const sparse_mla::DecodeShape shape = DecodeShapeFor(spec, *t);
        EXPECT_EQ(shape.kv_staging_bytes_per_token, f.staging) << where;
        if (ExpectRegisterPipelineIfSixteenHeads(spec, *t, where)) continue;
        const sparse_mla::DecodeSmemLayout l = sparse_mla::MakeDecodeSmemLayout(shape);
        const int tokens = static_cast<int>(t->token_tile());
        // V4's 64-head wgmma tiling: the warp-specialised pipeline (two
        // bf16 tiles, no staging buffer), and every such tiling of these
        // records whose head groups pair up: crossover pairs; the others
        // stage.
        const bool wide = t->wgmma() && t->head_tile() == 64;
        const bool pairs = wide && t->num_head_groups() % 2 == 0;
        const bool ws = pairs || (wide && f.dtype == v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4);
        EXPECT_EQ(sparse_mla::WarpSpecialized(shape), ws) << where;
        EXPECT_EQ(t->crossover(), pairs) << where;
        if (ws) {
          EXPECT_EQ(l.kv_staging - l.kv, 2 * tokens * (512 + f.rope) * 2) << where;
          EXPECT_EQ(l.p, l.kv_staging) << where;
          continue;
        }
        EXPECT_EQ(l.kv_staging - l.kv, tokens * (512 + f.rope) * 2) << where;
        EXPECT_GE(l.p - l.kv_staging, tokens * f.staging) << where;
      }
    }
  }
}

// ctas_per_sm counts what holds a CTA resident: shared memory, and the
// register file at the 255 registers a thread may take (the entries'
// launch bounds promise no fewer): 8 warps of those per SM.
TEST(MakeLaunchRule, CtasPerSmStayWithinTheRegisterFile) {
  for (const Arch& arch : SupportedArchs()) {
    for (const KvFormatInfo& kv : KvFormats()) {
      for (int heads : {1, 8, 16, 24, 64, 128}) {
        v1::AttentionSpec spec = SpecWith(heads, 512, 64);
        spec.set_kv_cache_dtype(kv.dtype);
        if (kv.takes_scale_format) spec.set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2);
        if (kv.supports != nullptr && !kv.supports(512, 64)) spec.set_rope_dim(0);
        const std::string where = absl::StrCat(arch.name, " ", kv.name, " heads=", heads);
        absl::StatusOr<v1::KernelTiling> t = ChooseTiling(spec, arch);
        ASSERT_TRUE(t.ok()) << where << ": " << t.status();
        // Throughput entries: up to 12 warps (168 registers a thread);
        // the small-batch path's: up to 8 (255).
        const v1::LaunchRule rule = MakeLaunchRule(spec, *t, arch);
        EXPECT_GE(rule.ctas_per_sm(), 1u) << where;
        EXPECT_LE(rule.ctas_per_sm() * t->warps(), 12u) << where;
        const v1::SmallBatchPath small = ChooseSmallBatchPath(spec, arch, *t);
        if (!small.entry().empty()) {
          EXPECT_LE(small.launch().ctas_per_sm() * CtaThreads(small.tiling()), 8u * 32) << where;
        }
        // The entries are compiled for exactly those counts.
        const std::string src =
            GenerateSource(spec, *t, rule, small, ChooseMainCluster(spec, arch, *t, small)).Whole();
        EXPECT_NE(
            src.find(absl::StrCat("__launch_bounds__(Traits::kThreads, ", rule.ctas_per_sm(), ")")),
            std::string::npos)
            << where;
        if (!small.entry().empty()) {
          EXPECT_NE(src.find(absl::StrCat("__launch_bounds__(SmallBatchTraits::kThreads, ",
                                          small.launch().ctas_per_sm(), ")")),
                    std::string::npos)
              << where;
        }
      }
    }
  }
  // Where shared memory holds three 16-head CTAs of 4 warps (the V4 record
  // on the 227 KB parts, here beside an extra cache, which keeps the
  // shared-memory pipeline), the throughput entries take them; the register
  // pipeline (one cache) takes two, 255 registers a thread.
  v1::AttentionSpec v4 = SpecWith(16, 512, 0);
  v4.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4);
  absl::StatusOr<v1::KernelTiling> t = ChooseTiling(v4, ArchNamed("sm_90a"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(sparse_mla::RegisterPipeline(DecodeShapeFor(v4, *t)));
  EXPECT_EQ(MakeLaunchRule(v4, *t, ArchNamed("sm_90a")).ctas_per_sm(), 2u);
  v4.mutable_extra_kv()->set_topk(128);
  v4.mutable_extra_kv()->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4);
  v4.mutable_extra_kv()->set_page_block_size(64);
  t = ChooseTiling(v4, ArchNamed("sm_90a"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(sparse_mla::RegisterPipeline(DecodeShapeFor(v4, *t)));
  EXPECT_EQ(t->warps(), 4u);
  EXPECT_EQ(MakeLaunchRule(v4, *t, ArchNamed("sm_90a")).ctas_per_sm(), 3u);
  EXPECT_EQ(MakeLaunchRule(v4, *t, ArchNamed("sm_90a"), EntryOccupancy::kLatency).ctas_per_sm(),
            2u);
}

TEST(KvRecordSizes, NewRecordLayouts) {
  using V4 = sparse_mla::KvFp8DsMlaV4Sizes;
  EXPECT_EQ(V4::BytesPerToken(512), 584);
  EXPECT_EQ(V4::kDataBytes, 576);
  EXPECT_EQ(V4::kScaleBytes, 8);
  EXPECT_TRUE(V4::kPageBlocked);
  EXPECT_TRUE(V4::Supports(512, 0));
  EXPECT_FALSE(V4::Supports(512, 64));
  using V41 = sparse_mla::KvMxfp8DsMlaV41Sizes;
  EXPECT_EQ(V41::BytesPerToken(512), 528);
  EXPECT_EQ(V41::kScaleBytes, 16);
  EXPECT_TRUE(V41::kPageBlocked);
  using Fp4 = sparse_mla::KvNvfp4DsMlaSizes;
  EXPECT_EQ(Fp4::BytesPerToken(576), 352);
  EXPECT_FALSE(Fp4::kPageBlocked);
  EXPECT_TRUE(Fp4::Supports(512, 64));
  EXPECT_FALSE(Fp4::Supports(512, 0));
  // vLLM's permutation: block s's scale at 320 + 8 (s & 3) + (s >> 2).
  EXPECT_EQ(Fp4::ScaleByte(0), 320);
  EXPECT_EQ(Fp4::ScaleByte(1), 328);
  EXPECT_EQ(Fp4::ScaleByte(4), 321);
  EXPECT_EQ(Fp4::ScaleByte(31), 351);
}

TEST(CodegenSource, NewRecordsNameTheirFormatType) {
  for (const auto& [dtype, rope, type] :
       {std::tuple{v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4, 0, "  using Kv = ks::KvFp8DsMlaV4;\n"},
        std::tuple{v1::KV_CACHE_DTYPE_MXFP8_DS_MLA_V41, 0, "  using Kv = ks::KvMxfp8DsMlaV41;\n"},
        std::tuple{v1::KV_CACHE_DTYPE_NVFP4_DS_MLA, 64, "  using Kv = ks::KvNvfp4DsMla;\n"}}) {
    v1::AttentionSpec spec = SpecWith(64, 512, rope);
    spec.set_kv_cache_dtype(dtype);
    const std::string src = SourceFor(spec, ArchNamed("sm_120a"));
    EXPECT_NE(src.find(type), std::string::npos) << src;
  }
}

// An extra cache (spec extra_kv): its topk, page size and format type
// follow the main cache's in the traits and the module name; the pipeline
// stages when either cache does, with rows that hold either record.
TEST(CodegenSource, ExtraCacheNamesItsFormatTopkAndPageSize) {
  v1::AttentionSpec spec = Fp8Spec(16, 64, v1::KV_SCALE_FORMAT_ARBITRARY);
  spec.set_topk(1000);
  v1::ExtraKvCache* x = spec.mutable_extra_kv();
  x->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_BF16);
  x->set_topk(100);
  x->set_page_block_size(16);
  ASSERT_TRUE(ValidateSpec(spec).ok()) << ValidateSpec(spec);
  const std::string src = SourceFor(spec, ArchNamed("sm_120a"));
  EXPECT_NE(src.find("  using Kv = ks::KvFp8DsMla<false>;\n"
                     "  static constexpr int kExtraTopk = 100;\n"
                     "  static constexpr int kExtraPageBlock = 16;\n"
                     "  using ExtraKv = ks::KvBf16;\n"),
            std::string::npos)
      << src;
  EXPECT_EQ(ModuleName(spec, ArchNamed("sm_120a")),
            "sparse_mla_decode_h16_d512r64_topk1000_fp8_ds_mla_arbitrary_pb64_xtopk100_bf16_"
            "pb16_sc0p0625_lse_sm120a");
  // The bf16 rows of the extra cache are staged too: 1152 bytes a row.
  absl::StatusOr<v1::KernelTiling> tiling = ChooseTiling(spec, ArchNamed("sm_120a"));
  ASSERT_TRUE(tiling.ok()) << tiling.status();
  EXPECT_EQ(DecodeShapeFor(spec, *tiling).kv_staging_bytes_per_token, 1152);
  x->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  x->set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2);
  EXPECT_NE(SourceFor(spec, ArchNamed("sm_90a")).find("  using ExtraKv = ks::KvFp8DsMla<true>;\n"),
            std::string::npos);
  EXPECT_EQ(DecodeShapeFor(spec, *tiling).kv_staging_bytes_per_token, 656);
  // Two bf16 caches: the direct pipeline.
  v1::AttentionSpec both = Preset("glm-5", 8);
  *both.mutable_extra_kv() = *x;
  both.mutable_extra_kv()->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_BF16);
  both.mutable_extra_kv()->clear_kv_scale_format();
  EXPECT_EQ(DecodeShapeFor(both, *tiling).kv_staging_bytes_per_token, 0);
  // Without one the config names no extra cache (the golden units above
  // are unchanged by the field).
  const std::string plain = SourceFor(Preset("glm-5", 8), ArchNamed("sm_120a"));
  EXPECT_NE(plain.find("  using Kv = ks::KvBf16;\n"), std::string::npos);
  EXPECT_EQ(plain.find("Extra"), std::string::npos);
}

TEST(KvFp8DsMlaSizes, RecordLayout) {
  using S = sparse_mla::KvFp8DsMlaSizes;
  EXPECT_EQ(S::BytesPerToken(576), 656);
  EXPECT_EQ(S::BytesPerToken(512), 528);
  EXPECT_EQ(S::kScalesOffset, 512);
  EXPECT_EQ(S::kRopeOffset, 528);
  EXPECT_EQ(S::StagingBytesPerToken(576), 656);
  EXPECT_EQ(S::StagingBytesPerToken(512), 528);
  EXPECT_TRUE(S::Supports(512, 64));
  EXPECT_TRUE(S::Supports(512, 0));
  EXPECT_FALSE(S::Supports(256, 64));
  EXPECT_FALSE(S::Supports(512, 32));
}

TEST(CodegenSource, Fp8NamesItsFormatAndScaleConvention) {
  const std::string pow2 =
      SourceFor(Fp8Spec(64, 64, v1::KV_SCALE_FORMAT_POW2), ArchNamed("sm_90a"));
  const std::string arbitrary =
      SourceFor(Fp8Spec(64, 64, v1::KV_SCALE_FORMAT_ARBITRARY), ArchNamed("sm_90a"));
  EXPECT_NE(pow2.find("  using Kv = ks::KvFp8DsMla<true>;\n"), std::string::npos) << pow2;
  EXPECT_NE(arbitrary.find("  using Kv = ks::KvFp8DsMla<false>;\n"), std::string::npos)
      << arbitrary;
  EXPECT_NE(SourceFor(Preset("glm-5", 1), ArchNamed("sm_90a")).find("  using Kv = ks::KvBf16;\n"),
            std::string::npos);
}

TEST(ChooseTiling, PresetShapes) {
  // glm-5 tp1 (64 heads) in one CTA on the 227 KB parts.
  for (const char* arch : {"sm_90a", "sm_100a"}) {
    absl::StatusOr<v1::KernelTiling> t = ChooseTiling(Preset("glm-5", 1), ArchNamed(arch));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->num_head_groups(), 1u) << arch;
    EXPECT_EQ(t->head_tile(), 64u) << arch;
  }
  // glm-5 tp8 (8 heads) on sm_120a: one 16-row tile, half padding.
  absl::StatusOr<v1::KernelTiling> t = ChooseTiling(Preset("glm-5", 8), ArchNamed("sm_120a"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->head_tile(), 16u);
  EXPECT_EQ(t->heads_per_group(), 8u);
  EXPECT_EQ(t->num_head_groups(), 1u);
}

TEST(ChooseTiling, FailsWhenNothingFits) {
  Arch tiny = ArchNamed("sm_90a");
  tiny.max_smem_per_block = 16 * 1024;
  absl::StatusOr<v1::KernelTiling> t = ChooseTiling(Preset("glm-5", 8), tiny);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------
// tiling.h: CheckDecodeTiling, WgmmaCovers, MakeDecodeSmemLayout

// glm-5 tp1 on sm_90a: 64 heads, 64-token tiles, 2 stages, 8 warps, wgmma.
constexpr sparse_mla::DecodeShape kWgmmaShape = {512, 64, 64, 64, 64, 2, 8, true, 0, 0};
// glm-5 tp8 on sm_120a: 8 heads in a 16-row tile, 32-token tiles, 4 warps.
constexpr sparse_mla::DecodeShape kSmallShape = {512, 64, 16, 8, 32, 2, 4, false, 0, 0};

// The host evaluates the rule at compile time exactly as DecodeTraits does.
static_assert(sparse_mla::CheckDecodeTiling(kWgmmaShape) == sparse_mla::TilingError::kOk);
static_assert(sparse_mla::CheckDecodeTiling(kSmallShape) == sparse_mla::TilingError::kOk);

TEST(CheckDecodeTiling, NamesTheBrokenRule) {
  using sparse_mla::TilingError;
  struct Case {
    const char* what;
    void (*mutate)(sparse_mla::DecodeShape&);
    TilingError expected;
  };
  const Case cases[] = {
      {"d_v 96", [](sparse_mla::DecodeShape& s) { s.d_v = 96; }, TilingError::kDims},
      {"rope 32", [](sparse_mla::DecodeShape& s) { s.rope = 32; }, TilingError::kDims},
      {"head tile 24", [](sparse_mla::DecodeShape& s) { s.head_tile = s.heads_per_group = 24; },
       TilingError::kHeadTile},
      {"48 heads in a 64-row tile", [](sparse_mla::DecodeShape& s) { s.heads_per_group = 48; },
       TilingError::kHeadsPerGroup},
      {"token tile 24", [](sparse_mla::DecodeShape& s) { s.token_tile = 24; },
       TilingError::kTokenTile},
      {"1 stage", [](sparse_mla::DecodeShape& s) { s.stages = 1; }, TilingError::kStages},
      {"3 warps", [](sparse_mla::DecodeShape& s) { s.warps = 3; }, TilingError::kWarps},
      {"16-row tile, 8 warps, 32 tokens",
       [](sparse_mla::DecodeShape& s) {
         s.head_tile = 16;
         s.heads_per_group = 16;
         s.token_tile = 32;
       },
       TilingError::kSColumns},
      {"d_v 64 over 8 warps", [](sparse_mla::DecodeShape& s) { s.d_v = 64; }, TilingError::kVCols},
      {"16 tokens, 32 rows per pass", [](sparse_mla::DecodeShape& s) { s.token_tile = 16; },
       TilingError::kGatherPasses},
      {"2 warps own 256 columns of 64 heads (mma.sync)",
       [](sparse_mla::DecodeShape& s) {
         s.warps = 2;
         s.wgmma = false;
       },
       TilingError::kORegisters},
      {"8 staging bytes", [](sparse_mla::DecodeShape& s) { s.kv_staging_bytes_per_token = 8; },
       TilingError::kStaging},
      {"staged pipeline, 3 stages",
       [](sparse_mla::DecodeShape& s) {
         s.kv_staging_bytes_per_token = 656;
         s.stages = 3;
       },
       TilingError::kStaging},
      {"wgmma on a 32-row tile",
       [](sparse_mla::DecodeShape& s) { s.head_tile = s.heads_per_group = 32; },
       TilingError::kWgmmaShape},
      {"land-only warps with nothing to land (bf16)",
       [](sparse_mla::DecodeShape& s) {
         s.wgmma = false;
         s.land_warps = 8;
       },
       TilingError::kLandWarps},
      {"17 warps in all",
       [](sparse_mla::DecodeShape& s) {
         s.wgmma = false;
         s.kv_staging_bytes_per_token = 656;
         s.land_warps = 9;
       },
       TilingError::kLandWarps},
      {"wgmma beside land-only warps",
       [](sparse_mla::DecodeShape& s) {
         s.kv_staging_bytes_per_token = 656;
         s.land_warps = 8;
       },
       TilingError::kWgmmaShape},
      {"4 land-only warps of bf16 without wgmma (no producer warpgroup: nothing to land)",
       [](sparse_mla::DecodeShape& s) {
         s.wgmma = false;
         s.land_warps = 4;
       },
       TilingError::kLandWarps},
      {"a producer warpgroup over 32-token tiles",
       [](sparse_mla::DecodeShape& s) {
         s.kv_staging_bytes_per_token = 656;
         s.land_warps = 4;
         s.token_tile = 32;
       },
       TilingError::kWgmmaShape},
      {"a producer warpgroup over d_v 256",
       [](sparse_mla::DecodeShape& s) {
         s.kv_staging_bytes_per_token = 656;
         s.land_warps = 4;
         s.d_v = 256;
       },
       TilingError::kWgmmaShape},
  };
  for (const Case& c : cases) {
    sparse_mla::DecodeShape shape = kWgmmaShape;
    c.mutate(shape);
    EXPECT_EQ(sparse_mla::CheckDecodeTiling(shape), c.expected)
        << c.what << ": got " << sparse_mla::TilingErrorName(sparse_mla::CheckDecodeTiling(shape));
  }
}

// The warp-specialised pipeline: the wgmma tiling of a staged format with
// 4 land-only warps; two bf16 tiles, no staging buffer, six mbarriers,
// within the 227 KB of sm_90a.
TEST(CheckDecodeTiling, WarpSpecialisedShapeAndLayout) {
  constexpr sparse_mla::DecodeShape kWs = {512, 64, 64, 64, 64, 2, 8, true, 656, 4};
  static_assert(sparse_mla::CheckDecodeTiling(kWs) == sparse_mla::TilingError::kOk);
  static_assert(sparse_mla::WarpSpecialized(kWs) && sparse_mla::KvTiles(kWs) == 2);
  constexpr sparse_mla::DecodeSmemLayout l = sparse_mla::MakeDecodeSmemLayout(kWs);
  EXPECT_EQ(l.kv, 64 * 576 * 2);
  EXPECT_EQ(l.kv_staging, l.kv + 2 * 64 * 576 * 2);
  EXPECT_EQ(l.p, l.kv_staging);
  EXPECT_EQ(l.p % 1024, 0);
  EXPECT_EQ(l.bar % 8, 0);
  EXPECT_GE(l.bar, l.valid + 2 * 64 * 4);
  EXPECT_EQ(l.bytes, l.bar + 48);
  EXPECT_LE(l.bytes, ArchNamed("sm_90a").max_smem_per_block);
  EXPECT_EQ(sparse_mla::CtaWarps(kWs), 12);
  // bf16 (direct): the same shape, its producer copying rows (WsCopy), the
  // same two tiles and shared memory less nothing (no staging either way).
  sparse_mla::DecodeShape direct = kWs;
  direct.kv_staging_bytes_per_token = 0;
  EXPECT_EQ(sparse_mla::CheckDecodeTiling(direct), sparse_mla::TilingError::kOk);
  EXPECT_TRUE(sparse_mla::WarpSpecialized(direct));
  EXPECT_EQ(sparse_mla::KvTiles(direct), 2);
  EXPECT_EQ(sparse_mla::MakeDecodeSmemLayout(direct).bytes, l.bytes);
  // Without the producer the same tiling is the staged lockstep pipeline.
  sparse_mla::DecodeShape staged = kWs;
  staged.land_warps = 0;
  EXPECT_FALSE(sparse_mla::WarpSpecialized(staged));
  EXPECT_EQ(sparse_mla::KvTiles(staged), 1);
  EXPECT_EQ(sparse_mla::MakeDecodeSmemLayout(staged).bytes,
            sparse_mla::MakeDecodeSmemLayout(staged).valid + 2 * 64 * 4);
}

// The one rule that names a shape's pipeline (PipelineOf), which
// DecodeTraits checks a config against: the register pipeline where stages
// is 1, the warp-specialised one (paired for a crossover main entry) where
// a producer warpgroup feeds wgmma, else lockstep; the pair flag names
// nothing else.
TEST(PipelineOf, NamesEachShapesPipeline) {
  using sparse_mla::Pipeline;
  using sparse_mla::PipelineOf;
  constexpr sparse_mla::DecodeShape kWs = {512, 64, 64, 64, 64, 2, 8, true, 656, 4};
  constexpr sparse_mla::DecodeShape kReg = {512, 64, 16, 16, 32, 1, 4, false, 656, 0};
  static_assert(PipelineOf(kWs, false) == Pipeline::kWarpSpecialized);
  static_assert(PipelineOf(kWs, true) == Pipeline::kCrossoverPair);
  static_assert(PipelineOf(kReg, false) == Pipeline::kRegister);
  static_assert(PipelineOf(kReg, true) == Pipeline::kRegister);
  static_assert(PipelineOf(kWgmmaShape, false) == Pipeline::kLockstep);
  static_assert(PipelineOf(kWgmmaShape, true) == Pipeline::kLockstep);
  static_assert(PipelineOf(kSmallShape, false) == Pipeline::kLockstep);
  static_assert(sparse_mla::MmaOf(kWs) == sparse_mla::Mma::kWgmma);
  static_assert(sparse_mla::MmaOf(kSmallShape) == sparse_mla::Mma::kMmaSync);
  // Every preset's chosen tiling names its pipeline in the unit's config.
  for (const char* arch : {"sm_80", "sm_90a", "sm_120a"}) {
    for (v1::KvCacheDtype d : {v1::KV_CACHE_DTYPE_BF16, v1::KV_CACHE_DTYPE_FP8_DS_MLA}) {
      for (int tp : {1, 8}) {
        v1::AttentionSpec spec = Preset("deepseek-v3.2", tp);
        spec.set_kv_cache_dtype(d);
        if (d == v1::KV_CACHE_DTYPE_FP8_DS_MLA) spec.set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2);
        absl::StatusOr<v1::KernelTiling> t = ChooseTiling(spec, ArchNamed(arch));
        ASSERT_TRUE(t.ok()) << t.status();
        const sparse_mla::DecodeShape shape = DecodeShapeFor(spec, *t);
        // The enumerators by number (the proto enum Pipeline's).
        const char* const kNames[] = {"", "kLockstep", "kRegister", "kWarpSpecialized",
                                      "kCrossoverPair"};
        const char* name = kNames[static_cast<int>(PipelineOf(shape, t->crossover()))];
        const std::string src = SourceFor(spec, ArchNamed(arch));
        EXPECT_NE(src.find("struct Traits : ks::DecodeTraits<TraitsConfig> {\n"),
                  std::string::npos);
        EXPECT_NE(src.find(absl::StrCat("  static constexpr ks::Pipeline kPipeline = "
                                        "ks::Pipeline::",
                                        name, ";\n")),
                  std::string::npos)
            << arch << " tp" << tp << " " << KvDtypeName(d);
      }
    }
  }
}

// Which specs get the warp-specialised pipeline: the formats whose row in
// the KV format table says so (fp8_ds_mla, V4), one cache, the sm_90a wgmma
// tiling; its launch is 384 threads, one CTA an SM.
TEST(ChooseTiling, WarpSpecialisedWhereMeasuredFaster) {
  const Arch& hopper = ArchNamed("sm_90a");
  for (int heads : {64, 100, 128}) {
    const std::string where = absl::StrCat("heads=", heads);
    const v1::AttentionSpec fp8 = Fp8Spec(heads, 64, v1::KV_SCALE_FORMAT_POW2);
    absl::StatusOr<v1::KernelTiling> t = ChooseTiling(fp8, hopper);
    ASSERT_TRUE(t.ok()) << where;
    EXPECT_TRUE(t->wgmma()) << where;
    EXPECT_EQ(t->land_warps(), 4u) << where;
    const v1::LaunchRule rule = MakeLaunchRule(fp8, *t, hopper, EntryOccupancy::kThroughput);
    EXPECT_EQ(rule.block_threads(), 384u) << where;
    EXPECT_EQ(rule.ctas_per_sm(), 1u) << where;
    EXPECT_LE(rule.dynamic_smem_bytes(), static_cast<uint32_t>(hopper.max_smem_per_block)) << where;
    const std::string src = SourceFor(fp8, hopper);
    // Traits: head tile 64, its group, 64 tokens, 2 stages, 8 + 4 warps,
    // the warp-specialised pipeline on wgmma.
    EXPECT_NE(src.find(absl::StrCat("  static constexpr int kHeadTile = 64;\n"
                                    "  static constexpr int kHeadsPerGroup = ",
                                    t->heads_per_group(),
                                    ";\n"
                                    "  static constexpr int kTokenTile = 64;\n"
                                    "  static constexpr int kStages = 2;\n"
                                    "  static constexpr int kWarps = 8;\n"
                                    "  static constexpr int kLandWarps = 4;\n"
                                    "  static constexpr ks::Pipeline kPipeline = "
                                    "ks::Pipeline::kWarpSpecialized;\n"
                                    "  static constexpr ks::Mma kMma = ks::Mma::kWgmma;\n")),
              std::string::npos)
        << where;
    // Other archs keep their tilings (no wgmma there).
    for (const char* arch : {"sm_80", "sm_100a", "sm_120a"}) {
      absl::StatusOr<v1::KernelTiling> other = ChooseTiling(fp8, ArchNamed(arch));
      ASSERT_TRUE(other.ok()) << where << " " << arch;
      EXPECT_EQ(other->land_warps(), 0u) << where << " " << arch;
    }
    EXPECT_FALSE(t->crossover()) << where;  // measured no faster for fp8_ds_mla
    // DeepSeek-V4's records too, and bf16 (its producer copies rows with
    // cp.async); V4.1 and nvfp4 measured slower with it (BENCH.md) except as
    // crossover pairs, where the head groups pair up (100 and 128 heads: 2
    // groups), as V4 then also runs; an extra cache is not in its thread
    // map.
    for (v1::KvCacheDtype d :
         {v1::KV_CACHE_DTYPE_BF16, v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4,
          v1::KV_CACHE_DTYPE_MXFP8_DS_MLA_V41, v1::KV_CACHE_DTYPE_NVFP4_DS_MLA}) {
      v1::AttentionSpec spec = fp8;
      spec.set_kv_cache_dtype(d);
      spec.set_kv_scale_format(v1::KV_SCALE_FORMAT_UNSPECIFIED);
      if (d == v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4 || d == v1::KV_CACHE_DTYPE_MXFP8_DS_MLA_V41)
        spec.set_rope_dim(0);
      absl::StatusOr<v1::KernelTiling> o = ChooseTiling(spec, hopper);
      ASSERT_TRUE(o.ok()) << where << " " << KvDtypeName(d);
      const bool pairs = d != v1::KV_CACHE_DTYPE_BF16 && o->num_head_groups() % 2 == 0;
      EXPECT_EQ(o->num_head_groups(), heads > 64 ? 2u : 1u) << where;
      EXPECT_EQ(
          o->land_warps(),
          d == v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4 || d == v1::KV_CACHE_DTYPE_BF16 || pairs ? 4u : 0u)
          << where << " " << KvDtypeName(d);
      EXPECT_EQ(o->crossover(), pairs) << where << " " << KvDtypeName(d);
    }
    v1::AttentionSpec extra = fp8;
    extra.mutable_extra_kv()->set_topk(128);
    extra.mutable_extra_kv()->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
    extra.mutable_extra_kv()->set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2);
    extra.mutable_extra_kv()->set_page_block_size(64);
    absl::StatusOr<v1::KernelTiling> x = ChooseTiling(extra, hopper);
    ASSERT_TRUE(x.ok()) << where;
    EXPECT_EQ(x->land_warps(), 0u) << where;
  }
}

// Crossover pairs (KernelTiling.crossover): the V4, V4.1 and nvfp4 records'
// 64-head sm_90a tiling where its head groups pair up. The main entry is
// compiled as 2-CTA clusters over head groups; the formats that run the
// warp-specialised pipeline only as pairs (V4.1, nvfp4) get no 2-split
// cluster entry, V4 keeps its, all keep the 16-split one; fp8_ds_mla and
// bf16, other archs and one head group: no pairs.
TEST(ChooseTiling, CrossoverPairsWhereTheHeadGroupsPairUp) {
  const Arch& hopper = ArchNamed("sm_90a");
  const std::string paired_main =
      "extern \"C\" __global__ void __cluster_dims__(2, 1, 1)\n"
      "__launch_bounds__(Traits::kThreads, 1)\n"
      "sparse_mla_decode_main(const ks::DecodeParams p) {\n"
      "  ks::DecodeMain<Traits, ks::Pipeline::kCrossoverPair, ks::Epilogue::kSplit>(p);\n}";
  for (v1::KvCacheDtype d :
       {v1::KV_CACHE_DTYPE_BF16, v1::KV_CACHE_DTYPE_FP8_DS_MLA, v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4,
        v1::KV_CACHE_DTYPE_MXFP8_DS_MLA_V41, v1::KV_CACHE_DTYPE_NVFP4_DS_MLA}) {
    const bool records = d != v1::KV_CACHE_DTYPE_BF16 && d != v1::KV_CACHE_DTYPE_FP8_DS_MLA;
    const int rope =
        d == v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4 || d == v1::KV_CACHE_DTYPE_MXFP8_DS_MLA_V41 ? 0 : 64;
    for (int heads : {64, 100, 128}) {
      const std::string where = absl::StrCat(KvDtypeName(d), " heads=", heads);
      v1::AttentionSpec spec = SpecWith(heads, 512, rope);
      spec.set_kv_cache_dtype(d);
      if (d == v1::KV_CACHE_DTYPE_FP8_DS_MLA) spec.set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2);
      absl::StatusOr<v1::KernelTiling> t = ChooseTiling(spec, hopper);
      ASSERT_TRUE(t.ok()) << where << ": " << t.status();
      const bool pairs = records && heads > 64;
      EXPECT_EQ(t->crossover(), pairs) << where;
      if (pairs) {
        EXPECT_EQ(t->num_head_groups(), 2u) << where;
        EXPECT_EQ(t->land_warps(), 4u) << where;
        EXPECT_TRUE(sparse_mla::PairCovers(DecodeShapeFor(spec, *t))) << where;
      }
      const v1::SmallBatchPath small = ChooseSmallBatchPath(spec, hopper, *t);
      const v1::ClusterPath cluster = ChooseMainCluster(spec, hopper, *t, small);
      // The 2-split cluster (without the pair) for V4 and the unpaired;
      // the 16-split one for every warp-specialised staged tiling.
      EXPECT_EQ(!cluster.entry().empty(), !pairs || d == v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4) << where;
      if (pairs) {
        EXPECT_FALSE(cluster.wide_entry().empty()) << where;
      }
      const std::string src =
          GenerateSource(spec, *t, MakeLaunchRule(spec, *t, hopper), small, cluster).Whole();
      EXPECT_EQ(src.find(paired_main) != std::string::npos, pairs) << where;
      EXPECT_EQ(src.find("__cluster_dims__(2, 1, 1)") != std::string::npos, pairs) << where;
      // The tiling's config names the pair; its cluster entries run the
      // warp-specialised pipeline unpaired.
      EXPECT_EQ(src.find("kPipeline = ks::Pipeline::kCrossoverPair;\n") != std::string::npos, pairs)
          << where;
      if (pairs) {
        EXPECT_NE(src.find("  ks::DecodeMain<Traits, ks::Pipeline::kWarpSpecialized, "
                           "ks::Epilogue::kClusterMerge, 16>(p);\n"),
                  std::string::npos)
            << where;
      }
      // No other arch runs pairs (no warp-specialised tiling there).
      for (const char* arch : {"sm_80", "sm_100a", "sm_120a"}) {
        absl::StatusOr<v1::KernelTiling> other = ChooseTiling(spec, ArchNamed(arch));
        ASSERT_TRUE(other.ok()) << where << " " << arch;
        EXPECT_FALSE(other->crossover()) << where << " " << arch;
      }
    }
  }
}

// The register pipeline (stages 1): a staged format's 16 x 32 tile of 4
// warps over d_v 512, and nothing else.
TEST(CheckDecodeTiling, RegisterPipelineOnlyWhereItIsWritten) {
  using sparse_mla::TilingError;
  constexpr sparse_mla::DecodeShape kReg = {512, 64, 16, 16, 32, 1, 4, false, 656, 0};
  static_assert(sparse_mla::CheckDecodeTiling(kReg) == TilingError::kOk);
  static_assert(sparse_mla::RegisterPipeline(kReg) && sparse_mla::RegisterPipelineCovers(kReg));
  struct Case {
    const char* what;
    void (*mutate)(sparse_mla::DecodeShape&);
  };
  const Case cases[] = {
      {"bf16 (nothing staged)",
       [](sparse_mla::DecodeShape& s) { s.kv_staging_bytes_per_token = 0; }},
      {"a 32-row tile", [](sparse_mla::DecodeShape& s) { s.head_tile = s.heads_per_group = 32; }},
      {"8 warps", [](sparse_mla::DecodeShape& s) { s.warps = 8; }},
      {"64 tokens", [](sparse_mla::DecodeShape& s) { s.token_tile = 64; }},
      {"d_v 256", [](sparse_mla::DecodeShape& s) { s.d_v = 256; }},
      {"land-only warps", [](sparse_mla::DecodeShape& s) { s.land_warps = 4; }},
      {"wgmma", [](sparse_mla::DecodeShape& s) { s.wgmma = true; }},
  };
  for (const Case& c : cases) {
    sparse_mla::DecodeShape shape = kReg;
    c.mutate(shape);
    EXPECT_EQ(sparse_mla::CheckDecodeTiling(shape), TilingError::kStages)
        << c.what << ": got " << sparse_mla::TilingErrorName(sparse_mla::CheckDecodeTiling(shape));
  }
  // Its shared memory: the warps' V tiles, then two partial S buffers; no
  // Q tile, no staging buffer (49,664 bytes with the row statistics).
  const sparse_mla::DecodeSmemLayout l = sparse_mla::MakeDecodeSmemLayout(kReg);
  EXPECT_EQ(l.kv, 0);
  EXPECT_EQ(l.kv_staging, 4 * 32 * 128 * 2);
  EXPECT_EQ(l.p, l.kv_staging);
  EXPECT_EQ(l.red - l.p, 2 * 4 * 16 * 32 * 4);
  EXPECT_EQ(l.bytes, 49664);
  EXPECT_FALSE(sparse_mla::ClusterMergeFits(kReg, sparse_mla::kMainClusterSplits));
}

TEST(CheckDecodeTiling, WgmmaCoversOnlyTheMeasuredPipeline) {
  EXPECT_TRUE(sparse_mla::WgmmaCovers(kWgmmaShape));
  sparse_mla::DecodeShape four_warps = kWgmmaShape;
  four_warps.warps = 4;
  four_warps.token_tile = 32;
  EXPECT_FALSE(sparse_mla::WgmmaCovers(four_warps));
  sparse_mla::DecodeShape short_tile = kWgmmaShape;
  short_tile.token_tile = 32;
  EXPECT_FALSE(sparse_mla::WgmmaCovers(short_tile));
  EXPECT_FALSE(sparse_mla::WgmmaCovers(kSmallShape));
  // O = P V is m64n{d_v / 2}: instantiated for d_v 512 and 256 only.
  sparse_mla::DecodeShape d_v_384 = kWgmmaShape;
  d_v_384.d_v = 384;
  EXPECT_FALSE(sparse_mla::WgmmaCovers(d_v_384));
  sparse_mla::DecodeShape d_v_256 = kWgmmaShape;
  d_v_256.d_v = 256;
  EXPECT_TRUE(sparse_mla::WgmmaCovers(d_v_256));
}

TEST(DecodeSmemLayout, RegionsInOrderAlignedAndSized) {
  for (sparse_mla::DecodeShape shape : {kWgmmaShape, kSmallShape}) {
    for (int staging : {0, 656}) {
      shape.kv_staging_bytes_per_token = staging;
      const sparse_mla::DecodeDims d = sparse_mla::DeriveDecodeDims(shape);
      const sparse_mla::DecodeSmemLayout l = sparse_mla::MakeDecodeSmemLayout(shape);
      const std::string where = absl::StrCat("head_tile ", shape.head_tile, " staging ", staging);
      EXPECT_EQ(l.q, 0) << where;  // wgmma needs the 1024-B aligned base
      EXPECT_EQ(l.kv - l.q, shape.head_tile * d.d_qk * 2) << where;
      // A staged format keeps one bf16 tile and one staging buffer.
      const int tiles = staging > 0 ? 1 : shape.stages;
      EXPECT_EQ(l.kv_staging - l.kv, tiles * shape.token_tile * d.d_qk * 2) << where;
      const int staged = shape.token_tile * staging;
      if (shape.wgmma) {  // P is a wgmma operand: 1024-B aligned, unpadded rows
        EXPECT_EQ(l.p % 1024, 0) << where;
        EXPECT_GE(l.p - l.kv_staging, staged) << where;
        EXPECT_LT(l.p - l.kv_staging, staged + 1024) << where;
        EXPECT_EQ(l.red - l.p, shape.head_tile * shape.token_tile * 2) << where;
      } else {
        EXPECT_EQ(l.p - l.kv_staging, staged) << where;
        EXPECT_EQ(l.red - l.p, shape.head_tile * (shape.token_tile + 8) * 2) << where;
      }
      EXPECT_EQ(l.scale - l.red, d.warps_n * shape.head_tile * 4) << where;
      EXPECT_EQ(l.max - l.scale, shape.head_tile * 4) << where;
      EXPECT_EQ(l.valid - l.max, shape.head_tile * 4) << where;
      EXPECT_EQ(l.bytes - l.valid, shape.stages * shape.token_tile * 4) << where;
      // cp.async and ldmatrix need 16-byte aligned regions.
      for (int offset : {l.kv, l.kv_staging, l.p, l.red}) {
        EXPECT_EQ(offset % 16, 0) << where;
      }
    }
  }
  // Pinned sizes (the kernels measured in BENCH.md): bf16 stages nothing.
  EXPECT_EQ(sparse_mla::MakeDecodeSmemLayout(kWgmmaShape).bytes, 230912);
  EXPECT_EQ(sparse_mla::MakeDecodeSmemLayout(kSmallShape).bytes, 94080);
}

// ---------------------------------------------------------------------------
// MakeLaunchRule

TEST(MakeLaunchRule, FollowsTheTiling) {
  std::vector<v1::AttentionSpec> specs = {
      Preset("deepseek-v3.2", 1), Preset("deepseek-v3.2", 8), Preset("glm-5", 1),
      Preset("glm-5", 8),         SpecWith(3, 64, 0),         SpecWith(24, 256, 64),
  };
  for (const Arch& arch : SupportedArchs()) {
    for (const v1::AttentionSpec& spec : specs) {
      const std::string where = absl::StrCat(arch.name, " ", spec.ShortDebugString());
      absl::StatusOr<v1::KernelTiling> t = ChooseTiling(spec, arch);
      ASSERT_TRUE(t.ok()) << where << ": " << t.status();
      const v1::LaunchRule rule = MakeLaunchRule(spec, *t, arch);
      EXPECT_EQ(rule.block_threads(), CtaThreads(*t)) << where;
      EXPECT_EQ(static_cast<int>(rule.dynamic_smem_bytes()), DecodeSmemBytesFor(spec, *t)) << where;
      EXPECT_LE(static_cast<int>(rule.dynamic_smem_bytes()), arch.max_smem_per_block) << where;
      EXPECT_EQ(rule.combine_block_threads(), static_cast<uint32_t>(sparse_mla::kCombineWarps * 32))
          << where;
      EXPECT_EQ(rule.split_granularity_tokens(), t->token_tile()) << where;
      EXPECT_EQ(rule.workspace_bytes_per_split_token(),
                static_cast<uint64_t>(spec.num_q_heads()) * (spec.kv_lora_rank() + 1) * 4)
          << where;
      EXPECT_GE(rule.ctas_per_sm(), 1u) << where;
      if (rule.ctas_per_sm() > 1) {
        // Resident blocks (with the driver's reserve) fit the SM.
        EXPECT_LE(static_cast<int>(rule.ctas_per_sm()) *
                      (static_cast<int>(rule.dynamic_smem_bytes()) + Arch::kReservedSmemPerBlock),
                  arch.smem_per_sm)
            << where;
      }
    }
  }
}

}  // namespace
}  // namespace kforge

// The wgmma S path exists only for sm_90a and the 64-head, 8-warp,
// 64-token pipeline; every other target and tiling uses mma.sync.
TEST(ChooseTiling, WgmmaOnlyOnSm90aWithTheSixtyFourHeadPipeline) {
  struct Case {
    const char* preset;
    int tp;
    const char* arch;
    bool wgmma;
  };
  for (const Case& c :
       {Case{"deepseek-v3.2", 1, "sm_90a", true}, Case{"glm-5", 1, "sm_90a", true},
        Case{"deepseek-v3.2", 1, "sm_90", false}, Case{"deepseek-v3.2", 1, "sm_100a", false},
        Case{"deepseek-v3.2", 1, "sm_120a", false}, Case{"deepseek-v3.2", 1, "sm_80", false},
        Case{"deepseek-v3.2", 8, "sm_90a", false}, Case{"glm-5", 2, "sm_90a", false}}) {
    absl::StatusOr<kforge::v1::AttentionSpec> spec = kforge::SpecFromPreset(c.preset, c.tp);
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<kforge::Arch> arch = kforge::ParseArch(c.arch);
    ASSERT_TRUE(arch.ok()) << arch.status();
    absl::StatusOr<kforge::v1::KernelTiling> t = kforge::ChooseTiling(*spec, *arch);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->wgmma(), c.wgmma) << c.preset << " tp" << c.tp << " " << c.arch;
    if (c.wgmma) {
      EXPECT_EQ(t->head_tile(), 64u);
      EXPECT_EQ(t->warps(), 8u);
    }
  }
}
