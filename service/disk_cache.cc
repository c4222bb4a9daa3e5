#include "service/disk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/absl_compat.h"
#include "base/io.h"
#include "model/format.h"
#include "service/cache_entry.h"

namespace kforge {
namespace {

// Entries live under v1/ so a future layout can sit beside them (the entry
// bytes are service/cache_entry.h's, shared with the Redis tier).
constexpr std::string_view kLayoutDir = "v1";
constexpr std::string_view kEntrySuffix = ".kfa";
constexpr std::string_view kTmpMarker = ".tmp.";
// A temporary file this old belongs to a writer that died: a live one
// renames it within the time of one write + fsync.
constexpr int64_t kStaleTmpSeconds = 60;

// Creates `path` if missing. Sets *created when this call made it (its
// parent then needs an fsync for the new name to be durable).
absl::Status MakeDir(const std::string& path, bool* created) {
  *created = false;
  if (mkdir(path.c_str(), 0755) == 0) {
    *created = true;
    return absl::OkStatus();
  }
  if (errno == EEXIST) return absl::OkStatus();
  return ErrnoStatus(errno, "cannot create directory", path);
}

int64_t ToNanos(const timespec& ts) { return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec; }

// The access stamp written into an entry's mtime. The kernel stamps files
// with a coarse clock (one tick is milliseconds), so two entries used in
// quick succession would tie and LRU order would be lost; an explicit
// CLOCK_REALTIME stamp, strictly increasing within this process, keeps it.
timespec AccessStamp() {
  static std::atomic<int64_t> last{0};
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  int64_t ns = ToNanos(now);
  int64_t prev = last.load(std::memory_order_relaxed);
  while (true) {
    const int64_t next = std::max(ns, prev + 1);
    if (last.compare_exchange_weak(prev, next, std::memory_order_relaxed)) {
      ns = next;
      break;
    }
  }
  return timespec{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
}

// Best effort: a reader that may not set the stamp (another user's file)
// still serves the entry; only its LRU position goes stale.
void Touch(int fd) {
  const timespec stamp = AccessStamp();
  const timespec times[2] = {stamp, stamp};
  (void)futimens(fd, times);
}

struct FileInfo {
  std::string path;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};

// Entry files under <dir>/v1. Names that are not <64 hex>.kfa in their own
// two-digit bucket are not entries: temporary files are removed when older
// than kStaleTmpSeconds if `clean_tmp`, anything else is left alone.
std::vector<FileInfo> ListEntries(const std::string& layout_dir, bool clean_tmp) {
  std::vector<FileInfo> out;
  DIR* top = opendir(layout_dir.c_str());
  if (top == nullptr) return out;
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  while (const dirent* bucket = readdir(top)) {
    const std::string_view bucket_name = bucket->d_name;
    if (bucket_name.size() != 2 || !IsLowerHexDigit(bucket_name[0]) ||
        !IsLowerHexDigit(bucket_name[1])) {
      continue;
    }
    const std::string bucket_path = absl::StrCat(layout_dir, "/", AsAbsl(bucket_name));
    DIR* files = opendir(bucket_path.c_str());
    if (files == nullptr) continue;
    while (const dirent* file = readdir(files)) {
      const std::string_view name = file->d_name;
      if (name == "." || name == "..") continue;
      const std::string path = absl::StrCat(bucket_path, "/", AsAbsl(name));
      struct stat st;
      // Gone already: evicted or renamed by another process.
      if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (name.find(kTmpMarker) != std::string_view::npos) {
        if (clean_tmp && now.tv_sec - st.st_mtim.tv_sec > kStaleTmpSeconds) {
          unlink(path.c_str());
        }
        continue;
      }
      const std::string_view key = name.substr(0, 64);
      if (name.size() != 64 + kEntrySuffix.size() || !IsValidCacheKey(key) ||
          name.substr(64) != kEntrySuffix || key.substr(0, 2) != bucket_name) {
        continue;
      }
      out.push_back(FileInfo{path, static_cast<uint64_t>(st.st_size), ToNanos(st.st_mtim)});
    }
    closedir(files);
  }
  closedir(top);
  return out;
}

}  // namespace

// Counters are this process's view of the directory: exact when one
// process uses it, re-measured at Open and at every eviction pass when
// several share it.
struct DiskCache::State {
  absl::Mutex mu;
  uint64_t bytes ABSL_GUARDED_BY(mu) = 0;
  uint64_t entries ABSL_GUARDED_BY(mu) = 0;
  uint64_t corrupt_entries ABSL_GUARDED_BY(mu) = 0;
  uint64_t untrusted_entries ABSL_GUARDED_BY(mu) = 0;
  uint64_t evictions ABSL_GUARDED_BY(mu) = 0;

