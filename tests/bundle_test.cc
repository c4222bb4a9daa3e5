// Bundle directories (runtime/bundle.h) and CheckArtifactForVariant, with a
// real kernel: glm-5 at TP 8 on sm_90a, compiled once for the suite (about
// a second with NVRTC, no GPU needed).
#include "bundle/bundle.h"

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/ed25519.h"
#include "base/io.h"
#include "bundle/kernel_source.h"
#include "compiler/key.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "model/artifact_check.h"
#include "model/format.h"
#include "model/indexer_spec.h"
#include "model/spec.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using ::google::protobuf::util::MessageDifferencer;
using ::kforge::testing::Contains;
using ::kforge::testing::Glm5Selector;
using ::kforge::testing::ReadFileOrEmpty;
using ::kforge::testing::TempDir;

constexpr char kArch[] = "sm_90a";

// Every problem as "path: message", one a line, for failure messages and
// substring checks.
std::string Describe(const std::vector<BundleProblem>& problems) {
  std::string text;
  for (const BundleProblem& p : problems) absl::StrAppend(&text, p.path, ": ", p.message, "\n");
  return text;
}

// Problems about `path` whose message contains `needle`.
int CountProblems(const std::vector<BundleProblem>& problems, const std::string& path,
                  const std::string& needle) {
  int n = 0;
  for (const BundleProblem& p : problems) {
    if (p.path == path && absl::StrContains(p.message, needle)) ++n;
  }
  return n;
}

void FlipByte(const fs::path& path, size_t offset) {
  std::string bytes = ReadFileOrEmpty(path);
  ASSERT_LT(offset, bytes.size()) << path;
  bytes[offset] ^= 0x5a;
  ASSERT_TRUE(WriteFileAtomic(path.string(), bytes).ok());
}

class BundleTest : public ::testing::Test {
 protected:
  // A four-variant manifest and the first choice's kernel. Real manifests
  // have one variant today; three more planned (not compiled) variants for
  // other page sizes stand for kernels a bundle may lack.
  static void SetUpTestSuite() {
    absl::StatusOr<testing::CompiledFirstChoice> compiled = testing::CompileGlm5Tp8(kArch);
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    full_manifest_ = new v1::Manifest(std::move(compiled->manifest));
    for (uint32_t page : {1u, 16u, 32u}) {
      v1::AttentionSpec spec = full_manifest_->variants(0).spec().sparse_mla_decode();
      spec.set_page_block_size(page);
      absl::StatusOr<v1::Manifest> other =
          BuildManifest(KernelCompiler(), KernelSpecOf(spec), kArch);
      ASSERT_TRUE(other.ok()) << other.status();
      full_manifest_->add_choice_order(full_manifest_->variants_size());
      *full_manifest_->add_variants() = other->variants(0);
    }
    artifact_ = new v1::KernelArtifact(std::move(compiled->artifact));
  }
  static void TearDownTestSuite() {
    delete full_manifest_;
    delete artifact_;
  }

  void SetUp() override {
    ASSERT_NE(artifact_, nullptr) << "suite setup failed";
    ASSERT_EQ(FirstChoice().key(), artifact_->key());
  }

  static const v1::ManifestVariant& FirstChoice() {
    return full_manifest_->variants(full_manifest_->choice_order(0));
  }

  // The manifest cut down to the one variant compiled, so a bundle holding
  // it is complete.
  static v1::Manifest OneVariantManifest() {
    v1::Manifest manifest = *full_manifest_;
    manifest.clear_variants();
    manifest.clear_choice_order();
    *manifest.add_variants() = FirstChoice();
    manifest.add_choice_order(0);
    return manifest;
  }

  // A finished bundle in `dir` holding `manifest` and the compiled kernel.
  static void WriteBundle(const fs::path& dir, const v1::Manifest& manifest) {
    absl::StatusOr<std::unique_ptr<BundleWriter>> writer = BundleWriter::Open(dir.string());
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->AddKernel(*artifact_).ok());
    absl::Status s = (*writer)->AddManifest(manifest);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE((*writer)->Finish().ok());
  }

  std::string KernelFile() const { return BundleKernelPath(artifact_->key()); }
  std::string ManifestFile() const { return *BundleManifestPath(*full_manifest_); }

  static v1::Manifest* full_manifest_;
  static v1::KernelArtifact* artifact_;
  TempDir tmp_{"kforge_bundle_test"};
};

v1::Manifest* BundleTest::full_manifest_ = nullptr;
v1::KernelArtifact* BundleTest::artifact_ = nullptr;

