#include "model/spec.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/json_keys.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "kforge/v1/spec.pb.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

using google::protobuf::util::MessageDifferencer;

using ::kforge::testing::Contains;

v1::AttentionSpec GoodSpec() { return ::kforge::testing::DeepseekTp1Spec(); }

v1::KernelSpec SparseKernelSpec(const v1::AttentionSpec& spec) { return KernelSpecOf(spec); }

struct FieldCase {
  std::string name;   // test name suffix
  std::string field;  // expected in the message; empty for a good case
  std::string got;    // the value as the message prints it
  std::function<void(v1::AttentionSpec&)> mutate;
};

void PrintTo(const FieldCase& c, std::ostream* os) { *os << c.name; }

class ValidateSpecTest : public ::testing::TestWithParam<FieldCase> {};

TEST_P(ValidateSpecTest, Field) {
  const FieldCase& c = GetParam();
  v1::AttentionSpec spec = GoodSpec();
  c.mutate(spec);
  absl::Status status = ValidateSpec(spec);
  if (c.field.empty()) {
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_TRUE(NormalizeSpec(spec).ok());
    return;
  }
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status.message(), absl::StrCat(c.field, ": got ", c.got, ", supported ")));
  // Exactly one problem: no "; " separator.
  EXPECT_FALSE(absl::StrContains(status.message(), "; ")) << status;
  absl::StatusOr<v1::AttentionSpec> normalized = NormalizeSpec(spec);
  ASSERT_FALSE(normalized.ok());
  EXPECT_EQ(normalized.status(), status);
}

using S = v1::AttentionSpec;

void SetExtra(S& s, v1::KvCacheDtype dtype, uint32_t topk, uint32_t page_block_size) {
  v1::ExtraKvCache* x = s.mutable_extra_kv();
  x->set_kv_cache_dtype(dtype);
  x->set_topk(topk);
  x->set_page_block_size(page_block_size);
}
const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