  void Forget(uint64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    bytes -= std::min(bytes, size);
    entries -= std::min<uint64_t>(entries, 1);
  }
};

DiskCache::DiskCache(std::string dir, uint64_t max_bytes, EntryTrust trust)
    : dir_(std::move(dir)),
      max_bytes_(max_bytes),
      trust_(std::move(trust)),
      state_(std::make_unique<State>()) {}

DiskCache::~DiskCache() = default;

absl::StatusOr<std::unique_ptr<DiskCache>> DiskCache::Open(const std::string& dir,
                                                           uint64_t max_bytes, EntryTrust trust) {
  if (dir.empty()) return absl::InvalidArgumentError("empty cache directory");
  std::string root = dir;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  const std::string layout_dir = absl::StrCat(root, "/", AsAbsl(kLayoutDir));
  std::error_code ec;
  std::filesystem::create_directories(layout_dir, ec);
  if (ec) {
    return ErrnoStatus(ec.value(), "cannot create cache directory", layout_dir);
  }
  if (access(layout_dir.c_str(), R_OK | W_OK | X_OK) != 0) {
    return ErrnoStatus(errno, "cache directory not writable", layout_dir);
  }

  std::unique_ptr<DiskCache> cache(new DiskCache(root, max_bytes, std::move(trust)));
  absl::MutexLock lock(&cache->state_->mu);
  for (const FileInfo& f : ListEntries(layout_dir, /*clean_tmp=*/true)) {
    cache->state_->bytes += f.size;
    ++cache->state_->entries;
  }
  return cache;
}

std::string DiskCache::EntryPath(const std::string& key) const {
  if (!IsValidCacheKey(key)) return "";
  return absl::StrCat(dir_, "/", AsAbsl(kLayoutDir), "/", key.substr(0, 2), "/", key,
                      AsAbsl(kEntrySuffix));
}

absl::StatusOr<ArtifactPtr> DiskCache::Get(const std::string& key) {
  if (!IsValidCacheKey(key)) return CacheKeyError(key);
  const std::string path = EntryPath(key);
  uint64_t size = 0;
  absl::StatusOr<int> opened =
      OpenRegularFile(path, kMaxArtifactFileBytes, Symlinks::kRefuse, &size);
  if (absl::IsNotFound(opened.status())) {
    return absl::NotFoundError(absl::StrCat("no artifact ", key, " on disk"));
  }
  if (absl::IsFailedPrecondition(opened.status())) {
    // A FIFO, device, link or directory in place of an entry (it hung the
    // request and shutdown when opened blocking), or one far too large:
    // damaged. Remove the name so the next Put rebuilds it.
    absl::MutexLock lock(&state_->mu);
    ++state_->corrupt_entries;
    struct stat now;
    if (lstat(path.c_str(), &now) == 0) {
      if (S_ISDIR(now.st_mode) ? rmdir(path.c_str()) == 0 : unlink(path.c_str()) == 0) {
        if (S_ISREG(now.st_mode)) state_->Forget(static_cast<uint64_t>(now.st_size));
      }
    }
    return DroppedCorruptEntry("disk", key, absl::DataLossError(opened.status().message()));
  }
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, "cannot stat", path);
  }
  absl::StatusOr<std::string> file = ReadFd(fd, size, path);
  if (!file.ok()) {
    close(fd);
    return file.status();
  }
  absl::StatusOr<DecodedEntry> entry = DecodeCacheEntry(*file, key, trust_);
  if (entry.ok()) {
    // The open file, not the path: if another process evicted the entry
    // meanwhile, this touches nothing that is still visible.
    Touch(fd);
    close(fd);
    return std::make_shared<const v1::KernelArtifact>(std::move(entry->artifact));
  }
  close(fd);

  // Damaged or untrusted. Remove it so the next Put rebuilds it, unless
  // another process has renamed a fresh entry over it since it was opened.
  absl::MutexLock lock(&state_->mu);
  ++state_->corrupt_entries;
  if (IsUntrustedEntry(entry.status())) ++state_->untrusted_entries;
  struct stat now;
  if (stat(path.c_str(), &now) == 0 && now.st_dev == st.st_dev && now.st_ino == st.st_ino &&
      unlink(path.c_str()) == 0) {
    state_->Forget(static_cast<uint64_t>(st.st_size));
  }
  return DroppedCorruptEntry("disk", key, entry.status());
}

