#ifndef KFORGE_RUNTIME_SPARSE_MLA_DECODE_H_
#define KFORGE_RUNTIME_SPARSE_MLA_DECODE_H_

// What an engine calls once per layer and decode step: sparse MLA attention
// with kforge's kernels, chosen from the model's manifest for this GPU and
// this batch, fetched from a kforge server or a bundle, loaded with the CUDA
// Driver API and launched on the engine's stream.
//
//   auto source = ServiceClient::Create(...);             // or BundleSource
//   auto decode = SparseMlaDecode::Create(*source, model, /*device=*/0);
//   decode->Prefetch();            // engine start: fetch and load every kernel
//   decode->Reserve(max_tokens);   // before CUDA-graph capture
//   decode->Run(args, stream);     // per layer and step
//
// examples/sparse_mla_decode_example.cc is a complete program.

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cuda.h"
#include "kforge/v1/service.pb.h"
#include "kforge/v1/spec.pb.h"
#include "runtime/cuda_driver.h"
#include "runtime/cuda_loader.h"
#include "runtime/kernel_source.h"
#include "runtime/selector.h"
#include "templates/kforge/sparse_mla/config.h"

namespace kforge {

// One decode call. Query tokens are numbered request-major:
// token = request * s_q + i, num_tokens = batch * s_q. Pointers are device
// pointers in the context of the SparseMlaDecode's device; strides are in
// elements of the pointed-to type.
struct DecodeArgs {
  CUdeviceptr q = 0;        // bf16 [num_tokens, num_q_heads, d_qk]; not null
  CUdeviceptr kv = 0;       // bf16 paged cache: the row of slot s starts at
                            // (s / page_block_size) * kv_page_stride +
                            // (s % page_block_size) * kv_row_stride; not null
  CUdeviceptr indices = 0;  // int32 [num_tokens, topk], row stride
                            // indices_stride; -1 or >= num_kv_slots = no
                            // token; not null
  CUdeviceptr out = 0;      // bf16 [num_tokens, num_q_heads, d_v]; not null
  CUdeviceptr lse = 0;      // fp32 [num_tokens, num_q_heads], contiguous
                            // (no strides), natural log; 0 = not wanted

  int batch = 0;             // requests
  int s_q = 0;               // query tokens per request (1, or 2..4 with MTP)
  int num_q_heads = 0;       // heads on this GPU
  int d_qk = 0;              // kv_lora_rank + rope_dim (576)
  int d_v = 0;               // kv_lora_rank (512): V is the first d_v columns
  int topk = 0;              // indices per query token
  int page_block_size = 0;   // KV cache tokens per page
  int64_t num_kv_slots = 0;  // num_pages * page_block_size
  v1::KvCacheDtype kv_dtype = v1::KV_CACHE_DTYPE_BF16;

  int64_t q_token_stride = 0;
  int64_t q_head_stride = 0;
  int64_t kv_page_stride = 0;
  int64_t kv_row_stride = 0;
  int64_t indices_stride = 0;  // between query tokens
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;

