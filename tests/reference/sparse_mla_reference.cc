#include "tests/reference/sparse_mla_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kforge {
namespace {

// Written into every padding element: a kernel that reads padding (a wrong
// stride) gets values far outside the data's [-1, 1] and fails the check.
constexpr float kPaddingValue = 100.0f;

int64_t NumTokens(const DecodeArgs& a) { return static_cast<int64_t>(a.batch) * a.s_q; }

void FillRow(std::mt19937_64& rng, uint16_t* row, int n) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int i = 0; i < n; ++i) row[i] = FloatToBf16(uniform(rng));
}

// A paged bf16 cache as the args describe one (main or extra).
struct CacheLayout {
  int page_block;
  int64_t page_stride, row_stride, num_slots;
  int64_t Offset(int64_t slot) const {
    return slot / page_block * page_stride + slot % page_block * row_stride;
  }
};

// `pages` pages of padding with every slot's first n values random.
std::vector<uint16_t> RandomCache(std::mt19937_64& rng, const CacheLayout& c, int64_t pages, int n,
                                  uint16_t padding) {
  std::vector<uint16_t> cache(static_cast<size_t>(pages * c.page_stride), padding);
  for (int64_t s = 0; s < c.num_slots; ++s) FillRow(rng, &cache[c.Offset(s)], n);
  return cache;
}

// Appends the rows of the first `length` entries of `indices` that name a
// slot of the cache (-1 and past-the-end entries are no token).
void AddRows(const std::vector<uint16_t>& cache, const CacheLayout& c, const int32_t* indices,
             int length, std::vector<const uint16_t*>* rows) {
  for (int i = 0; i < length; ++i) {
    const int64_t slot = indices[i];
    if (slot >= 0 && slot < c.num_slots) rows->push_back(&cache[c.Offset(slot)]);
  }
}

// Query token t's list length: `lengths` (one per `per` tokens) clamped to
// 0..topk, or topk without lengths.
int ListLength(const std::vector<int32_t>& lengths, int64_t t, int per, int topk) {
  return lengths.empty() ? topk : std::clamp(lengths[t / std::max(1, per)], 0, topk);
}

CacheLayout MainCache(const DecodeArgs& a) {
  return {a.page_block_size, a.kv_page_stride, a.kv_row_stride, a.num_kv_slots};
}

CacheLayout ExtraCache(const DecodeArgs& a) {
  return {a.extra_page_block_size, a.extra_kv_page_stride, a.extra_kv_row_stride,
          a.extra_num_kv_slots};
}

// One query token's indices: uniform slots, some -1, some past the end,
// some repeats of an earlier entry of the row.
void FillIndices(std::mt19937_64& rng, int64_t num_slots, int32_t* row, int topk) {
  std::uniform_int_distribution<int64_t> slot(0, num_slots - 1);
  for (int i = 0; i < topk; ++i) {
    const uint64_t r = rng() % 32;
    if (r < 2) {
      row[i] = -1;
    } else if (r == 2) {
      row[i] = static_cast<int32_t>(num_slots + static_cast<int64_t>(rng() % 1000));
    } else if (r < 5 && i > 0) {
      row[i] = row[rng() % static_cast<uint64_t>(i)];
    } else {
      row[i] = static_cast<int32_t>(slot(rng));
    }
  }
}

}  // namespace