absl::Status DiskCache::Drop(const std::string& key, const absl::Status& why) {
  if (!IsValidCacheKey(key)) return CacheKeyError(key);
  const std::string path = EntryPath(key);
  absl::MutexLock lock(&state_->mu);
  ++state_->corrupt_entries;
  if (IsUntrustedEntry(why)) ++state_->untrusted_entries;
  struct stat st;
  // A good entry renamed over the bad one since is lost too: one compile.
  if (lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && unlink(path.c_str()) == 0) {
    state_->Forget(static_cast<uint64_t>(st.st_size));
  }
  return DroppedCorruptEntry("disk", key, why);
}

absl::Status DiskCache::Put(const std::string& key, ArtifactPtr artifact) {
  return PutFrom(key, std::move(artifact), EntryOrigin::kCompiled);
}

absl::Status DiskCache::PutFrom(const std::string& key, ArtifactPtr artifact, EntryOrigin origin) {
  if (!IsValidCacheKey(key)) return CacheKeyError(key);
  if (artifact == nullptr) return absl::InvalidArgumentError("null artifact");
  if (artifact->key() != key) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact key ", artifact->key(), " stored under key ", key));
  }
  absl::StatusOr<std::string> entry = EncodeCacheEntry(*artifact, origin, trust_);
  if (!entry.ok()) return entry.status();
  const uint64_t size = entry->size();
  // Larger than the whole cache: keeping it would evict everything else.
  if (size > max_bytes_) return absl::OkStatus();

  const std::string path = EntryPath(key);
  const std::string bucket = path.substr(0, path.rfind('/'));
  bool bucket_created;
  if (absl::Status s = MakeDir(bucket, &bucket_created); !s.ok()) return s;
  if (bucket_created) {
    if (absl::Status s = FsyncDir(bucket.substr(0, bucket.rfind('/'))); !s.ok()) {
      return s;
    }
  }

  // A unique temporary per writer: two processes storing the same key each
  // write their own file, and whichever rename lands last leaves a whole
  // entry.
  absl::StatusOr<AtomicFile> file = AtomicFile::Create(path);
  if (!file.ok()) return file.status();
  absl::Status written = file->Write(*entry);
  if (written.ok()) {
    Touch(file->fd());
    written = file->Sync();
  }
  if (!written.ok()) return written;

  bool over_cap;
  {
    absl::MutexLock lock(&state_->mu);
    struct stat old;
    const bool replaced = stat(path.c_str(), &old) == 0;
    if (absl::Status s = file->Rename(); !s.ok()) return s;
    if (replaced) state_->Forget(static_cast<uint64_t>(old.st_size));
    state_->bytes += size;
    ++state_->entries;
    over_cap = state_->bytes > max_bytes_;
  }
  // The rename is durable only once the directory is.
  if (absl::Status s = FsyncDir(bucket); !s.ok()) return s;
  if (over_cap) Evict(path);
  return absl::OkStatus();
}

void DiskCache::Evict(const std::string& keep) {
  absl::MutexLock lock(&state_->mu);
  // Re-measure: other processes sharing the directory add and remove
  // entries this one has not counted.
  std::vector<FileInfo> files = ListEntries(absl::StrCat(dir_, "/", AsAbsl(kLayoutDir)),
                                            /*clean_tmp=*/false);
  uint64_t bytes = 0;
  for (const FileInfo& f : files) bytes += f.size;
  uint64_t entries = files.size();
  std::sort(files.begin(), files.end(), [](const FileInfo& a, const FileInfo& b) {
    return std::tie(a.mtime_ns, a.path) < std::tie(b.mtime_ns, b.path);
  });
  for (const FileInfo& f : files) {
    if (bytes <= max_bytes_) break;
    if (f.path == keep) continue;
    // ENOENT: another process evicted it first; it is gone either way.
    const bool removed = unlink(f.path.c_str()) == 0;
    if (removed || errno == ENOENT) {
      bytes -= f.size;
      --entries;
    }
    if (removed) ++state_->evictions;
  }
  state_->bytes = bytes;
  state_->entries = entries;
}

CacheUsage DiskCache::Usage() const {
  absl::MutexLock lock(&state_->mu);
  CacheUsage usage;
  usage.bytes = state_->bytes;
  usage.entries = state_->entries;
  usage.corrupt_entries = state_->corrupt_entries;
  usage.untrusted_entries = state_->untrusted_entries;
  usage.evictions = state_->evictions;
  return usage;
}

}  // namespace kforge
