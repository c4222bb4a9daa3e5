#include "bundle/bundle.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/absl_compat.h"
#include "base/credentials.h"
#include "base/ed25519.h"
#include "base/io.h"
#include "base/sha256.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/type_resolver.h"
#include "google/protobuf/util/type_resolver_util.h"
#include "model/arch.h"
#include "model/artifact_check.h"
#include "model/format.h"
#include "model/selector.h"
#include "model/spec.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;

constexpr char kFormatName[] = "kforge-bundle";
constexpr char kKernelsPrefix[] = "kernels/";
constexpr char kManifestsPrefix[] = "manifests/";
constexpr char kKernelSuffix[] = ".kfa";
constexpr char kManifestSuffix[] = ".json";
constexpr char kTypeUrlPrefix[] = "type.googleapis.com";

// The size cap of a bundle file by its kind (model/format.h).
uint64_t MaxBundleFileBytes(std::string_view relative) {
  if (relative == kBundleMarkerFile || relative == kBundleReleaseFile) return kMaxMarkerFileBytes;
  if (relative == kBundleChecksumsFile) return kMaxChecksumsFileBytes;
  if (absl::StartsWith(AsAbsl(relative), kManifestsPrefix)) return kMaxManifestFileBytes;
  return kMaxArtifactFileBytes;
}

std::string JoinPath(const std::string& dir, std::string_view relative) {
  return absl::StrCat(dir, "/", AsAbsl(relative));
}

std::string MarkerText() {
  return absl::StrCat("{\"format\": \"", kFormatName,
                      "\", \"format_version\": ", kBundleFormatVersion, "}\n");
}

// The format version of a marker of this format that this kforge reads;
// NotFound (naming the path) when there is none; FailedPrecondition for
// anything else.
absl::StatusOr<int> ReadMarkerVersion(const std::string& dir) {
  const std::string path = JoinPath(dir, kBundleMarkerFile);
  absl::StatusOr<std::string> text = ReadFile(path, kMaxMarkerFileBytes);
  if (!text.ok()) return text.status();
  google::protobuf::Struct marker;
  google::protobuf::util::Status parsed =
      google::protobuf::util::JsonStringToMessage(*text, &marker);
  if (!parsed.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": not a kforge bundle marker: ", std::string(parsed.message())));
  }
  const auto& fields = marker.fields();
  auto format = fields.find("format");
  const std::string got_format = format == fields.end() ? "" : format->second.string_value();
  if (got_format != kFormatName) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": format is \"", got_format,
                                                      "\", expected \"", kFormatName, "\": ", dir,
                                                      " is not a kforge bundle"));
  }
  auto version = fields.find("format_version");
  const double got_version = version == fields.end() ? 0 : version->second.number_value();
  if (got_version < kOldestReadableBundleFormatVersion || got_version > kBundleFormatVersion ||
      got_version != static_cast<int>(got_version)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": bundle format version ", got_version, ", this kforge reads versions ",
                     kOldestReadableBundleFormatVersion, "..", kBundleFormatVersion,
                     " and writes version ", kBundleFormatVersion,
                     "; rebuild the bundle with this kforge "
                     "(`kforge prebuild`) or use the kforge that wrote it"));
  }
  return static_cast<int>(got_version);
}

absl::Status CheckMarker(const std::string& dir) { return ReadMarkerVersion(dir).status(); }

// release.json: {"sequence": N}, N a whole number 1..2^53 (exact in the
// JSON number protobuf's Struct reads).
absl::StatusOr<uint64_t> ParseRelease(const std::string& json) {
  google::protobuf::Struct release;
  google::protobuf::util::Status parsed =
      google::protobuf::util::JsonStringToMessage(json, &release);
  auto field = release.fields().find("sequence");
  const double value = !parsed.ok() || field == release.fields().end() ||
                               field->second.kind_case() != google::protobuf::Value::kNumberValue
                           ? 0
                           : field->second.number_value();
  if (!(value >= 1 && value <= 9007199254740992.0) ||
      value != static_cast<double>(static_cast<uint64_t>(value))) {
    return absl::DataLossError(
        absl::StrCat(kBundleReleaseFile, ": expected {\"sequence\": N} with a whole N >= 1"));
  }
  return static_cast<uint64_t>(value);
}

// Protobuf's default serialization may order map entries differently from
// run to run; bundle files must not.
std::string SerializeDeterministic(const google::protobuf::Message& message) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return bytes;
}

