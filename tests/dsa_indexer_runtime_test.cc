// runtime/dsa_indexer.h: what Load refuses before touching a GPU, and on a
// GPU (skipped without one) one logits + top-k step of a glm-5 indexer
// module against a double-precision reference on the same e4m3 inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "compiler/compiler.h"
#include "gtest/gtest.h"
#include "model/arch.h"
#include "model/indexer_spec.h"
#include "model/spec.h"
#include "runtime/cuda_driver.h"
#include "runtime/dsa_indexer.h"
#include "templates/kforge/dsa_indexer/config.h"

namespace kforge {
namespace {

using dsa_indexer::IndexKeyPage;

v1::KernelArtifact FakeIndexerArtifact() {
  v1::KernelArtifact a;
  a.set_module_name("dsa_indexer_h32_d128_topk2048_pb64_sm90a");
  a.set_arch("sm_90a");
  *a.mutable_spec() = KernelSpecOf(*IndexerSpecFromPreset("glm-5", 8));
  a.mutable_indexer()->set_logits_entry("dsa_indexer_logits");
  a.mutable_indexer()->set_topk_entry("dsa_indexer_topk");
  v1::KernelResources* k = a.mutable_cubin_info()->add_kernels();
  k->set_name("dsa_indexer_logits");
  k->set_param_bytes(sizeof(dsa_indexer::LogitsParams));
  k = a.mutable_cubin_info()->add_kernels();
  k->set_name("dsa_indexer_topk");
  k->set_param_bytes(sizeof(dsa_indexer::TopkParams));
  v1::KernelEntry* e = a.add_entries();
  e->set_name("dsa_indexer_logits");
  e->set_role(v1::ENTRY_ROLE_INDEXER_LOGITS);
  e->set_params_bytes(sizeof(dsa_indexer::LogitsParams));
  e = a.add_entries();
  e->set_name("dsa_indexer_topk");
  e->set_role(v1::ENTRY_ROLE_INDEXER_TOPK);
  e->set_params_bytes(sizeof(dsa_indexer::TopkParams));
  return a;
}

TEST(DsaIndexerModule, RefusesWhatIsNotAnIndexerOrOtherParamBlocks) {
  v1::KernelArtifact a = FakeIndexerArtifact();
  *a.mutable_spec() = KernelSpecOf(*SpecFromPreset("glm-5", 8));
  EXPECT_EQ(DsaIndexerModule::Load(a, 0).status().code(), absl::StatusCode::kInvalidArgument);
  a = FakeIndexerArtifact();
  a.mutable_cubin_info()->mutable_kernels(1)->set_param_bytes(80);
  absl::Status s = DsaIndexerModule::Load(a, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "dsa_indexer_topk")) << s;
  a = FakeIndexerArtifact();  // no cubin
  EXPECT_EQ(DsaIndexerModule::Load(a, 0).status().code(), absl::StatusCode::kInvalidArgument);
  // A sparse MLA entry in it: not a module this runtime launches.
  a = FakeIndexerArtifact();
  a.mutable_entries(1)->set_role(v1::ENTRY_ROLE_COMBINE);
  s = DsaIndexerModule::Load(a, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "role ENTRY_ROLE_COMBINE")) << s;
}

// e4m3fn to double (no NaN codes are generated).
double E4m3(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 15, mant = b & 7;
  const double v = exp == 0 ? std::ldexp(mant / 8.0, -6) : std::ldexp(1.0 + mant / 8.0, exp - 7);
  return sign ? -v : v;
}

uint8_t RandomE4m3(std::mt19937& rng) {
  uint8_t b;
  do {
    b = static_cast<uint8_t>(rng());
  } while ((b & 0x7f) == 0x7f || ((b >> 3) & 15) > 9);  // no NaN, |v| < 8
  return b;
}

class DsaIndexerGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<const CudaDriver*> driver = CudaDriver::Get();
    if (!driver.ok()) GTEST_SKIP() << "no GPU to run on: " << driver.status();
    cu_ = *driver;
    int count = 0;
    if (cu_->DeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
      GTEST_SKIP() << "the CUDA driver sees no device";
    }
    ASSERT_EQ(cu_->DeviceGet(&device_, 0), CUDA_SUCCESS);
    ASSERT_EQ(cu_->DevicePrimaryCtxRetain(&ctx_, device_), CUDA_SUCCESS);
    ASSERT_EQ(cu_->CtxSetCurrent(ctx_), CUDA_SUCCESS);
  }
  void TearDown() override {
    for (CUdeviceptr p : allocations_) (void)cu_->MemFree(p);
    if (ctx_ != nullptr) (void)cu_->DevicePrimaryCtxRelease(device_);
  }
  template <typename T>
  uint64_t Upload(const std::vector<T>& host) {
    CUdeviceptr p = 0;
    EXPECT_EQ(cu_->MemAlloc(&p, host.size() * sizeof(T)), CUDA_SUCCESS);
    EXPECT_EQ(cu_->MemcpyHtoD(p, host.data(), host.size() * sizeof(T)), CUDA_SUCCESS);
    allocations_.push_back(p);
    return p;
  }
  template <typename T>
  std::vector<T> Download(uint64_t p, size_t n) {
    std::vector<T> host(n);
    EXPECT_EQ(cu_->MemcpyDtoH(host.data(), p, n * sizeof(T)), CUDA_SUCCESS);
    return host;
  }

  const CudaDriver* cu_ = nullptr;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
  std::vector<CUdeviceptr> allocations_;

 public:
  void RunAndCheck(bool prefill);
};

