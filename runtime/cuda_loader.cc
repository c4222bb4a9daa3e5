#include "runtime/cuda_loader.h"

#include <algorithm>

#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "base/absl_compat.h"
#include "model/artifact_check.h"

namespace kforge {
namespace {

absl::Status CheckEntryParams(const v1::KernelArtifact& artifact, const std::string& entry,
                              size_t want, const char* struct_name) {
  for (const v1::KernelResources& k : artifact.cubin_info().kernels()) {
    if (k.name() != entry) continue;
    if (k.param_bytes() != want) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s in %s takes %u parameter bytes but this runtime passes "
                          "sizeof(%s) = %u: kernel and runtime were built from different "
                          "templates/kforge/sparse_mla/common/params.h",
                          entry, artifact.module_name(), k.param_bytes(), struct_name, want));
    }
    return absl::OkStatus();
  }
  return absl::DataLossError(absl::StrFormat("%s: cubin_info lists no kernel named \"%s\"",
                                             artifact.module_name(), entry));
}

absl::Status CheckRecordedSize(const v1::KernelArtifact& artifact, const char* field,
                               uint32_t recorded, size_t want, const char* struct_name) {
  // 0: an artifact from before the field existed; cubin_info still checks.
  if (recorded == 0 || recorded == want) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrFormat("%s: %s = %u but this runtime's sizeof(%s) = %u: kernel and runtime were "
                      "built from different templates/kforge/sparse_mla/common/params.h",
                      artifact.module_name(), field, recorded, struct_name, want));
}

absl::StatusOr<int> DeviceAttribute(const CudaDriver& cu, CUdevice device,
                                    CUdevice_attribute attribute, std::string_view what) {
  int value = 0;
  if (absl::Status s =
          cu.Check(cu.DeviceGetAttribute(&value, attribute, device),
                   absl::StrCat("cuDeviceGetAttribute(", AsAbsl(what), ", device ", device, ")"));
      !s.ok()) {
    return s;
  }
  return value;
}

}  // namespace

absl::Status CheckParamSizes(const v1::KernelArtifact& artifact) {
  using sparse_mla::CombineParams;
  using sparse_mla::DecodeParams;
  if (absl::Status s = CheckRecordedSize(artifact, "params_bytes", artifact.params_bytes(),
                                         sizeof(DecodeParams), "DecodeParams");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckRecordedSize(artifact, "combine_params_bytes", artifact.combine_params_bytes(),
                            sizeof(CombineParams), "CombineParams");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckEntryParams(artifact, artifact.main_entry(), sizeof(DecodeParams), "DecodeParams");
      !s.ok()) {
    return s;
  }
  for (const std::string* entry : OptionalMainEntries(artifact.small_batch(), artifact.cluster())) {
    if (absl::Status s = CheckEntryParams(artifact, *entry, sizeof(DecodeParams), "DecodeParams");
        !s.ok()) {
      return s;
    }
  }
  return CheckEntryParams(artifact, artifact.combine_entry(), sizeof(CombineParams),
                          "CombineParams");
}