// The manifest as indented JSON with proto field names and every field
// printed, zeros included (as `kforge manifest` prints it), ending in a
// newline. Printed from the
// deterministic binary form so map entries come out sorted by key.
std::string ManifestJson(const v1::Manifest& manifest) {
  static google::protobuf::util::TypeResolver* const resolver =
      google::protobuf::util::NewTypeResolverForDescriptorPool(
          kTypeUrlPrefix, google::protobuf::DescriptorPool::generated_pool());
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Printing a valid message with a resolver over its own pool cannot fail.
  (void)google::protobuf::util::BinaryToJsonString(
      resolver, absl::StrCat(kTypeUrlPrefix, "/", v1::Manifest::descriptor()->full_name()),
      SerializeDeterministic(manifest), &json, options);
  if (!absl::EndsWith(json, "\n")) json.push_back('\n');
  return json;
}

absl::StatusOr<v1::Manifest> ParseManifest(const std::string& json) {
  v1::Manifest manifest;
  google::protobuf::util::JsonParseOptions options;
  // Fields added later within format version 1 must not break older readers.
  options.ignore_unknown_fields = true;
  google::protobuf::util::Status s =
      google::protobuf::util::JsonStringToMessage(json, &manifest, options);
  if (!s.ok()) {
    return absl::DataLossError(absl::StrCat("not a manifest: ", std::string(s.message())));
  }
  return manifest;
}

absl::StatusOr<v1::KernelArtifact> ParseKernel(const std::string& bytes) {
  v1::KernelArtifact artifact;
  if (!artifact.ParseFromString(bytes)) {
    return absl::DataLossError("not a binary KernelArtifact (truncated or damaged)");
  }
  return artifact;
}

// The variant an artifact claims to be, to check an artifact on its own
// (truncated trailing fields, a damaged cubin) with CheckArtifactForVariant.
absl::Status CheckKernelOnItsOwn(const v1::KernelArtifact& artifact) {
  return CheckArtifactForVariant(VariantOfArtifact(artifact), artifact.arch(), artifact);
}

