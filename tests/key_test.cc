#include "compiler/key.h"

#include <cmath>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"
#include "model/indexer_spec.h"
#include "model/spec.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

using ::google::protobuf::EnumDescriptor;
using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::Reflection;

v1::AttentionSpec GoldenSpec() { return ::kforge::testing::DeepseekTp1Spec(); }

KeyInputs GoldenInputs() {
  KeyInputs inputs;
  inputs.spec = KernelSpecOf(GoldenSpec());
  // Fixed strings, not TemplateDigest() / NvrtcVersion(), so the golden key
  // does not move when the templates or the toolkit do.
  inputs.template_digest = Sha256Hex("templates");
  inputs.nvrtc_version = "13.0";
  inputs.options = {"--gpu-architecture=sm_90a", "-no-cache", "-no-source-include", "-std=c++17"};
  inputs.arch = "sm_90a";
  inputs.programs = {"main,main_cluster", "combine"};
  inputs.format_version = 1;
  return inputs;
}

TEST(Sha256HexTest, KnownVectors) {
  // FIPS 180-2 appendix B.1 and the empty message.
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(TemplateDigestTest, IsStableHex) {
  const std::string& digest = TemplateDigest();
  EXPECT_EQ(digest.size(), 64u);
  EXPECT_EQ(digest.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(&TemplateDigest(), &digest);
}

TEST(CacheKeyTest, IsDeterministic) {
  EXPECT_EQ(ComputeCacheKey(GoldenInputs()), ComputeCacheKey(GoldenInputs()));
}

// Pinned so that an accidental change to the key recipe fails here. Changing
// the recipe on purpose requires bumping kFormatVersion (so no old cache entry
// is served under a new meaning) and then updating this literal. Adding a field
// to AttentionSpec also changes it (by design: every field is hashed; the
// last change: the programs a module is compiled as, hashed).
TEST(CacheKeyTest, GoldenKey) {
  EXPECT_EQ(ComputeCacheKey(GoldenInputs()),
            "e4b3554fe2b402ca86f0026e824297b8012997ee88480ba2fccede24ffff07b8");
}

TEST(CacheKeyTest, DefaultFormatVersionIsCurrent) {
  EXPECT_EQ(KeyInputs().format_version, kFormatVersion);
}

// Returns a copy of `spec` (an AttentionSpec or a DsaIndexerSpec) with
// `field` changed to another value.
template <typename Spec>
Spec Mutated(const Spec& spec, const FieldDescriptor* field) {
  Spec out = spec;
  const Reflection& r = *out.GetReflection();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      r.SetInt32(&out, field, r.GetInt32(out, field) + 1);
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      r.SetInt64(&out, field, r.GetInt64(out, field) + 1);
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      r.SetUInt32(&out, field, r.GetUInt32(out, field) + 1);
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      r.SetUInt64(&out, field, r.GetUInt64(out, field) + 1);
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      r.SetBool(&out, field, !r.GetBool(out, field));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      // One ulp: a decimal encoding could miss it, the bit encoding must not.
      r.SetFloat(&out, field, std::nextafter(r.GetFloat(out, field), 1e30f));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      r.SetDouble(&out, field, std::nextafter(r.GetDouble(out, field), 1e300));
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      const EnumDescriptor* type = field->enum_type();
      const int current = r.GetEnumValue(out, field);
      for (int i = 0; i < type->value_count(); ++i) {
        if (type->value(i)->number() != current) {
          r.SetEnumValue(&out, field, type->value(i)->number());
          break;
        }
      }
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING:
      r.SetString(&out, field, r.GetString(out, field) + "x");
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      if (field->name() != "extra_kv") {
        ADD_FAILURE() << "extend Mutated() for message field " << field->name();
        break;
      }
      // Present when absent; else its topk moved.
      if constexpr (std::is_same_v<Spec, v1::AttentionSpec>) {
        out.mutable_extra_kv()->set_topk(out.extra_kv().topk() + 1);
      }
      break;
  }
  return out;
}

TEST(CacheKeyTest, EveryFieldOfTheSpecChangesTheKey) {
  const KeyInputs base = GoldenInputs();
  const std::string base_key = ComputeCacheKey(base);
  const auto* descriptor = v1::AttentionSpec::descriptor();
  ASSERT_GT(descriptor->field_count(), 0);
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    ASSERT_FALSE(field->is_repeated()) << "extend this test for " << field->name();
    KeyInputs changed = base;
    changed.spec = KernelSpecOf(Mutated(base.spec.sparse_mla_decode(), field));
    ASSERT_NE(changed.spec.SerializeAsString(), base.spec.SerializeAsString()) << field->name();
    EXPECT_NE(ComputeCacheKey(changed), base_key) << field->name();
  }
}