INSTANTIATE_TEST_SUITE_P(
    Table, ValidateSpecTest,
    ::testing::Values(
        FieldCase{"GoodBaseline", "", "", [](S&) {}},
        // num_q_heads
        FieldCase{"Heads1", "", "", [](S& s) { s.set_num_q_heads(1); }},
        FieldCase{"Heads3", "", "", [](S& s) { s.set_num_q_heads(3); }},
        FieldCase{"Heads128", "", "", [](S& s) { s.set_num_q_heads(128); }},
        FieldCase{"Heads0", "num_q_heads", "0", [](S& s) { s.set_num_q_heads(0); }},
        FieldCase{"Heads129", "num_q_heads", "129", [](S& s) { s.set_num_q_heads(129); }},
        // kv_lora_rank
        FieldCase{"Rank64", "", "", [](S& s) { s.set_kv_lora_rank(64); }},
        FieldCase{"Rank256", "", "", [](S& s) { s.set_kv_lora_rank(256); }},
        FieldCase{"Rank0", "kv_lora_rank", "0", [](S& s) { s.set_kv_lora_rank(0); }},
        FieldCase{"Rank32", "kv_lora_rank", "32", [](S& s) { s.set_kv_lora_rank(32); }},
        FieldCase{"Rank100", "kv_lora_rank", "100", [](S& s) { s.set_kv_lora_rank(100); }},
        FieldCase{"Rank576", "kv_lora_rank", "576", [](S& s) { s.set_kv_lora_rank(576); }},
        // rope_dim
        FieldCase{"Rope0", "", "", [](S& s) { s.set_rope_dim(0); }},
        FieldCase{"RopeUnset", "rope_dim", "unset", [](S& s) { s.clear_rope_dim(); }},
        FieldCase{"Rope32", "rope_dim", "32", [](S& s) { s.set_rope_dim(32); }},
        FieldCase{"Rope128", "rope_dim", "128", [](S& s) { s.set_rope_dim(128); }},
        // topk
        FieldCase{"Topk1", "", "", [](S& s) { s.set_topk(1); }},
        FieldCase{"Topk16384", "", "", [](S& s) { s.set_topk(16384); }},
        FieldCase{"Topk0", "topk", "0", [](S& s) { s.set_topk(0); }},
        FieldCase{"Topk16385", "topk", "16385", [](S& s) { s.set_topk(16385); }},
        // s_q
        FieldCase{"Sq4", "", "", [](S& s) { s.set_s_q(4); }},
        FieldCase{"Sq5", "s_q", "5", [](S& s) { s.set_s_q(5); }},
        // kv_cache_dtype
        FieldCase{"DtypeUnspecified", "kv_cache_dtype", "KV_CACHE_DTYPE_UNSPECIFIED",
                  [](S& s) { s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_UNSPECIFIED); }},
        // fp8_ds_mla needs its scale convention; bf16 must have none.
        FieldCase{"Fp8WithoutScaleFormat", "kv_scale_format", "KV_SCALE_FORMAT_UNSPECIFIED",
                  [](S& s) { s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA); }},
        FieldCase{"Fp8Pow2", "", "",
                  [](S& s) {
                    s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
                    s.set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2);
                  }},
        FieldCase{"Fp8NoRope", "", "",
                  [](S& s) {
                    s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
                    s.set_kv_scale_format(v1::KV_SCALE_FORMAT_ARBITRARY);
                    s.set_rope_dim(0);
                  }},
        FieldCase{"Fp8Rank256", "kv_lora_rank", "256",
                  [](S& s) {
                    s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
                    s.set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2);
                    s.set_kv_lora_rank(256);
                  }},
        // The issue-15 records: one geometry each, scales defined by the record.
        FieldCase{"V4", "", "",
                  [](S& s) {
                    s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4);
                    s.set_rope_dim(0);
                  }},
        FieldCase{"V4WithRope", "rope_dim", "64",
                  [](S& s) { s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4); }},
        FieldCase{"V4Rank448", "kv_lora_rank", "448",
                  [](S& s) {
                    s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4);
                    s.set_rope_dim(0);
                    s.set_kv_lora_rank(448);
                  }},
        FieldCase{"V4WithScaleFormat", "kv_scale_format", "KV_SCALE_FORMAT_POW2",
                  [](S& s) {
                    s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4);
                    s.set_rope_dim(0);
                    s.set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2);
                  }},
        FieldCase{"V41", "", "",
                  [](S& s) {
                    s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_MXFP8_DS_MLA_V41);
                    s.set_rope_dim(0);
                  }},
        FieldCase{"V41WithRope", "rope_dim", "64",
                  [](S& s) { s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_MXFP8_DS_MLA_V41); }},
        FieldCase{"Nvfp4", "", "",
                  [](S& s) { s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_NVFP4_DS_MLA); }},
        FieldCase{"Nvfp4NoRope", "rope_dim", "0",
                  [](S& s) {
                    s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_NVFP4_DS_MLA);
                    s.set_rope_dim(0);
                  }},
        FieldCase{"Nvfp4Rank256", "kv_lora_rank", "256",
                  [](S& s) {
                    s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_NVFP4_DS_MLA);
                    s.set_kv_lora_rank(256);
                  }},
        FieldCase{"Nvfp4WithScaleFormat", "kv_scale_format", "KV_SCALE_FORMAT_ARBITRARY",
                  [](S& s) {
                    s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_NVFP4_DS_MLA);
                    s.set_kv_scale_format(v1::KV_SCALE_FORMAT_ARBITRARY);
                  }},
        FieldCase{"Bf16WithScaleFormat", "kv_scale_format", "KV_SCALE_FORMAT_POW2",
                  [](S& s) { s.set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2); }},
        FieldCase{"DtypeOutOfRange", "kv_cache_dtype", "9",
                  [](S& s) { s.set_kv_cache_dtype(static_cast<v1::KvCacheDtype>(9)); }},
        // page_block_size
        FieldCase{"Page1", "", "", [](S& s) { s.set_page_block_size(1); }},
        FieldCase{"Page17", "", "", [](S& s) { s.set_page_block_size(17); }},
        FieldCase{"Page4096", "", "", [](S& s) { s.set_page_block_size(4096); }},
        FieldCase{"Page0", "page_block_size", "0", [](S& s) { s.set_page_block_size(0); }},
        FieldCase{"Page4097", "page_block_size", "4097", [](S& s) { s.set_page_block_size(4097); }},
        // softmax_scale
        FieldCase{"ScaleSmall", "", "", [](S& s) { s.set_softmax_scale(1e-6f); }},
        FieldCase{"ScaleLarge", "", "", [](S& s) { s.set_softmax_scale(4.0f); }},
        FieldCase{"ScaleZero", "softmax_scale", "0", [](S& s) { s.set_softmax_scale(0.0f); }},
        FieldCase{"ScaleNegative", "softmax_scale", "-0.5",
                  [](S& s) { s.set_softmax_scale(-0.5f); }},
        FieldCase{"ScaleNan", "softmax_scale", "nan", [](S& s) { s.set_softmax_scale(kNan); }},
        FieldCase{"ScaleInf", "softmax_scale", "inf", [](S& s) { s.set_softmax_scale(kInf); }},
        // Finite, but softmax_scale * log2(e), a constant of the kernel, is
        // not: NVRTC failed on "inff" (INTERNAL) after validation passed.
        FieldCase{"ScaleHuge", "softmax_scale", "3e+38",
                  [](S& s) { s.set_softmax_scale(3e38f); }},
        FieldCase{"ScaleLargestThatBuilds", "", "",
                  [](S& s) { s.set_softmax_scale(2.3e38f); }},
        FieldCase{"ScaleNegInf", "softmax_scale", "-inf", [](S& s) { s.set_softmax_scale(-kInf); }},
        // return_lse
        FieldCase{"LseFalse", "", "", [](S& s) { s.set_return_lse(false); }},
        FieldCase{"LseTrue", "", "", [](S& s) { s.set_return_lse(true); }},
        // extra_kv: a second cache of its own format, page size and topk.
        FieldCase{"ExtraBf16", "", "", [](S& s) { SetExtra(s, v1::KV_CACHE_DTYPE_BF16, 128, 64); }},
        FieldCase{"ExtraFp8OfItsOwnScales", "", "",
                  [](S& s) {
                    SetExtra(s, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 1, 16);
                    s.mutable_extra_kv()->set_kv_scale_format(v1::KV_SCALE_FORMAT_ARBITRARY);
                  }},
        FieldCase{"ExtraNvfp4BesideFp8", "", "",
                  [](S& s) {
                    s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
                    s.set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2);
                    SetExtra(s, v1::KV_CACHE_DTYPE_NVFP4_DS_MLA, 16384, 4096);
                  }},
        FieldCase{"ExtraV4BesideV4", "", "",
                  [](S& s) {
                    s.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4);
                    s.set_rope_dim(0);
                    SetExtra(s, v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4, 128, 64);
                  }},
        FieldCase{"ExtraEmpty", "extra_kv.kv_cache_dtype", "KV_CACHE_DTYPE_UNSPECIFIED",
                  [](S& s) {
                    SetExtra(s, v1::KV_CACHE_DTYPE_UNSPECIFIED, 1, 1);
                  }},
        FieldCase{"ExtraTopk0", "extra_kv.topk", "0",
                  [](S& s) { SetExtra(s, v1::KV_CACHE_DTYPE_BF16, 0, 64); }},
        FieldCase{"ExtraTopk16385", "extra_kv.topk", "16385",
                  [](S& s) { SetExtra(s, v1::KV_CACHE_DTYPE_BF16, 16385, 64); }},
        FieldCase{"ExtraPage0", "extra_kv.page_block_size", "0",
                  [](S& s) { SetExtra(s, v1::KV_CACHE_DTYPE_BF16, 8, 0); }},
        FieldCase{"ExtraPage4097", "extra_kv.page_block_size", "4097",
                  [](S& s) { SetExtra(s, v1::KV_CACHE_DTYPE_BF16, 8, 4097); }},
        FieldCase{"ExtraFp8WithoutScaleFormat", "extra_kv.kv_scale_format",
                  "KV_SCALE_FORMAT_UNSPECIFIED",
                  [](S& s) { SetExtra(s, v1::KV_CACHE_DTYPE_FP8_DS_MLA, 8, 64); }},
        FieldCase{"ExtraBf16WithScaleFormat", "extra_kv.kv_scale_format", "KV_SCALE_FORMAT_POW2",
                  [](S& s) {
                    SetExtra(s, v1::KV_CACHE_DTYPE_BF16, 8, 64);
                    s.mutable_extra_kv()->set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2);
                  }},
        // The extra cache has the spec's geometry: a V4 record needs rope 0.
        FieldCase{"ExtraV4WithRope", "rope_dim", "64",
                  [](S& s) { SetExtra(s, v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4, 8, 64); }},
        FieldCase{"ExtraDtypeOutOfRange", "extra_kv.kv_cache_dtype", "9",
                  [](S& s) { SetExtra(s, static_cast<v1::KvCacheDtype>(9), 8, 64); }}),
    [](const ::testing::TestParamInfo<FieldCase>& info) { return info.param.name; });