// Regular files and symbolic links under `dir` (links are listed so that
// the checks refuse them by their own path), as sorted paths relative to it
// with '/'. Relative lexically: fs::relative resolves links, and a report
// named a linked entry by its target ("../../../../etc/passwd").
std::vector<std::string> ListFiles(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_symlink(ec) || it->is_regular_file(ec)) {
      files.push_back(it->path().lexically_relative(dir).generic_string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

bool IsKernelPath(std::string_view path) {
  return absl::StartsWith(AsAbsl(path), kKernelsPrefix) &&
         absl::EndsWith(AsAbsl(path), kKernelSuffix);
}

bool IsManifestPath(std::string_view path) {
  return absl::StartsWith(AsAbsl(path), kManifestsPrefix) &&
         absl::EndsWith(AsAbsl(path), kManifestSuffix);
}

// "kernels/<key>.kfa" -> "<key>".
std::string KeyOfPath(std::string_view path) {
  path.remove_prefix(sizeof(kKernelsPrefix) - 1);
  path.remove_suffix(sizeof(kKernelSuffix) - 1);
  return std::string(path);
}

// A temporary of WriteFileAtomic ("<path>.tmp.XXXXXX") left by a killed
// writer.
bool IsStaleTemporary(std::string_view path) {
  const size_t at = path.rfind(".tmp.");
  return at != std::string_view::npos && path.size() == at + 5 + 6;
}

// checksums.sha256 as path -> hex sha256, and what was wrong with its lines.
struct ChecksumList {
  std::map<std::string, std::string> sha_by_path;
  std::vector<std::string> errors;
};

bool IsHexSha256(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// Lines as sha256sum writes them: "<hex>  <path>" (text) or "<hex> *<path>"
// (binary mode); paths relative, inside the bundle.
ChecksumList ParseChecksums(const std::string& text) {
  ChecksumList list;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ++line_number;
    const bool well_formed = line.size() > 66 && IsHexSha256({line.data(), 64}) &&
                             line[64] == ' ' && (line[65] == ' ' || line[65] == '*');
    const std::string path(line.substr(well_formed ? 66 : 0));
    if (!well_formed || path.front() == '/' ||
        absl::StrContains(absl::StrCat("/", path, "/"), "/../")) {
      list.errors.push_back(absl::StrCat("line ", line_number, ": got \"", line,
                                         "\", expected \"<sha256 hex>  <relative path>\""));
      continue;
    }
    if (!list.sha_by_path.emplace(path, std::string(line.substr(0, 64))).second) {
      list.errors.push_back(absl::StrCat("line ", line_number, ": ", path, " listed twice"));
    }
  }
  return list;
}

std::string VerifyHint(const std::string& dir) {
  return absl::StrCat("run `kforge verify ", dir, "` for the full report");
}

// A file of the bundle, checked against the checksum list. NotFound when it
// is neither listed nor present; DataLoss when it is present but not listed,
// listed but missing, or its bytes do not hash to the listed sum.
absl::StatusOr<std::string> ReadListedFile(const std::string& dir, const ChecksumList& checksums,
                                           const std::string& relative) {
  const std::string path = JoinPath(dir, relative);
  // The file itself is opened without following a link; no directory on
  // the way may be one either ("manifests" linked out of the bundle).
  for (size_t slash = relative.find('/'); slash != std::string::npos;
       slash = relative.find('/', slash + 1)) {
    struct stat st;
    const std::string parent = JoinPath(dir, relative.substr(0, slash));
    if (lstat(parent.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      return absl::DataLossError(absl::StrCat(parent, " is not a directory of the bundle (",
                                              S_ISLNK(st.st_mode) ? "a symbolic link" : "a file",
                                              "); ", VerifyHint(dir)));
    }
  }
  absl::StatusOr<std::string> data = ReadFile(path, MaxBundleFileBytes(relative));
  auto listed = checksums.sha_by_path.find(relative);
  if (listed == checksums.sha_by_path.end()) {
    if (absl::IsNotFound(data.status())) {
      return absl::NotFoundError(absl::StrCat("bundle ", dir, " has no ", relative));
    }
    return absl::DataLossError(
        absl::StrCat(path, " is not listed in ", kBundleChecksumsFile, "; ", VerifyHint(dir)));
  }
  if (!data.ok()) {
    return absl::DataLossError(absl::StrCat(path, " is listed in ", kBundleChecksumsFile,
                                            " but cannot be read (", data.status().message(), "); ",
                                            VerifyHint(dir)));
  }
  const std::string got = Sha256Hex(*data);
  if (got != listed->second) {
    return absl::DataLossError(absl::StrCat(path, ": sha256 ", got, ", ", kBundleChecksumsFile,
                                            " lists ", listed->second, ": the file is damaged; ",
                                            VerifyHint(dir)));
  }
  return data;
}

// What BundleSource::GetManifest needs to find a manifest at all: its arch
// spelled canonically and each variant's spec normalized, since lookups
// compare canonical arch names and normalized specs. A manifest without them
// would sit in a bundle, listed and checksummed, and never be served.
absl::Status CheckManifestCanBeFound(const v1::Manifest& manifest) {
  absl::StatusOr<Arch> arch = ParseArch(manifest.arch());
  if (!arch.ok())
    return absl::InvalidArgumentError(absl::StrCat("manifest ", arch.status().message()));
  if (arch->name != manifest.arch()) {
    return absl::InvalidArgumentError(absl::StrCat("manifest arch: got \"", manifest.arch(),
                                                   "\", supported its canonical name \"",
                                                   arch->name, "\""));
  }
  for (int i = 0; i < manifest.variants_size(); ++i) {
    const v1::KernelSpec& spec = manifest.variants(i).spec();
    absl::StatusOr<v1::KernelSpec> normalized = NormalizeKernelSpec(spec);
    if (!normalized.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest variants[", i, "].spec: ", normalized.status().message()));
    }
    if (!google::protobuf::util::MessageDifferencer::Equals(*normalized, spec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest variants[", i, "].spec: got {", spec.ShortDebugString(),
                       "}, supported its normalized form {", normalized->ShortDebugString(), "}"));
    }
  }
  return absl::OkStatus();
}

// The normalized spec a selector names (model's SpecOfSelector).
absl::StatusOr<v1::KernelSpec> NormalizedSpecOfSelector(const v1::KernelSelector& selector) {
  absl::StatusOr<v1::KernelSpec> spec = SpecOfSelector(selector);
  if (!spec.ok()) return spec.status();
  return NormalizeKernelSpec(*spec);
}

}  // namespace

std::string BundleKernelPath(std::string_view key) {
  return absl::StrCat(kKernelsPrefix, AsAbsl(key), kKernelSuffix);
}

absl::StatusOr<std::string> BundleManifestPath(const v1::Manifest& manifest) {
  if (manifest.variants_size() == 0) {
    return absl::InvalidArgumentError(
        "manifest has no variants; a bundle manifest is named by its first choice");
  }
  if (manifest.choice_order_size() > 0 &&
      manifest.choice_order(0) >= static_cast<uint32_t>(manifest.variants_size())) {
    return absl::InvalidArgumentError(absl::StrCat("manifest choice_order[0]: got ",
                                                   manifest.choice_order(0), ", only ",
                                                   manifest.variants_size(), " variants"));
  }
  const std::string& name = FirstChoice(manifest).module_name();
  if (absl::Status s = CheckFileStem("module_name", name); !s.ok()) return s;
  return absl::StrCat(kManifestsPrefix, name, kManifestSuffix);
}

// ---------------------------------------------------------------------------
// BundleWriter

namespace {

// flock on the bundle directory: the lock lives with the open file
// description, so it is released when the writer closes it or dies.
absl::StatusOr<FileLock> LockDirectory(int fd, const std::string& dir, FileLock::Wait wait) {
  absl::StatusOr<FileLock> lock = FileLock::Lock(fd, absl::StrCat("bundle directory ", dir), wait);
  if (absl::IsUnavailable(lock.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat("bundle directory ", dir,
                     " is being written by another kforge process (a "
                     "prebuild, or a client keeping its local copy there); wait for it to "
                     "finish or write elsewhere"));
  }
  return lock;
}

}  // namespace

class BundleWriter::WriteLock {
 public:
  explicit WriteLock(const BundleWriter& writer) {
    if (writer.locking_ != BundleLocking::kPerWrite) return;
    absl::StatusOr<FileLock> lock =
        LockDirectory(writer.dir_fd_, writer.dir_, FileLock::Wait::kBlock);
    if (lock.ok()) {
      lock_.emplace(*std::move(lock));
    } else {
      status_ = lock.status();
    }
  }
  const absl::Status& status() const { return status_; }

 private:
  std::optional<FileLock> lock_;
  absl::Status status_;
};

absl::StatusOr<std::unique_ptr<BundleWriter>> BundleWriter::Open(const std::string& dir,
                                                                 BundleLocking locking) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create bundle directory ", dir, ": ", ec.message()));
  }
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot open bundle directory ", dir, ": ", strerror(errno)));
  }
  // Owns fd from here: the destructor closes it (and drops any lock).
  std::unique_ptr<BundleWriter> writer(new BundleWriter(dir, fd, locking));
  if (locking == BundleLocking::kWholeRun) {
    absl::StatusOr<FileLock> lock = LockDirectory(fd, dir, FileLock::Wait::kTry);
    if (!lock.ok()) return lock.status();
    writer->run_lock_.emplace(*std::move(lock));
  }
  WriteLock lock(*writer);
  if (!lock.status().ok()) return lock.status();
  absl::StatusOr<int> version = ReadMarkerVersion(dir);
  // No marker: a new bundle. Version 2: the same layout without
  // release.json, which this writer may add.
  if (absl::IsNotFound(version.status()) ||
      (version.ok() && *version != static_cast<int>(kBundleFormatVersion))) {
    if (absl::Status s = WriteFileAtomic(JoinPath(dir, kBundleMarkerFile), MarkerText()); !s.ok()) {
      return s;
    }
  } else if (!version.ok()) {
    return version.status();
  }
  return writer;
}

