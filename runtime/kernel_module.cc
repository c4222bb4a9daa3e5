#include "runtime/kernel_module.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/absl_compat.h"
#include "model/arch.h"
#include "model/artifact_check.h"

namespace kforge {
namespace {

const EntryParams* ParamsFor(absl::Span<const EntryParams> expected, v1::EntryRole role) {
  auto it = std::find_if(expected.begin(), expected.end(),
                         [&](const EntryParams& p) { return p.role == role; });
  return it == expected.end() ? nullptr : &*it;
}

// The grid, block and dynamic shared memory of `d` as a launch config (no
// stream, no attributes).
CUlaunchConfig LaunchConfigOf(const LaunchDims& d) {
  CUlaunchConfig config{};
  config.gridDimX = d.grid_x;
  config.gridDimY = d.grid_y;
  config.gridDimZ = d.grid_z;
  config.blockDimX = d.block_threads;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = d.dynamic_smem_bytes;
  return config;
}

}  // namespace

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

absl::Status CheckEntryParams(const v1::KernelArtifact& artifact,
                              absl::Span<const EntryParams> expected) {
  if (artifact.entries().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(artifact.module_name(), ": the artifact lists no entries (format ",
                     artifact.format_version(),
                     "; kforge artifacts list them from format 3): rebuild it with this kforge"));
  }
  for (const v1::KernelEntry& entry : artifact.entries()) {
    const EntryParams* want = ParamsFor(expected, entry.role());
    if (want == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s in %s has role %s, which this runtime does not launch: not a "
                          "module of this kernel family",
                          entry.name(), artifact.module_name(), v1::EntryRole_Name(entry.role())));
    }
    // 0: not recorded; the cubin's own size below still checks.
    if (entry.params_bytes() != 0 && entry.params_bytes() != want->bytes) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: entries[%s].params_bytes = %u but this runtime's sizeof(%s) = %u: kernel and "
          "runtime were built from different %s",
          artifact.module_name(), entry.name(), entry.params_bytes(), want->struct_name,
          want->bytes, want->defined_in));
    }
    const v1::KernelResources* k = FindKernel(artifact.cubin_info(), entry.name());
    if (k == nullptr) {
      return absl::DataLossError(absl::StrFormat("%s: cubin_info lists no kernel named \"%s\"",
                                                 artifact.module_name(), entry.name()));
    }
    if (k->param_bytes() != want->bytes) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s in %s takes %u parameter bytes but this runtime passes "
                          "sizeof(%s) = %u: kernel and runtime were built from different %s",
                          entry.name(), artifact.module_name(), k->param_bytes(), want->struct_name,
                          want->bytes, want->defined_in));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const CudaDriver*> KernelModule::CheckLoadable(
    const v1::KernelArtifact& artifact, absl::Span<const EntryParams> expected) {
  if (absl::Status s = CheckEntryParams(artifact, expected); !s.ok()) return s;
  for (size_t i = 0; i < CubinImageCount(artifact); ++i) {
    if (ImageOf(artifact, i).empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(artifact.module_name(), ": the artifact carries no cubin",
                       i == 0 ? std::string() : absl::StrCat(" for image ", i)));
    }
  }
  absl::StatusOr<const CudaDriver*> driver = CudaDriver::Get();
  if (!driver.ok()) {
    return absl::Status(driver.status().code(),
                        absl::StrCat("loading kforge kernels needs the CUDA driver (",
                                     artifact.module_name(), "): ", driver.status().message()));
  }
  return driver;
}

absl::StatusOr<std::unique_ptr<KernelModule>> KernelModule::Load(
    const v1::KernelArtifact& artifact, absl::Span<const EntryParams> expected, CUdevice device) {
  absl::StatusOr<const CudaDriver*> driver = CheckLoadable(artifact, expected);
  if (!driver.ok()) return driver.status();
  return LoadChecked(**driver, artifact, expected, device);
}

absl::StatusOr<std::unique_ptr<KernelModule>> KernelModule::LoadOnOrdinal(
    const v1::KernelArtifact& artifact, absl::Span<const EntryParams> expected,
    int device_ordinal) {
  absl::StatusOr<const CudaDriver*> driver = CheckLoadable(artifact, expected);
  if (!driver.ok()) return driver.status();
  const CudaDriver& cu = **driver;
  CUdevice device = 0;
  if (absl::Status s = cu.Check(cu.DeviceGet(&device, device_ordinal),
                                absl::StrCat("cuDeviceGet(", device_ordinal, ")"));
      !s.ok()) {
    return s;
  }
  return LoadChecked(cu, artifact, expected, device);
}

