#ifndef KFORGE_SERVICE_REDIS_CACHE_H_
#define KFORGE_SERVICE_REDIS_CACHE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/artifact_cache.h"
#include "service/cache_entry.h"

namespace kforge {

struct RedisCacheOptions {
  std::string host;  // "" = no Redis tier
  int port = 6379;
  std::string password;  // sent with AUTH when not empty
  // Connecting and each command. A Redis that does not answer within it is
  // taken for down: the tier is skipped (requests go on with the local
  // tiers and local compiles) until a background ping succeeds. Loopback
  // answers in well under a millisecond and a cubin of a few MB crosses a
  // LAN in tens of them, so 500 ms means something is wrong.
  absl::Duration timeout = absl::Milliseconds(500);
  absl::Duration reconnect_interval = absl::Seconds(1);
  // The fleet-wide compile lock's expiry; its holder renews it every third
  // of it while it compiles, so only a dead holder lets it lapse. A lock
  // found without an expiry or a fencing token (an older kforge, or set by
  // hand) is given this expiry when first seen, so it stalls the fleet for
  // at most this long.
  absl::Duration lock_ttl = absl::Seconds(10);
  // Values expire after this long without being stored again, so that the
  // kernels of old kforge versions leave a Redis that has no eviction.
  absl::Duration value_ttl = absl::Hours(24 * 30);
  // A reply larger than this is refused and its connection dropped (Redis
  // is not trusted with this process's memory). Cubins are a few MB.
  uint64_t max_value_bytes = uint64_t{64} << 20;
  int max_connections = 16;
  // Keys are <prefix>:f<format version>:e<entry version>:{kernel,lock}:<key>.
  std::string key_prefix = "kforge";
  // How values are sealed and what a read demands of them. A shared tier
  // is never trusted blindly: Create refuses options without a fleet key,
  // so every value carries an HMAC only the fleet's servers can make.
  EntryTrust trust;
  // One line per change of reachability ("down: why", "up again").
  std::function<void(std::string_view)> log;
};

// What the Redis tier has done, for Stats and metrics.
struct RedisCounters {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t errors = 0;   // timeouts, refused connections, error replies
  uint64_t skipped = 0;  // calls not made because Redis was down
  uint64_t corrupt_entries = 0;
  uint64_t untrusted_entries = 0;  // of corrupt_entries: no or a wrong MAC
  uint64_t stores = 0;
  // Locks found without an expiry or a fencing token, given one (TryLock).
  uint64_t stale_locks = 0;
  bool up = false;
};

// The shared tier on Redis (hiredis, blocking connections from a small
// pool). Values are the bytes of service/cache_entry.h, sealed with the
// fleet key, so a read checks the same MAC, digest and key a disk read
// does; what fails is counted, deleted and answered as a miss. Never blocks a caller longer than
// about `timeout`. Thread-safe.
class RedisCache : public SharedArtifactCache {
 public:
  // Never fails for an unreachable Redis (the tier starts down and a
  // background thread keeps trying); InvalidArgument for bad options,
  // among them no (or a short) fleet key.
  static absl::StatusOr<std::unique_ptr<RedisCache>> Create(RedisCacheOptions options);
  ~RedisCache() override;

  absl::StatusOr<ArtifactPtr> Get(const std::string& key) override;
  absl::Status Put(const std::string& key, ArtifactPtr artifact) override;
  // Deletes a value a caller found wrong after Get served it (the server's
  // own check of what it serves), counted and logged as Get counts a
  // damaged one; returns that NotFound.
  absl::Status Drop(const std::string& key, const absl::Status& why);
  // Redis keeps its own size; entries and bytes are not counted here.
  CacheUsage Usage() const override;
  Lock TryLock(const std::string& key) override;
  void Unlock(const std::string& key) override;

  RedisCounters Counters() const;
  // The Redis key of a kernel's value (tests corrupt it on purpose).
  std::string ValueKey(const std::string& key) const;

 private:
  struct State;
  explicit RedisCache(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kforge

#endif  // KFORGE_SERVICE_REDIS_CACHE_H_