BundleWriter::~BundleWriter() {
  run_lock_.reset();  // unlocks dir_fd_, which must still be open
  close(dir_fd_);
}

bool BundleWriter::HasKernel(std::string_view key) const {
  if (!CheckFileStem("key", key).ok()) return false;
  absl::StatusOr<std::string> bytes =
      ReadFile(JoinPath(dir_, BundleKernelPath(key)), kMaxArtifactFileBytes);
  if (!bytes.ok()) return false;
  absl::StatusOr<v1::KernelArtifact> artifact = ParseKernel(*bytes);
  return artifact.ok() && artifact->key() == key && CheckKernelOnItsOwn(*artifact).ok();
}

absl::Status BundleWriter::AddKernel(const v1::KernelArtifact& artifact) {
  if (absl::Status s = CheckFileStem("key", artifact.key()); !s.ok()) return s;
  if (absl::Status s = CheckKernelOnItsOwn(artifact); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("refusing to add a broken kernel to bundle ", dir_, ": ", s.message()));
  }
  WriteLock lock(*this);
  if (!lock.status().ok()) return lock.status();
  return WriteFileAtomic(JoinPath(dir_, BundleKernelPath(artifact.key())),
                         SerializeDeterministic(artifact));
}

absl::Status BundleWriter::AddManifest(const v1::Manifest& manifest) {
  absl::StatusOr<std::string> path = BundleManifestPath(manifest);
  if (!path.ok()) return path.status();
  if (absl::Status s = CheckManifestCanBeFound(manifest); !s.ok()) return s;
  WriteLock lock(*this);
  if (!lock.status().ok()) return lock.status();
  return WriteFileAtomic(JoinPath(dir_, *path), ManifestJson(manifest));
}

absl::Status BundleWriter::SetSequence(uint64_t sequence) {
  if (sequence < 1 || sequence > (uint64_t{1} << 53)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bundle sequence: got ", sequence, ", expected 1..2^53"));
  }
  WriteLock lock(*this);
  if (!lock.status().ok()) return lock.status();
  return WriteFileAtomic(JoinPath(dir_, kBundleReleaseFile),
                         absl::StrCat("{\"sequence\": ", sequence, "}\n"));
}