// The one table of KV formats: each row's name parses back to it, prints
// as itself, and its sizes are the records' (docs/DESIGN.md).
TEST(KvFormatsTest, EveryRowParsesByNameAndHasItsRecordSize) {
  const std::vector<std::pair<v1::KvCacheDtype, int>> bytes = {
      {v1::KV_CACHE_DTYPE_BF16, 1152},         {v1::KV_CACHE_DTYPE_FP8_DS_MLA, 656},
      {v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4, 584}, {v1::KV_CACHE_DTYPE_MXFP8_DS_MLA_V41, 528},
      {v1::KV_CACHE_DTYPE_NVFP4_DS_MLA, 352},
  };
  ASSERT_EQ(KvFormats().size(), bytes.size());
  for (const auto& [dtype, record] : bytes) {
    const KvFormatInfo* f = FindKvFormat(dtype);
    ASSERT_NE(f, nullptr) << dtype;
    SCOPED_TRACE(f->name);
    absl::StatusOr<v1::KvCacheDtype> parsed = ParseKvDtype(absl::AsciiStrToUpper(f->name));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
    EXPECT_EQ(KvDtypeName(dtype), f->name);
    const int d_qk = f->supports == nullptr || f->supports(512, 64) ? 576 : 512;
    EXPECT_EQ(f->bytes_per_token(d_qk), record);
    // Staging rows are whole 16-byte chunks holding at least the record.
    const int staging = f->staging_bytes_per_token(d_qk);
    EXPECT_EQ(staging % 16, 0);
    if (staging > 0) {
      EXPECT_GE(staging, record);
    }
  }
  EXPECT_EQ(FindKvFormat(v1::KV_CACHE_DTYPE_UNSPECIFIED), nullptr);
  absl::StatusOr<v1::KvCacheDtype> bad = ParseKvDtype("fp4");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "nvfp4_ds_mla")) << bad.status();
}

TEST(ValidateSpecTest, Fp8PresetsTakeTheModelsScaleFormat) {
  absl::StatusOr<v1::AttentionSpec> ds =
      SpecFromPreset("deepseek-v3.2", 8, v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->kv_cache_dtype(), v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  EXPECT_EQ(ds->kv_scale_format(), v1::KV_SCALE_FORMAT_POW2);
  absl::StatusOr<v1::AttentionSpec> glm = SpecFromPreset("glm-5", 1, v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  ASSERT_TRUE(glm.ok()) << glm.status();
  EXPECT_EQ(glm->kv_scale_format(), v1::KV_SCALE_FORMAT_ARBITRARY);
  // bf16 (the default) carries no scale format.
  absl::StatusOr<v1::AttentionSpec> bf16 = SpecFromPreset("glm-5", 1);
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->kv_scale_format(), v1::KV_SCALE_FORMAT_UNSPECIFIED);
  // Switching a spec's dtype keeps a given scale format, clears it for bf16.
  v1::AttentionSpec back =
      SpecWithKvDtype(*ds, v1::KV_CACHE_DTYPE_BF16, v1::KV_SCALE_FORMAT_ARBITRARY);
  EXPECT_EQ(back.kv_scale_format(), v1::KV_SCALE_FORMAT_UNSPECIFIED);
  EXPECT_TRUE(ValidateSpec(back).ok());
}

TEST(ValidateSpecTest, ReportsAllBadFieldsInFieldOrder) {
  v1::AttentionSpec spec;  // every field at its default
  spec.set_s_q(9);         // 0 means "not given" and is valid
  absl::Status status = ValidateSpec(spec);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  const std::vector<std::string> fields = {
      "num_q_heads: got", "kv_lora_rank: got",   "rope_dim: got",        "topk: got",
      "s_q: got",         "kv_cache_dtype: got", "page_block_size: got", "softmax_scale: got"};
  size_t last = 0;
  for (const std::string& field : fields) {
    size_t pos = status.message().find(field);
    ASSERT_NE(pos, std::string_view::npos) << field << " in " << status;
    EXPECT_GE(pos, last) << field << " out of order in " << status;
    last = pos;
  }
  EXPECT_TRUE(Contains(status.message(), "; "));
}

TEST(NormalizeSpecTest, KeepsEveryKernelFieldAndIsIdempotent) {
  v1::AttentionSpec spec = GoodSpec();
  spec.set_rope_dim(0);
  absl::StatusOr<v1::AttentionSpec> normalized = NormalizeSpec(spec);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  // s_q does not change the kernel and is cleared; every other field stays.
  EXPECT_EQ(normalized->s_q(), 0u);
  v1::AttentionSpec without_sq = spec;
  without_sq.clear_s_q();
  EXPECT_TRUE(MessageDifferencer::Equals(*normalized, without_sq));
  EXPECT_TRUE(normalized->has_rope_dim());
  absl::StatusOr<v1::AttentionSpec> again = NormalizeSpec(*normalized);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->SerializeAsString(), normalized->SerializeAsString());
}

TEST(NormalizeSpecTest, DropsUnknownWireFields) {
  v1::AttentionSpec spec = GoodSpec();
  // Field 99 (varint 5), as a newer client might send.
  std::string wire = spec.SerializeAsString();
  // Tag (99 << 3) | 0 = 792 as a varint is 0x98 0x06.
  wire += std::string("\x98\x06\x05", 3);
  v1::AttentionSpec with_unknown;
  ASSERT_TRUE(with_unknown.ParseFromString(wire));
  ASSERT_NE(with_unknown.SerializeAsString(), spec.SerializeAsString());
  absl::StatusOr<v1::AttentionSpec> normalized = NormalizeSpec(with_unknown);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  absl::StatusOr<v1::AttentionSpec> plain = NormalizeSpec(spec);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(normalized->SerializeAsString(), plain->SerializeAsString());
}