TEST_F(BundleTest, RoundTripAnswersTheSameKernelAndManifest) {
  const fs::path dir = tmp_.path() / "bundle";
  const v1::Manifest manifest = OneVariantManifest();
  WriteBundle(dir, manifest);

  EXPECT_EQ(ReadFileOrEmpty(dir / kBundleMarkerFile),
            "{\"format\": \"kforge-bundle\", \"format_version\": 3}\n");
  EXPECT_EQ(ManifestFile(), absl::StrCat("manifests/", FirstChoice().module_name(), ".json"));
  // sha256sum's own format, sorted by path: `sha256sum -c` works in DIR.
  EXPECT_EQ(
      ReadFileOrEmpty(dir / kBundleChecksumsFile),
      absl::StrCat(Sha256Hex(ReadFileOrEmpty(dir / KernelFile())), "  ", KernelFile(), "\n",
                   Sha256Hex(ReadFileOrEmpty(dir / ManifestFile())), "  ", ManifestFile(), "\n"));
  EXPECT_EQ(Describe(VerifyBundle(dir.string())), "");

  absl::StatusOr<std::unique_ptr<BundleSource>> source = BundleSource::Open(dir.string());
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_EQ((*source)->manifests().size(), 1u);
  // A preset, its spec spelled out, and another arch spelling: one manifest.
  v1::KernelSelector by_spec;
  *by_spec.mutable_spec() = KernelSpecOf(*SpecFromPreset("glm-5", 8));
  for (const auto& [selector, arch] :
       {std::pair{Glm5Selector(8), "sm_90a"}, std::pair{by_spec, "90a"}}) {
    absl::StatusOr<v1::Manifest> got = (*source)->GetManifest(selector, arch);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(MessageDifferencer::Equals(*got, manifest)) << got->DebugString();
  }
  // The same preset with an fp8_ds_mla cache is another model: the bf16
  // manifest must not answer for it.
  v1::KernelSelector fp8 = Glm5Selector(8);
  fp8.mutable_preset()->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  EXPECT_EQ((*source)->GetManifest(fp8, kArch).status().code(), absl::StatusCode::kNotFound);

  absl::StatusOr<ArtifactRef> kernel = (*source)->GetKernel(FirstChoice(), kArch);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ((*kernel)->SerializeAsString(), artifact_->SerializeAsString());
  EXPECT_EQ((*kernel)->cubin(), artifact_->cubin());
  absl::StatusOr<ArtifactRef> again = (*source)->GetKernel(FirstChoice(), kArch);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), kernel->get()) << "second call should come from memory";
}

TEST_F(BundleTest, SameInputsGiveIdenticalBytes) {
  const fs::path a = tmp_.path() / "a", b = tmp_.path() / "b";
  WriteBundle(a, *full_manifest_);
  WriteBundle(b, *full_manifest_);
  const std::string manifest_bytes = ReadFileOrEmpty(a / ManifestFile());
  EXPECT_EQ(manifest_bytes, ReadFileOrEmpty(b / ManifestFile()));
  EXPECT_EQ(ReadFileOrEmpty(a / KernelFile()), ReadFileOrEmpty(b / KernelFile()));
  const std::string checksums = ReadFileOrEmpty(a / kBundleChecksumsFile);
  EXPECT_EQ(checksums, ReadFileOrEmpty(b / kBundleChecksumsFile));
  EXPECT_FALSE(checksums.empty());
  // Protobuf JSON, proto field names, zeros printed, newline-terminated.
  EXPECT_TRUE(absl::EndsWith(manifest_bytes, "}\n")) << manifest_bytes;
  EXPECT_TRUE(Contains(manifest_bytes, "\"choice_order\""));
}

TEST_F(BundleTest, VerifyReportsEveryProblemAtOnce) {
  const fs::path dir = tmp_.path() / "bundle";
  WriteBundle(dir, *full_manifest_);
  // One bundle, four faults: a damaged kernel, a listed file deleted, an
  // unlisted file added, and (from the start) three variants whose kernels
  // were never added.
  const std::string other_manifest = "manifests/other.json";
  ASSERT_TRUE(WriteFileAtomic((dir / other_manifest).string(), "{}").ok());
  {
    absl::StatusOr<std::unique_ptr<BundleWriter>> writer = BundleWriter::Open(dir.string());
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Finish().ok());
  }
  fs::remove(dir / other_manifest);
  FlipByte(dir / KernelFile(), ReadFileOrEmpty(dir / KernelFile()).size() / 2);
  ASSERT_TRUE(WriteFileAtomic((dir / "notes.txt").string(), "hello").ok());

  const std::vector<BundleProblem> problems = VerifyBundle(dir.string());
  const std::string report = Describe(problems);
  EXPECT_EQ(CountProblems(problems, KernelFile(), "sha256"), 1) << report;
  EXPECT_EQ(CountProblems(problems, other_manifest, "listed in checksums.sha256 but missing"), 1)
      << report;
  EXPECT_EQ(CountProblems(problems, "notes.txt", "not listed"), 1) << report;
  EXPECT_EQ(CountProblems(problems, ManifestFile(), "is missing"), 3) << report;
  EXPECT_EQ(CountProblems(problems, kBundleMarkerFile, ""), 0) << report;
}

TEST_F(BundleTest, VerifyChecksMarkerAndNamesAndVariants) {
  const fs::path dir = tmp_.path() / "bundle";
  WriteBundle(dir, OneVariantManifest());
  ASSERT_TRUE(WriteFileAtomic((dir / kBundleMarkerFile).string(),
                              "{\"format\": \"kforge-bundle\", \"format_version\": 7}\n")
                  .ok());
  // A kernel under another key's name, then listed so only the name is wrong.
  const std::string renamed = BundleKernelPath(std::string(64, 'a'));
  fs::copy_file(dir / KernelFile(), dir / renamed);
  fs::remove(dir / kBundleChecksumsFile);

  std::vector<BundleProblem> problems = VerifyBundle(dir.string());
  std::string report = Describe(problems);
  EXPECT_EQ(CountProblems(problems, kBundleMarkerFile, "format version 7"), 1) << report;
  EXPECT_EQ(CountProblems(problems, kBundleChecksumsFile, "cannot open"), 1) << report;
  EXPECT_EQ(CountProblems(problems, renamed, "holds key " + artifact_->key()), 1) << report;
  EXPECT_EQ(CountProblems(problems, ManifestFile(), "not listed"), 1) << report;

  fs::remove(dir / kBundleMarkerFile);
  problems = VerifyBundle(dir.string());
  report = Describe(problems);
  EXPECT_EQ(CountProblems(problems, kBundleMarkerFile, "not a kforge bundle"), 1) << report;
  EXPECT_EQ(Describe(VerifyBundle((tmp_.path() / "nothing").string())),
            absl::StrCat(".: ", (tmp_.path() / "nothing").string(), " is not a directory\n"));
}