absl::Status BundleWriter::Finish() {
  WriteLock lock(*this);
  if (!lock.status().ok()) return lock.status();
  {
    // Removed before the list changes: a signature never covers another list.
    std::error_code ec;
    fs::remove(JoinPath(dir_, kBundleSignatureFile), ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot remove the old signature ",
                                              JoinPath(dir_, kBundleSignatureFile), ": ",
                                              ec.message()));
    }
  }
  std::string text;
  for (const std::string& relative : ListFiles(dir_)) {
    const std::string path = JoinPath(dir_, relative);
    if (IsStaleTemporary(relative)) {
      // Left by a killed writer (the directory lock keeps live writers out
      // of Finish); never a bundle file.
      std::error_code ec;
      fs::remove(path, ec);
      continue;
    }
    if (!IsKernelPath(relative) && !IsManifestPath(relative) && relative != kBundleReleaseFile) {
      continue;
    }
    absl::StatusOr<std::string> data = ReadFile(path, MaxBundleFileBytes(relative));
    if (!data.ok()) return data.status();
    absl::StrAppend(&text, Sha256Hex(*data), "  ", relative, "\n");
  }
  return WriteFileAtomic(JoinPath(dir_, kBundleChecksumsFile), text);
}

absl::Status BundleWriter::Sign(const std::string& private_key_pem) {
  WriteLock lock(*this);
  if (!lock.status().ok()) return lock.status();
  absl::StatusOr<std::string> text =
      ReadFile(JoinPath(dir_, kBundleChecksumsFile), kMaxChecksumsFileBytes);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::string> signature = Ed25519Sign(private_key_pem, *text);
  if (!signature.ok()) return signature.status();
  return WriteFileAtomic(JoinPath(dir_, kBundleSignatureFile), *signature);
}