TEST(PresetsTest, ListsBothModels) {
  const std::vector<PresetInfo>& presets = Presets();
  ASSERT_EQ(presets.size(), 2u);
  EXPECT_EQ(presets[0].name, "deepseek-v3.2");
  EXPECT_EQ(presets[0].total_heads, 128);
  EXPECT_EQ(presets[0].kv_lora_rank, 512);
  EXPECT_EQ(presets[0].rope_dim, 64);
  EXPECT_EQ(presets[0].topk, 2048);
  EXPECT_FLOAT_EQ(presets[0].softmax_scale, 0.135234f);
  EXPECT_EQ(presets[1].name, "glm-5");
  EXPECT_EQ(presets[1].total_heads, 64);
  EXPECT_EQ(presets[1].kv_lora_rank, 512);
  EXPECT_EQ(presets[1].rope_dim, 64);
  EXPECT_EQ(presets[1].topk, 2048);
  EXPECT_FLOAT_EQ(presets[1].softmax_scale, 0.0625f);
}

struct PresetCase {
  std::string preset;
  int tp;
  uint32_t heads;
  float scale;
};

class SpecFromPresetTest : public ::testing::TestWithParam<PresetCase> {};

TEST_P(SpecFromPresetTest, SplitsHeads) {
  const PresetCase& c = GetParam();
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset(c.preset, c.tp);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_q_heads(), c.heads);
  EXPECT_EQ(spec->kv_lora_rank(), 512u);
  ASSERT_TRUE(spec->has_rope_dim());
  EXPECT_EQ(spec->rope_dim(), 64u);
  EXPECT_EQ(spec->topk(), 2048u);
  EXPECT_EQ(spec->s_q(), 0u);  // not part of the kernel
  EXPECT_EQ(spec->kv_cache_dtype(), v1::KV_CACHE_DTYPE_BF16);
  EXPECT_EQ(spec->page_block_size(), 64u);
  EXPECT_EQ(spec->softmax_scale(), c.scale);
  EXPECT_TRUE(spec->return_lse());
  EXPECT_TRUE(ValidateSpec(*spec).ok());
}

INSTANTIATE_TEST_SUITE_P(Both, SpecFromPresetTest,
                         ::testing::Values(PresetCase{"deepseek-v3.2", 1, 128, 0.135234f},
                                           PresetCase{"deepseek-v3.2", 2, 64, 0.135234f},
                                           PresetCase{"deepseek-v3.2", 4, 32, 0.135234f},
                                           PresetCase{"deepseek-v3.2", 8, 16, 0.135234f},
                                           PresetCase{"glm-5", 1, 64, 0.0625f},
                                           PresetCase{"glm-5", 2, 32, 0.0625f},
                                           PresetCase{"glm-5", 4, 16, 0.0625f},
                                           PresetCase{"glm-5", 8, 8, 0.0625f}),
                         [](const ::testing::TestParamInfo<PresetCase>& info) {
                           std::string name = absl::StrCat(info.param.preset, "_tp", info.param.tp);
                           for (char& c : name) {
                             if (!absl::ascii_isalnum(c)) c = '_';
                           }
                           return name;
                         });

TEST(SpecFromPresetTest, BadTensorParallel) {
  for (const char* preset : {"deepseek-v3.2", "glm-5"}) {
    for (int tp : {0, -1, 3, 256}) {
      absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset(preset, tp);
      ASSERT_FALSE(spec.ok()) << preset << " tp " << tp;
      EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_TRUE(Contains(spec.status().message(), absl::StrCat("tensor_parallel: got ", tp)));
    }
  }
}

TEST(SpecFromPresetTest, UnknownPresetListsKnownNames) {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("llama-3", 1);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(spec.status().message(), "\"llama-3\""));
  EXPECT_TRUE(Contains(spec.status().message(), "deepseek-v3.2"));
  EXPECT_TRUE(Contains(spec.status().message(), "glm-5"));
}

TEST(ParseSpecTest, JsonRoundTrip) {
  const v1::AttentionSpec spec = GoodSpec();
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(spec, &json, options).ok());
  absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << json;
  EXPECT_TRUE(MessageDifferencer::Equals(*parsed, spec)) << json;
}

TEST(ParseSpecTest, JsonSnakeAndCamelCaseNamesAndEnumNames) {
  absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec(R"(
    {
      "num_q_heads": 16,
      "kvLoraRank": 512,
      "rope_dim": 0,
      "topk": 2048,
      "s_q": 2,
      "kv_cache_dtype": "KV_CACHE_DTYPE_BF16",
      "page_block_size": 1,
      "softmax_scale": 0.0625,
      "return_lse": false
    })");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->num_q_heads(), 16u);
  EXPECT_EQ(parsed->kv_lora_rank(), 512u);
  // An explicit 0 sets presence: NoPE is only ever chosen on purpose.
  EXPECT_TRUE(parsed->has_rope_dim());
  EXPECT_EQ(parsed->rope_dim(), 0u);
  EXPECT_EQ(parsed->s_q(), 2u);
  EXPECT_EQ(parsed->kv_cache_dtype(), v1::KV_CACHE_DTYPE_BF16);
  EXPECT_EQ(parsed->softmax_scale(), 0.0625f);
  EXPECT_FALSE(parsed->return_lse());
  EXPECT_TRUE(ValidateSpec(*parsed).ok());
}

TEST(ParseSpecTest, JsonWithoutRopeDimLeavesItUnset) {
  absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec(R"({"num_q_heads": 8})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->has_rope_dim());
}

TEST(ParseSpecTest, TextProtoRoundTrip) {
  for (v1::AttentionSpec spec : {GoodSpec(), *SpecFromPreset("glm-5", 8)}) {
    std::string text;
    ASSERT_TRUE(google::protobuf::TextFormat::PrintToString(spec, &text));
    absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
    EXPECT_TRUE(MessageDifferencer::Equals(*parsed, spec)) << text;
  }
}

// fuzz/spec_fuzzer found that a scale of -0 did not survive a JSON round
// trip (the printer drops it, it reads back as +0); the parser makes it +0.
TEST(ParseSpecTest, NegativeZeroScaleIsPlusZeroAndRoundTrips) {
  for (const char* text : {"page_block_size: 64\nsoftmax_scale: -0.0\nreturn_lse: true\n",
                           "{\"page_block_size\": 64, \"softmax_scale\": -0.0}"}) {
    absl::StatusOr<v1::AttentionSpec> spec = ParseSpec(text);
    ASSERT_TRUE(spec.ok()) << spec.status() << "\n" << text;
    EXPECT_EQ(spec->softmax_scale(), 0.0f) << text;
    EXPECT_FALSE(std::signbit(spec->softmax_scale())) << text;
    std::string json;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(*spec, &json).ok());
    absl::StatusOr<v1::AttentionSpec> again = ParseSpec(json);
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << json;
    EXPECT_TRUE(MessageDifferencer::Equals(*again, *spec)) << json;
  }
}