absl::StatusOr<std::unique_ptr<KernelModule>> KernelModule::LoadChecked(
    const CudaDriver& cu, const v1::KernelArtifact& artifact,
    absl::Span<const EntryParams> expected, CUdevice device) {
  absl::StatusOr<int> major =
      DeviceAttribute(cu, device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "cc major");
  if (!major.ok()) return major.status();
  absl::StatusOr<int> minor =
      DeviceAttribute(cu, device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "cc minor");
  if (!minor.ok()) return minor.status();
  if (absl::Status s = CheckDeviceArch(artifact.arch(), *major, *minor); !s.ok()) return s;

  std::unique_ptr<KernelModule> module(new KernelModule(cu, artifact.module_name(), device));
  const std::string& name = module->module_name_;
  const size_t images = CubinImageCount(artifact);
  module->libraries_.reserve(images);
  for (size_t i = 0; i < images; ++i) {
    CUlibrary library = nullptr;
    if (absl::Status s = cu.Check(cu.LibraryLoadData(&library, ImageOf(artifact, i).data(), nullptr,
                                                     nullptr, 0, nullptr, nullptr, 0),
                                  absl::StrCat("cuLibraryLoadData(", name, ", image ", i, ")"));
        !s.ok()) {
      return s;
    }
    module->libraries_.push_back(library);
  }
  module->entries_.reserve(artifact.entries_size());
  for (const v1::KernelEntry& entry : artifact.entries()) {
    // CheckEntryParams found its cubin_info record.
    const uint32_t image = FindKernel(artifact.cubin_info(), entry.name())->image();
    if (image >= images) {
      return absl::DataLossError(absl::StrFormat("%s: cubin_info puts %s in image %u of %u", name,
                                                 entry.name(), image, images));
    }
    CUkernel kernel = nullptr;
    if (absl::Status s =
            cu.Check(cu.LibraryGetKernel(&kernel, module->libraries_[image], entry.name().c_str()),
                     absl::StrCat("cuLibraryGetKernel(", name, ", ", entry.name(), ")"));
        !s.ok()) {
      return s;
    }
    // CheckEntryParams found every role among `expected`.
    module->entries_.push_back({entry.name(), kernel, ParamsFor(expected, entry.role())->bytes});
  }
  return module;
}

KernelModule::~KernelModule() {
  for (CUlibrary library : libraries_) (void)cu_.LibraryUnload(library);
}

absl::StatusOr<size_t> KernelModule::EntryIndex(std::string_view name) const {
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].name == name) return i;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      module_name_, " has no entry named '", AsAbsl(name), "' among the artifact's entries"));
}

absl::StatusOr<CUkernel> KernelModule::Entry(std::string_view name) const {
  absl::StatusOr<size_t> index = EntryIndex(name);
  if (!index.ok()) return index.status();
  return entries_[*index].kernel;
}

absl::Status KernelModule::SetMaxDynamicSmem(CUkernel kernel, std::string_view entry,
                                             uint32_t bytes, CUdevice device) const {
  return cu_.Check(cu_.KernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          static_cast<int>(bytes), kernel, device),
                   absl::StrCat("cuKernelSetAttribute(", module_name_, ", ", AsAbsl(entry),
                                ", max dynamic shared memory ", bytes, ")"));
}

absl::Status KernelModule::AllowNonPortableCluster(CUkernel kernel, std::string_view entry,
                                                   CUdevice device) const {
  return cu_.Check(cu_.KernelSetAttribute(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1,
                                          kernel, device),
                   absl::StrCat("cuKernelSetAttribute(", module_name_, ", ", AsAbsl(entry),
                                ", non-portable cluster size allowed)"));
}

absl::StatusOr<int> KernelModule::MaxActiveClusters(CUkernel kernel, std::string_view entry,
                                                    const LaunchDims& one_cluster) const {
  CUfunction function = nullptr;
  if (absl::Status s =
          cu_.Check(cu_.KernelGetFunction(&function, kernel),
                    absl::StrCat("cuKernelGetFunction(", module_name_, ", ", AsAbsl(entry), ")"));
      !s.ok()) {
    return s;
  }
  CUlaunchConfig config = LaunchConfigOf(one_cluster);
  int clusters = 0;
  // A driver that cannot say: none (the selector then never picks it).
  if (cu_.OccupancyMaxActiveClusters(&clusters, function, &config) != CUDA_SUCCESS) return 0;
  return clusters;
}

absl::Status KernelModule::LoadIntoCurrentContext() const {
  for (const ModuleEntry& e : entries_) {
    CUfunction function = nullptr;
    if (absl::Status s =
            cu_.Check(cu_.KernelGetFunction(&function, e.kernel),
                      absl::StrCat("cuKernelGetFunction(", module_name_, ", ", e.name, ")"));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
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
  CUlaunchConfig config = LaunchConfigOf(d);
  config.hStream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cu.LaunchKernelEx(&config, reinterpret_cast<CUfunction>(kernel), args, nullptr);
}

absl::Status KernelModule::Launch(CUkernel kernel, std::string_view entry, void* params,
                                  const LaunchDims& d, CUstream stream) const {
  void* args[] = {params};
  const CUresult result = LaunchWithDims(cu_, kernel, args, d, stream);
  if (result == CUDA_SUCCESS) return absl::OkStatus();  // no message to format per launch
  const std::string_view how = d.programmatic ? "cuLaunchKernelEx" : "cuLaunchKernel";
  return cu_.Check(result, absl::StrFormat("%s(%s, %s, grid (%u, %u, %u), block %u, smem %u)", how,
                                           module_name_, entry, d.grid_x, d.grid_y, d.grid_z,
                                           d.block_threads, d.dynamic_smem_bytes));
}

}  // namespace kforge