TEST_F(BundleTest, VerifyRunsTheVariantCheckOnEachKernel) {
  const fs::path dir = tmp_.path() / "bundle";
  // A manifest whose variant names the kernel's key but another module:
  // the kernel is sound on its own and still not the variant's.
  v1::Manifest manifest = OneVariantManifest();
  manifest.mutable_variants(0)->set_main_entry("some_other_entry");
  WriteBundle(dir, manifest);
  const std::vector<BundleProblem> problems = VerifyBundle(dir.string());
  EXPECT_EQ(CountProblems(problems, ManifestFile(), "main_entry: expected \"some_other_entry\""), 1)
      << Describe(problems);
  EXPECT_EQ(problems.size(), 1u) << Describe(problems);
}

// Found by fuzz/bundle_fuzzer.cc (input kept in fuzz/corpus/bundle/): a
// manifest whose arch was spelled "90a" passed verify, and BundleSource,
// which looks manifests up by canonical arch and normalized spec, then never
// found it. The writer, verify and BundleSource now refuse such a manifest
// alike.
TEST_F(BundleTest, ManifestsNoLookupCanFindAreRefused) {
  v1::Manifest short_arch = OneVariantManifest();
  short_arch.set_arch("90a");
  v1::Manifest with_s_q = OneVariantManifest();
  with_s_q.mutable_variants(0)->mutable_spec()->mutable_sparse_mla_decode()->set_s_q(2);
  const std::pair<const v1::Manifest*, const char*> cases[] = {
      {&short_arch, "manifest arch: got \"90a\", supported its canonical name \"sm_90a\""},
      {&with_s_q, "manifest variants[0].spec: got {"}};
  for (const auto& [manifest, expected] : cases) {
    const fs::path dir = tmp_.path() / "bundle";
    fs::remove_all(dir);
    WriteBundle(dir, OneVariantManifest());
    {
      absl::StatusOr<std::unique_ptr<BundleWriter>> writer = BundleWriter::Open(dir.string());
      ASSERT_TRUE(writer.ok());
      absl::Status added = (*writer)->AddManifest(*manifest);
      EXPECT_EQ(added.code(), absl::StatusCode::kInvalidArgument) << added;
      EXPECT_TRUE(Contains(added.message(), expected)) << added;
    }
    // Planted as someone who recomputes the checksums would.
    std::string json;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(*manifest, &json).ok());
    ASSERT_TRUE(WriteFileAtomic((dir / ManifestFile()).string(), json).ok());
    {
      absl::StatusOr<std::unique_ptr<BundleWriter>> writer = BundleWriter::Open(dir.string());
      ASSERT_TRUE(writer.ok());
      ASSERT_TRUE((*writer)->Finish().ok());
    }
    const std::vector<BundleProblem> problems = VerifyBundle(dir.string());
    EXPECT_EQ(CountProblems(problems, ManifestFile(), expected), 1) << Describe(problems);
    absl::StatusOr<std::unique_ptr<BundleSource>> source = BundleSource::Open(dir.string());
    ASSERT_FALSE(source.ok());
    EXPECT_EQ(source.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(source.status().message(), expected)) << source.status();
  }
}

TEST_F(BundleTest, OpenRefusesAnotherFormatOrVersion) {
  const fs::path dir = tmp_.path() / "bundle";
  const std::pair<const char*, const char*> markers[] = {
      // A bundle written by kforge 0.1 (format 1, s_q in its kernels' keys).
      {"{\"format\": \"kforge-bundle\", \"format_version\": 1}\n",
       "bundle format version 1, this kforge reads versions 2..3 and writes version 3; rebuild"},
      {"{\"format\": \"kforge-bundle\", \"format_version\": 4}\n", "format version 4"},
      {"{\"format\": \"something-else\", \"format_version\": 1}\n", "\"something-else\""},
      {"not json", "not a kforge bundle marker"}};
  for (const auto& [marker, expected] : markers) {
    ASSERT_TRUE(WriteFileAtomic((dir / kBundleMarkerFile).string(), marker).ok());
    absl::StatusOr<std::unique_ptr<BundleWriter>> writer = BundleWriter::Open(dir.string());
    ASSERT_FALSE(writer.ok()) << marker;
    EXPECT_EQ(writer.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(writer.status().message(), expected));
    absl::StatusOr<std::unique_ptr<BundleSource>> source = BundleSource::Open(dir.string());
    ASSERT_FALSE(source.ok());
    EXPECT_TRUE(Contains(source.status().message(), expected));
  }
  // The marker is left alone: a refused Open writes nothing.
  EXPECT_EQ(ReadFileOrEmpty(dir / kBundleMarkerFile), "not json");

  absl::StatusOr<std::unique_ptr<BundleSource>> none =
      BundleSource::Open((tmp_.path() / "empty").string());
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(Contains(none.status().message(), "is not a kforge bundle"));
}