absl::Status CheckBundleSignature(const std::string& dir, const std::string& checksums_text,
                                  const std::string& trust_key_file) {
  absl::StatusOr<std::string> public_pem = ReadCredentialFile(trust_key_file, "trust key");
  if (!public_pem.ok()) {
    return absl::InvalidArgumentError(public_pem.status().message());
  }
  const std::string sig_path = JoinPath(dir, kBundleSignatureFile);
  absl::StatusOr<std::string> signature = ReadFile(sig_path, kMaxMarkerFileBytes);
  if (absl::IsNotFound(signature.status())) {
    return absl::UnauthenticatedError(absl::StrCat(
        "bundle ", dir, " is not signed (no ", kBundleSignatureFile, ") and a trust key (",
        trust_key_file, ") is configured: sign it with `kforge prebuild --sign KEY`"));
  }
  if (!signature.ok()) {
    return absl::UnauthenticatedError(
        absl::StrCat("bundle ", dir, ": ", signature.status().message()));
  }
  absl::Status verified = Ed25519Verify(*public_pem, checksums_text, *signature);
  if (absl::IsInvalidArgument(verified)) {
    return absl::InvalidArgumentError(
        absl::StrCat("trust key ", trust_key_file, ": ", verified.message()));
  }
  if (!verified.ok()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "bundle ", dir, ": ", kBundleSignatureFile, " is not a signature of ", kBundleChecksumsFile,
        " by trust key ", trust_key_file, ": ", verified.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<uint64_t>> ReadBundleSequence(const std::string& dir,
                                                           const std::string& checksums_text) {
  const ChecksumList checksums = ParseChecksums(checksums_text);
  absl::StatusOr<std::string> json = ReadListedFile(dir, checksums, kBundleReleaseFile);
  if (absl::IsNotFound(json.status())) return std::nullopt;
  if (!json.ok()) return json.status();
  absl::StatusOr<uint64_t> sequence = ParseRelease(*json);
  if (!sequence.ok()) {
    return absl::DataLossError(absl::StrCat("bundle ", dir, ": ", sequence.status().message()));
  }
  return std::optional<uint64_t>(*sequence);
}

absl::Status CheckBundleSequence(const std::string& dir, const std::string& checksums_text,
                                 uint64_t min_sequence) {
  if (min_sequence == 0) return absl::OkStatus();
  absl::StatusOr<std::optional<uint64_t>> sequence = ReadBundleSequence(dir, checksums_text);
  if (!sequence.ok()) return sequence.status();
  if (!sequence->has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bundle ", dir, " has no sequence (no ", kBundleReleaseFile,
        ": built without `kforge prebuild --sequence N`, or by a kforge before bundle format 3) "
        "and a minimum of ",
        min_sequence, " is required (--trust-min-sequence): rebuild it with --sequence ",
        min_sequence, " or higher"));
  }
  if (**sequence < min_sequence) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bundle ", dir, " has sequence ", **sequence, ", below the required minimum ", min_sequence,
        " (--trust-min-sequence): it is an older release than this host accepts (a rollback); "
        "deploy the current bundle, or lower the minimum on purpose"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// VerifyBundle

namespace {

// What a manifest needs from the kernel files: each variant, by key.
struct Requirement {
  std::string manifest_path;
  std::string arch;
  v1::ManifestVariant variant;
};

class Verifier {
 public:
  explicit Verifier(std::string dir) : dir_(std::move(dir)) {}

  std::vector<BundleProblem> Run() {
    if (absl::Status s = CheckMarker(dir_); absl::IsNotFound(s)) {
      Add(kBundleMarkerFile, absl::StrCat("missing: ", dir_, " is not a kforge bundle"));
    } else if (!s.ok()) {
      Add(kBundleMarkerFile, s.message());
    }
    LoadChecksums();
    const std::vector<std::string> files = ListFiles(dir_);
    for (const std::string& path : files) {
      if (IsManifestPath(path)) CheckManifest(path);
    }
    for (const std::string& path : files) CheckFile(path);
    for (const auto& [path, sha] : checksums_.sha_by_path) {
      if (!std::binary_search(files.begin(), files.end(), path)) {
        Add(path, absl::StrCat("listed in ", kBundleChecksumsFile, " but missing"));
      }
    }
    for (const auto& [key, requirements] : requirements_) {
      const std::string kernel_path = BundleKernelPath(key);
      const bool present = std::binary_search(files.begin(), files.end(), kernel_path);
      for (const Requirement& r : requirements) {
        Add(r.manifest_path,
            absl::StrCat("variant ", r.variant.module_name(), ": kernel ", kernel_path,
                         present ? " is damaged (see its own problem)" : " is missing"));
      }
    }
    std::stable_sort(
        problems_.begin(), problems_.end(),
        [](const BundleProblem& a, const BundleProblem& b) { return a.path < b.path; });
    return std::move(problems_);
  }

 private:
  void Add(std::string_view path, absl::string_view message) {
    problems_.push_back({std::string(path), std::string(message)});
  }

  void LoadChecksums() {
    absl::StatusOr<std::string> text =
        ReadFile(JoinPath(dir_, kBundleChecksumsFile), kMaxChecksumsFileBytes);
    if (!text.ok()) {
      Add(kBundleChecksumsFile, text.status().message());
      return;
    }
    checksums_ = ParseChecksums(*text);
    for (const std::string& error : checksums_.errors) Add(kBundleChecksumsFile, error);
  }

  // A manifest's own problems; its variants become requirements that the
  // kernel files settle.
  void CheckManifest(const std::string& path) {
    absl::StatusOr<std::string> json = ReadFile(JoinPath(dir_, path), kMaxManifestFileBytes);
    absl::StatusOr<v1::Manifest> manifest =
        json.ok() ? ParseManifest(*json) : absl::StatusOr<v1::Manifest>(json.status());
    if (!manifest.ok()) {
      Add(path, manifest.status().message());
      return;
    }
    absl::StatusOr<std::string> expected_path = BundleManifestPath(*manifest);
    if (!expected_path.ok()) {
      Add(path, expected_path.status().message());
    } else if (*expected_path != path) {
      Add(path, absl::StrCat("named after its first-choice variant it would be ", *expected_path));
    }
    if (absl::Status s = CheckManifestCanBeFound(*manifest); !s.ok()) Add(path, s.message());
    for (const v1::ManifestVariant& variant : manifest->variants()) {
      requirements_[variant.key()].push_back({path, manifest->arch(), variant});
    }
  }

  void CheckFile(const std::string& path) {
    if (path == kBundleMarkerFile || path == kBundleChecksumsFile || path == kBundleSignatureFile) {
      return;
    }
    absl::StatusOr<std::string> data = ReadFile(JoinPath(dir_, path), MaxBundleFileBytes(path));
    if (!data.ok()) {
      Add(path, data.status().message());
      return;
    }
    auto listed = checksums_.sha_by_path.find(path);
    if (listed == checksums_.sha_by_path.end()) {
      Add(path, absl::StrCat("present but not listed in ", kBundleChecksumsFile));
    } else if (const std::string got = Sha256Hex(*data); got != listed->second) {
      Add(path,
          absl::StrCat("sha256 ", got, ", ", kBundleChecksumsFile, " lists ", listed->second));
    }
    if (IsKernelPath(path)) {
      CheckKernel(path, *data);
    } else if (path == kBundleReleaseFile) {
      if (absl::StatusOr<uint64_t> s = ParseRelease(*data); !s.ok())
        Add(path, s.status().message());
    } else if (!IsManifestPath(path) && listed != checksums_.sha_by_path.end()) {
      Add(path,
          "listed, but neither a kernel (kernels/<key>.kfa) nor a manifest "
          "(manifests/<name>.json)");
    }
  }

  void CheckKernel(const std::string& path, const std::string& bytes) {
    absl::StatusOr<v1::KernelArtifact> artifact = ParseKernel(bytes);
    if (!artifact.ok()) {
      Add(path, artifact.status().message());
      return;
    }
    const std::string key = KeyOfPath(path);
    if (artifact->key() != key) {
      Add(path, absl::StrCat("holds key ", artifact->key(), ", its name says ", key));
      return;
    }
    if (absl::Status s = CheckKernelOnItsOwn(*artifact); !s.ok()) {
      Add(path, s.message());
      return;
    }
    auto wanted = requirements_.find(key);
    if (wanted == requirements_.end()) return;
    for (const Requirement& r : wanted->second) {
      if (absl::Status s = CheckArtifactForVariant(r.variant, r.arch, *artifact); !s.ok()) {
        Add(r.manifest_path, s.message());
      }
    }
    requirements_.erase(wanted);
  }

  std::string dir_;
  ChecksumList checksums_;
  // Settled requirements are erased; what is left names missing kernels.
  std::map<std::string, std::vector<Requirement>> requirements_;
  std::vector<BundleProblem> problems_;
};

}  // namespace

std::vector<BundleProblem> VerifyBundle(const std::string& dir, const std::string& trust_key_file,
                                        uint64_t min_sequence) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return {{".", absl::StrCat(dir, " is not a directory")}};
  }
  std::vector<BundleProblem> problems = Verifier(dir).Run();
  if (!trust_key_file.empty()) {
    absl::StatusOr<std::string> text =
        ReadFile(JoinPath(dir, kBundleChecksumsFile), kMaxChecksumsFileBytes);
    // An unreadable list is reported by the Verifier already.
    if (text.ok()) {
      if (absl::Status s = CheckBundleSignature(dir, *text, trust_key_file); !s.ok()) {
        problems.push_back({kBundleSignatureFile, std::string(s.message())});
      } else if (absl::Status s = CheckBundleSequence(dir, *text, min_sequence); !s.ok()) {
        problems.push_back({kBundleReleaseFile, std::string(s.message())});
      }
    }
  } else if (min_sequence > 0) {
    problems.push_back({kBundleReleaseFile,
                        "a minimum sequence needs a trust key: an unsigned sequence proves "
                        "nothing"});
  }
  return problems;
}