absl::StatusOr<std::unique_ptr<CudaKernelModule>> CudaKernelModule::Load(
    const v1::KernelArtifact& artifact, CUdevice device) {
  absl::StatusOr<const CudaDriver*> driver = CudaDriver::Get();
  if (!driver.ok()) return driver.status();
  const CudaDriver& cu = **driver;

  absl::StatusOr<int> major =
      DeviceAttribute(cu, device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "cc major");
  if (!major.ok()) return major.status();
  absl::StatusOr<int> minor =
      DeviceAttribute(cu, device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "cc minor");
  if (!minor.ok()) return minor.status();
  if (absl::Status s = CheckDeviceArch(artifact.arch(), *major, *minor); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckParamSizes(artifact); !s.ok()) return s;
  absl::StatusOr<int> smem_optin =
      DeviceAttribute(cu, device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                      "max shared memory per block (opt-in)");
  if (!smem_optin.ok()) return smem_optin.status();
  const uint32_t smem = artifact.launch().dynamic_smem_bytes();
  const uint32_t small_smem = artifact.small_batch().launch().dynamic_smem_bytes();
  if (std::max(smem, small_smem) > static_cast<uint32_t>(*smem_optin)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s needs %u bytes of dynamic shared memory per block; this device allows "
                        "%d",
                        artifact.module_name(), std::max(smem, small_smem), *smem_optin));
  }
  if (artifact.cubin().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(artifact.module_name(), ": the artifact carries no cubin"));
  }

  std::unique_ptr<CudaKernelModule> module(
      new CudaKernelModule(cu, artifact.module_name(), artifact.key()));
  module->main_entry_ = artifact.main_entry();
  module->combine_entry_ = artifact.combine_entry();
  module->small_entry_ = artifact.small_batch().entry();
  module->cluster_entry_ = artifact.small_batch().cluster_entry();
  module->main_cluster_entry_ = artifact.cluster().entry();
  module->wide_cluster_entry_ = artifact.cluster().wide_entry();
  module->cluster_dims_ = {artifact.small_batch().tiling().num_head_groups(),
                           artifact.small_batch().cluster_splits(), 1,
                           artifact.small_batch().launch().block_threads(), small_smem};
  module->wide_cluster_dims_ = {artifact.tiling().num_head_groups(),
                                artifact.cluster().wide_splits(), 1,
                                artifact.launch().block_threads(), smem};
  const std::string& name = module->module_name_;
  if (absl::Status s = cu.Check(cu.LibraryLoadData(&module->library_, artifact.cubin().data(),
                                                   nullptr, nullptr, 0, nullptr, nullptr, 0),
                                absl::StrCat("cuLibraryLoadData(", name, ")"));
      !s.ok()) {
    return s;
  }
  for (auto [entry, kernel] : {std::pair{&module->main_entry_, &module->main_},
                               std::pair{&module->combine_entry_, &module->combine_},
                               std::pair{&module->small_entry_, &module->small_},
                               std::pair{&module->cluster_entry_, &module->cluster_},
                               std::pair{&module->main_cluster_entry_, &module->main_cluster_},
                               std::pair{&module->wide_cluster_entry_, &module->wide_cluster_}}) {
    if (entry->empty()) continue;  // no small-batch path or cluster entry
    if (absl::Status s = cu.Check(cu.LibraryGetKernel(kernel, module->library_, entry->c_str()),
                                  absl::StrCat("cuLibraryGetKernel(", name, ", ", *entry, ")"));
        !s.ok()) {
      return s;
    }
  }
  // Above 48 KB a kernel must opt into its dynamic shared memory, per device.
  for (auto [kernel, bytes] :
       {std::pair{module->main_, smem}, std::pair{module->small_, small_smem},
        std::pair{module->cluster_, small_smem}, std::pair{module->main_cluster_, smem},
        std::pair{module->wide_cluster_, smem}}) {
    if (kernel == nullptr) continue;
    if (absl::Status s =
            cu.Check(cu.KernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                           static_cast<int>(bytes), kernel, device),
                     absl::StrCat("cuKernelSetAttribute(", name, ", max dynamic shared memory ",
                                  bytes, ")"));
        !s.ok()) {
      return s;
    }
  }
  // Clusters past the portable 8 CTAs (the cluster entry's size is
  // compiled in) launch only once the kernel opts in; a device that refuses
  // runs none of them (MaxActiveClusters answers 0).
  for (CUkernel* kernel : {&module->cluster_, &module->wide_cluster_}) {
    if (*kernel != nullptr &&
        cu.KernelSetAttribute(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, *kernel,
                              device) != CUDA_SUCCESS) {
      *kernel = nullptr;
    }
  }
  return module;
}

absl::StatusOr<int> CudaKernelModule::ClustersOf(CUkernel kernel, const std::string& entry,
                                                 const LaunchDims& one_cluster) const {
  CUfunction function = nullptr;
  if (absl::Status s =
          cu_.Check(cu_.KernelGetFunction(&function, kernel),
                    absl::StrCat("cuKernelGetFunction(", module_name_, ", ", entry, ")"));
      !s.ok()) {
    return s;
  }
  CUlaunchConfig config{};
  config.gridDimX = one_cluster.grid_x;
  config.gridDimY = one_cluster.grid_y;
  config.gridDimZ = 1;
  config.blockDimX = one_cluster.block_threads;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = one_cluster.dynamic_smem_bytes;
  int clusters = 0;
  // A driver that cannot say: none (the selector then never picks it).
  if (cu_.OccupancyMaxActiveClusters(&clusters, function, &config) != CUDA_SUCCESS) return 0;
  return clusters;
}