uint16_t FloatToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float Bf16ToFloat(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

size_t HostDecodeProblem::out_elements() const {
  return static_cast<size_t>(NumTokens(args) * args.out_token_stride);
}

size_t HostDecodeProblem::lse_elements() const {
  return static_cast<size_t>(NumTokens(args) * args.num_q_heads);
}

HostDecodeProblem MakeRandomDecodeProblem(const v1::AttentionSpec& spec,
                                          const RandomProblemOptions& o) {
  HostDecodeProblem p;
  DecodeArgs& a = p.args;
  a.batch = o.batch;
  a.s_q = o.s_q;
  a.num_q_heads = static_cast<int>(spec.num_q_heads());
  a.d_v = static_cast<int>(spec.kv_lora_rank());
  a.d_qk = a.d_v + static_cast<int>(spec.rope_dim());
  a.topk = static_cast<int>(spec.topk());
  a.page_block_size = static_cast<int>(spec.page_block_size());
  a.kv_dtype = spec.kv_cache_dtype();
  a.softmax_scale = spec.softmax_scale();
  const int pad = o.row_padding;
  a.q_head_stride = a.d_qk + pad;
  a.q_token_stride = a.num_q_heads * a.q_head_stride + pad;
  a.kv_row_stride = a.d_qk + pad;
  a.kv_page_stride = a.page_block_size * a.kv_row_stride + pad;
  a.indices_stride = a.topk + pad;
  a.out_head_stride = a.d_v + pad;
  a.out_token_stride = a.num_q_heads * a.out_head_stride + pad;
  // Twice topk slots: most indices are distinct, some pages stay unused.
  p.num_pages =
      o.num_pages > 0 ? o.num_pages : (2 * a.topk + a.page_block_size - 1) / a.page_block_size;
  a.num_kv_slots = static_cast<int64_t>(p.num_pages) * a.page_block_size;

  std::mt19937_64 rng(o.seed);
  const int64_t tokens = NumTokens(a);
  const uint16_t padding = FloatToBf16(kPaddingValue);
  p.q.assign(static_cast<size_t>(tokens * a.q_token_stride), padding);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int h = 0; h < a.num_q_heads; ++h) {
      FillRow(rng, &p.q[t * a.q_token_stride + h * a.q_head_stride], a.d_qk);
    }
  }
  p.kv = RandomCache(rng, MainCache(a), p.num_pages, a.d_qk, padding);
  // Padding indices name valid slots, so reading them changes the result.
  p.indices.assign(static_cast<size_t>(tokens * a.indices_stride), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    FillIndices(rng, a.num_kv_slots, &p.indices[t * a.indices_stride], a.topk);
  }
  if (o.topk_length != 0) {
    a.topk_length_tokens = o.topk_length == 2 ? a.s_q : 1;
    const int64_t n = tokens / a.topk_length_tokens;
    std::uniform_int_distribution<int32_t> len(0, a.topk);
    p.topk_length.resize(static_cast<size_t>(n));
    for (int32_t& l : p.topk_length) l = len(rng);
    const int32_t edges[] = {0, a.topk, a.topk + 1, -3};
    for (int64_t i = 0; i < n && i < 4; ++i) p.topk_length[i] = edges[i];
  }
  if (spec.has_extra_kv()) {
    const v1::ExtraKvCache& x = spec.extra_kv();
    a.extra_topk = static_cast<int>(x.topk());
    a.extra_page_block_size = static_cast<int>(x.page_block_size());
    a.extra_kv_dtype = x.kv_cache_dtype();
    a.extra_kv_row_stride = a.d_qk + pad;
    a.extra_kv_page_stride = a.extra_page_block_size * a.extra_kv_row_stride + pad;
    a.extra_indices_stride = a.extra_topk + pad;
    p.extra_num_pages = (2 * a.extra_topk + a.extra_page_block_size - 1) / a.extra_page_block_size;
    a.extra_num_kv_slots = static_cast<int64_t>(p.extra_num_pages) * a.extra_page_block_size;
    p.extra_kv = RandomCache(rng, ExtraCache(a), p.extra_num_pages, a.d_qk, padding);
    p.extra_indices.assign(static_cast<size_t>(tokens * a.extra_indices_stride), 0);
    for (int64_t t = 0; t < tokens; ++t) {
      FillIndices(rng, a.extra_num_kv_slots, &p.extra_indices[t * a.extra_indices_stride],
                  a.extra_topk);
    }
    if (o.topk_length != 0) {
      std::uniform_int_distribution<int32_t> len(0, a.extra_topk);
      p.extra_topk_length.resize(p.topk_length.size());
      for (int32_t& l : p.extra_topk_length) l = len(rng);
      // The main list's edges meet other extra lengths: full, 0, -1, past.
      const int32_t edges[] = {a.extra_topk, 0, -1, a.extra_topk + 5};
      for (size_t i = 0; i < p.extra_topk_length.size() && i < 4; ++i) {
        p.extra_topk_length[i] = edges[i];
      }
    }
  }
  if (o.sink) {
    std::normal_distribution<float> logit(4.f, 3.f);
    p.sink.resize(static_cast<size_t>(a.num_q_heads));
    for (float& s : p.sink) s = logit(rng);
    const float edges[] = {1e4f, -1e4f, -std::numeric_limits<float>::infinity()};
    for (int h = 0; h < a.num_q_heads && h < 3; ++h) p.sink[h] = edges[h];
  }
  return p;
}

