#ifndef KFORGE_TESTS_REFERENCE_SPARSE_MLA_REFERENCE_H_
#define KFORGE_TESTS_REFERENCE_SPARSE_MLA_REFERENCE_H_

// Host-side tools for checking sparse MLA decode results: a seeded random
// problem in the kernels' layouts and an fp64 reference of what the kernels
// compute, and the copies to and from a GPU around one call. Used by the
// example and the tests; an engine can use them to check its integration
// once. Everything but DeviceDecodeProblem runs with no GPU or driver.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda.h"
#include "kforge/v1/spec.pb.h"
#include "runtime/cuda_driver.h"
#include "runtime/sparse_mla_decode.h"

namespace kforge {

uint16_t FloatToBf16(float x);  // round to nearest even; NaN stays NaN
float Bf16ToFloat(uint16_t x);

// A decode call's inputs on the host, laid out as `args` describes.
struct HostDecodeProblem {
  DecodeArgs args;  // sizes, strides, scale; pointers 0 (set on upload)
  int num_pages = 0;
  std::vector<uint16_t> q;       // bf16, num_tokens * q_token_stride
  std::vector<uint16_t> kv;      // bf16, num_pages * kv_page_stride
  std::vector<int32_t> indices;  // num_tokens * indices_stride
  // Optional (empty: absent; args.topk_length / sink are set on upload):
  // one length per args.topk_length_tokens query tokens, and one sink
  // logit per head.
  std::vector<int32_t> topk_length;
  std::vector<float> sink;
  // The extra cache (spec extra_kv, bf16 like kv; empty: none), laid out as
  // args' extra_* fields say, its indices and (with topk_length) its
  // lengths, one per args.topk_length_tokens query tokens.
  int extra_num_pages = 0;
  std::vector<uint16_t> extra_kv;
  std::vector<int32_t> extra_indices;
  std::vector<int32_t> extra_topk_length;
  size_t out_elements() const;  // bf16 elements `out` spans
  size_t lse_elements() const;  // num_tokens * num_q_heads
};

struct RandomProblemOptions {
  int batch = 1;
  int s_q = 1;        // query tokens per request
  int num_pages = 0;  // 0: enough pages for topk distinct slots per token
  // Extra elements after each q / kv / out row and each indices row (tests
  // strides that are not the dense ones); must keep rows 16-byte aligned.
  int row_padding = 0;
  uint64_t seed = 1;
  // topk_length: 0 none, 1 one per query token, 2 one per request (shared
  // by its s_q tokens). Lengths are uniform in 0..topk, with a 0, a full
  // topk, one past it and a negative one among them (the kernels clamp).
  int topk_length = 0;
  // A sink logit per head: normal around the typical lse, and one head each
  // at +1e4 (out ~0), -1e4 and -inf (no effect).
  bool sink = false;
};

// q and kv uniform in [-1, 1] (as bf16), indices uniform over the cache's
// slots with about 1 in 16 set to -1, 1 in 32 past the end (also "no token")
// and 1 in 16 repeating an earlier index of the same row. Sizes, page size
// and scale come from `spec` (a variant of the model's manifest). A spec
// with extra_kv gets an extra cache, indices (and lengths) drawn the same
// way with its own top-k and page size. bf16 caches only (both).
HostDecodeProblem MakeRandomDecodeProblem(const v1::AttentionSpec& spec,
                                          const RandomProblemOptions& options);

// out [num_tokens, num_q_heads, d_v] and lse [num_tokens, num_q_heads],
// dense. A (token, head) with no valid index has out 0 and lse -inf, as the
// kernels write.
struct DecodeReference {
  std::vector<double> out;
  std::vector<double> lse;
};

// softmax(scale * q.k) over the valid indices of each query token (a
// repeated index counts each time it appears, as in the kernels; with
// topk_length only the first clamp(length, 0, topk) positions), and those
// of its extra indices in the same softmax (cut at extra_topk_length), out =
// p . v with v the first d_v columns of each KV row, lse in natural log.
// A sink scales out by 1 / (1 + exp(sink - lse)) and leaves lse alone.
DecodeReference ReferenceDecode(const HostDecodeProblem& problem);

struct DecodeErrors {
  double out_max_abs = 0;  // max |out - ref|
  double out_ref_max = 0;  // max |ref|
  double out_rel = 0;      // out_max_abs / out_ref_max
  double lse_max_abs = 0;  // max |lse - ref| (0 when lse was not checked)
  bool pass = false;
  std::string Summary() const;
};

// Error bars: bf16 output against an fp64 reference.
inline constexpr double kOutRelTolerance = 1e-2;
inline constexpr double kLseAbsTolerance = 1e-3;

// `out` is the device's bf16 output copied back with the problem's out
// strides; `lse` its fp32 lse, or empty when none was asked for. Non-finite
// values (a poisoned output the kernel never wrote) fail.
DecodeErrors CompareWithReference(const HostDecodeProblem& problem,
                                  const DecodeReference& reference,
                                  const std::vector<uint16_t>& out, const std::vector<float>& lse);

// The problem's tensors on the GPU, freed on destruction. q, kv and
// indices are copied up; out and lse are filled with 0xFF bytes (NaN in
// bf16 and fp32), so an output row the kernels never write fails
// CompareWithReference. Every call needs the device's context current on
// the calling thread (SparseMlaDecode::context()).
class DeviceDecodeProblem {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceDecodeProblem>> Upload(
      const CudaDriver& cu, const HostDecodeProblem& problem, bool with_lse);
  ~DeviceDecodeProblem();
  DeviceDecodeProblem(const DeviceDecodeProblem&) = delete;
  DeviceDecodeProblem& operator=(const DeviceDecodeProblem&) = delete;

  // The host problem's args with the device pointers filled in.
  const DecodeArgs& args() const { return args_; }
  // Copies out (bf16, with the out strides) and lse (empty without lse)
  // back; synchronous.
  absl::Status Download(std::vector<uint16_t>* out, std::vector<float>* lse) const;

 private:
  explicit DeviceDecodeProblem(const CudaDriver& cu) : cu_(cu) {}
  absl::StatusOr<CUdeviceptr> Copy(const void* host, size_t bytes);
  absl::StatusOr<CUdeviceptr> Poisoned(size_t bytes);

  const CudaDriver& cu_;
  DecodeArgs args_;
  size_t out_bytes_ = 0, lse_bytes_ = 0;
  std::vector<CUdeviceptr> allocations_;
};

}  // namespace kforge

#endif  // KFORGE_TESTS_REFERENCE_SPARSE_MLA_REFERENCE_H_