// ---------------------------------------------------------------------------
// BundleSource

struct BundleSource::State {
  std::string dir;
  ChecksumList checksums;
  std::vector<v1::Manifest> manifests;  // read at Open, never changed
  std::optional<uint64_t> sequence;     // release.json's, read at Open
  absl::Mutex mu;
  std::map<std::string, ArtifactRef> kernels ABSL_GUARDED_BY(mu);  // by key
};

absl::StatusOr<std::unique_ptr<BundleSource>> BundleSource::Open(const std::string& dir,
                                                                 const std::string& trust_key_file,
                                                                 uint64_t min_sequence) {
  if (min_sequence > 0 && trust_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a minimum bundle sequence needs a trust key: an unsigned sequence proves nothing");
  }
  absl::Status marker = CheckMarker(dir);
  if (absl::IsNotFound(marker)) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " is not a kforge bundle: it has no ", kBundleMarkerFile));
  }
  if (!marker.ok()) return marker;
  auto state = std::make_shared<State>();
  state->dir = dir;
  absl::StatusOr<std::string> text =
      ReadFile(JoinPath(dir, kBundleChecksumsFile), kMaxChecksumsFileBytes);
  if (!text.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bundle ", dir, " has no readable ", kBundleChecksumsFile, " (", text.status().message(),
        "): its writer never finished; rebuild it or ", VerifyHint(dir)));
  }
  if (!trust_key_file.empty()) {
    if (absl::Status s = CheckBundleSignature(dir, *text, trust_key_file); !s.ok()) return s;
  }
  if (absl::Status s = CheckBundleSequence(dir, *text, min_sequence); !s.ok()) return s;
  state->checksums = ParseChecksums(*text);
  if (!state->checksums.errors.empty()) {
    return absl::DataLossError(absl::StrCat(JoinPath(dir, kBundleChecksumsFile), ": ",
                                            state->checksums.errors.front(), "; ",
                                            VerifyHint(dir)));
  }
  // The bundle is what its checksum list names: unlisted manifest files
  // (a writer killed before Finish) are not read.
  for (const auto& [path, sha] : state->checksums.sha_by_path) {
    if (!IsManifestPath(path)) continue;
    absl::StatusOr<std::string> json = ReadListedFile(dir, state->checksums, path);
    if (!json.ok()) return json.status();
    absl::StatusOr<v1::Manifest> manifest = ParseManifest(*json);
    // FirstChoice needs a variant and an in-range choice_order[0].
    absl::StatusOr<std::string> expected_path =
        manifest.ok() ? BundleManifestPath(*manifest) : manifest.status();
    absl::Status valid = expected_path.status();
    // Named by its content, as verify requires: a manifest copied under
    // another name is not loaded.
    if (valid.ok() && *expected_path != path) {
      valid = absl::DataLossError(
          absl::StrCat("holds the manifest of ", *expected_path, ", not of ", path));
    }
    if (valid.ok()) valid = CheckManifestCanBeFound(*manifest);
    if (!valid.ok()) {
      return absl::DataLossError(
          absl::StrCat(JoinPath(dir, path), ": ", valid.message(), "; ", VerifyHint(dir)));
    }
    state->manifests.push_back(*std::move(manifest));
  }
  // Without a minimum the sequence is only reported: a damaged
  // release.json is `kforge verify`'s to report.
  absl::StatusOr<std::optional<uint64_t>> sequence = ReadBundleSequence(dir, *text);
  if (sequence.ok()) state->sequence = *sequence;
  std::unique_ptr<BundleSource> source(new BundleSource());
  source->state_ = std::move(state);
  return source;
}

