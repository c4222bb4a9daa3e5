// The module loader (runtime/kernel_module.h) over a stand-in driver
// (tests/fake_cuda.cc), so that it runs where there is no GPU: a module of
// several cubin images loads each image once, takes every entry from the
// image cubin_info names, and unloads them all; an entry routed to another
// image, an image index past the last and an empty image are errors that
// name the module. The stand-in checks the calls, not kernels: the GPU
// tests (cuda_runtime_test, tests/gpu/) launch them.
#include <dlfcn.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "compiler/compiler.h"
#include "gtest/gtest.h"
#include "model/spec.h"
#include "runtime/cuda_driver.h"
#include "runtime/cuda_loader.h"
#include "runtime/kernel_module.h"

namespace kforge {
namespace {

// The stand-in, loaded by its path before anything asks for the driver:
// dlopen("libcuda.so.1") then finds it by its soname.
struct FakeCuda {
  void* handle = dlopen(KFORGE_FAKE_CUDA, RTLD_NOW | RTLD_LOCAL);
  int (*live)() = Sym("fake_cuda_live_libraries");
  int (*loaded)() = Sym("fake_cuda_libraries_loaded");
  int (*found)() = Sym("fake_cuda_kernels_found");

  using Counter = int (*)();
  Counter Sym(const char* name) const {
    return handle == nullptr ? nullptr : reinterpret_cast<Counter>(dlsym(handle, name));
  }
};

const FakeCuda& Fake() {
  static const FakeCuda* fake = new FakeCuda();
  return *fake;
}

// glm-5 TP 8 on sm_90a: five entries in three images (main + main_cluster,
// small + cluster, combine).
const v1::KernelArtifact& Module() {
  static const v1::KernelArtifact* artifact = [] {
    absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("glm-5", 8);
    absl::StatusOr<v1::KernelArtifact> a =
        spec.ok() ? KernelCompiler().Compile(KernelSpecOf(*spec), "sm_90a") : spec.status();
    return new v1::KernelArtifact(a.ok() ? *a : v1::KernelArtifact());
  }();
  return *artifact;
}

class ModuleLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(Fake().handle, nullptr) << dlerror();
    ASSERT_NE(Fake().live, nullptr);
    absl::StatusOr<const CudaDriver*> driver = CudaDriver::Get();
    ASSERT_TRUE(driver.ok()) << driver.status();
    ASSERT_EQ((*driver)->version(), 12080) << "not the stand-in driver";
    ASSERT_EQ(Module().more_cubins_size(), 2);
  }
};

TEST_F(ModuleLoaderTest, LoadsEveryImageAndTakesEachEntryFromItsOwn) {
  const int loaded = Fake().loaded(), found = Fake().found();
  {
    absl::StatusOr<std::unique_ptr<KernelModule>> module =
        KernelModule::LoadOnOrdinal(Module(), kSparseMlaEntryParams, 0);
    ASSERT_TRUE(module.ok()) << module.status();
    EXPECT_EQ(Fake().loaded() - loaded, 3);
    EXPECT_EQ(Fake().live(), 3);
    // The stand-in finds a kernel only in an image that holds it.
    EXPECT_EQ(Fake().found() - found, Module().entries_size());
    ASSERT_EQ((*module)->entries().size(), static_cast<size_t>(Module().entries_size()));
    for (const v1::KernelEntry& e : Module().entries()) {
      EXPECT_TRUE((*module)->Entry(e.name()).ok()) << e.name();
    }
    EXPECT_TRUE((*module)->LoadIntoCurrentContext().ok());
  }
  EXPECT_EQ(Fake().live(), 0);
}

TEST_F(ModuleLoaderTest, AWrongRouteIsAnErrorAndLeavesNothingLoaded) {
  // The small-batch entries said to be in image 0, which does not hold them.
  v1::KernelArtifact wrong = Module();
  for (v1::KernelResources& k : *wrong.mutable_cubin_info()->mutable_kernels()) {
    if (k.image() == 1) k.set_image(0);
  }
  absl::StatusOr<std::unique_ptr<KernelModule>> module =
      KernelModule::LoadOnOrdinal(wrong, kSparseMlaEntryParams, 0);
  ASSERT_FALSE(module.ok());
  EXPECT_TRUE(absl::StrContains(module.status().message(), "cuLibraryGetKernel("))
      << module.status();
  EXPECT_TRUE(absl::StrContains(module.status().message(), wrong.small_batch().entry()) ||
              absl::StrContains(module.status().message(), wrong.small_batch().cluster_entry()))
      << module.status();
  EXPECT_EQ(Fake().live(), 0);

  // An image past the last.
  wrong = Module();
  wrong.mutable_cubin_info()->mutable_kernels(0)->set_image(3);
  module = KernelModule::LoadOnOrdinal(wrong, kSparseMlaEntryParams, 0);
  ASSERT_FALSE(module.ok());
  EXPECT_EQ(module.status().code(), absl::StatusCode::kDataLoss) << module.status();
  EXPECT_TRUE(absl::StrContains(module.status().message(), "image 3 of 3")) << module.status();
  EXPECT_EQ(Fake().live(), 0);

  // A further image missing its bytes: refused before the driver is asked.
  wrong = Module();
  wrong.set_more_cubins(1, "");
  const int loaded = Fake().loaded();
  module = KernelModule::LoadOnOrdinal(wrong, kSparseMlaEntryParams, 0);
  ASSERT_FALSE(module.ok());
  EXPECT_EQ(module.status().code(), absl::StatusCode::kInvalidArgument) << module.status();
  EXPECT_TRUE(absl::StrContains(module.status().message(), "no cubin for image 2"))
      << module.status();
  EXPECT_EQ(Fake().loaded(), loaded);
}

}  // namespace
}  // namespace kforge