DecodeReference ReferenceDecode(const HostDecodeProblem& p) {
  const DecodeArgs& a = p.args;
  const int64_t tokens = NumTokens(a);
  DecodeReference ref;
  ref.out.assign(static_cast<size_t>(tokens * a.num_q_heads * a.d_v), 0.0);
  ref.lse.assign(static_cast<size_t>(tokens * a.num_q_heads),
                 -std::numeric_limits<double>::infinity());
  std::vector<const uint16_t*> rows;
  std::vector<double> scores;
  for (int64_t t = 0; t < tokens; ++t) {
    rows.clear();
    AddRows(p.kv, MainCache(a), &p.indices[t * a.indices_stride],
            ListLength(p.topk_length, t, a.topk_length_tokens, a.topk), &rows);
    if (!p.extra_kv.empty()) {
      AddRows(p.extra_kv, ExtraCache(a), &p.extra_indices[t * a.extra_indices_stride],
              ListLength(p.extra_topk_length, t, a.topk_length_tokens, a.extra_topk), &rows);
    }
    if (rows.empty()) continue;
    for (int h = 0; h < a.num_q_heads; ++h) {
      const uint16_t* q = &p.q[t * a.q_token_stride + h * a.q_head_stride];
      scores.assign(rows.size(), 0.0);
      double max_score = -std::numeric_limits<double>::infinity();
      for (size_t r = 0; r < rows.size(); ++r) {
        double dot = 0;
        for (int d = 0; d < a.d_qk; ++d) {
          dot += static_cast<double>(Bf16ToFloat(q[d])) * Bf16ToFloat(rows[r][d]);
        }
        scores[r] = dot * a.softmax_scale;
        max_score = std::max(max_score, scores[r]);
      }
      double sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - max_score));
      const double lse = max_score + std::log(sum);
      // The sink joins the denominator: 1 / (1 + exp(sink - lse)).
      const double sink = p.sink.empty() ? 1.0 : 1.0 / (1.0 + std::exp(p.sink[h] - lse));
      double* out = &ref.out[(t * a.num_q_heads + h) * a.d_v];
      for (size_t r = 0; r < rows.size(); ++r) {
        const double w = scores[r] / sum * sink;
        for (int d = 0; d < a.d_v; ++d) out[d] += w * Bf16ToFloat(rows[r][d]);
      }
      ref.lse[t * a.num_q_heads + h] = lse;
    }
  }
  return ref;
}

std::string DecodeErrors::Summary() const {
  return absl::StrFormat(
      "out: max abs err %.3g, max |ref| %.3g, rel %.3g (bar %.0e); lse: max abs err "
      "%.3g (bar %.0e): %s",
      out_max_abs, out_ref_max, out_rel, kOutRelTolerance, lse_max_abs, kLseAbsTolerance,
      pass ? "PASS" : "FAIL");
}

DecodeErrors CompareWithReference(const HostDecodeProblem& p, const DecodeReference& ref,
                                  const std::vector<uint16_t>& out, const std::vector<float>& lse) {
  const DecodeArgs& a = p.args;
  const double inf = std::numeric_limits<double>::infinity();
  DecodeErrors e;
  const int64_t rows = NumTokens(a) * a.num_q_heads;
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t t = row / a.num_q_heads, h = row % a.num_q_heads;
    const uint16_t* got = &out[t * a.out_token_stride + h * a.out_head_stride];
    const double* want = &ref.out[row * a.d_v];
    for (int d = 0; d < a.d_v; ++d) {
      const double g = Bf16ToFloat(got[d]);
      e.out_max_abs = std::max(e.out_max_abs, std::isfinite(g) ? std::abs(g - want[d]) : inf);
      e.out_ref_max = std::max(e.out_ref_max, std::abs(want[d]));
    }
    if (lse.empty()) continue;
    const double g = lse[row], w = ref.lse[row];
    // Both -inf (no valid index) agree; one infinite and not the other does not.
    const double diff = g == w ? 0.0 : std::abs(g - w);
    e.lse_max_abs = std::max(e.lse_max_abs, std::isnan(diff) ? inf : diff);
  }
  e.out_rel = e.out_max_abs / std::max(e.out_ref_max, 1e-30);
  e.pass = e.out_rel <= kOutRelTolerance && e.lse_max_abs <= kLseAbsTolerance;
  return e;
}

