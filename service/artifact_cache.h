#ifndef KFORGE_SERVICE_ARTIFACT_CACHE_H_
#define KFORGE_SERVICE_ARTIFACT_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kforge/v1/artifact.pb.h"

namespace kforge {

using ArtifactPtr = std::shared_ptr<const v1::KernelArtifact>;

struct CacheUsage {
  uint64_t bytes = 0;
  uint64_t entries = 0;
  uint64_t corrupt_entries = 0;  // entries dropped because they failed checks
  // Of those, entries whole but not trusted (no or a wrong fleet-key MAC,
  // an origin the server refuses): someone without the key wrote them.
  uint64_t untrusted_entries = 0;
  uint64_t evictions = 0;
};

// A tier of the kernel cache, by cache key (hex SHA-256 from
// ComputeCacheKey). A shared tier for many replicas (e.g. Redis) implements
// the same interface without touching the service.
class ArtifactCache {
 public:
  virtual ~ArtifactCache() = default;
  // NotFound on a miss. A tier that finds a damaged entry drops it, counts
  // it in corrupt_entries and answers NotFound: it never returns it.
  virtual absl::StatusOr<ArtifactPtr> Get(const std::string& key) = 0;
  // Stores an artifact whose key() equals `key`; may evict others.
  virtual absl::Status Put(const std::string& key, ArtifactPtr artifact) = 0;
  virtual CacheUsage Usage() const = 0;
};

// A tier shared by every server of a fleet (service/redis_cache.h), which
// also carries the fleet-wide compile lock: of N servers missing one key,
// the one that takes the lock compiles and stores the kernel, the others
// wait for the value. Get answers Unavailable (not NotFound) when the tier
// cannot be reached; callers then go on with their local tiers.
class SharedArtifactCache : public ArtifactCache {
 public:
  enum class Lock {
    kAcquired,       // this process compiles the key; Unlock when stored
    kHeldElsewhere,  // another server compiles it
    kUnavailable,    // the tier is down or slow: compile locally
  };
  // The lock expires unless its holder keeps it alive, so a server that
  // dies while compiling holds up the others for one expiry at most.
  virtual Lock TryLock(const std::string& key) = 0;
  virtual void Unlock(const std::string& key) = 0;
};

}  // namespace kforge

#endif  // KFORGE_SERVICE_ARTIFACT_CACHE_H_
