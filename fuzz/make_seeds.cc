// Writes the binary seed inputs of the fuzz targets from a bundle that
// `kforge prebuild` wrote (fuzz/make_seeds.sh): usage
//   kforge_fuzz_make_seeds BUNDLE_DIR CORPUS_DIR
// CORPUS_DIR/<target>/ gets, for the first manifest of the bundle and its
// first-choice kernel:
//   bundle/      the whole bundle as an archive, and the same without its
//                checksum list (the harness writes one) and with derived names
//   cubin/       the kernel's cubin
//   disk_cache/  the kernel's entry file as DiskCache writes it, and the
//                artifact in Put mode
//   cache_entry/ its entry sealed with the fuzz fleet key (resealed by the
//                harness, and an unsigned bundle's for a reader that refuses
//                them) and unsealed
//   request/     GetKernelRequests for the kernel's spec on its arch, for
//                its preset, and lookup_only
// Spec and matrix seeds are text, written by hand.

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/io.h"
#include "bundle/bundle.h"
#include "fuzz/fuzz_support.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/service.pb.h"
#include "model/artifact_check.h"
#include "model/format.h"
#include "model/selector.h"
#include "model/spec.h"
#include "service/cache_entry.h"
#include "service/disk_cache.h"

namespace {

namespace fs = std::filesystem;
using kforge::fuzz::BundleArchive;
using kforge::fuzz::BundleEntry;
using kforge::fuzz::BundleEntryKind;
using kforge::fuzz::Fail;

std::string ReadOrDie(const std::string& path) {
  absl::StatusOr<std::string> data = kforge::ReadFile(path, kforge::kMaxArtifactFileBytes);
  if (!data.ok()) Fail(data.status().ToString());
  return *std::move(data);
}

void Write(const std::string& dir, const std::string& name, const std::string& bytes) {
  kforge::fuzz::WriteFileOrDie(absl::StrCat(dir, "/", name), bytes);
  std::printf("%s/%s (%zu bytes)\n", dir.c_str(), name.c_str(), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s BUNDLE_DIR CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::string bundle = argv[1];
  const std::string out = argv[2];
  absl::StatusOr<std::unique_ptr<kforge::BundleSource>> source = kforge::BundleSource::Open(bundle);
  if (!source.ok()) Fail(source.status().ToString());
  if ((*source)->manifests().empty()) Fail("the bundle has no manifest");
  const kforge::v1::Manifest& manifest = (*source)->manifests().front();
  const kforge::v1::ManifestVariant& variant = kforge::FirstChoice(manifest);
  absl::StatusOr<kforge::ArtifactRef> kernel = (*source)->GetKernel(variant, manifest.arch());
  if (!kernel.ok()) Fail(kernel.status().ToString());
  const kforge::v1::KernelArtifact& artifact = **kernel;

  // bundle/
  const std::string manifest_json =
      ReadOrDie(absl::StrCat(bundle, "/", *kforge::BundleManifestPath(manifest)));
  const std::string kernel_bytes =
      ReadOrDie(absl::StrCat(bundle, "/", kforge::BundleKernelPath(variant.key())));
  const std::string marker = ReadOrDie(absl::StrCat(bundle, "/", kforge::kBundleMarkerFile));
  BundleArchive whole;
  whole.entries = {
      {BundleEntryKind::kMarker, "", marker},
      {BundleEntryKind::kManifest, variant.module_name(), manifest_json},
      {BundleEntryKind::kKernel, variant.key(), kernel_bytes},
      {BundleEntryKind::kChecksums, "",
       ReadOrDie(absl::StrCat(bundle, "/", kforge::kBundleChecksumsFile))},
  };
  BundleArchive derived;
  derived.write_checksums = true;
  derived.entries = {
      {BundleEntryKind::kMarker, "", marker},
      {BundleEntryKind::kManifest, "", manifest_json},
      {BundleEntryKind::kKernel, "", kernel_bytes},
  };
  Write(out + "/bundle", "seed_bundle", kforge::fuzz::EncodeBundleArchive(whole));
  Write(out + "/bundle", "seed_bundle_derived_names", kforge::fuzz::EncodeBundleArchive(derived));

  // cubin/
  Write(out + "/cubin", absl::StrCat("seed_", artifact.arch()), artifact.cubin());

  // disk_cache/: the entry of the fuzz key, as DiskCache writes it.
  kforge::v1::KernelArtifact keyed = artifact;
  keyed.set_key(kforge::fuzz::kDiskFuzzKey);
  std::error_code ec;
  const fs::path scratch = fs::temp_directory_path(ec) / "kforge-make-seeds-cache";
  fs::remove_all(scratch, ec);
  absl::StatusOr<std::unique_ptr<kforge::DiskCache>> cache =
      kforge::DiskCache::Open(scratch.string(), uint64_t{1} << 40);
  if (!cache.ok()) Fail(cache.status().ToString());
  if (absl::Status s =
          (*cache)->Put(keyed.key(), std::make_shared<const kforge::v1::KernelArtifact>(keyed));
      !s.ok()) {
    Fail(s.ToString());
  }
  // Mode byte 0: the entry file as is.
  Write(out + "/disk_cache", "seed_entry",
        absl::StrCat(std::string(1, '\0'), ReadOrDie((*cache)->EntryPath(keyed.key()))));
  fs::remove_all(scratch, ec);
  Write(out + "/disk_cache", "seed_put",
        absl::StrCat(std::string(1, static_cast<char>(kforge::fuzz::kDiskModePut)),
                     artifact.SerializeAsString()));

  // cache_entry/: mode byte (fuzz_support.h), then the entry.
  fs::create_directories(out + "/cache_entry", ec);
  kforge::EntryTrust sealed;
  sealed.fleet_key = kforge::fuzz::kEntryFuzzFleetKey;
  struct EntrySeed {
    const char* name;
    uint8_t mode;
    kforge::EntryOrigin origin;
    bool seal;
  };
  for (const EntrySeed& seed : {
           EntrySeed{"seed_sealed_resealed",
                     kforge::fuzz::kEntryFuzzKeyed | kforge::fuzz::kEntryFuzzReseal,
                     kforge::EntryOrigin::kSignedBundle, true},
           EntrySeed{"seed_unsigned_bundle_signed_only",
                     kforge::fuzz::kEntryFuzzKeyed | kforge::fuzz::kEntryFuzzSignedOnly,
                     kforge::EntryOrigin::kUnsignedBundle, true},
           EntrySeed{"seed_unsealed", 0, kforge::EntryOrigin::kCompiled, false},
       }) {
    absl::StatusOr<std::string> entry =
        kforge::EncodeCacheEntry(keyed, seed.origin, seed.seal ? sealed : kforge::EntryTrust{});
    if (!entry.ok()) Fail(entry.status().ToString());
    Write(out + "/cache_entry", seed.name,
          absl::StrCat(std::string(1, static_cast<char>(seed.mode)), *entry));
  }

  // request/
  kforge::v1::GetKernelRequest by_spec;
  *by_spec.mutable_kernel()->mutable_spec() = variant.spec();
  by_spec.set_arch(manifest.arch());
  Write(out + "/request", "seed_spec", by_spec.SerializeAsString());
  kforge::v1::GetKernelRequest lookup = by_spec;
  lookup.set_lookup_only(true);
  Write(out + "/request", "seed_spec_lookup_only", lookup.SerializeAsString());
  kforge::v1::GetKernelRequest by_preset;
  by_preset.mutable_kernel()->mutable_preset()->set_name("glm-5");
  by_preset.mutable_kernel()->mutable_preset()->set_tensor_parallel(8);
  by_preset.mutable_kernel()->mutable_preset()->set_kv_cache_dtype(
      kforge::v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  by_preset.set_arch("sm_100a");
  Write(out + "/request", "seed_preset", by_preset.SerializeAsString());

  // answer/
  kforge::v1::GetKernelResponse response;
  *response.mutable_artifact() = artifact;
  response.set_source(kforge::v1::ARTIFACT_SOURCE_COMPILED);
  Write(out + "/answer", "seed_answer",
        kforge::fuzz::EncodeServerAnswer(
            {manifest.SerializeAsString(), response.SerializeAsString()}));
  // A first answer of the same kernel (KernelArtifact.partial): the images
  // holding the main and combine entries, the launch less the paths the
  // others serve (FirstAnswerVariant).
  {
    kforge::v1::KernelArtifact partial = artifact;
    const std::vector<const std::string*> wanted = kforge::FirstAnswerEntries(variant);
    std::vector<uint32_t> keep;
    for (const kforge::v1::KernelResources& k : artifact.cubin_info().kernels()) {
      const bool held = std::any_of(wanted.begin(), wanted.end(),
                                    [&](const std::string* w) { return *w == k.name(); });
      if (held && std::find(keep.begin(), keep.end(), k.image()) == keep.end()) {
        keep.push_back(k.image());
      }
    }
    std::sort(keep.begin(), keep.end());
    partial.clear_more_cubins();
    partial.mutable_cubin_info()->clear_kernels();
    std::vector<std::string> present;
    for (size_t i = 0; i < keep.size(); ++i) {
      if (i == 0) {
        partial.set_cubin(kforge::ImageOf(artifact, keep[i]));
      } else {
        partial.add_more_cubins(kforge::ImageOf(artifact, keep[i]));
      }
      for (const kforge::v1::KernelResources& k : artifact.cubin_info().kernels()) {
        if (k.image() != keep[i]) continue;
        kforge::v1::KernelResources* copy = partial.mutable_cubin_info()->add_kernels();
        *copy = k;
        copy->set_image(static_cast<uint32_t>(i));
        present.push_back(k.name());
      }
    }
    const kforge::v1::ManifestVariant first =
        kforge::FirstAnswerVariant(kforge::VariantOfArtifact(artifact), present);
    partial.clear_small_batch();
    partial.clear_cluster();
    if (first.has_small_batch()) *partial.mutable_small_batch() = first.small_batch();
    if (first.has_cluster()) *partial.mutable_cluster() = first.cluster();
    *partial.mutable_entries() = first.entries();
    partial.set_partial(true);
    if (!kforge::CheckAnswerForVariant(variant, manifest.arch(), partial, true).ok()) {
      Fail("the first-answer seed does not pass the client's check");
    }
    kforge::v1::GetKernelResponse first_response = response;
    *first_response.mutable_artifact() = std::move(partial);
    Write(out + "/answer", "seed_answer_first",
          kforge::fuzz::EncodeServerAnswer(
              {manifest.SerializeAsString(), first_response.SerializeAsString()}));
  }
  response.mutable_artifact()->set_module_name("../../x");
  Write(out + "/answer", "seed_answer_escaping_name",
        kforge::fuzz::EncodeServerAnswer(
            {manifest.SerializeAsString(), response.SerializeAsString()}));
  return 0;
}