// The indexer's spec: every field is hashed too.
TEST(CacheKeyTest, EveryIndexerFieldChangesTheKey) {
  KeyInputs base = GoldenInputs();
  absl::StatusOr<v1::DsaIndexerSpec> indexer = IndexerSpecFromPreset("glm-5", 1);
  ASSERT_TRUE(indexer.ok()) << indexer.status();
  for (const v1::DsaIndexerSpec& from : {*indexer, v1::DsaIndexerSpec()}) {
    base.spec = KernelSpecOf(from);
    const std::string base_key = ComputeCacheKey(base);
    const auto* descriptor = v1::DsaIndexerSpec::descriptor();
    ASSERT_GT(descriptor->field_count(), 0);
    for (int i = 0; i < descriptor->field_count(); ++i) {
      const FieldDescriptor* field = descriptor->field(i);
      KeyInputs changed = base;
      changed.spec = KernelSpecOf(Mutated(from, field));
      EXPECT_NE(ComputeCacheKey(changed), base_key) << field->name();
    }
  }
}

// The case is part of the key: two kinds' specs whose fields encode alike
// (here both empty) are different kernels.
TEST(CacheKeyTest, TheSpecCaseChangesTheKey) {
  KeyInputs attention = GoldenInputs(), indexer = GoldenInputs(), none = GoldenInputs();
  attention.spec = KernelSpecOf(v1::AttentionSpec());
  indexer.spec = KernelSpecOf(v1::DsaIndexerSpec());
  none.spec.Clear();
  const std::set<std::string> keys = {ComputeCacheKey(attention), ComputeCacheKey(indexer),
                                      ComputeCacheKey(none)};
  EXPECT_EQ(keys.size(), 3u);
}

// From the all-defaults spec too, so a field whose mutation from zero is
// what matters (the common case for a newly added field) is covered.
TEST(CacheKeyTest, EveryFieldChangesTheKeyFromDefaults) {
  KeyInputs base = GoldenInputs();
  base.spec = KernelSpecOf(v1::AttentionSpec());  // the case set, every field default
  const std::string base_key = ComputeCacheKey(base);
  const auto* descriptor = v1::AttentionSpec::descriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    KeyInputs changed = base;
    changed.spec = KernelSpecOf(Mutated(base.spec.sparse_mla_decode(), field));
    EXPECT_NE(ComputeCacheKey(changed), base_key) << field->name();
  }
}

// An optional field set to its default is not the same as absent: an unset
// rope_dim is an error upstream, never a silent NoPE kernel.
TEST(CacheKeyTest, PresenceOfOptionalFieldsChangesTheKey) {
  const auto* descriptor = v1::AttentionSpec::descriptor();
  int optional_fields = 0;
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated() || !field->has_presence()) continue;
    ++optional_fields;
    KeyInputs unset = GoldenInputs();
    v1::AttentionSpec& u = *unset.spec.mutable_sparse_mla_decode();
    u.GetReflection()->ClearField(&u, field);
    // Setting the default value through reflection marks it present.
    KeyInputs zero = unset;
    v1::AttentionSpec& z = *zero.spec.mutable_sparse_mla_decode();
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_UINT32:
        z.GetReflection()->SetUInt32(&z, field, 0);
        break;
      case FieldDescriptor::CPPTYPE_INT32:
        z.GetReflection()->SetInt32(&z, field, 0);
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        z.GetReflection()->MutableMessage(&z, field);  // present, all default
        break;
      default:
        ADD_FAILURE() << "extend this test for optional field " << field->name();
        continue;
    }
    ASSERT_TRUE(z.GetReflection()->HasField(z, field));
    EXPECT_NE(ComputeCacheKey(unset), ComputeCacheKey(zero)) << field->name();
  }
  EXPECT_GE(optional_fields, 2);  // rope_dim, extra_kv
}