TEST(ParseSpecTest, TextProtoWithComments) {
  absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec(R"(
    # deepseek-v3.2 at tp 8
    num_q_heads: 16
    kv_lora_rank: 512
    rope_dim: 64
    topk: 2048
    s_q: 1
    kv_cache_dtype: KV_CACHE_DTYPE_BF16
    page_block_size: 64
    softmax_scale: 0.135234
    return_lse: true
  )");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->s_q(), 1u);  // parsed as written
  EXPECT_TRUE(
      MessageDifferencer::Equals(*NormalizeSpec(*parsed), *SpecFromPreset("deepseek-v3.2", 8)));
}

TEST(ParseSpecTest, JsonUnknownFieldIsError) {
  absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec(R"({"num_q_heads": 16, "num_kv_heads": 1})");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(parsed.status().message(), "num_kv_heads"));
}

TEST(ParseSpecTest, TextProtoUnknownFieldIsErrorWithPosition) {
  absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec("num_q_heads: 16\nnum_kv_heads: 1\n");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(parsed.status().message(), "num_kv_heads"));
  EXPECT_TRUE(Contains(parsed.status().message(), "line 2"));
}

TEST(ParseSpecTest, MalformedInputIsError) {
  for (const char* text : {"{", "{\"num_q_heads\": }", "{\"num_q_heads\": -1}",
                           "{\"kind\": \"NOT_A_KIND\"}", "num_q_heads 16 {", "num_q_heads: -1",
                           "kind: NOT_A_KIND", "num_q_heads: \"sixteen\"", "   ", ""}) {
    absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec(text);
    EXPECT_FALSE(parsed.ok()) << "'" << text << "'";
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << "'" << text << "'";
  }
}

// Protobuf's JSON parser takes the last of two equal keys; a spec that
// says a field twice (in either spelling) is an error naming it.
TEST(ParseSpecTest, DuplicateKeysAreAnError) {
  for (const char* text :
       {R"({"topk": 2048, "num_q_heads": 16, "topk": 1024})",
        R"({"num_q_heads": 16, "numQHeads": 8})", "{\"topk\": 1,\n \"top\\u006b\": 2}"}) {
    absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(Contains(parsed.status().message(), "is given twice")) << parsed.status();
  }
  absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec("num_q_heads: 16\ntopk: 2048\ntopk: 1024\n");
  ASSERT_FALSE(parsed.ok());
  EXPECT_TRUE(Contains(parsed.status().message(), "topk")) << parsed.status();
  // Equal keys in different objects, or inside strings, are fine.
  EXPECT_TRUE(CheckNoDuplicateJsonKeys(R"({"a": {"b": 1}, "c": {"b": "a, \"a\": 2"}})", true).ok());
}

// A preset's tensor_parallel is a uint32 on the wire; 4294967295 was
// reported as "got -1".
TEST(SpecOfSelectorTest, HugeTensorParallelIsReportedAsSent) {
  v1::KernelSelector selector;
  selector.mutable_preset()->set_name("glm-5");
  selector.mutable_preset()->set_tensor_parallel(4294967295u);
  absl::StatusOr<v1::KernelSpec> spec = SpecOfSelector(selector);
  ASSERT_FALSE(spec.ok());
  EXPECT_TRUE(Contains(spec.status().message(), "tensor_parallel: got 4294967295,"))
      << spec.status();
}

// A selector's spec is a KernelSpec: one with no case is refused naming
// kind, an indexer one resolves to the indexer's spec.
TEST(SpecOfSelectorTest, SpecCaseChoosesTheKind) {
  v1::KernelSelector selector;
  selector.mutable_spec();
  absl::StatusOr<v1::KernelSpec> spec = SpecOfSelector(selector);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(spec.status().message(), "kind: got none")) << spec.status();
  v1::DsaIndexerSpec& indexer = *selector.mutable_spec()->mutable_dsa_indexer();
  indexer.set_index_heads(32);
  indexer.set_index_head_dim(128);
  indexer.set_topk(2048);
  indexer.set_page_block_size(64);
  spec = SpecOfSelector(selector);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->has_dsa_indexer());
  EXPECT_EQ(spec->dsa_indexer().index_heads(), 32u);
  *selector.mutable_spec() = SparseKernelSpec(GoodSpec());
  spec = SpecOfSelector(selector);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(MessageDifferencer::Equals(spec->sparse_mla_decode(), GoodSpec()));
}

TEST(ParseSpecTest, TextProtoErrorHasLineAndColumn) {
  absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec("num_q_heads: 16\n  topk: oops\n");
  ASSERT_FALSE(parsed.ok());
  EXPECT_TRUE(Contains(parsed.status().message(), "line 2 column"));
}