TEST_F(BundleTest, HasKernelTreatsDamagedFilesAsAbsent) {
  const fs::path dir = tmp_.path() / "bundle";
  absl::StatusOr<std::unique_ptr<BundleWriter>> opened = BundleWriter::Open(dir.string());
  ASSERT_TRUE(opened.ok()) << opened.status();
  BundleWriter& writer = **opened;
  EXPECT_FALSE(writer.HasKernel(artifact_->key()));
  ASSERT_TRUE(writer.AddKernel(*artifact_).ok());
  EXPECT_TRUE(writer.HasKernel(artifact_->key()));
  EXPECT_FALSE(writer.HasKernel("../" + artifact_->key()));

  const fs::path file = dir / KernelFile();
  const std::string whole = ReadFileOrEmpty(file);
  // Fields are written in number order and the params sizes, the
  // small-batch path, the cluster entry, the entries, the schedule's
  // reasons, the spec and the further cubin images come last, so cutting
  // exactly them off leaves a file that still parses.
  v1::KernelArtifact no_params = *artifact_;
  no_params.clear_params_bytes();
  no_params.clear_combine_params_bytes();
  no_params.clear_small_batch();
  no_params.clear_cluster();
  no_params.clear_entries();
  no_params.clear_schedule_reasons();
  no_params.clear_spec();
  no_params.clear_more_cubins();
  const size_t without_params = no_params.ByteSizeLong();
  ASSERT_LT(without_params, whole.size());
  ASSERT_TRUE(no_params.ParseFromString(whole.substr(0, without_params)));
  // Cut in the cubin; cut after it; garbage.
  for (const std::string& damaged : {whole.substr(0, whole.size() / 2),
                                     whole.substr(0, without_params), std::string("garbage")}) {
    ASSERT_TRUE(WriteFileAtomic(file.string(), damaged).ok());
    EXPECT_FALSE(writer.HasKernel(artifact_->key())) << damaged.size() << " bytes";
  }
  ASSERT_TRUE(writer.AddKernel(*artifact_).ok());
  EXPECT_TRUE(writer.HasKernel(artifact_->key()));
  EXPECT_EQ(ReadFileOrEmpty(file), whole);
}

TEST_F(BundleTest, WriterRefusesWhatItCannotStoreSafely) {
  absl::StatusOr<std::unique_ptr<BundleWriter>> writer =
      BundleWriter::Open((tmp_.path() / "bundle").string());
  ASSERT_TRUE(writer.ok());
  EXPECT_EQ((*writer)->AddManifest(v1::Manifest()).code(), absl::StatusCode::kInvalidArgument);

  v1::KernelArtifact escape = *artifact_;
  escape.set_key("../../etc/x");
  absl::Status s = (*writer)->AddKernel(escape);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "../../etc/x"));
  v1::KernelArtifact empty = *artifact_;
  empty.clear_cubin();
  s = (*writer)->AddKernel(empty);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "cubin"));
}

TEST_F(BundleTest, FinishDropsTemporariesOfAKilledWriter) {
  const fs::path dir = tmp_.path() / "bundle";
  ASSERT_TRUE(WriteFileAtomic((dir / "kernels" / "x.kfa.tmp.AbC123").string(), "half").ok());
  WriteBundle(dir, OneVariantManifest());
  EXPECT_FALSE(fs::exists(dir / "kernels" / "x.kfa.tmp.AbC123"));
  EXPECT_EQ(Describe(VerifyBundle(dir.string())), "");
}

// One prebuild per directory at a time; writers that lock per write (a
// client's local copy) wait for it, and share the directory among
// themselves. The lock is on the directory: nothing extra in the bundle.
TEST_F(BundleTest, WritersOnOneDirectoryAreKeptApart) {
  const fs::path dir = tmp_.path() / "bundle";
  absl::StatusOr<std::unique_ptr<BundleWriter>> prebuild = BundleWriter::Open(dir.string());
  ASSERT_TRUE(prebuild.ok()) << prebuild.status();
  absl::StatusOr<std::unique_ptr<BundleWriter>> second = BundleWriter::Open(dir.string());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(second.status().message(), dir.string())) << second.status();
  EXPECT_TRUE(Contains(second.status().message(), "another kforge process"));

  std::atomic<bool> copied{false};
  std::thread local_copy([&] {
    absl::StatusOr<std::unique_ptr<BundleWriter>> w =
        BundleWriter::Open(dir.string(), BundleLocking::kPerWrite);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->AddKernel(*artifact_).ok());
    ASSERT_TRUE((*w)->Finish().ok());
    copied = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(copied) << "a per-write writer got in while a prebuild held the directory";
  prebuild->reset();  // the prebuild ends: its lock goes with its descriptor
  local_copy.join();
  EXPECT_TRUE(copied);

  absl::StatusOr<std::unique_ptr<BundleWriter>> a =
      BundleWriter::Open(dir.string(), BundleLocking::kPerWrite);
  absl::StatusOr<std::unique_ptr<BundleWriter>> b =
      BundleWriter::Open(dir.string(), BundleLocking::kPerWrite);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->AddManifest(OneVariantManifest()).ok());
  ASSERT_TRUE((*b)->Finish().ok());
  EXPECT_EQ(Describe(VerifyBundle(dir.string())), "");
}