TEST(CacheKeyTest, NegativeZeroScaleIsADifferentKey) {
  KeyInputs a = GoldenInputs(), b = GoldenInputs();
  a.spec.mutable_sparse_mla_decode()->set_softmax_scale(0.0f);
  b.spec.mutable_sparse_mla_decode()->set_softmax_scale(-0.0f);
  EXPECT_NE(ComputeCacheKey(a), ComputeCacheKey(b));
}

TEST(CacheKeyTest, EveryOtherInputChangesTheKey) {
  const KeyInputs base = GoldenInputs();
  const std::string base_key = ComputeCacheKey(base);
  std::vector<std::pair<std::string, KeyInputs>> cases;
  auto add = [&](std::string name, auto mutate) {
    KeyInputs inputs = base;
    mutate(inputs);
    cases.emplace_back(std::move(name), std::move(inputs));
  };
  add("template_digest", [](KeyInputs& k) { k.template_digest = Sha256Hex("x"); });
  add("nvrtc_version", [](KeyInputs& k) { k.nvrtc_version = "13.1"; });
  add("arch", [](KeyInputs& k) { k.arch = "sm_120a"; });
  add("format_version", [](KeyInputs& k) { k.format_version += 1; });
  add("max_smem_per_block", [](KeyInputs& k) { k.max_smem_per_block = 101376; });
  add("small_batch_floor", [](KeyInputs& k) { k.small_batch_floor = "2,2"; });
  add("small_batch_floor other", [](KeyInputs& k) { k.small_batch_floor = "3,2"; });
  add("programs regrouped", [](KeyInputs& k) { k.programs = {"main", "main_cluster,combine"}; });
  add("programs reordered", [](KeyInputs& k) { std::swap(k.programs[0], k.programs[1]); });
  add("one program", [](KeyInputs& k) { k.programs = {"main,main_cluster,combine"}; });
  add("option order", [](KeyInputs& k) { std::swap(k.options[1], k.options[2]); });
  add("option added", [](KeyInputs& k) { k.options.push_back("-lineinfo"); });
  add("option removed", [](KeyInputs& k) { k.options.pop_back(); });
  add("no options", [](KeyInputs& k) { k.options.clear(); });
  for (size_t i = 0; i < base.options.size(); ++i) {
    add("option " + std::to_string(i) + " changed", [i](KeyInputs& k) { k.options[i] += " "; });
  }
  std::set<std::string> keys = {base_key};
  for (const auto& [name, inputs] : cases) {
    const std::string key = ComputeCacheKey(inputs);
    EXPECT_NE(key, base_key) << name;
    EXPECT_TRUE(keys.insert(key).second) << name << " collides with another case";
  }
}

// Length prefixes keep item boundaries: moving bytes between adjacent items
// must not produce the same encoding.
TEST(CacheKeyTest, ItemBoundariesAreUnambiguous) {
  KeyInputs a = GoldenInputs(), b = GoldenInputs(), c = GoldenInputs();
  a.options = {"-a b"};
  b.options = {"-a", "b"};
  c.options = {"-a ", "b"};
  EXPECT_NE(ComputeCacheKey(a), ComputeCacheKey(b));
  EXPECT_NE(ComputeCacheKey(b), ComputeCacheKey(c));

  KeyInputs d = GoldenInputs(), e = GoldenInputs();
  d.nvrtc_version = "13.0";
  d.arch = "sm_90a";
  e.nvrtc_version = "13.0sm_90a";
  e.arch = "";
  EXPECT_NE(ComputeCacheKey(d), ComputeCacheKey(e));
}

}  // namespace
}  // namespace kforge