// Spec files take the short names the CLI takes (--kv-dtype), in any
// case, beside the enum names: each KvFormats() row and each scale format,
// in JSON (either key spelling) and text proto (identifier or string),
// for the spec's own cache and for extra_kv.
TEST(ParseSpecTest, ShortKvNamesInJsonAndTextProto) {
  for (const KvFormatInfo& f : KvFormats()) {
    for (const std::string& name :
         {std::string(f.name), absl::AsciiStrToUpper(f.name), v1::KvCacheDtype_Name(f.dtype)}) {
      SCOPED_TRACE(name);
      for (const std::string& text :
           {absl::StrCat(R"({"kv_cache_dtype": ")", name, R"("})"),
            absl::StrCat(R"({"kvCacheDtype": ")", name, R"("})"),
            absl::StrCat(R"({"extra_kv": {"kv_cache_dtype": ")", name, R"("}})"),
            absl::StrCat(R"({"extraKv": {"kvCacheDtype": ")", name, R"("}})"),
            absl::StrCat("kv_cache_dtype: ", name), absl::StrCat("kv_cache_dtype: \"", name, "\""),
            absl::StrCat("extra_kv { kv_cache_dtype: ", name, " }"),
            absl::StrCat("extra_kv: < kv_cache_dtype: '", name, "' >")}) {
        absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec(text);
        ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
        const v1::KvCacheDtype got =
            parsed->has_extra_kv() ? parsed->extra_kv().kv_cache_dtype() : parsed->kv_cache_dtype();
        EXPECT_EQ(got, f.dtype) << text;
      }
    }
  }
  for (const auto& [name, format] : {std::pair{"pow2", v1::KV_SCALE_FORMAT_POW2},
                                     std::pair{"Arbitrary", v1::KV_SCALE_FORMAT_ARBITRARY},
                                     std::pair{"KV_SCALE_FORMAT_POW2", v1::KV_SCALE_FORMAT_POW2}}) {
    SCOPED_TRACE(name);
    for (const std::string& text :
         {absl::StrCat(R"({"kvScaleFormat": ")", name, R"("})"),
          absl::StrCat(R"({"extra_kv": {"kv_scale_format": ")", name, R"("}})"),
          absl::StrCat("kv_scale_format: ", name),
          absl::StrCat("extra_kv { kv_scale_format: \"", name, "\" }")}) {
      absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec(text);
      ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
      EXPECT_EQ(
          parsed->has_extra_kv() ? parsed->extra_kv().kv_scale_format() : parsed->kv_scale_format(),
          format)
          << text;
    }
  }
}

// A whole DeepSeek-V4-shaped spec written with short names is the spec
// written with enum names; in text proto the names are replaced in place
// (several on a line, after tabs and comments), so every other field
// keeps its value.
TEST(ParseSpecTest, ShortNamesGiveTheSpecOfTheEnumNames) {
  v1::AttentionSpec want;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"(num_q_heads: 64 kv_lora_rank: 512 rope_dim: 0
         topk: 512 kv_cache_dtype: KV_CACHE_DTYPE_FP8_DS_MLA_V4 page_block_size: 64
         softmax_scale: 0.0441941738 return_lse: true
         extra_kv { kv_cache_dtype: KV_CACHE_DTYPE_FP8_DS_MLA kv_scale_format: KV_SCALE_FORMAT_POW2
                    topk: 128 page_block_size: 64 })",
      &want));
  for (const char* text : {
           R"({"num_q_heads": 64, "kv_lora_rank": 512,
               "rope_dim": 0, "topk": 512, "kv_cache_dtype": "fp8_ds_mla_v4",
               "page_block_size": 64, "softmax_scale": 0.0441941738, "return_lse": true,
               "extraKv": {"kvCacheDtype": "fp8_ds_mla", "kvScaleFormat": "pow2", "topk": 128,
                           "pageBlockSize": 64}})",
           "kind: ATTENTION_KIND_SPARSE_MLA_DECODE num_q_heads: 64 kv_lora_rank: 512 rope_dim: 0\n"
           "# kv_cache_dtype: bf16 (a comment: not a field)\n"
           "topk: 512 kv_cache_dtype:\tfp8_ds_mla_v4\tpage_block_size: 64\n"
           "softmax_scale: 0.0441941738 return_lse: true\n"
           "extra_kv {\tkv_cache_dtype: \"fp8_ds_mla\"; kv_scale_format: pow2 topk: 128\n"
           "  page_block_size: 64 }\n"}) {
    absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
    EXPECT_TRUE(MessageDifferencer::Equals(*parsed, want)) << parsed->ShortDebugString() << "\n"
                                                           << text;
    EXPECT_TRUE(ValidateSpec(*parsed).ok()) << ValidateSpec(*parsed);
  }
}

struct BadName {
  const char* text;
  std::vector<const char*> message_parts;  // each must appear
};

// A name that is neither spelling, an empty one, or the other enum's name
// is an error naming the field path, the value and every accepted name;
// a value of the wrong type is protobuf's error. Nothing else is accepted.
TEST(ParseSpecTest, BadKvNamesAreNamedWithWhatIsAccepted) {
  const char* dtypes =
      "supported bf16, fp8_ds_mla, fp8_ds_mla_v4, mxfp8_ds_mla_v41, nvfp4_ds_mla "
      "(or the KV_CACHE_DTYPE_* names)";
  const char* scales = "supported pow2, arbitrary (or the KV_SCALE_FORMAT_* names)";
  const std::vector<BadName> cases = {
      {R"({"kv_cache_dtype": "fp4"})", {"kv_cache_dtype: got \"fp4\", ", dtypes}},
      {R"({"kv_cache_dtype": ""})", {"kv_cache_dtype: got \"\", ", dtypes}},
      {R"({"kv_cache_dtype": "pow2"})", {"kv_cache_dtype: got \"pow2\", ", dtypes}},
      {R"({"kv_cache_dtype": " bf16"})", {"kv_cache_dtype: got \" bf16\""}},
      {R"({"kv_cache_dtype": "bf\u0001"})", {"kv_cache_dtype: got \"bf\\x01\""}},
      {R"({"kv_scale_format": "pow3"})", {"kv_scale_format: got \"pow3\", ", scales}},
      {R"({"kv_scale_format": "bf16"})", {"kv_scale_format: got \"bf16\", ", scales}},
      {R"({"kv_scale_format": "KV_SCALE_FORMAT_pow2"})", {"got \"KV_SCALE_FORMAT_pow2\""}},
      {R"({"extra_kv": {"topk": 128, "kv_cache_dtype": "fp8"}})",
       {"extra_kv.kv_cache_dtype: got \"fp8\", ", dtypes}},
      {R"({"extraKv": {"kvScaleFormat": ""}})", {"extraKv.kvScaleFormat: got \"\", ", scales}},
      {"num_q_heads: 8\nkv_cache_dtype: fp4\n",
       {"line 2 column 17: kv_cache_dtype: got \"fp4\"", dtypes}},
      {"kv_cache_dtype: \"\"", {"line 1 column 17: kv_cache_dtype: got \"\"", dtypes}},
      {"extra_kv {\n  topk: 1\n  kv_scale_format: 'pow 2' }",
       {"line 3 column 20: extra_kv.kv_scale_format: got \"pow 2\"", scales}},
      {"extra_kv < kv_cache_dtype: Fp4 >", {"extra_kv.kv_cache_dtype: got \"Fp4\"", dtypes}},
      // Wrong types: protobuf's parsers refuse them.
      {R"({"kv_cache_dtype": true})", {"invalid JSON spec", "kv_cache_dtype"}},
      {R"({"kv_cache_dtype": ["bf16"]})", {"invalid JSON spec"}},
      {R"({"kv_cache_dtype": {"bf16": 1}})", {"invalid JSON spec"}},
      {R"({"kv_cache_dtype": 1.5})", {"invalid JSON spec"}},
      {R"({"extra_kv": "fp8_ds_mla"})", {"invalid JSON spec"}},
      {"kv_cache_dtype: 1.5", {"invalid text-proto spec", "line 1"}},
      {"kv_cache_dtype { }", {"invalid text-proto spec"}},
      {"kv_cache_dtype: [bf16]", {"invalid text-proto spec"}},
      // Short names belong to the KV fields only.
      {R"({"kind": "sparse_mla_decode"})", {"invalid JSON spec", "kind"}},
      {"kind: bf16", {"invalid text-proto spec", "no field named \"kind\""}},
  };
  for (const BadName& c : cases) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec(c.text);
    ASSERT_FALSE(parsed.ok()) << parsed->ShortDebugString();
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    for (const char* part : c.message_parts) {
      EXPECT_TRUE(Contains(parsed.status().message(), part)) << parsed.status();
    }
  }
}

