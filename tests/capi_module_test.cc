// The C ABI's kernel module functions (capi/kforge_capi.h, over
// runtime/kernel_module.h) as a binding sees them: only the shared
// library's exported functions, artifacts as serialized bytes. On a machine
// without a CUDA driver (every CPU test machine) the checks that need no
// driver still refuse bad input, and a good artifact fails with the clear
// "needs the CUDA driver" error instead of anything worse.
//
// The artifacts are encoded here in the protobuf wire format rather than
// with the generated classes: the library carries its own copy of those,
// and a second one in this process would register the same .proto twice.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "capi/kforge_capi.h"
#include "gtest/gtest.h"

namespace {

// absl::StatusCode values the ABI returns.
constexpr int32_t kOk = 0, kInvalidArgument = 3, kFailedPrecondition = 9, kDataLoss = 15;

// kforge.v1.EntryRole values (proto/kforge/v1/artifact.proto).
constexpr int32_t kAttention = 1, kCombine = 2, kIndexerLogits = 3, kIndexerTopk = 4;

// ---- a minimal protobuf wire encoder ----

void Varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void VarintField(std::string& out, int field, uint64_t v) {
  Varint(out, static_cast<uint64_t>(field) << 3);  // wire type 0
  Varint(out, v);
}

void BytesField(std::string& out, int field, std::string_view bytes) {
  Varint(out, (static_cast<uint64_t>(field) << 3) | 2);  // wire type 2
  Varint(out, bytes.size());
  out.append(bytes);
}

struct Entry {
  std::string name;
  int32_t role;
  uint32_t params_bytes;       // KernelEntry.params_bytes (0: not recorded)
  uint32_t cubin_param_bytes;  // cubin_info's; 0: not listed there
};

// A KernelArtifact: module_name 2, arch 4, cubin_info 10 (kernels 3: name
// 1, param_bytes 4), cubin 15, entries 20 (name 1, role 2, params_bytes 8).
std::string Artifact(const std::vector<Entry>& entries, std::string_view cubin = "not a cubin") {
  std::string out, info;
  BytesField(out, 2, "m");
  BytesField(out, 4, "sm_90a");
  for (const Entry& e : entries) {
    std::string entry;
    BytesField(entry, 1, e.name);
    VarintField(entry, 2, static_cast<uint64_t>(e.role));
    if (e.params_bytes != 0) VarintField(entry, 8, e.params_bytes);
    BytesField(out, 20, entry);
    if (e.cubin_param_bytes != 0) {
      std::string kernel;
      BytesField(kernel, 1, e.name);
      VarintField(kernel, 4, e.cubin_param_bytes);
      BytesField(info, 3, kernel);
    }
  }
  BytesField(out, 10, info);
  if (!cubin.empty()) BytesField(out, 15, cubin);
  return out;
}

// A sparse MLA artifact whose entries take this library's blocks.
std::string SparseMlaArtifact(std::string_view cubin = "not a cubin") {
  const auto main = static_cast<uint32_t>(kforge_sizeof("DecodeParams"));
  const auto combine = static_cast<uint32_t>(kforge_sizeof("CombineParams"));
  return Artifact({{"main", kAttention, main, main}, {"combine", kCombine, combine, combine}},
                  cubin);
}

constexpr KforgeEntryParams kSparseMla[] = {{kAttention, 0, 0, "DecodeParams"},
                                            {kCombine, 0, 0, "CombineParams"}};
constexpr KforgeEntryParams kIndexer[] = {{kIndexerLogits, 0, 0, "LogitsParams"},
                                          {kIndexerTopk, 0, 0, "TopkParams"}};

bool HaveDriver() {
  int32_t version = 0;
  return kforge_cuda_driver_version(&version, nullptr) == kOk;
}

// One kforge_module_load: (code, message); closes a module that loads.
std::pair<int32_t, std::string> Load(const std::string& artifact, const KforgeEntryParams* expected,
                                     size_t count, int32_t ordinal = 0) {
  KforgeModule* module = nullptr;
  char* error = nullptr;
  const int32_t code =
      kforge_module_load(reinterpret_cast<const uint8_t*>(artifact.data()), artifact.size(),
                         expected, count, ordinal, &module, &error);
  std::string message = error != nullptr ? error : "";
  kforge_free(error);
  kforge_module_close(module);
  return {code, message};
}

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

TEST(CapiModule, VersionAndStructSizes) {
  EXPECT_EQ(kforge_capi_version(), 14);
  EXPECT_EQ(kforge_capi_version(), KFORGE_CAPI_VERSION);
  EXPECT_EQ(kforge_sizeof("KforgeEntryParams"), sizeof(KforgeEntryParams));
  EXPECT_GT(kforge_sizeof("DecodeParams"), 0u);
  EXPECT_GT(kforge_sizeof("TopkParams"), 0u);
}

TEST(CapiModule, WithoutADriverTheDriverVersionSaysSo) {
  if (HaveDriver()) GTEST_SKIP() << "a CUDA driver is present; this checks machines without one";
  int32_t version = -1;
  char* error = nullptr;
  EXPECT_EQ(kforge_cuda_driver_version(&version, &error), kFailedPrecondition);
  ASSERT_NE(error, nullptr);
  EXPECT_TRUE(Contains(error, "no CUDA driver (libcuda.so.1 not found)")) << error;
  kforge_free(error);
  EXPECT_EQ(version, -1);  // outputs are written only on success
  EXPECT_EQ(kforge_cuda_driver_version(nullptr, nullptr), kInvalidArgument);
}

TEST(CapiModule, AGoodArtifactWithoutADriverIsAClearError) {
  if (HaveDriver()) GTEST_SKIP() << "a CUDA driver is present; this checks machines without one";
  auto [code, message] = Load(SparseMlaArtifact(), kSparseMla, 2);
  EXPECT_EQ(code, kFailedPrecondition) << message;
  EXPECT_TRUE(Contains(message,
                       "loading kforge kernels needs the CUDA driver (m): no CUDA driver "
                       "(libcuda.so.1 not found)"))
      << message;
  // Sizes given as numbers instead of names: the same checks pass.
  const KforgeEntryParams by_size[] = {
      {kAttention, 0, kforge_sizeof("DecodeParams"), nullptr},
      {kCombine, 0, kforge_sizeof("CombineParams"), "MyCombineBlock"}};
  std::tie(code, message) = Load(SparseMlaArtifact(), by_size, 2);
  EXPECT_EQ(code, kFailedPrecondition) << message;
  EXPECT_TRUE(Contains(message, "needs the CUDA driver")) << message;
}

TEST(CapiModule, BadArtifactsAreRefusedBeforeAnythingLoads) {
  // Not a KernelArtifact.
  auto [code, message] = Load(std::string("\xff\xff\xff", 3), kSparseMla, 2);
  EXPECT_EQ(code, kInvalidArgument);
  EXPECT_TRUE(Contains(message, "artifact: 3 bytes do not parse as a kforge.v1.KernelArtifact"))
      << message;
  // An artifact that lists no entries (an older kforge's).
  std::tie(code, message) = Load(Artifact({}), kSparseMla, 2);
  EXPECT_EQ(code, kFailedPrecondition);
  EXPECT_TRUE(Contains(message, "m: the artifact lists no entries")) << message;
  // Another family's module: the indexer's roles for a sparse MLA one.
  std::tie(code, message) = Load(SparseMlaArtifact(), kIndexer, 2);
  EXPECT_EQ(code, kFailedPrecondition);
  EXPECT_TRUE(Contains(message,
                       "main in m has role ENTRY_ROLE_ATTENTION, which this runtime "
                       "does not launch"))
      << message;
  // A block of another size than this library's, as recorded...
  const auto main = static_cast<uint32_t>(kforge_sizeof("DecodeParams"));
  const auto combine = static_cast<uint32_t>(kforge_sizeof("CombineParams"));
  std::tie(code, message) =
      Load(Artifact({{"main", kAttention, 8, main}, {"combine", kCombine, combine, combine}}),
           kSparseMla, 2);
  EXPECT_EQ(code, kFailedPrecondition);
  EXPECT_TRUE(Contains(message,
                       "entries[main].params_bytes = 8 but this runtime's "
                       "sizeof(DecodeParams)"))
      << message;
  EXPECT_TRUE(Contains(message, "templates/kforge/sparse_mla/common/params.h")) << message;
  // ...and as the cubin says.
  std::tie(code, message) =
      Load(Artifact({{"main", kAttention, 0, 8}, {"combine", kCombine, combine, combine}}),
           kSparseMla, 2);
  EXPECT_EQ(code, kFailedPrecondition);
  EXPECT_TRUE(Contains(message, "main in m takes 8 parameter bytes")) << message;
  // The caller's own size, checked the same way.
  const KforgeEntryParams wrong_size[] = {{kAttention, 0, main + 8, "Mine"},
                                          {kCombine, 0, 0, "CombineParams"}};
  std::tie(code, message) = Load(SparseMlaArtifact(), wrong_size, 2);
  EXPECT_EQ(code, kFailedPrecondition);
  EXPECT_TRUE(Contains(message, "sizeof(Mine)")) << message;
  // An entry cubin_info lacks.
  std::tie(code, message) =
      Load(Artifact({{"main", kAttention, main, 0}, {"combine", kCombine, combine, combine}}),
           kSparseMla, 2);
  EXPECT_EQ(code, kDataLoss);
  EXPECT_TRUE(Contains(message, "cubin_info lists no kernel named \"main\"")) << message;
  // No cubin.
  std::tie(code, message) = Load(SparseMlaArtifact(""), kSparseMla, 2);
  EXPECT_EQ(code, kInvalidArgument);
  EXPECT_TRUE(Contains(message, "m: the artifact carries no cubin")) << message;
}

TEST(CapiModule, BadExpectedParamsAreRefused) {
  const std::string artifact = SparseMlaArtifact();
  auto [code, message] = Load(artifact, nullptr, 2);
  EXPECT_EQ(code, kInvalidArgument);
  EXPECT_EQ(message, "expected: NULL");
  std::tie(code, message) = Load(artifact, kSparseMla, 0);
  EXPECT_EQ(code, kInvalidArgument);
  EXPECT_TRUE(Contains(message, "expected_count: 0")) << message;
  const KforgeEntryParams unspecified[] = {{0, 0, 8, "X"}};
  std::tie(code, message) = Load(artifact, unspecified, 1);
  EXPECT_EQ(code, kInvalidArgument);
  EXPECT_TRUE(Contains(message, "expected[0].role: 0 is not a kforge.v1.EntryRole")) << message;
  const KforgeEntryParams no_role[] = {{kAttention, 0, 8, "X"}, {77, 0, 8, "Y"}};
  std::tie(code, message) = Load(artifact, no_role, 2);
  EXPECT_EQ(code, kInvalidArgument);
  EXPECT_TRUE(Contains(message, "expected[1].role: 77")) << message;
  const KforgeEntryParams twice[] = {{kAttention, 0, 8, "X"}, {kAttention, 0, 8, "Y"}};
  std::tie(code, message) = Load(artifact, twice, 2);
  EXPECT_EQ(code, kInvalidArgument);
  EXPECT_TRUE(Contains(message, "ENTRY_ROLE_ATTENTION is given twice")) << message;
  const KforgeEntryParams reserved[] = {{kAttention, 1, 8, "X"}};
  std::tie(code, message) = Load(artifact, reserved, 1);
  EXPECT_EQ(code, kInvalidArgument);
  EXPECT_TRUE(Contains(message, "expected[0].reserved: 1")) << message;
  // Neither a size nor a block this library knows.
  const KforgeEntryParams unknown[] = {{kAttention, 0, 0, "NoSuchParams"}};
  std::tie(code, message) = Load(artifact, unknown, 1);
  EXPECT_EQ(code, kInvalidArgument);
  EXPECT_TRUE(Contains(message, "expected[0].params_bytes: 0, with struct_name \"NoSuchParams\""))
      << message;
  const KforgeEntryParams unnamed[] = {{kAttention, 0, 0, nullptr}};
  std::tie(code, message) = Load(artifact, unnamed, 1);
  EXPECT_EQ(code, kInvalidArgument);
  EXPECT_TRUE(Contains(message, "struct_name NULL")) << message;
  std::tie(code, message) = Load(artifact, kSparseMla, 2, -1);
  EXPECT_EQ(code, kInvalidArgument);
  EXPECT_TRUE(Contains(message, "device_ordinal: -1")) << message;
}

TEST(CapiModule, NullHandlesAndOutputsAreRefused) {
  const std::string artifact = SparseMlaArtifact();
  char* error = nullptr;
  EXPECT_EQ(kforge_module_load(reinterpret_cast<const uint8_t*>(artifact.data()), artifact.size(),
                               kSparseMla, 2, 0, nullptr, &error),
            kInvalidArgument);
  ASSERT_NE(error, nullptr);
  EXPECT_STREQ(error, "module: NULL");
  kforge_free(error);
  EXPECT_EQ(kforge_module_load(nullptr, 5, kSparseMla, 2, 0, nullptr, nullptr), kInvalidArgument);

  int32_t index = -1;
  uint64_t bytes = 0;
  int32_t clusters = -1;
  const char block[16] = {};
  EXPECT_EQ(kforge_module_entry(nullptr, "main", &index, &bytes, &error), kInvalidArgument);
  EXPECT_STREQ(error, "module: NULL");
  kforge_free(error);
  EXPECT_EQ(index, -1);
  EXPECT_EQ(kforge_module_load_into_current_context(nullptr, nullptr), kInvalidArgument);
  EXPECT_EQ(kforge_module_set_max_dynamic_smem(nullptr, 0, 100 << 10, nullptr), kInvalidArgument);
  EXPECT_EQ(kforge_module_allow_non_portable_cluster(nullptr, 0, nullptr), kInvalidArgument);
  EXPECT_EQ(kforge_module_max_active_clusters(nullptr, 0, 2, 1, 1, 128, 0, &clusters, nullptr),
            kInvalidArgument);
  EXPECT_EQ(clusters, -1);
  EXPECT_EQ(
      kforge_module_launch(nullptr, 0, block, sizeof(block), 1, 1, 1, 128, 0, nullptr, 0, &error),
      kInvalidArgument);
  EXPECT_STREQ(error, "module: NULL");
  kforge_free(error);
  kforge_module_close(nullptr);  // a no-op, as free(NULL)
}

}  // namespace
