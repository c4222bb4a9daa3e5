// The disk-cache entry decoder (service/disk_cache.h), through DiskCache's
// own Get and Put on a scratch directory; the input layout is in
// fuzz_support.h. Beyond no crash, UB or leak, DiskCache's contract:
//   - an entry file that does not decode is removed and never served (Get
//     answers NotFound and the file is gone);
//   - an entry that decodes holds the key asked for, and Put of what Get
//     served, then Get, serves the same artifact (byte for byte);
//   - an artifact Put under a key is served back the same by Get.

#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_support.h"
#include "kforge/v1/artifact.pb.h"
#include "service/disk_cache.h"

namespace {

using kforge::fuzz::Check;
using kforge::fuzz::kDiskFuzzKey;

kforge::DiskCache& Cache() {
  static kforge::DiskCache* const cache = [] {
    absl::StatusOr<std::unique_ptr<kforge::DiskCache>> opened =
        kforge::DiskCache::Open(kforge::fuzz::ScratchDir(), uint64_t{1} << 40);
    Check(opened.ok(), absl::StrCat("DiskCache::Open: ", opened.status().ToString()));
    return opened->release();
  }();
  return *cache;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Put `artifact` under the fuzz key, then Get: an equal artifact.
void CheckPutGet(const kforge::v1::KernelArtifact& artifact) {
  kforge::DiskCache& cache = Cache();
  absl::Status put =
      cache.Put(kDiskFuzzKey, std::make_shared<const kforge::v1::KernelArtifact>(artifact));
  Check(put.ok(), absl::StrCat("Put: ", put.ToString()));
  absl::StatusOr<kforge::ArtifactPtr> got = cache.Get(kDiskFuzzKey);
  Check(got.ok(), absl::StrCat("Get after Put: ", got.status().ToString()));
  // Byte for byte: the artifact has no map fields, so its serialization is
  // deterministic, and a NaN (compile_seconds can hold one) must come back
  // as the same NaN.
  Check((*got)->SerializeAsString() == artifact.SerializeAsString(),
        "Get after Put serves another artifact");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  kforge::DiskCache& cache = Cache();
  const std::string path = cache.EntryPath(kDiskFuzzKey);
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);

  if ((data[0] & kforge::fuzz::kDiskModePut) != 0) {
    kforge::v1::KernelArtifact artifact;
    if (!artifact.ParseFromArray(rest.data(), static_cast<int>(rest.size()))) return 0;
    artifact.set_key(kDiskFuzzKey);
    CheckPutGet(artifact);
    return 0;
  }

  kforge::fuzz::WriteFileOrDie(path, rest);
  absl::StatusOr<kforge::ArtifactPtr> got = cache.Get(kDiskFuzzKey);
  if (!got.ok()) {
    Check(absl::IsNotFound(got.status()),
          absl::StrCat("Get of a damaged entry: ", got.status().ToString()));
    Check(!Exists(path), "a damaged entry was left in place");
    return 0;
  }
  Check((*got)->key() == kDiskFuzzKey,
        absl::StrCat("entry for ", kDiskFuzzKey, " served key ", (*got)->key()));
  CheckPutGet(**got);
  return 0;
}