// Enum numbers parse as protobuf reads them: proto3 enums are open, so an
// out-of-range number is kept, and validation names it.
TEST(ParseSpecTest, EnumNumbersOutOfRangeAreRefusedByValidation) {
  for (const char* text : {R"({"kv_cache_dtype": 99})", "kv_cache_dtype: 99",
                           R"({"kv_cache_dtype": -1})", "kv_cache_dtype: -1"}) {
    SCOPED_TRACE(text);
    absl::StatusOr<v1::AttentionSpec> parsed = ParseSpec(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    v1::AttentionSpec spec = GoodSpec();
    spec.set_kv_cache_dtype(parsed->kv_cache_dtype());
    const absl::Status status = ValidateSpec(spec);
    ASSERT_FALSE(status.ok());
    EXPECT_TRUE(Contains(status.message(), absl::StrCat("kv_cache_dtype: got ",
                                                        static_cast<int>(spec.kv_cache_dtype()))))
        << status;
  }
  absl::StatusOr<v1::AttentionSpec> numbered = ParseSpec(R"({"kv_cache_dtype": 3})");
  ASSERT_TRUE(numbered.ok()) << numbered.status();
  EXPECT_EQ(numbered->kv_cache_dtype(), v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4);
}

TEST(KvScaleFormatNameTest, ShortNamesReadBackAndOthersPrintAsTheEnum) {
  EXPECT_EQ(KvScaleFormatName(v1::KV_SCALE_FORMAT_POW2), "pow2");
  EXPECT_EQ(KvScaleFormatName(v1::KV_SCALE_FORMAT_ARBITRARY), "arbitrary");
  EXPECT_EQ(KvScaleFormatName(v1::KV_SCALE_FORMAT_UNSPECIFIED), "KV_SCALE_FORMAT_UNSPECIFIED");
  EXPECT_EQ(KvScaleFormatName(static_cast<v1::KvScaleFormat>(7)), "7");
  for (v1::KvScaleFormat format : {v1::KV_SCALE_FORMAT_POW2, v1::KV_SCALE_FORMAT_ARBITRARY}) {
    for (const std::string& name :
         {KvScaleFormatName(format), absl::AsciiStrToUpper(KvScaleFormatName(format)),
          v1::KvScaleFormat_Name(format)}) {
      absl::StatusOr<v1::KvScaleFormat> parsed = ParseKvScaleFormat(name);
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(*parsed, format) << name;
    }
  }
  for (const char* bad : {"", "KV_SCALE_FORMAT_UNSPECIFIED", "unspecified", "7", "pow2 "}) {
    absl::StatusOr<v1::KvScaleFormat> parsed = ParseKvScaleFormat(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_TRUE(Contains(parsed.status().message(), "kv scale format: got")) << parsed.status();
    EXPECT_TRUE(Contains(parsed.status().message(), "pow2, arbitrary")) << parsed.status();
  }
}

class LoadSpecFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::path(::testing::TempDir()) / absl::StrCat("kforge_spec_test_", getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& contents) {
    std::string path = (dir_ / name).string();
    std::ofstream(path) << contents;
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(LoadSpecFileTest, MissingFileIsNotFound) {
  const std::string path = (dir_ / "missing.json").string();
  absl::StatusOr<v1::AttentionSpec> spec = LoadSpecFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(spec.status().message(), path));
}

TEST_F(LoadSpecFileTest, LoadsJsonAndTextProto) {
  const v1::AttentionSpec expected = *SpecFromPreset("glm-5", 2);
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(expected, &json).ok());
  std::string text;
  ASSERT_TRUE(google::protobuf::TextFormat::PrintToString(expected, &text));
  for (const auto& [name, contents] : {std::pair{"a.json", json}, std::pair{"a.textproto", text}}) {
    absl::StatusOr<v1::AttentionSpec> spec = LoadSpecFile(Write(name, contents));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_TRUE(MessageDifferencer::Equals(*spec, expected)) << name;
  }
}

TEST_F(LoadSpecFileTest, ParseErrorNamesFile) {
  const std::string path = Write("bad.textproto", "num_q_heads: 16\nbogus: 1\n");
  absl::StatusOr<v1::AttentionSpec> spec = LoadSpecFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(spec.status().message(), path + ": ")) << spec.status();
  EXPECT_TRUE(Contains(spec.status().message(), "bogus"));
}