TEST_F(BundleTest, SourceRefusesKernelsTheChecksumsDoNotVouchFor) {
  const fs::path dir = tmp_.path() / "bundle";
  WriteBundle(dir, OneVariantManifest());
  const std::string path = (dir / KernelFile()).string();
  // A changed compile time: the kernel is still sound and still the
  // variant's, only the checksum can tell.
  v1::KernelArtifact altered = *artifact_;
  altered.set_compile_seconds(artifact_->compile_seconds() + 1);
  ASSERT_TRUE(WriteFileAtomic(path, altered.SerializeAsString()).ok());
  ASSERT_TRUE(CheckArtifactForVariant(FirstChoice(), kArch, altered).ok());
  absl::StatusOr<std::unique_ptr<BundleSource>> source = BundleSource::Open(dir.string());
  ASSERT_TRUE(source.ok()) << source.status();
  absl::StatusOr<ArtifactRef> kernel = (*source)->GetKernel(FirstChoice(), kArch);
  ASSERT_FALSE(kernel.ok());
  EXPECT_EQ(kernel.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(kernel.status().message(), path));
  EXPECT_TRUE(Contains(kernel.status().message(), "kforge verify"));

  // Unlisted (added after Finish) is refused too; absent and unlisted is
  // simply not there.
  fs::remove(dir / kBundleChecksumsFile);
  {
    absl::StatusOr<std::unique_ptr<BundleWriter>> writer = BundleWriter::Open(dir.string());
    ASSERT_TRUE(writer.ok());
    fs::remove(path);
    ASSERT_TRUE((*writer)->AddManifest(OneVariantManifest()).ok());
    ASSERT_TRUE((*writer)->Finish().ok());
    ASSERT_TRUE((*writer)->AddKernel(*artifact_).ok());
  }
  source = BundleSource::Open(dir.string());
  ASSERT_TRUE(source.ok()) << source.status();
  kernel = (*source)->GetKernel(FirstChoice(), kArch);
  EXPECT_EQ(kernel.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(kernel.status().message(), "is not listed in checksums.sha256"));
  kernel = (*source)->GetKernel(full_manifest_->variants(1), kArch);
  EXPECT_EQ(kernel.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      Contains(kernel.status().message(), BundleKernelPath(full_manifest_->variants(1).key())));
}

// A bundle signed with Sign opens with its public key as trust key; one
// without a signature, with a signature by another key, or whose checksum
// list changed after signing (a planted kernel with recomputed sums) is
// refused by BundleSource::Open and reported by VerifyBundle.
TEST_F(BundleTest, TrustKeyRefusesUnsignedAndMisSignedBundles) {
  const fs::path dir = tmp_.path() / "signed";
  WriteBundle(dir, OneVariantManifest());
  absl::StatusOr<Ed25519KeyPair> signer = GenerateEd25519KeyPair();
  absl::StatusOr<Ed25519KeyPair> other = GenerateEd25519KeyPair();
  ASSERT_TRUE(signer.ok() && other.ok());
  const std::string signer_pub = (tmp_.path() / "signer.pub").string();
  const std::string other_pub = (tmp_.path() / "other.pub").string();
  ASSERT_TRUE(WriteFileAtomic(signer_pub, signer->public_pem).ok());
  ASSERT_TRUE(WriteFileAtomic(other_pub, other->public_pem).ok());

  // Unsigned: fine without a trust key, refused with one.
  EXPECT_TRUE(BundleSource::Open(dir.string()).ok());
  absl::StatusOr<std::unique_ptr<BundleSource>> source =
      BundleSource::Open(dir.string(), signer_pub);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Contains(source.status().message(), "is not signed")) << source.status();
  EXPECT_EQ(
      CountProblems(VerifyBundle(dir.string(), signer_pub), kBundleSignatureFile, "is not signed"),
      1);

  {
    absl::StatusOr<std::unique_ptr<BundleWriter>> writer = BundleWriter::Open(dir.string());
    ASSERT_TRUE(writer.ok());
    EXPECT_EQ((*writer)->Sign(signer->public_pem).code(), absl::StatusCode::kInvalidArgument)
        << "a public key cannot sign";
    ASSERT_TRUE((*writer)->Sign(signer->private_pem).ok());
  }
  EXPECT_EQ(ReadFileOrEmpty(dir / kBundleSignatureFile).size(), kEd25519SignatureBytes);
  source = BundleSource::Open(dir.string(), signer_pub);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE((*source)->GetKernel(FirstChoice(), kArch).ok());
  EXPECT_EQ(Describe(VerifyBundle(dir.string(), signer_pub)), "");
  EXPECT_EQ(Describe(VerifyBundle(dir.string())), "") << "the signature file is not unlisted";

  source = BundleSource::Open(dir.string(), other_pub);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Contains(source.status().message(), "is not a signature")) << source.status();
  // A key file that is not a public key is the caller's mistake, named.
  source = BundleSource::Open(dir.string(), (dir / kBundleChecksumsFile).string());
  EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(source.status().message(), "trust key")) << source.status();

  // A planted kernel with a recomputed checksum list.
  const fs::path kernel = dir / KernelFile();
  FlipByte(kernel, ReadFileOrEmpty(kernel).size() / 2);
  const std::string sums =
      absl::StrCat(Sha256Hex(ReadFileOrEmpty(kernel)), "  ", KernelFile(), "\n",
                   Sha256Hex(ReadFileOrEmpty(dir / ManifestFile())), "  ", ManifestFile(), "\n");
  ASSERT_TRUE(WriteFileAtomic((dir / kBundleChecksumsFile).string(), sums).ok());
  source = BundleSource::Open(dir.string(), signer_pub);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Contains(source.status().message(), "is not a signature")) << source.status();
  EXPECT_EQ(CountProblems(VerifyBundle(dir.string(), signer_pub), kBundleSignatureFile,
                          "is not a signature"),
            1);

  // Finish rewrites the list: the stale signature goes with the old list.
  {
    absl::StatusOr<std::unique_ptr<BundleWriter>> writer = BundleWriter::Open(dir.string());
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Finish().ok());
  }
  EXPECT_FALSE(fs::exists(dir / kBundleSignatureFile));
}