absl::StatusOr<int> CudaKernelModule::MaxActiveClusters() const {
  // Either entry may be missing or refused; the selector holds one number
  // for both, so a module with both gets the fewer (a device refusing one
  // of them runs neither).
  if ((!cluster_entry_.empty() && cluster_ == nullptr) ||
      (!wide_cluster_entry_.empty() && wide_cluster_ == nullptr)) {
    return 0;
  }
  int fewest = -1;
  for (auto [kernel, entry, dims] :
       {std::tuple{cluster_, &cluster_entry_, &cluster_dims_},
        std::tuple{wide_cluster_, &wide_cluster_entry_, &wide_cluster_dims_}}) {
    if (kernel == nullptr) continue;
    absl::StatusOr<int> clusters = ClustersOf(kernel, *entry, *dims);
    if (!clusters.ok()) return clusters.status();
    fewest = fewest < 0 ? *clusters : std::min(fewest, *clusters);
  }
  return std::max(fewest, 0);
}

CudaKernelModule::~CudaKernelModule() {
  if (library_ != nullptr) (void)cu_.LibraryUnload(library_);
}

CUresult LaunchWithDims(const CudaDriver& cu, CUkernel kernel, void** args, const LaunchDims& d,
                        CUstream stream) {
  if (!d.programmatic) {
    // A CUkernel passed as a CUfunction launches in the stream's context
    // (CUDA 12.0+), so one library serves every context.
    return cu.LaunchKernel(reinterpret_cast<CUfunction>(kernel), d.grid_x, d.grid_y, d.grid_z,
                           d.block_threads, 1, 1, d.dynamic_smem_bytes, stream, args, nullptr);
  }
  CUlaunchAttribute attribute{};
  attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attribute.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig config{};
  config.gridDimX = d.grid_x;
  config.gridDimY = d.grid_y;
  config.gridDimZ = d.grid_z;
  config.blockDimX = d.block_threads;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = d.dynamic_smem_bytes;
  config.hStream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cu.LaunchKernelEx(&config, reinterpret_cast<CUfunction>(kernel), args, nullptr);
}

absl::Status CudaKernelModule::Launch(CUkernel kernel, std::string_view entry, void* params,
                                      const LaunchDims& d, CUstream stream) const {
  void* args[] = {params};
  const CUresult result = LaunchWithDims(cu_, kernel, args, d, stream);
  if (result == CUDA_SUCCESS) return absl::OkStatus();  // no message to format per launch
  const std::string_view how = d.programmatic ? "cuLaunchKernelEx" : "cuLaunchKernel";
  return cu_.Check(result, absl::StrFormat("%s(%s, %s, grid (%u, %u, %u), block %u, smem %u)", how,
                                           module_name_, entry, d.grid_x, d.grid_y, d.grid_z,
                                           d.block_threads, d.dynamic_smem_bytes));
}

absl::Status CudaKernelModule::LaunchMain(const sparse_mla::DecodeParams& params,
                                          const LaunchDims& dims, std::string_view entry,
                                          CUstream stream) const {
  CUkernel kernel = nullptr;
  for (auto [name, k] :
       {std::pair{&main_entry_, main_}, std::pair{&small_entry_, small_},
        std::pair{&cluster_entry_, cluster_}, std::pair{&main_cluster_entry_, main_cluster_},
        std::pair{&wide_cluster_entry_, wide_cluster_}}) {
    if (k != nullptr && *name == entry) kernel = k;
  }
  if (kernel == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(module_name_, " has no main kernel named '",
                                                      AsAbsl(entry), "'; the plan asked for it"));
  }
  // cuLaunchKernel copies the parameter block; the const_cast never writes.
  return Launch(kernel, entry, const_cast<sparse_mla::DecodeParams*>(&params), dims, stream);
}

absl::Status CudaKernelModule::LaunchCombine(const sparse_mla::CombineParams& params,
                                             const LaunchDims& dims, CUstream stream) const {
  return Launch(combine_, combine_entry_, const_cast<sparse_mla::CombineParams*>(&params), dims,
                stream);
}

}  // namespace kforge
