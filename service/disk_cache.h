#ifndef KFORGE_SERVICE_DISK_CACHE_H_
#define KFORGE_SERVICE_DISK_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "service/artifact_cache.h"
#include "service/cache_entry.h"

namespace kforge {

// Content-addressed on-disk store under `dir`, bounded by total bytes with
// LRU eviction (access time kept in the file's mtime). Each entry is one
// file written to a temporary name, fsynced and renamed, holding a format
// version, the SHA-256 of the payload and the serialized KernelArtifact in
// service/cache_entry.h's envelope (its origin, and with a fleet key its
// HMAC); a read re-hashes the payload, checks the key and what `trust`
// demands, so a truncated, corrupted, foreign or unauthenticated file is
// removed and never served.
// Several processes may share one directory. Thread-safe.
class DiskCache : public ArtifactCache {
 public:
  // Creates `dir` if needed, removes stale temporary files left by killed
  // writers, and measures what is there.
  static absl::StatusOr<std::unique_ptr<DiskCache>> Open(const std::string& dir, uint64_t max_bytes,
                                                         EntryTrust trust = {});
  ~DiskCache() override;

  absl::StatusOr<ArtifactPtr> Get(const std::string& key) override;
  // Put of a kernel this server or the fleet compiled.
  absl::Status Put(const std::string& key, ArtifactPtr artifact) override;
  // Put recording where the kernel came from (a bundle's, signed or not).
  absl::Status PutFrom(const std::string& key, ArtifactPtr artifact, EntryOrigin origin);
  // Removes the entry a caller found wrong after Get served it (the server's
  // own check of what it serves), counted and logged as Get counts a
  // damaged one; returns that NotFound.
  absl::Status Drop(const std::string& key, const absl::Status& why);
  CacheUsage Usage() const override;

  // Path of the entry file for a key (tests corrupt it on purpose).
  std::string EntryPath(const std::string& key) const;

 private:
  DiskCache(std::string dir, uint64_t max_bytes, EntryTrust trust);
  // Removes least recently used entries, never `keep`, until the directory
  // is within max_bytes_.
  void Evict(const std::string& keep);
  struct State;
  std::string dir_;
  uint64_t max_bytes_;
  EntryTrust trust_;
  std::unique_ptr<State> state_;
};

}  // namespace kforge

#endif  // KFORGE_SERVICE_DISK_CACHE_H_
