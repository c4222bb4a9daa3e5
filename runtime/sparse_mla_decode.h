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
//   decode->Refresh();             // between steps, while HoldsFirstAnswer()
//                                  // (a source asked for first answers)
//
// examples/sparse_mla_decode_example.cc is a complete program.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bundle/kernel_source.h"
#include "cuda.h"
#include "kforge/v1/service.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/decode_plan.h"
#include "model/selector.h"
#include "runtime/cuda_driver.h"
#include "runtime/cuda_loader.h"
#include "templates/kforge/sparse_mla/common/params.h"

namespace kforge {

// Launch dimensions of a selection's two kernels.
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

  // Whether a loaded kernel is a first answer (KernelArtifact.partial: the
  // module's main and combine entries, from a source asked for first
  // answers on a server's miss), planned as the module it is until
  // Refresh replaces it.
  bool HoldsFirstAnswer() const;

  // Asks the source again for each kernel loaded as a first answer; where
  // it answers with the whole module, loads that in its place and plans
  // later Runs with the manifest's variant (the small-batch and cluster
  // entries the first answer lacked). Call it outside stream capture
  // (loading a module there breaks the capture), e.g. between decode
  // steps until HoldsFirstAnswer() is false. Graphs captured before stay
  // valid: the replaced modules stay loaded, and where the whole module
  // needs more workspace for Reserve's max_tokens a new buffer is
  // allocated beside the old one, which is kept. Returns how many were
  // replaced.
  absl::StatusOr<int> Refresh();

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
  // The manifest the source answered. Run plans with it, except where a
  // loaded kernel is a first answer (KernelArtifact.partial): that variant
  // is planned as the module it is (VariantOfArtifact: its main and combine
  // entries) until Refresh replaces it with the whole module.
  const v1::Manifest& manifest() const { return manifest_; }
  uint64_t workspace_bytes() const;

 private:
  SparseMlaDecode(const CudaDriver& cu, KernelSource& source) : cu_(cu), source_(source) {}
  // The source's kernel of `variant`, its key checked.
  absl::StatusOr<ArtifactRef> Fetch(const v1::ManifestVariant& variant) const;
  // Loads the kernel of `variant` once; a first answer replaces its
  // variant in plan_manifest_ (the caller plans again: `variant` may
  // point there).
  absl::StatusOr<const CudaKernelModule*> KernelFor(const v1::ManifestVariant& variant)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // max_active_clusters_ from `module`, while it is unknown (0).
  absl::Status LearnClusters(const CudaKernelModule& module) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Selection> PlanLocked(const DecodeArgs& args) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // keep_old: the old buffer is kept (retired_workspaces_), not freed.
  absl::Status GrowWorkspace(uint64_t bytes, bool keep_old = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CudaDriver& cu_;
  KernelSource& source_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;  // retained primary context
  std::string arch_;
  int sm_count_ = 0;
  v1::Manifest manifest_;
  // DeviceInfo::max_active_clusters: learnt from the first loaded module
  // with a cluster entry (CudaKernelModule::MaxActiveClusters); 0 before.
  std::atomic<int> max_active_clusters_{0};

  mutable absl::Mutex mu_;
  // What Run plans with: manifest_, or a copy of it with each loaded first
  // answer's own variant in its place. Every copy is kept (one a first
  // answer loaded or replaced at most), so that a Selection Plan returned
  // stays valid.
  const v1::Manifest* plan_manifest_ ABSL_GUARDED_BY(mu_) = &manifest_;
  std::vector<std::unique_ptr<v1::Manifest>> planned_manifests_ ABSL_GUARDED_BY(mu_);
  // Plans with `variant` in place of the variant of its key (a copy of
  // plan_manifest_, kept).
  void ReplanVariant(const v1::ManifestVariant& variant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<std::string, std::unique_ptr<CudaKernelModule>> modules_
      ABSL_GUARDED_BY(mu_);                                      // by cache key
  std::vector<std::string> first_answers_ ABSL_GUARDED_BY(mu_);  // keys loaded as one
  // First answers Refresh replaced, and workspaces it outgrew: graphs
  // captured before may still launch them, so both live as long as this.
  std::vector<std::unique_ptr<CudaKernelModule>> retired_modules_ ABSL_GUARDED_BY(mu_);
  std::vector<CUdeviceptr> retired_workspaces_ ABSL_GUARDED_BY(mu_);
  int reserved_tokens_ ABSL_GUARDED_BY(mu_) = 0;  // Reserve's largest max_tokens
  CUdeviceptr workspace_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t workspace_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kforge

#endif  // KFORGE_RUNTIME_SPARSE_MLA_DECODE_H_