// Decode (s_q 2 rows per request) or prefill (query_start's ragged rows:
// 1, 2 and 3 rows for the three requests), the same 6 query rows.
void DsaIndexerGpu::RunAndCheck(bool prefill) {
  int major = 0, minor = 0;
  cu_->DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device_);
  cu_->DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device_);
  absl::StatusOr<std::string> arch = ArchForComputeCapability(major, minor);
  ASSERT_TRUE(arch.ok()) << arch.status();
  v1::DsaIndexerSpec spec = *IndexerSpecFromPreset("glm-5", 8);
  spec.set_topk(100);  // contexts both shorter and longer than k
  absl::StatusOr<v1::KernelArtifact> artifact = KernelCompiler().Compile(KernelSpecOf(spec), *arch);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  absl::StatusOr<std::unique_ptr<DsaIndexerModule>> module =
      DsaIndexerModule::Load(*artifact, device_);
  ASSERT_TRUE(module.ok()) << module.status();

  const int heads = 32, k = 100, s_q = 2, batch = 3, max_context = 700;
  const std::vector<int> lens = {1, 60, 650};
  const int pages_per_req = (max_context + 63) / 64, rows = batch * s_q;
  std::mt19937 rng(7);
  std::vector<int> table(batch * pages_per_req);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int>(table.size() - 1 - i);
  std::vector<uint8_t> cache(table.size() * IndexKeyPage::kBytes);
  for (auto& b : cache) b = RandomE4m3(rng);
  std::uniform_real_distribution<float> unit(0.5f, 1.5f);
  for (size_t page = 0; page < table.size(); ++page) {
    for (int t = 0; t < 64; ++t) {
      const float scale = unit(rng);
      std::memcpy(&cache[page * IndexKeyPage::kBytes + IndexKeyPage::kValueBytes + 4 * t], &scale,
                  4);
    }
  }
  std::vector<uint8_t> q(rows * heads * 128);
  for (auto& b : q) b = RandomE4m3(rng);
  std::normal_distribution<float> normal(0.f, 0.1f);
  std::vector<float> w(rows * heads);
  for (auto& x : w) x = normal(rng);
  std::vector<float> poison(rows * max_context, std::nanf(""));
  std::vector<int> poison_i(rows * k, 0x7eadbeef);

  IndexerLogitsArgs la;
  la.q = Upload(q);
  la.weights = Upload(w);
  la.index_cache = Upload(cache);
  la.block_table = Upload(table);
  la.context_lens = Upload(lens);
  la.logits = Upload(poison);
  la.q_row_stride = heads * 128;
  la.weights_row_stride = heads;
  la.page_stride = IndexKeyPage::kBytes;
  la.block_table_stride = la.block_table_cols = pages_per_req;
  la.logits_stride = la.logits_cols = max_context;
  la.batch = batch;
  la.s_q = s_q;
  la.max_context = max_context;
  // Request b's rows and the causal length of each row.
  const std::vector<int> query_start = {0, 1, 3, 6};
  std::vector<std::pair<int, int>> row_len;
  for (int b = 0; b < batch; ++b) {
    const int n = prefill ? query_start[b + 1] - query_start[b] : s_q;
    for (int i = 0; i < n; ++i) row_len.push_back({b, std::clamp(lens[b] - n + i + 1, 0, lens[b])});
  }
  ASSERT_EQ(static_cast<int>(row_len.size()), rows);
  if (prefill) {
    la.query_start = Upload(query_start);
    la.s_q = 0;
    la.rows = rows;
  }
  IndexerTopkArgs ta;
  ta.logits = la.logits;
  ta.context_lens = la.context_lens;
  ta.indices = Upload(poison_i);
  ta.block_table = la.block_table;
  ta.slots = Upload(poison_i);
  ta.logits_stride = max_context;
  ta.indices_stride = ta.slots_stride = k;
  ta.block_table_stride = pages_per_req;
  ta.batch = batch;
  ta.s_q = s_q;
  ta.slot_page_size = 64;
  ta.max_context = max_context;
  ta.query_start = la.query_start;
  ta.s_q = la.s_q;
  ta.rows = la.rows;
  ASSERT_TRUE((*module)->Logits(la, nullptr).ok());
  ASSERT_TRUE((*module)->Topk(ta, nullptr).ok());
  ASSERT_EQ(cu_->CtxSynchronize(), CUDA_SUCCESS);
  const std::vector<float> logits = Download<float>(la.logits, rows * max_context);
  const std::vector<int> idx = Download<int>(ta.indices, rows * k);
  const std::vector<int> slots = Download<int>(ta.slots, rows * k);

  for (int r = 0; r < rows; ++r) {
    {
      const auto [b, len] = row_len[r];
      SCOPED_TRACE(absl::StrCat("row ", r, " len ", len));
      for (int s = 0; s < max_context; ++s) {
        const float got = logits[r * max_context + s];
        if (s >= len) {
          ASSERT_TRUE(std::isinf(got) && got < 0) << s << ": " << got;
          continue;
        }
        const int page = table[b * pages_per_req + s / 64], row = s % 64;
        const uint8_t* key = &cache[page * IndexKeyPage::kBytes + row * 128];
        float scale;
        std::memcpy(&scale,
                    &cache[page * IndexKeyPage::kBytes + IndexKeyPage::kValueBytes + 4 * row], 4);
        double ref = 0, mag = 0;
        for (int h = 0; h < heads; ++h) {
          double dot = 0;
          for (int d = 0; d < 128; ++d) dot += E4m3(q[(r * heads + h) * 128 + d]) * E4m3(key[d]);
          ref += w[r * heads + h] * std::max(dot, 0.0) * scale;
          mag += std::abs(w[r * heads + h] * dot * scale);
        }
        ASSERT_NEAR(got, ref, 1e-2 * std::abs(ref) + 1e-5 * mag) << s;
      }
      // Top-k: the valid prefix in increasing position order, every logit
      // above the k-th in, of those equal to it the smallest positions, -1
      // after, slots.
      const int m = std::min(len, k);
      std::set<int> chosen;
      for (int j = 0; j < k; ++j) {
        const int pos = idx[r * k + j];
        if (j >= m) {
          ASSERT_EQ(pos, -1) << j;
          ASSERT_EQ(slots[r * k + j], -1) << j;
          continue;
        }
        ASSERT_TRUE(pos >= 0 && pos < len) << j << ": " << pos;
        ASSERT_TRUE(chosen.insert(pos).second) << "repeated " << pos;
        ASSERT_EQ(slots[r * k + j], table[b * pages_per_req + pos / 64] * 64 + pos % 64);
        if (j > 0) {
          ASSERT_LT(idx[r * k + j - 1], pos) << j;
        }
      }
      if (m > 0) {
        float kth = logits[r * max_context + *chosen.begin()];
        for (int pos : chosen) kth = std::min(kth, logits[r * max_context + pos]);
        int ties_skipped = 0;  // tied positions not chosen, so far
        for (int s = 0; s < len; ++s) {
          const float v = logits[r * max_context + s];
          if (v > kth) {
            ASSERT_TRUE(chosen.count(s)) << s;
          }
          if (v == kth && !chosen.count(s)) ++ties_skipped;
          if (v == kth && chosen.count(s)) {
            ASSERT_EQ(ties_skipped, 0) << "tie at " << s;
          }
        }
      }
    }
  }
}

TEST_F(DsaIndexerGpu, LogitsAndTopkMatchTheReference) { RunAndCheck(false); }

TEST_F(DsaIndexerGpu, PrefillRowsMatchTheReference) { RunAndCheck(true); }

}  // namespace
}  // namespace kforge
