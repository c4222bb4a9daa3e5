// A stand-in for libcuda.so.1 with no GPU behind it, for tests of the
// module loader (runtime/kernel_module.h) on machines without a driver:
// enough of the Driver API to load a module. A library keeps a copy of the
// cubin image it was given (sized from its ELF header), a kernel is found
// only in a library whose image has that .text.<name> section, and the
// device is an sm_90 part of 132 SMs. fake_cuda_*() give a test the
// counts. Every other entry point resolves to a function that answers
// CUDA_ERROR_NOT_SUPPORTED (the loader never calls them).
//
// The library's soname is libcuda.so.1: loaded by its path before
// CudaDriver::Get() runs, it is the driver dlopen("libcuda.so.1") finds.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>

#include "cuda.h"

namespace {

struct FakeKernel {
  std::string name;
};
struct FakeLibrary {
  std::string image;
  std::deque<FakeKernel> kernels;  // freed with the library, as a driver's
};

std::atomic<int> g_live_libraries{0};
std::atomic<int> g_libraries_loaded{0};
std::atomic<int> g_kernels_found{0};

constexpr int kVersion = 12080;

template <typename T>
T Read(const unsigned char* p, size_t at) {
  T v;
  std::memcpy(&v, p + at, sizeof(v));
  return v;
}

CUresult NotSupported() { return CUDA_ERROR_NOT_SUPPORTED; }

CUresult GetErrorName(CUresult error, const char** out) {
  *out = error == CUDA_ERROR_NOT_FOUND ? "CUDA_ERROR_NOT_FOUND" : "CUDA_ERROR_FAKE";
  return CUDA_SUCCESS;
}

CUresult GetErrorString(CUresult, const char** out) {
  *out = "an error of the stand-in driver";
  return CUDA_SUCCESS;
}

CUresult Init(unsigned int) { return CUDA_SUCCESS; }

CUresult DriverGetVersion(int* version) {
  *version = kVersion;
  return CUDA_SUCCESS;
}

CUresult DeviceGet(CUdevice* device, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *device = 0;
  return CUDA_SUCCESS;
}

CUresult DeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice) {
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *value = 9;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *value = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *value = 132;
      break;
    default:
      *value = 0;
  }
  return CUDA_SUCCESS;
}

// A copy of the ELF64 image at `code`: its section headers end it.
CUresult LibraryLoadData(CUlibrary* library, const void* code, CUjit_option*, void**, unsigned int,
                         CUlibraryOption*, void**, unsigned int) {
  const auto* p = static_cast<const unsigned char*>(code);
  constexpr unsigned char kElf64[5] = {0x7f, 'E', 'L', 'F', 2};
  if (p == nullptr || std::memcmp(p, kElf64, sizeof(kElf64)) != 0) {
    return CUDA_ERROR_INVALID_IMAGE;
  }
  const uint64_t size = Read<uint64_t>(p, 0x28) +
                        uint64_t{Read<uint16_t>(p, 0x3c)} * uint64_t{Read<uint16_t>(p, 0x3a)};
  auto* fake = new FakeLibrary{std::string(reinterpret_cast<const char*>(p), size), {}};
  *library = reinterpret_cast<CUlibrary>(fake);
  ++g_live_libraries;
  ++g_libraries_loaded;
  return CUDA_SUCCESS;
}

CUresult LibraryUnload(CUlibrary library) {
  delete reinterpret_cast<FakeLibrary*>(library);
  --g_live_libraries;
  return CUDA_SUCCESS;
}

// Found where the image's section names hold ".text.<name>".
CUresult LibraryGetKernel(CUkernel* kernel, CUlibrary library, const char* name) {
  auto* fake = reinterpret_cast<FakeLibrary*>(library);
  const std::string section = std::string(".text.") + name;
  if (fake->image.find(std::string(section.c_str(), section.size() + 1)) == std::string::npos) {
    return CUDA_ERROR_NOT_FOUND;
  }
  fake->kernels.push_back({name});
  *kernel = reinterpret_cast<CUkernel>(&fake->kernels.back());
  ++g_kernels_found;
  return CUDA_SUCCESS;
}

CUresult KernelSetAttribute(CUfunction_attribute, int, CUkernel, CUdevice) { return CUDA_SUCCESS; }

CUresult KernelGetFunction(CUfunction* function, CUkernel kernel) {
  *function = reinterpret_cast<CUfunction>(kernel);
  return CUDA_SUCCESS;
}

struct Symbol {
  const char* name;
  void* fn;
};

template <typename F>
void* Fn(F* f) {
  return reinterpret_cast<void*>(f);
}

const Symbol kSymbols[] = {
    {"cuGetErrorName", Fn(GetErrorName)},
    {"cuGetErrorString", Fn(GetErrorString)},
    {"cuInit", Fn(Init)},
    {"cuDriverGetVersion", Fn(DriverGetVersion)},
    {"cuDeviceGet", Fn(DeviceGet)},
    {"cuDeviceGetAttribute", Fn(DeviceGetAttribute)},
    {"cuLibraryLoadData", Fn(LibraryLoadData)},
    {"cuLibraryUnload", Fn(LibraryUnload)},
    {"cuLibraryGetKernel", Fn(LibraryGetKernel)},
    {"cuKernelSetAttribute", Fn(KernelSetAttribute)},
    {"cuKernelGetFunction", Fn(KernelGetFunction)},
};

}  // namespace

extern "C" {

CUresult CUDAAPI cuDriverGetVersion(int* version) { return DriverGetVersion(version); }

CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int, cuuint64_t,
                                     CUdriverProcAddressQueryResult* status) {
  *pfn = Fn(NotSupported);
  for (const Symbol& s : kSymbols) {
    if (std::strcmp(s.name, symbol) == 0) *pfn = s.fn;
  }
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

// For tests: libraries loaded and not unloaded; loaded in all; kernels found.
int fake_cuda_live_libraries() { return g_live_libraries; }
int fake_cuda_libraries_loaded() { return g_libraries_loaded; }
int fake_cuda_kernels_found() { return g_kernels_found; }

}  // extern "C"