// Issue 43 finding 8: an older bundle signed by the same key was accepted.
// The sequence in release.json is covered by the signature; a minimum
// refuses a lower one, a missing one and a format 2 bundle (no sequence).
TEST_F(BundleTest, MinimumSequenceRefusesAnOlderSignedBundle) {
  absl::StatusOr<Ed25519KeyPair> signer = GenerateEd25519KeyPair();
  ASSERT_TRUE(signer.ok());
  const std::string pub = (tmp_.path() / "signer.pub").string();
  ASSERT_TRUE(WriteFileAtomic(pub, signer->public_pem).ok());
  // A signed bundle with `sequence` (0: none).
  auto signed_bundle = [&](const std::string& name, uint64_t sequence) {
    const fs::path dir = tmp_.path() / name;
    WriteBundle(dir, OneVariantManifest());
    absl::StatusOr<std::unique_ptr<BundleWriter>> writer = BundleWriter::Open(dir.string());
    EXPECT_TRUE(writer.ok());
    if (sequence > 0) {
      EXPECT_TRUE((*writer)->SetSequence(sequence).ok());
    }
    EXPECT_TRUE((*writer)->Finish().ok());
    EXPECT_TRUE((*writer)->Sign(signer->private_pem).ok());
    return dir.string();
  };
  const std::string current = signed_bundle("current", 5);
  const std::string older = signed_bundle("older", 4);
  const std::string none = signed_bundle("none", 0);
  EXPECT_TRUE(Contains(ReadFileOrEmpty(fs::path(current) / kBundleChecksumsFile),
                       absl::StrCat("  ", kBundleReleaseFile, "\n")))
      << "release.json is listed, so the signature covers it";

  absl::StatusOr<std::unique_ptr<BundleSource>> source = BundleSource::Open(current, pub, 5);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->sequence(), std::optional<uint64_t>(5));
  EXPECT_EQ(Describe(VerifyBundle(current, pub, 5)), "");

  source = BundleSource::Open(older, pub, 5);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(source.status().message(), "has sequence 4, below the required minimum 5"))
      << source.status();
  EXPECT_TRUE(Contains(source.status().message(), "rollback")) << source.status();
  EXPECT_EQ(CountProblems(VerifyBundle(older, pub, 5), kBundleReleaseFile, "below"), 1);
  // Without a minimum the older bundle is what it was: accepted.
  EXPECT_TRUE(BundleSource::Open(older, pub).ok());

  source = BundleSource::Open(none, pub, 1);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(source.status().message(), "has no sequence")) << source.status();

  // A format 2 bundle (written before release.json existed) still opens,
  // and has no sequence to meet a minimum with.
  ASSERT_TRUE(WriteFileAtomic((fs::path(none) / kBundleMarkerFile).string(),
                              "{\"format\": \"kforge-bundle\", \"format_version\": 2}\n")
                  .ok());
  source = BundleSource::Open(none, pub);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->sequence(), std::nullopt);
  EXPECT_EQ(Describe(VerifyBundle(none, pub)), "");
  EXPECT_TRUE(Contains(BundleSource::Open(none, pub, 1).status().message(), "has no sequence"));

  // A minimum without a trust key proves nothing and is refused.
  EXPECT_EQ(BundleSource::Open(current, "", 1).status().code(), absl::StatusCode::kInvalidArgument);

  // Raising the sequence of the older bundle breaks its signature.
  ASSERT_TRUE(
      WriteFileAtomic((fs::path(older) / kBundleReleaseFile).string(), "{\"sequence\": 9}\n").ok());
  const std::string sums = absl::StrCat(
      Sha256Hex(ReadFileOrEmpty(fs::path(older) / KernelFile())), "  ", KernelFile(), "\n",
      Sha256Hex(ReadFileOrEmpty(fs::path(older) / ManifestFile())), "  ", ManifestFile(), "\n",
      Sha256Hex(ReadFileOrEmpty(fs::path(older) / kBundleReleaseFile)), "  ", kBundleReleaseFile,
      "\n");
  ASSERT_TRUE(WriteFileAtomic((fs::path(older) / kBundleChecksumsFile).string(), sums).ok());
  source = BundleSource::Open(older, pub, 5);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kUnauthenticated) << source.status();
}

// A stray file or link that verify reports is named by UnlistedFiles, which
// a warming server refuses (issue 43 finding 10).
TEST_F(BundleTest, UnlistedFilesNamesStrayFilesAndLinks) {
  const fs::path dir = tmp_.path() / "bundle";
  WriteBundle(dir, OneVariantManifest());
  absl::StatusOr<std::unique_ptr<BundleSource>> source = BundleSource::Open(dir.string());
  ASSERT_TRUE(source.ok());
  EXPECT_TRUE((*source)->UnlistedFiles().empty());
  ASSERT_TRUE(WriteFileAtomic((dir / "kernels" / "stray.bin").string(), "x").ok());
  fs::create_symlink("/etc/passwd", dir / "manifests" / "linked.json");
  EXPECT_EQ((*source)->UnlistedFiles(),
            (std::vector<std::string>{"kernels/stray.bin", "manifests/linked.json"}));
}

TEST_F(BundleTest, SourceChecksTheKernelAgainstTheVariant) {
  const fs::path dir = tmp_.path() / "bundle";
  WriteBundle(dir, OneVariantManifest());
  absl::StatusOr<std::unique_ptr<BundleSource>> source = BundleSource::Open(dir.string());
  ASSERT_TRUE(source.ok());
  v1::ManifestVariant renamed = FirstChoice();
  renamed.set_module_name("sparse_mla_decode_something_else");
  absl::StatusOr<ArtifactRef> kernel = (*source)->GetKernel(renamed, kArch);
  EXPECT_EQ(kernel.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(kernel.status().message(), "module_name"));
  kernel = (*source)->GetKernel(FirstChoice(), "sm_120a");
  EXPECT_EQ(kernel.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(kernel.status().message(), "arch: expected \"sm_120a\", got \"sm_90a\""));
  // A refused answer is not kept: the right question still gets the kernel.
  EXPECT_TRUE((*source)->GetKernel(FirstChoice(), kArch).ok());
}