absl::StatusOr<CUdeviceptr> DeviceDecodeProblem::Copy(const void* host, size_t bytes) {
  CUdeviceptr ptr = 0;
  if (absl::Status s =
          cu_.Check(cu_.MemAlloc(&ptr, bytes), absl::StrCat("cuMemAlloc(", bytes, " bytes)"));
      !s.ok()) {
    return s;
  }
  allocations_.push_back(ptr);
  if (host == nullptr) return ptr;
  if (absl::Status s = cu_.Check(cu_.MemcpyHtoD(ptr, host, bytes),
                                 absl::StrCat("cuMemcpyHtoD(", bytes, " bytes)"));
      !s.ok()) {
    return s;
  }
  return ptr;
}

absl::StatusOr<CUdeviceptr> DeviceDecodeProblem::Poisoned(size_t bytes) {
  absl::StatusOr<CUdeviceptr> ptr = Copy(nullptr, bytes);
  if (!ptr.ok()) return ptr;
  if (absl::Status s = cu_.Check(cu_.MemsetD8(*ptr, 0xFF, bytes), "cuMemsetD8(0xFF)"); !s.ok()) {
    return s;
  }
  return ptr;
}

absl::StatusOr<std::unique_ptr<DeviceDecodeProblem>> DeviceDecodeProblem::Upload(
    const CudaDriver& cu, const HostDecodeProblem& p, bool with_lse) {
  std::unique_ptr<DeviceDecodeProblem> d(new DeviceDecodeProblem(cu));
  d->args_ = p.args;
  d->out_bytes_ = p.out_elements() * sizeof(uint16_t);
  d->lse_bytes_ = with_lse ? p.lse_elements() * sizeof(float) : 0;
  struct Tensor {
    uint64_t* ptr;     // a DecodeArgs pointer field
    const void* host;  // null: poisoned output
    size_t bytes;
  };
  std::vector<Tensor> tensors = {
      {&d->args_.q, p.q.data(), p.q.size() * sizeof(uint16_t)},
      {&d->args_.kv, p.kv.data(), p.kv.size() * sizeof(uint16_t)},
      {&d->args_.indices, p.indices.data(), p.indices.size() * sizeof(int32_t)},
      {&d->args_.out, nullptr, d->out_bytes_},
  };
  if (with_lse) tensors.push_back({&d->args_.lse, nullptr, d->lse_bytes_});
  if (!p.topk_length.empty()) {
    tensors.push_back(
        {&d->args_.topk_length, p.topk_length.data(), p.topk_length.size() * sizeof(int32_t)});
  }
  if (!p.sink.empty()) {
    tensors.push_back({&d->args_.sink, p.sink.data(), p.sink.size() * sizeof(float)});
  }
  if (!p.extra_kv.empty()) {
    tensors.push_back(
        {&d->args_.extra_kv, p.extra_kv.data(), p.extra_kv.size() * sizeof(uint16_t)});
    tensors.push_back({&d->args_.extra_indices, p.extra_indices.data(),
                       p.extra_indices.size() * sizeof(int32_t)});
  }
  if (!p.extra_topk_length.empty()) {
    tensors.push_back({&d->args_.extra_topk_length, p.extra_topk_length.data(),
                       p.extra_topk_length.size() * sizeof(int32_t)});
  }
  for (const Tensor& t : tensors) {
    absl::StatusOr<CUdeviceptr> ptr =
        t.host != nullptr ? d->Copy(t.host, t.bytes) : d->Poisoned(t.bytes);
    if (!ptr.ok()) return ptr.status();
    *t.ptr = *ptr;
  }
  return d;
}

DeviceDecodeProblem::~DeviceDecodeProblem() {
  for (CUdeviceptr ptr : allocations_) (void)cu_.MemFree(ptr);
}

absl::Status DeviceDecodeProblem::Download(std::vector<uint16_t>* out,
                                           std::vector<float>* lse) const {
  out->resize(out_bytes_ / sizeof(uint16_t));
  if (absl::Status s =
          cu_.Check(cu_.MemcpyDtoH(out->data(), args_.out, out_bytes_), "cuMemcpyDtoH(out)");
      !s.ok()) {
    return s;
  }
  lse->resize(lse_bytes_ / sizeof(float));
  if (lse_bytes_ == 0) return absl::OkStatus();
  return cu_.Check(cu_.MemcpyDtoH(lse->data(), args_.lse, lse_bytes_), "cuMemcpyDtoH(lse)");
}

}  // namespace kforge