const std::vector<v1::Manifest>& BundleSource::manifests() const { return state_->manifests; }

std::optional<uint64_t> BundleSource::sequence() const { return state_->sequence; }

std::vector<std::string> BundleSource::UnlistedFiles() const {
  std::vector<std::string> unlisted;
  for (const std::string& path : ListFiles(state_->dir)) {
    if (path == kBundleMarkerFile || path == kBundleChecksumsFile || path == kBundleSignatureFile ||
        state_->checksums.sha_by_path.count(path) > 0) {
      continue;
    }
    unlisted.push_back(path);
  }
  return unlisted;
}

absl::StatusOr<v1::Manifest> BundleSource::GetManifest(const v1::KernelSelector& kernel,
                                                       std::string_view arch) {
  absl::StatusOr<v1::KernelSpec> spec = NormalizedSpecOfSelector(kernel);
  if (!spec.ok()) return spec.status();
  absl::StatusOr<Arch> target = ParseArch(arch);
  if (!target.ok()) return target.status();
  std::map<std::string, std::vector<std::string>> held;  // arch -> module names
  for (const v1::Manifest& m : state_->manifests) {
    if (m.arch() == target->name &&
        google::protobuf::util::MessageDifferencer::Equals(FirstChoice(m).spec(), *spec)) {
      return m;
    }
    held[m.arch()].push_back(FirstChoice(m).module_name());
  }
  std::vector<std::string> lines;
  for (const auto& [held_arch, names] : held) {
    lines.push_back(absl::StrCat(held_arch, ": ", absl::StrJoin(names, ", ")));
  }
  return absl::NotFoundError(absl::StrCat(
      "bundle ", state_->dir, " has no manifest for {", spec->ShortDebugString(), "} on ",
      target->name, "; it holds ", lines.empty() ? "no manifests" : absl::StrJoin(lines, "; ")));
}

absl::StatusOr<ArtifactRef> BundleSource::GetKernel(const v1::ManifestVariant& variant,
                                                    std::string_view arch) {
  if (absl::Status s = CheckFileStem("variant key", variant.key()); !s.ok()) return s;
  State& state = *state_;
  {
    absl::MutexLock lock(&state.mu);
    auto hit = state.kernels.find(variant.key());
    if (hit != state.kernels.end()) return hit->second;
  }
  const std::string relative = BundleKernelPath(variant.key());
  absl::StatusOr<std::string> bytes = ReadListedFile(state.dir, state.checksums, relative);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<v1::KernelArtifact> artifact = ParseKernel(*bytes);
  absl::Status check =
      artifact.ok() ? CheckArtifactForVariant(variant, arch, *artifact) : artifact.status();
  if (!check.ok()) {
    return absl::DataLossError(absl::StrCat(JoinPath(state.dir, relative), ": ", check.message(),
                                            "; ", VerifyHint(state.dir)));
  }
  auto shared = std::make_shared<const v1::KernelArtifact>(*std::move(artifact));
  absl::MutexLock lock(&state.mu);
  return state.kernels.emplace(variant.key(), std::move(shared)).first->second;
}

}  // namespace kforge
