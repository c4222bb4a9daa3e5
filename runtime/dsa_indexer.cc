#include "runtime/dsa_indexer.h"

#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/arch.h"
#include "runtime/cuda_loader.h"

namespace kforge {
namespace {

absl::StatusOr<int> Attribute(const CudaDriver& cu, CUdevice device, CUdevice_attribute a,
                              const char* what) {
  int value = 0;
  if (absl::Status s = cu.Check(cu.DeviceGetAttribute(&value, a, device),
                                absl::StrCat("cuDeviceGetAttribute(", what, ")"));
      !s.ok()) {
    return s;
  }
  return value;
}

// The cubin's own entries (read back from its ELF) take this build's
// parameter blocks.
absl::Status CheckEntry(const v1::KernelArtifact& artifact, const std::string& entry,
                        size_t bytes) {
  for (const v1::KernelResources& k : artifact.cubin_info().kernels()) {
    if (k.name() != entry) continue;
    if (k.param_bytes() == bytes) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s in %s takes %u parameter bytes, this runtime passes %u: kernel and runtime were "
        "built from different templates/kforge/dsa_indexer/config.h",
        entry, artifact.module_name(), k.param_bytes(), bytes));
  }
  return absl::DataLossError(
      absl::StrCat(artifact.module_name(), ": cubin_info lists no kernel named ", entry));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DsaIndexerModule>> DsaIndexerModule::Load(
    const v1::KernelArtifact& artifact, CUdevice device) {
  if (artifact.spec().kind() != v1::ATTENTION_KIND_DSA_INDEXER || !artifact.has_indexer()) {
    return absl::InvalidArgumentError(absl::StrCat(
        artifact.module_name(), ": not a DSA indexer module (kind ",
        v1::AttentionKind_Name(artifact.spec().kind()), "); SparseMlaDecode loads attention"));
  }
  const v1::IndexerLaunch& launch = artifact.indexer();
  if (absl::Status s =
          CheckEntry(artifact, launch.logits_entry(), sizeof(dsa_indexer::LogitsParams));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckEntry(artifact, launch.topk_entry(), sizeof(dsa_indexer::TopkParams));
      !s.ok()) {
    return s;
  }
  if (artifact.cubin().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(artifact.module_name(), ": the artifact carries no cubin"));
  }
  absl::StatusOr<const CudaDriver*> driver = CudaDriver::Get();
  if (!driver.ok()) return driver.status();
  const CudaDriver& cu = **driver;
  absl::StatusOr<int> major =
      Attribute(cu, device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "cc major");
  if (!major.ok()) return major.status();
  absl::StatusOr<int> minor =
      Attribute(cu, device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "cc minor");
  if (!minor.ok()) return minor.status();
  if (absl::Status s = CheckDeviceArch(artifact.arch(), *major, *minor); !s.ok()) return s;

  std::unique_ptr<DsaIndexerModule> m(new DsaIndexerModule(cu));
  m->spec_ = artifact.spec();
  m->launch_ = launch;
  m->module_name_ = artifact.module_name();
  if (absl::Status s = cu.Check(cu.LibraryLoadData(&m->library_, artifact.cubin().data(), nullptr,
                                                   nullptr, 0, nullptr, nullptr, 0),
                                absl::StrCat("cuLibraryLoadData(", m->module_name_, ")"));
      !s.ok()) {
    return s;
  }
  for (auto [entry, kernel, smem] :
       {std::tuple{&launch.logits_entry(), &m->logits_, launch.logits_smem_bytes()},
        std::tuple{&launch.topk_entry(), &m->topk_, launch.topk_smem_bytes()},
        std::tuple{&launch.topk_cluster().entry(), &m->topk_cluster_,
                   launch.topk_cluster().smem_bytes()}}) {
    if (entry->empty() && kernel == &m->topk_cluster_) continue;  // before sm_90
    if (absl::Status s =
            cu.Check(cu.LibraryGetKernel(kernel, m->library_, entry->c_str()),
                     absl::StrCat("cuLibraryGetKernel(", m->module_name_, ", ", *entry, ")"));
        !s.ok()) {
      return s;
    }
    if (smem > 48 * 1024) {  // above 48 KB a kernel opts in, per device
      if (absl::Status s =
              cu.Check(cu.KernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                             static_cast<int>(smem), *kernel, device),
                       absl::StrCat("cuKernelSetAttribute(", *entry, ", ", smem, ")"));
          !s.ok()) {
        return s;
      }
    }
  }
  return m;
}

DsaIndexerModule::~DsaIndexerModule() {
  if (library_ != nullptr) (void)cu_.LibraryUnload(library_);
}

template <typename Params>
absl::Status DsaIndexerModule::Launch(CUkernel kernel, const IndexerKernelLaunch<Params>& l,
                                      CUstream stream) const {
  // cuLaunchKernel copies the parameter block; the const_cast never writes.
  void* args[] = {const_cast<Params*>(&l.params)};
  LaunchDims d;
  d.grid_x = l.grid_x;
  d.grid_y = l.grid_y;
  d.grid_z = l.grid_z;
  d.block_threads = l.block_threads;
  d.dynamic_smem_bytes = l.dynamic_smem_bytes;
  d.programmatic = l.programmatic;
  const CUresult r = LaunchWithDims(cu_, kernel, args, d, stream);
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  return cu_.Check(
      r, absl::StrFormat("%s(%s, %s, grid (%u, %u, %u), block %u)",
                         l.programmatic ? "cuLaunchKernelEx" : "cuLaunchKernel", module_name_,
                         l.entry, l.grid_x, l.grid_y, l.grid_z, l.block_threads));
}

absl::Status DsaIndexerModule::Logits(const IndexerLogitsArgs& args, CUstream stream) const {
  absl::StatusOr<IndexerKernelLaunch<dsa_indexer::LogitsParams>> l =
      PlanIndexerLogits(spec_, launch_, args);
  if (!l.ok()) return l.status();
  return Launch(logits_, *l, stream);
}

absl::Status DsaIndexerModule::Topk(const IndexerTopkArgs& args, CUstream stream) const {
  absl::StatusOr<IndexerKernelLaunch<dsa_indexer::TopkParams>> l =
      PlanIndexerTopk(spec_, launch_, args);
  if (!l.ok()) return l.status();
  return Launch(l->entry == launch_.topk_entry() ? topk_ : topk_cluster_, *l, stream);
}

}  // namespace kforge