  // Must equal the model's (it is compiled into the kernel): relative
  // difference <= kSoftmaxScaleTolerance.
  double softmax_scale = 0;
};

// Alignments the kernels rely on. q and kv rows are gathered with 16-byte
// cp.async (templates/kforge/sparse_mla/decode.cuh), so their pointers and
// strides must keep every row on a 16-byte boundary; out is written as
// pairs of bf16 (4-byte stores) by both kernels; indices and lse are
// read/written as 4-byte scalars.
inline constexpr int kQKvAlignBytes = 16;
inline constexpr int kOutAlignBytes = 4;
inline constexpr double kSoftmaxScaleTolerance = 1e-6;

// Checks `args` against the model the manifest was built for (every variant
// shares heads, d_qk, d_v, topk, page size, dtype, scale, return_lse; they
// differ in s_q) before anything is launched. InvalidArgument naming the
// field, the value and what the kernels support: null pointers, non-positive
// sizes, sizes and scale that differ from the model, strides smaller than
// the row they step over (rows are head-inner: token stride >= heads * head
// stride), misaligned pointers and strides (see kQKvAlignBytes), an s_q no
// variant supports, lse given when the kernels were built without
// return_lse. FailedPrecondition for a manifest with no variants.
absl::StatusOr<RuntimeShape> ValidateDecodeArgs(const DecodeArgs& args,
                                                const v1::Manifest& manifest);

// Keys of the top-k range per split: ceil(topk / num_splits) rounded up to
// the token tile, as the main kernel's grid.y blocks expect.
int TokensPerSplit(int topk, int token_tile, int num_splits);

// Workspace layout (selection.workspace_bytes at `workspace`, only when
// selection.needs_combine): fp32 o_accum [num_splits, num_tokens, heads,
// d_v], then fp32 lse_accum [num_splits, num_tokens, heads].
sparse_mla::DecodeParams MakeDecodeParams(const Selection& selection, const DecodeArgs& args,
                                          CUdeviceptr workspace);
sparse_mla::CombineParams MakeCombineParams(const Selection& selection, const DecodeArgs& args,
                                            CUdeviceptr workspace);
LaunchDims MainLaunchDims(const Selection& selection);
LaunchDims CombineLaunchDims(const Selection& selection);

// Sparse MLA decode for one model on one GPU.
//
// Threading: every method is thread-safe on the host (a mutex serializes
// kernel loading, workspace growth and launches). The split-K workspace is
// one buffer used in stream order, so Runs on different streams that
// overlap on the GPU would share it: use one SparseMlaDecode per stream
// (an engine normally decodes on one stream per device).
//
// CUDA graphs: Run allocates only when the call needs more workspace than
// it holds; during stream capture it refuses to (FailedPrecondition) rather
// than break the capture. Call Prefetch() and Reserve(max_tokens) before
// capturing: then every Run of up to max_tokens query tokens loads and
// allocates nothing, and the captured launches keep pointing at the same
// workspace. A later Run with more tokens (outside capture) grows the
// workspace and frees the old one, which invalidates graphs captured
// before: reserve for the largest batch any graph will use.
class SparseMlaDecode {
 public:
  // Loads the driver (FailedPrecondition, with no call to `source`, when
  // there is none), reads device `device_ordinal`'s compute capability
  // (-> arch, see ArchForComputeCapability) and SM count, retains its
  // primary context (the one the CUDA runtime and PyTorch use; streams
  // passed to Run must belong to it) and fetches the manifest once.
  // `source` must outlive the object.
  static absl::StatusOr<std::unique_ptr<SparseMlaDecode>> Create(KernelSource& source,
                                                                 const v1::KernelSelector& model,
                                                                 int device_ordinal = 0);
  ~SparseMlaDecode();  // synchronizes the context, frees, unloads, releases
  SparseMlaDecode(const SparseMlaDecode&) = delete;
  SparseMlaDecode& operator=(const SparseMlaDecode&) = delete;

  // Fetches and loads every variant's kernel (engine start), so no Run
  // waits on the network or a compile.
  absl::Status Prefetch();

  // Sizes the workspace for every call of up to max_tokens (batch * s_q)
  // query tokens, with any variant.
  absl::Status Reserve(int max_tokens);

  // Validates, selects, loads the kernel on first use and enqueues the main
  // kernel and, when the top-k range is split, the combine kernel on
  // `stream`. Returns once enqueued; errors from the kernels themselves
  // surface at the next synchronization.
  absl::Status Run(const DecodeArgs& args, CUstream stream);

  // The variant and launch Run would use for `args` (validated).
  absl::StatusOr<Selection> Plan(const DecodeArgs& args) const;

  const std::string& arch() const { return arch_; }
  int sm_count() const { return sm_count_; }
  CUdevice device() const { return device_; }
  CUcontext context() const { return context_; }
  const v1::Manifest& manifest() const { return manifest_; }
  uint64_t workspace_bytes() const;

 private:
  SparseMlaDecode(const CudaDriver& cu, KernelSource& source) : cu_(cu), source_(source) {}
  absl::StatusOr<const CudaKernelModule*> KernelFor(const v1::ManifestVariant& variant)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status GrowWorkspace(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CudaDriver& cu_;
  KernelSource& source_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;  // retained primary context
  std::string arch_;
  int sm_count_ = 0;
  v1::Manifest manifest_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<CudaKernelModule>> modules_
      ABSL_GUARDED_BY(mu_);  // by cache key
  CUdeviceptr workspace_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t workspace_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kforge

#endif  // KFORGE_RUNTIME_SPARSE_MLA_DECODE_H_