TEST_F(LoadSpecFileTest, EmptyFileIsInvalidArgument) {
  absl::StatusOr<v1::AttentionSpec> spec = LoadSpecFile(Write("empty", ""));
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LoadSpecFileTest, DirectoryIsInvalidArgument) {
  absl::StatusOr<v1::AttentionSpec> spec = LoadSpecFile(dir_.string());
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LoadSpecFileTest, KernelSpecFormAndFlatFormGiveTheSameSpec) {
  const v1::KernelSpec expected = SparseKernelSpec(*SpecFromPreset("glm-5", 2));
  std::string nested_json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(expected, &nested_json).ok());
  std::string nested_text;
  ASSERT_TRUE(google::protobuf::TextFormat::PrintToString(expected, &nested_text));
  std::string flat_json;
  ASSERT_TRUE(
      google::protobuf::util::MessageToJsonString(*SpecFromPreset("glm-5", 2), &flat_json).ok());
  std::string flat_text;
  ASSERT_TRUE(google::protobuf::TextFormat::PrintToString(*SpecFromPreset("glm-5", 2), &flat_text));
  ASSERT_TRUE(Contains(nested_json, "sparseMlaDecode")) << nested_json;
  // Files written before KernelSpec named the kind beside the fields.
  const std::string old_json = absl::StrCat(R"({"kind": "ATTENTION_KIND_SPARSE_MLA_DECODE", )",
                                            absl::StripPrefix(flat_json, "{"));
  const std::string old_text =
      absl::StrCat("# an older file\nkind: ATTENTION_KIND_SPARSE_MLA_DECODE\n", flat_text);
  for (const auto& [name, contents] :
       {std::pair{"nested.json", nested_json}, std::pair{"nested.textproto", nested_text},
        std::pair{"flat.json", flat_json}, std::pair{"flat.textproto", flat_text},
        std::pair{"old.json", old_json}, std::pair{"old.textproto", old_text}}) {
    absl::StatusOr<v1::KernelSpec> spec = LoadKernelSpecFile(Write(name, contents));
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_EQ(KindOf(*spec), v1::ATTENTION_KIND_SPARSE_MLA_DECODE) << name;
    absl::StatusOr<v1::KernelSpec> normalized = NormalizeKernelSpec(*spec);
    ASSERT_TRUE(normalized.ok()) << name << ": " << normalized.status();
    EXPECT_TRUE(MessageDifferencer::Equals(*normalized, expected))
        << name << ": " << normalized->DebugString() << " vs " << expected.DebugString();
  }
}

TEST(ParseSpecTextTest, IndexerSpecIsItsKernelSpec) {
  v1::KernelSpec expected;
  v1::DsaIndexerSpec& indexer = *expected.mutable_dsa_indexer();
  indexer.set_index_heads(64);
  indexer.set_index_head_dim(128);
  indexer.set_topk(2048);
  indexer.set_page_block_size(64);
  indexer.set_s_q(2);
  for (const char* text : {
           R"({"dsa_indexer": {"index_heads": 64, "index_head_dim": 128, "topk": 2048,
               "page_block_size": 64, "s_q": 2}})",
           "# the indexer\ndsa_indexer { index_heads: 64 index_head_dim: 128 topk: 2048 "
           "page_block_size: 64 s_q: 2 }\n",
       }) {
    absl::StatusOr<v1::KernelSpec> spec = ParseSpecText(text);
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    EXPECT_TRUE(MessageDifferencer::Equals(*spec, expected)) << text << ": " << spec->DebugString();
    EXPECT_EQ(KindOf(*spec), v1::ATTENTION_KIND_DSA_INDEXER);
    EXPECT_EQ(KindCaseName(*spec), "dsa_indexer");
    absl::StatusOr<v1::KernelSpec> normalized = NormalizeKernelSpec(*spec);
    ASSERT_TRUE(normalized.ok()) << normalized.status();
    EXPECT_EQ(normalized->dsa_indexer().s_q(), 0u);
  }
}

// The flat form is a sparse MLA spec's fields: an indexer written flat (as
// files were before KernelSpec), or the other kind's fields, are refused
// with how to write the spec instead.
TEST(ParseSpecTextTest, FlatIndexerFieldsAreRefusedSayingHowToWriteThem) {
  for (const char* text : {
           R"({"kind": "ATTENTION_KIND_DSA_INDEXER", "index_heads": 64, "topk": 2048})",
           "kind: ATTENTION_KIND_DSA_INDEXER index_heads: 64 topk: 2048\n",
           "num_q_heads: 16 index_heads: 64",
           R"({"num_q_heads": 16, "index_head_dim": 128})",
       }) {
    absl::StatusOr<v1::KernelSpec> spec = ParseSpecText(text);
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(spec.status().message(), "dsa_indexer { index_heads: ... }"))
        << text << ": " << spec.status();
  }
  // The sparse kind named in a string or a comment is not a field.
  absl::StatusOr<v1::AttentionSpec> flat =
      ParseSpec("num_q_heads: 16 # kind: ATTENTION_KIND_SPARSE_MLA_DECODE\nmykind: 3\n");
  ASSERT_FALSE(flat.ok());
  EXPECT_TRUE(Contains(flat.status().message(), "mykind")) << flat.status();
}

TEST(ParseSpecTextTest, KernelSpecFormTakesShortNamesAndRefusesUnknownFields) {
  absl::StatusOr<v1::KernelSpec> spec =
      ParseSpecText(R"({"sparse_mla_decode": {"kv_cache_dtype": "fp8_ds_mla"}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->sparse_mla_decode().kv_cache_dtype(), v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  spec = ParseSpecText("sparse_mla_decode { kv_cache_dtype: fp8_ds_mla kv_scale_format: pow2 }");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->sparse_mla_decode().kv_scale_format(), v1::KV_SCALE_FORMAT_POW2);
  spec = ParseSpecText(R"({"dsa_indexer": {"num_q_heads": 16}})");
  ASSERT_FALSE(spec.ok());
  EXPECT_TRUE(Contains(spec.status().message(), "num_q_heads")) << spec.status();
}

TEST(NormalizeKernelSpecTest, NoCaseIsRefusedNamingKind) {
  absl::StatusOr<v1::KernelSpec> normalized = NormalizeKernelSpec(v1::KernelSpec());
  ASSERT_FALSE(normalized.ok());
  EXPECT_EQ(normalized.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(normalized.status().message(), "kind: got none"))
      << normalized.status();
  EXPECT_EQ(KindOf(v1::KernelSpec()), v1::ATTENTION_KIND_UNSPECIFIED);
  EXPECT_EQ(KindCaseName(v1::KernelSpec()), "none");
}

}  // namespace
}  // namespace kforge
