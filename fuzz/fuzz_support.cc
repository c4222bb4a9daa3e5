#include "fuzz/fuzz_support.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "base/io.h"
#include "base/sha256.h"
#include "bundle/bundle.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/field_comparator.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/service.pb.h"

namespace kforge::fuzz {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxNameBytes = 255;

std::string SafeName(std::string_view name) {
  std::string out(name.substr(0, kMaxNameBytes));
  for (char& c : out) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) c = '_';
  }
  if (!out.empty() && out.front() == '.') out.front() = '_';
  return out;
}

// The bundle-relative path an entry is written to.
std::string EntryPath(const BundleEntry& entry) {
  std::string name = SafeName(entry.name);
  switch (entry.kind) {
    case BundleEntryKind::kMarker:
      return kBundleMarkerFile;
    case BundleEntryKind::kChecksums:
      return kBundleChecksumsFile;
    case BundleEntryKind::kManifest:
      if (name.empty()) {
        v1::Manifest manifest;
        google::protobuf::util::JsonParseOptions options;
        options.ignore_unknown_fields = true;
        if (google::protobuf::util::JsonStringToMessage(entry.contents, &manifest, options).ok()) {
          if (absl::StatusOr<std::string> path = BundleManifestPath(manifest); path.ok()) {
            return *path;
          }
        }
        name = "_";
      }
      return absl::StrCat("manifests/", name, ".json");
    case BundleEntryKind::kKernel:
      if (name.empty()) {
        v1::KernelArtifact artifact;
        if (artifact.ParseFromString(entry.contents)) name = SafeName(artifact.key());
        if (name.empty()) name = "_";
      }
      return BundleKernelPath(name);
    case BundleEntryKind::kOther:
      return name.empty() ? "_" : name;
  }
  return "_";
}

// Protobuf logs every string field with invalid UTF-8 it parses; fuzzed
// inputs hold many, and the log would drown the fuzzer's own output.
const bool kQuietProtobuf = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

uint32_t Read32Le(std::string_view bytes) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  return v;
}

}  // namespace

void Fail(std::string_view what) {
  std::fprintf(stderr, "kforge fuzz property failed: %.*s\n", static_cast<int>(what.size()),
               what.data());
  std::fflush(stderr);
  std::abort();
}

bool SameMessage(const google::protobuf::Message& a, const google::protobuf::Message& b) {
  google::protobuf::util::DefaultFieldComparator comparator;
  comparator.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_field_comparator(&comparator);
  return differencer.Compare(a, b);
}

const std::string& ScratchDir() {
  static const std::string* const dir = [] {
    std::error_code ec;
    std::string pattern = (fs::temp_directory_path(ec) / "kforge-fuzz-XXXXXX").string();
    if (ec || mkdtemp(pattern.data()) == nullptr) Fail("cannot create a scratch directory");
    auto* made = new std::string(pattern);
    std::atexit([] {
      std::error_code ignored;
      fs::remove_all(ScratchDir(), ignored);
    });
    return made;
  }();
  return *dir;
}

void EmptyDir(const std::string& dir) {
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    fs::remove_all(entry.path(), ec);
    if (ec) Fail(absl::StrCat("cannot empty ", dir, ": ", ec.message()));
  }
  if (ec) Fail(absl::StrCat("cannot list ", dir, ": ", ec.message()));
}

bool WriteFile(const std::string& path, std::string_view contents) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
  return std::fclose(f) == 0 && ok;
}

void WriteFileOrDie(const std::string& path, std::string_view contents) {
  if (!WriteFile(path, contents)) Fail(absl::StrCat("cannot write ", path));
}

std::string EncodeBundleArchive(const BundleArchive& archive) {
  std::string out(1, static_cast<char>(archive.write_checksums ? 1 : 0));
  for (const BundleEntry& entry : archive.entries) {
    out.push_back(static_cast<char>(entry.kind));
    const std::string_view name = std::string_view(entry.name).substr(0, kMaxNameBytes);
    out.push_back(static_cast<char>(name.size()));
    out.append(name);
    const uint32_t size = static_cast<uint32_t>(entry.contents.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(size >> (8 * i)));
    out.append(entry.contents);
  }
  return out;
}

BundleArchive DecodeBundleArchive(std::string_view bytes) {
  BundleArchive archive;
  if (bytes.empty()) return archive;
  archive.write_checksums = (bytes[0] & 1) != 0;
  bytes.remove_prefix(1);
  while (bytes.size() >= 2) {
    BundleEntry entry;
    entry.kind =
        static_cast<BundleEntryKind>(static_cast<unsigned char>(bytes[0]) % kBundleEntryKinds);
    const size_t name_size =
        std::min<size_t>(static_cast<unsigned char>(bytes[1]), bytes.size() - 2);
    entry.name = std::string(bytes.substr(2, name_size));
    bytes.remove_prefix(2 + name_size);
    if (bytes.size() >= 4) {
      const size_t size = std::min<size_t>(Read32Le(bytes), bytes.size() - 4);
      entry.contents = std::string(bytes.substr(4, size));
      bytes.remove_prefix(4 + size);
    } else {
      bytes = {};
    }
    archive.entries.push_back(std::move(entry));
  }
  return archive;
}

std::string EncodeServerAnswer(const ServerAnswer& answer) {
  std::string out;
  const uint32_t size = static_cast<uint32_t>(answer.manifest.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(size >> (8 * i)));
  return absl::StrCat(out, answer.manifest, answer.kernel);
}

ServerAnswer DecodeServerAnswer(std::string_view bytes) {
  ServerAnswer answer;
  if (bytes.size() < 4) return answer;
  const size_t size = std::min<size_t>(Read32Le(bytes), bytes.size() - 4);
  answer.manifest = std::string(bytes.substr(4, size));
  answer.kernel = std::string(bytes.substr(4 + size));
  return answer;
}

void WriteBundleArchive(const BundleArchive& archive, const std::string& dir) {
  std::map<std::string, std::string> files;  // relative path -> contents
  for (const BundleEntry& entry : archive.entries) files[EntryPath(entry)] = entry.contents;
  if (archive.write_checksums) {
    std::string list;
    for (const auto& [path, contents] : files) {
      if (path.starts_with("kernels/") || path.starts_with("manifests/")) {
        absl::StrAppend(&list, Sha256Hex(contents), "  ", path, "\n");
      }
    }
    files[kBundleChecksumsFile] = list;
  }
  // A path that cannot be made (a top-level file named "kernels" before
  // kernels/<key>.kfa) is left out, as it could not exist in a directory.
  for (const auto& [path, contents] : files)
    (void)WriteFile(absl::StrCat(dir, "/", path), contents);
}

}  // namespace kforge::fuzz
