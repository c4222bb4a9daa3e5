#include "runtime/sparse_mla_decode.h"

#include <algorithm>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"
#include "model/artifact_check.h"
#include "model/spec.h"

namespace kforge {
namespace {

absl::Status Invalid(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(AsAbsl(field), ": ", AsAbsl(why)));
}

absl::Status WithContext(const absl::Status& s, std::string_view context) {
  return absl::Status(s.code(), absl::StrCat(AsAbsl(context), ": ", s.message()));
}

}  // namespace

LaunchDims MainLaunchDims(const Selection& sel) {
  return {sel.grid_x,      sel.grid_y, sel.grid_z, sel.block_threads, sel.dynamic_smem_bytes,
          sel.programmatic};
}

LaunchDims CombineLaunchDims(const Selection& sel) {
  return {sel.combine_grid_x, sel.combine_grid_y, 1, sel.combine_block_threads, 0,
          sel.programmatic};
}

absl::StatusOr<std::unique_ptr<SparseMlaDecode>> SparseMlaDecode::Create(
    KernelSource& source, const v1::KernelSelector& model, int device_ordinal) {
  absl::StatusOr<const CudaDriver*> driver = CudaDriver::Get();
  if (!driver.ok()) return driver.status();
  const CudaDriver& cu = **driver;

  int count = 0;
  if (absl::Status s = cu.Check(cu.DeviceGetCount(&count), "cuDeviceGetCount"); !s.ok()) {
    return s;
  }
  if (device_ordinal < 0 || device_ordinal >= count) {
    return Invalid("device_ordinal", absl::StrCat("got ", device_ordinal, ", this machine has ",
                                                  count, " CUDA device(s)"));
  }
  std::unique_ptr<SparseMlaDecode> self(new SparseMlaDecode(cu, source));
  if (absl::Status s = cu.Check(cu.DeviceGet(&self->device_, device_ordinal),
                                absl::StrCat("cuDeviceGet(", device_ordinal, ")"));
      !s.ok()) {
    return s;
  }
  int major = 0, minor = 0;
  for (auto [value, attribute, name] :
       {std::tuple{&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "cc major"},
        std::tuple{&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "cc minor"},
        std::tuple{&self->sm_count_, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "SM count"}}) {
    if (absl::Status s = cu.Check(cu.DeviceGetAttribute(value, attribute, self->device_),
                                  absl::StrCat("cuDeviceGetAttribute(", name, ")"));
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<std::string> arch = ArchForComputeCapability(major, minor);
  if (!arch.ok()) return arch.status();
  self->arch_ = *std::move(arch);
  if (absl::Status s = cu.Check(cu.DevicePrimaryCtxRetain(&self->context_, self->device_),
                                "cuDevicePrimaryCtxRetain");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<v1::Manifest> manifest = source.GetManifest(model, self->arch_);
  if (!manifest.ok()) {
    return WithContext(manifest.status(), absl::StrCat("fetching the manifest for ", self->arch_));
  }
  if (manifest->variants_size() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the manifest for ", self->arch_, " has no kernel variants"));
  }
  if (const v1::ManifestVariant& first = FirstChoice(*manifest);
      !first.spec().has_sparse_mla_decode()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the manifest for ", self->arch_, " is for ", first.module_name(), ", a ",
        KindCaseName(first.spec()), " module; SparseMlaDecode runs sparse_mla_decode modules"));
  }
  self->manifest_ = *std::move(manifest);
  return self;
}

SparseMlaDecode::~SparseMlaDecode() {
  if (context_ == nullptr) return;  // Create failed before retaining it
  {
    absl::MutexLock lock(&mu_);
    ScopedCudaContext scope(cu_, context_);
    if (scope.status().ok()) {
      // Kernels enqueued by Run may still read the workspace.
      (void)cu_.CtxSynchronize();
      if (workspace_ != 0) (void)cu_.MemFree(workspace_);
      for (CUdeviceptr w : retired_workspaces_) (void)cu_.MemFree(w);
    }
    modules_.clear();
    retired_modules_.clear();
  }
  (void)cu_.DevicePrimaryCtxRelease(device_);
}

uint64_t SparseMlaDecode::workspace_bytes() const {
  absl::MutexLock lock(&mu_);
  return workspace_bytes_;
}

absl::StatusOr<ArtifactRef> SparseMlaDecode::Fetch(const v1::ManifestVariant& variant) const {
  absl::StatusOr<ArtifactRef> artifact = source_.GetKernel(variant, arch_);
  if (!artifact.ok()) {
    return WithContext(artifact.status(), absl::StrCat("fetching kernel ", variant.module_name()));
  }
  if ((*artifact)->key() != variant.key()) {
    return absl::DataLossError(absl::StrCat("asked for kernel ", variant.key(),
                                            ", the source answered with ", (*artifact)->key()));
  }
  return artifact;
}

absl::StatusOr<const CudaKernelModule*> SparseMlaDecode::KernelFor(
    const v1::ManifestVariant& variant) {
  auto it = modules_.find(variant.key());
  if (it != modules_.end()) return it->second.get();
  absl::StatusOr<ArtifactRef> artifact = Fetch(variant);
  if (!artifact.ok()) return artifact.status();
  absl::StatusOr<std::unique_ptr<CudaKernelModule>> module =
      CudaKernelModule::Load(**artifact, device_);
  if (!module.ok()) return module.status();
  const CudaKernelModule* loaded = module->get();
  const std::string key = variant.key();  // `variant` may be replaced below
  modules_.emplace(key, *std::move(module));
  if ((*artifact)->partial()) {
    first_answers_.push_back(key);
    ReplanVariant(VariantOfArtifact(**artifact));
  }
  if (absl::Status s = LearnClusters(*loaded); !s.ok()) return s;
  return loaded;
}

absl::Status SparseMlaDecode::LearnClusters(const CudaKernelModule& module) {
  if (max_active_clusters_.load() != 0) return absl::OkStatus();
  ScopedCudaContext scope(cu_, context_);
  if (!scope.status().ok()) return scope.status();
  absl::StatusOr<int> clusters = module.MaxActiveClusters();
  if (!clusters.ok()) return clusters.status();
  max_active_clusters_.store(*clusters);
  return absl::OkStatus();
}

void SparseMlaDecode::ReplanVariant(const v1::ManifestVariant& variant) {
  auto planned = std::make_unique<v1::Manifest>(*plan_manifest_);
  for (v1::ManifestVariant& v : *planned->mutable_variants()) {
    if (v.key() == variant.key()) v = variant;
  }
  plan_manifest_ = planned.get();
  planned_manifests_.push_back(std::move(planned));
}

bool SparseMlaDecode::HoldsFirstAnswer() const {
  absl::MutexLock lock(&mu_);
  return !first_answers_.empty();
}

absl::StatusOr<int> SparseMlaDecode::Refresh() {
  absl::MutexLock lock(&mu_);
  int replaced = 0;
  for (const v1::ManifestVariant& variant : manifest_.variants()) {
    auto held = std::find(first_answers_.begin(), first_answers_.end(), variant.key());
    if (held == first_answers_.end()) continue;
    absl::StatusOr<ArtifactRef> artifact = Fetch(variant);
    if (!artifact.ok()) return artifact.status();
    if ((*artifact)->partial()) continue;  // the server is still compiling the rest
    absl::StatusOr<std::unique_ptr<CudaKernelModule>> module =
        CudaKernelModule::Load(**artifact, device_);
    if (!module.ok()) return module.status();
    std::unique_ptr<CudaKernelModule>& slot = modules_[variant.key()];
    retired_modules_.push_back(std::move(slot));
    slot = *std::move(module);
    first_answers_.erase(held);
    ReplanVariant(variant);
    ++replaced;
    // A first answer has no cluster entry to learn the device's clusters
    // from; the whole module may.
    if (absl::Status s = LearnClusters(*slot); !s.ok()) return s;
  }
  if (replaced > 0 && reserved_tokens_ > 0) {
    absl::StatusOr<uint64_t> need =
        WorkspaceBytesFor(*plan_manifest_, DeviceInfo{arch_, sm_count_}, reserved_tokens_);
    if (!need.ok()) return need.status();
    if (absl::Status s = GrowWorkspace(*need, /*keep_old=*/true); !s.ok()) return s;
  }
  return replaced;
}

absl::Status SparseMlaDecode::Prefetch() {
  absl::MutexLock lock(&mu_);
  for (const v1::ManifestVariant& variant : manifest_.variants()) {
    if (absl::StatusOr<const CudaKernelModule*> m = KernelFor(variant); !m.ok()) {
      return m.status();
    }
  }
  return absl::OkStatus();
}

absl::Status SparseMlaDecode::GrowWorkspace(uint64_t bytes, bool keep_old) {
  if (bytes <= workspace_bytes_) return absl::OkStatus();
  ScopedCudaContext scope(cu_, context_);
  if (!scope.status().ok()) return scope.status();
  if (workspace_ != 0) {
    if (keep_old) {
      retired_workspaces_.push_back(workspace_);
    } else {
      // Launches already enqueued (on any stream) may still use the old
      // buffer; it is freed only once they are done.
      if (absl::Status s = cu_.Check(cu_.CtxSynchronize(), "cuCtxSynchronize"); !s.ok()) {
        return s;
      }
      if (absl::Status s = cu_.Check(cu_.MemFree(workspace_), "cuMemFree(workspace)"); !s.ok()) {
        return s;
      }
    }
    workspace_ = 0;
    workspace_bytes_ = 0;
  }
  if (absl::Status s =
          cu_.Check(cu_.MemAlloc(&workspace_, bytes),
                    absl::StrCat("cuMemAlloc(", bytes, " bytes of split-K workspace)"));
      !s.ok()) {
    workspace_ = 0;
    return s;
  }
  workspace_bytes_ = bytes;
  return absl::OkStatus();
}

absl::Status SparseMlaDecode::Reserve(int max_tokens) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<uint64_t> need =
      WorkspaceBytesFor(*plan_manifest_, DeviceInfo{arch_, sm_count_}, max_tokens);
  if (!need.ok()) return need.status();
  reserved_tokens_ = std::max(reserved_tokens_, max_tokens);
  return GrowWorkspace(*need);
}

