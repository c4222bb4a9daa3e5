#ifndef KFORGE_SERVICE_MEMORY_CACHE_H_
#define KFORGE_SERVICE_MEMORY_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "service/artifact_cache.h"

namespace kforge {

// In-process LRU of artifacts, bounded by total bytes (cubin + description).
// Thread-safe.
class MemoryCache : public ArtifactCache {
 public:
  explicit MemoryCache(uint64_t max_bytes);

  absl::StatusOr<ArtifactPtr> Get(const std::string& key) override;
  absl::Status Put(const std::string& key, ArtifactPtr artifact) override;
  CacheUsage Usage() const override;

 private:
  struct Entry;
  const uint64_t max_bytes_;
  mutable absl::Mutex mu_;
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // front = most recent
  std::unordered_map<std::string, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kforge

#endif  // KFORGE_SERVICE_MEMORY_CACHE_H_