TEST_F(BundleTest, UnknownSpecNamesWhatTheBundleHolds) {
  const fs::path dir = tmp_.path() / "bundle";
  WriteBundle(dir, OneVariantManifest());
  absl::StatusOr<std::unique_ptr<BundleSource>> source = BundleSource::Open(dir.string());
  ASSERT_TRUE(source.ok());
  for (const auto& [selector, arch] :
       {std::pair{Glm5Selector(4), "sm_90a"}, std::pair{Glm5Selector(8), "sm_120a"}}) {
    absl::StatusOr<v1::Manifest> got = (*source)->GetManifest(selector, arch);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(Contains(got.status().message(),
                         absl::StrCat("it holds sm_90a: ", FirstChoice().module_name())));
    EXPECT_TRUE(Contains(got.status().message(), arch));
  }
  EXPECT_EQ((*source)->GetManifest(Glm5Selector(3), kArch).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*source)->GetManifest(Glm5Selector(8), "sm_42").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(BundleTest, PrefetchNamesTheVariantItCannotGet) {
  const fs::path dir = tmp_.path() / "bundle";
  WriteBundle(dir, *full_manifest_);
  absl::StatusOr<std::unique_ptr<BundleSource>> source = BundleSource::Open(dir.string());
  ASSERT_TRUE(source.ok());
  EXPECT_TRUE(PrefetchKernels(**source, OneVariantManifest(), kArch).ok());
  absl::Status s = PrefetchKernels(**source, *full_manifest_, kArch);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  const v1::ManifestVariant& missing =
      full_manifest_->variants(FirstChoice().key() == full_manifest_->variants(0).key() ? 1 : 0);
  EXPECT_TRUE(Contains(s.message(), absl::StrCat("prefetching ", missing.module_name())));
}

// CheckArtifactForVariant, one altered field at a time.
TEST_F(BundleTest, ArtifactCheckNamesTheFirstMismatch) {
  ASSERT_TRUE(CheckArtifactForVariant(FirstChoice(), kArch, *artifact_).ok());
  ASSERT_TRUE(CheckArtifactForVariant(FirstChoice(), "90a", *artifact_).ok());
  struct Case {
    const char* expected;
    std::function<void(v1::KernelArtifact&)> alter;
  };
  const Case cases[] = {
      {"key: expected", [](v1::KernelArtifact& a) { a.set_key(std::string(64, '0')); }},
      {"module_name: expected", [](v1::KernelArtifact& a) { a.set_module_name("x"); }},
      {"arch: expected \"sm_90a\", got \"sm_120a\"",
       [](v1::KernelArtifact& a) { a.set_arch("sm_120a"); }},
      {"main_entry", [](v1::KernelArtifact& a) { a.set_main_entry("other"); }},
      {"combine_entry", [](v1::KernelArtifact& a) { a.set_combine_entry("other"); }},
      {"params_bytes: expected", [](v1::KernelArtifact& a) { a.set_params_bytes(8); }},
      {"combine_params_bytes", [](v1::KernelArtifact& a) { a.set_combine_params_bytes(8); }},
      {"spec: expected",
       [](v1::KernelArtifact& a) { a.mutable_spec()->mutable_sparse_mla_decode()->set_topk(7); }},
      {"tiling: expected", [](v1::KernelArtifact& a) { a.mutable_tiling()->set_token_tile(8); }},
      {"launch: expected",
       [](v1::KernelArtifact& a) { a.mutable_launch()->set_block_threads(32); }},
      {"small_batch: expected",
       [](v1::KernelArtifact& a) { a.mutable_small_batch()->set_max_tokens(1000); }},
      {"small_batch: expected",
       [](v1::KernelArtifact& a) { a.mutable_small_batch()->set_entry("other"); }},
      {"cubin: expected \"non-empty\"", [](v1::KernelArtifact& a) { a.clear_cubin(); }},
      {"cubin is unreadable", [](v1::KernelArtifact& a) { a.set_cubin("not an ELF"); }},
      // The module's further images (compiler/unit.h): each one whole,
      // readable and of the arch, every entry in exactly one of them and
      // where cubin_info says, at most kMaxCubinImages of them.
      {"more_cubins[0] is unreadable",
       [](v1::KernelArtifact& a) { a.set_more_cubins(0, "not an ELF"); }},
      {"more_cubins[2]: expected \"non-empty\"",
       [](v1::KernelArtifact& a) { a.add_more_cubins(""); }},
      {"each entry in one image", [](v1::KernelArtifact& a) { a.add_more_cubins(a.cubin()); }},
      {"no such entry", [](v1::KernelArtifact& a) { a.mutable_more_cubins()->RemoveLast(); }},
      {"image: expected \"0\", got \"1\"",
       [](v1::KernelArtifact& a) { a.mutable_cubin()->swap(*a.mutable_more_cubins(0)); }},
      {"image: expected \"1\", got \"7\"",
       [](v1::KernelArtifact& a) {
         for (v1::KernelResources& k : *a.mutable_cubin_info()->mutable_kernels()) {
           if (k.image() == 1) k.set_image(7);
         }
       }},
      {"cubin images: expected \"at most 16\"",
       [](v1::KernelArtifact& a) {
         while (a.more_cubins_size() < 16) a.add_more_cubins(a.more_cubins(0));
       }},
      {"cubin size",
       [](v1::KernelArtifact& a) {
         a.mutable_more_cubins(0)->resize(kMaxCubinBytes - a.cubin().size() + 1);
       }},
  };
  ASSERT_EQ(artifact_->more_cubins_size(), 2);  // main + main_cluster, small + cluster, combine
  for (const Case& c : cases) {
    v1::KernelArtifact altered = *artifact_;
    c.alter(altered);
    absl::Status s = CheckArtifactForVariant(FirstChoice(), kArch, altered);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.expected;
    EXPECT_TRUE(Contains(s.message(), c.expected));
    EXPECT_TRUE(Contains(s.message(), FirstChoice().module_name()));
  }
  // Metadata that agrees but names a small-batch kernel the cubin lacks.
  ASSERT_FALSE(artifact_->small_batch().entry().empty());  // glm-5 TP8 on sm_90a has one
  v1::ManifestVariant variant = FirstChoice();
  v1::KernelArtifact altered = *artifact_;
  variant.mutable_small_batch()->set_entry("sparse_mla_decode_nope");
  altered.mutable_small_batch()->set_entry("sparse_mla_decode_nope");
  absl::Status s = CheckArtifactForVariant(variant, kArch, altered);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "cubin entries")) << s;
}