absl::StatusOr<Selection> SparseMlaDecode::Plan(const DecodeArgs& args) const {
  absl::MutexLock lock(&mu_);
  return PlanLocked(args);
}

absl::StatusOr<Selection> SparseMlaDecode::PlanLocked(const DecodeArgs& args) const {
  absl::StatusOr<RuntimeShape> shape = ValidateDecodeArgs(args, *plan_manifest_);
  if (!shape.ok()) return shape.status();
  return Select(*plan_manifest_, DeviceInfo{arch_, sm_count_, 0, max_active_clusters_.load()},
                *shape);
}

absl::Status SparseMlaDecode::Run(const DecodeArgs& args, CUstream stream) {
  absl::MutexLock lock(&mu_);
  // Planned under the lock: the parameter blocks point into the workspace,
  // which a concurrent Run could otherwise grow (and free) in between.
  absl::StatusOr<Selection> sel = PlanLocked(args);
  if (!sel.ok()) return sel.status();
  const int clusters = max_active_clusters_.load();
  const v1::Manifest* planned = plan_manifest_;
  absl::StatusOr<const CudaKernelModule*> module = KernelFor(*sel->variant);
  if (!module.ok()) return module.status();
  if (max_active_clusters_.load() != clusters || plan_manifest_ != planned) {
    // The first load of a module with a cluster entry told how many of its
    // clusters the device runs, and a first answer plans as the module it
    // is: plan again knowing it.
    sel = PlanLocked(args);
    if (!sel.ok()) return sel.status();
    module = KernelFor(*sel->variant);
    if (!module.ok()) return module.status();
  }
  ScopedCudaContext scope(cu_, context_);
  if (!scope.status().ok()) return scope.status();
  if (sel->workspace_bytes > workspace_bytes_) {
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    if (absl::Status s = cu_.Check(cu_.StreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
        !s.ok()) {
      return s;
    }
    if (capture != CU_STREAM_CAPTURE_STATUS_NONE) {
      return absl::FailedPreconditionError(absl::StrCat(
          "workspace: this call needs ", sel->workspace_bytes, " bytes but ", workspace_bytes_,
          " are reserved, and the stream is being captured "
          "(allocating would break the capture): call Reserve(max_tokens) "
          "before capturing"));
    }
    if (absl::Status s = GrowWorkspace(sel->workspace_bytes); !s.ok()) return s;
  }
  if (absl::Status s = (*module)->LaunchMain(MakeDecodeParams(*sel, args, workspace_),
                                             MainLaunchDims(*sel), *sel->main_entry, stream);
      !s.ok()) {
    return s;
  }
  if (!sel->needs_combine) return absl::OkStatus();
  return (*module)->LaunchCombine(MakeCombineParams(*sel, args, workspace_),
                                  CombineLaunchDims(*sel), stream);
}

}  // namespace kforge
