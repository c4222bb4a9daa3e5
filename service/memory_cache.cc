#include "service/memory_cache.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kforge {

struct MemoryCache::Entry {
  ArtifactPtr artifact;
  // Serialized size: the cubin plus everything that describes it. Fixed at
  // Put so that eviction subtracts exactly what insertion added.
  uint64_t bytes = 0;
  std::list<std::string>::iterator lru_pos;
};

MemoryCache::MemoryCache(uint64_t max_bytes) : max_bytes_(max_bytes) {}

absl::StatusOr<ArtifactPtr> MemoryCache::Get(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("no artifact ", key, " in memory"));
  }
  Entry& entry = *it->second;
  lru_.splice(lru_.begin(), lru_, entry.lru_pos);
  return entry.artifact;
}

absl::Status MemoryCache::Put(const std::string& key, ArtifactPtr artifact) {
  if (artifact == nullptr) {
    return absl::InvalidArgumentError("null artifact");
  }
  if (artifact->key() != key) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact key ", artifact->key(), " stored under key ", key));
  }
  // Outside the lock: ByteSizeLong walks the whole message.
  const uint64_t bytes = artifact->ByteSizeLong();

  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    // Same key, same content: refresh the pointer and the recency.
    Entry& entry = *it->second;
    bytes_ -= entry.bytes;
    lru_.erase(entry.lru_pos);
    entries_.erase(it);
  }
  // An entry larger than the whole cache would evict everything and still
  // not fit; the caller keeps its copy and the tier below still has it.
  if (bytes > max_bytes_) return absl::OkStatus();

  while (bytes_ + bytes > max_bytes_ && !lru_.empty()) {
    auto victim = entries_.find(lru_.back());
    bytes_ -= victim->second->bytes;
    entries_.erase(victim);
    lru_.pop_back();
    ++evictions_;
  }
  lru_.push_front(key);
  auto entry = std::make_shared<Entry>();
  entry->artifact = std::move(artifact);
  entry->bytes = bytes;
  entry->lru_pos = lru_.begin();
  entries_.emplace(key, std::move(entry));
  bytes_ += bytes;
  return absl::OkStatus();
}

CacheUsage MemoryCache::Usage() const {
  absl::MutexLock lock(&mu_);
  CacheUsage usage;
  usage.bytes = bytes_;
  usage.entries = entries_.size();
  usage.evictions = evictions_;
  return usage;
}

}  // namespace kforge