// The checks the server shares with the clients (it runs the same function
// on every kernel a cache tier hands it): the cubin holds exactly the
// entries the artifact names, for the arch asked for, within the size cap.
TEST_F(BundleTest, ArtifactCheckRefusesUnnamedEntriesOtherArchsAndOversizedCubins) {
  // Metadata that agrees, but leaves out the small-batch kernel the cubin
  // still exports: code nobody asked for.
  ASSERT_FALSE(artifact_->small_batch().entry().empty());
  v1::ManifestVariant variant = FirstChoice();
  v1::KernelArtifact altered = *artifact_;
  variant.clear_small_batch();
  altered.clear_small_batch();
  absl::Status s = CheckArtifactForVariant(variant, kArch, altered);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  // The small-batch entry or its cluster entry, whichever the cubin lists first.
  const std::string small = artifact_->small_batch().entry();
  const std::string small_cluster = artifact_->small_batch().cluster_entry();
  EXPECT_TRUE(Contains(s.message(), "got \"another entry " + small + "\"") ||
              Contains(s.message(), "got \"another entry " + small_cluster + "\""))
      << s;

  // Asked for another arch: the artifact says sm_90a.
  s = CheckArtifactForVariant(FirstChoice(), "sm_100a", *artifact_);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "arch: expected \"sm_100a\", got \"sm_90a\"")) << s;
  // Metadata relabelled to the arch asked for: the ELF still says sm_90a.
  altered = *artifact_;
  altered.set_arch("sm_100a");
  s = CheckArtifactForVariant(FirstChoice(), "sm_100a", altered);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "cubin arch: expected \"sm_100a\", got \"sm_90a\"")) << s;

  altered = *artifact_;
  altered.mutable_cubin()->resize(kMaxCubinBytes + 1);
  s = CheckArtifactForVariant(FirstChoice(), kArch, altered);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "cubin size")) << s;
}

// A DSA indexer module on sm_90a also exports its cluster top-k, which its
// artifact names in indexer.topk_cluster: exactly those three entries pass.
TEST(ArtifactCheckTest, AnIndexerModuleWithItsClusterTopkPasses) {
  absl::StatusOr<v1::DsaIndexerSpec> spec = IndexerSpecFromPreset("glm-5", 8);
  ASSERT_TRUE(spec.ok()) << spec.status();
  KernelCompiler compiler;
  absl::StatusOr<v1::Manifest> manifest = BuildManifest(compiler, KernelSpecOf(*spec), kArch);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  absl::StatusOr<v1::KernelArtifact> artifact = compiler.Compile(KernelSpecOf(*spec), kArch);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  ASSERT_FALSE(artifact->indexer().topk_cluster().entry().empty());
  EXPECT_TRUE(CheckArtifactForVariant(manifest->variants(0), kArch, *artifact).ok());
  // Named nowhere, the cluster top-k is an entry nobody asked for.
  v1::ManifestVariant variant = manifest->variants(0);
  v1::KernelArtifact altered = *artifact;
  variant.mutable_indexer()->clear_topk_cluster();
  altered.mutable_indexer()->clear_topk_cluster();
  const absl::Status s = CheckArtifactForVariant(variant, kArch, altered);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "another entry")) << s;
}

}  // namespace

// One name per source for the counters, `kforge get` and the load
// generator (each had its own spelling of a shared compile).
TEST(ArtifactSourceNameTest, NamesEverySourceAsTheCountersDo) {
  EXPECT_EQ(ArtifactSourceName(v1::ARTIFACT_SOURCE_MEMORY), "memory");
  EXPECT_EQ(ArtifactSourceName(v1::ARTIFACT_SOURCE_DISK), "disk");
  EXPECT_EQ(ArtifactSourceName(v1::ARTIFACT_SOURCE_COMPILED), "compiled");
  EXPECT_EQ(ArtifactSourceName(v1::ARTIFACT_SOURCE_SHARED_COMPILE), "shared_compile");
  EXPECT_EQ(ArtifactSourceName(v1::ARTIFACT_SOURCE_REDIS), "redis");
  EXPECT_EQ(ArtifactSourceName(v1::ARTIFACT_SOURCE_UNSPECIFIED), "unspecified");
  EXPECT_EQ(ArtifactSourceName(static_cast<v1::ArtifactSource>(99)), "unknown");
}

}  // namespace kforge
