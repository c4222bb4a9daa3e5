#include "service/redis_cache.h"

#include <hiredis/hiredis.h>

#include <atomic>
#include <map>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/absl_compat.h"
#include "model/format.h"
#include "service/cache_entry.h"

namespace kforge {
namespace {

struct ContextFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextFree>;
struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

// Takes a compile lock: its value is "<fencing token>:<owner token>", the
// fencing token a number that grows with every lock taken in this
// namespace (KEYS[2] counts them), and it always expires (ARGV[2] ms) unless
// renewed. Answers the fencing token when taken. A lock held by anyone else
// answers 0, or -1 when it could stall the fleet: it has no expiry, or it is
// not one of ours (no fencing token: written by an older kforge or by hand)
// and expires later than ours would. Such a lock is given our expiry, so
// it is taken for stale after one lock TTL from when it is first seen; a
// live older server renews its own lock meanwhile.
constexpr char kLockScript[] =
    "local v = redis.call('get', KEYS[1]) "
    "if not v then "
    "  local fence = redis.call('incr', KEYS[2]) "
    "  redis.call('set', KEYS[1], fence .. ':' .. ARGV[1], 'px', ARGV[2]) "
    "  return fence "
    "end "
    "local ttl = redis.call('pttl', KEYS[1]) "
    "if ttl < 0 or (not string.match(v, '^%d+:%x+$') and ttl > tonumber(ARGV[2])) then "
    "  redis.call('pexpire', KEYS[1], ARGV[2]) "
    "  return -1 "
    "end "
    "return 0";
// Deletes / renews a lock only while this process holds it (its value is
// the fencing token and owner token it was taken with): a lock that expired
// and was taken by another server, or again by this one, is left alone.
constexpr char kUnlockScript[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
    "else return 0 end";
constexpr char kRenewScript[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], "
    "ARGV[2]) else return 0 end";

std::string_view ReplyText(const redisReply& r) { return std::string_view(r.str, r.len); }

absl::Status BrokenConnection(const redisContext& c, std::string_view doing) {
  return absl::UnavailableError(absl::StrCat(AsAbsl(doing), ": ", c.errstr));
}

// Sends one command and reads its reply on a blocking connection. Redis is
// not trusted: the reply must be a type our commands answer with (status,
// error, integer, bulk string or nil: never an array, whose element count
// hiredis would allocate up front), no larger than `max_reply_bytes`, and
// complete by `deadline`. Any error leaves the connection unusable.
absl::StatusOr<Reply> Call(redisContext* c, const std::vector<std::string_view>& argv,
                           absl::Time deadline, uint64_t max_reply_bytes) {
  redisReader* reader = c->reader;
  // Bytes nobody asked for: the connection is out of step with its replies.
  if (reader->len > reader->pos) return absl::UnavailableError("redis sent an unrequested reply");
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
  for (std::string_view a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  if (redisAppendCommandArgv(c, static_cast<int>(argv.size()), ptrs.data(), lens.data()) !=
      REDIS_OK) {
    return BrokenConnection(*c, "cannot queue a command");
  }
  for (int done = 0; !done;) {
    if (redisBufferWrite(c, &done) != REDIS_OK) return BrokenConnection(*c, "write");
    if (!done && absl::Now() > deadline) return absl::UnavailableError("write timed out");
  }
  // The reply's first byte is its type; hiredis moves past it once it
  // starts parsing, so it is checked as soon as it arrives.
  for (bool typed = false;;) {
    if (!typed && reader->len > reader->pos) {
      typed = true;
      const char type = reader->buf[reader->pos];
      if (type != '+' && type != '-' && type != ':' && type != '$') {
        return absl::UnavailableError(absl::StrCat("redis answered a reply of type '",
                                                   absl::CEscape(std::string(1, type)), "'"));
      }
    }
    void* reply = nullptr;
    if (redisGetReplyFromReader(c, &reply) != REDIS_OK) return BrokenConnection(*c, "bad reply");
    if (reply != nullptr) return Reply(static_cast<redisReply*>(reply));
    if (reader->len - reader->pos > max_reply_bytes) {
      return absl::UnavailableError(
          absl::StrCat("redis reply over ", max_reply_bytes, " bytes refused"));
    }
    if (absl::Now() > deadline) return absl::UnavailableError("timed out");
    if (redisBufferRead(c) != REDIS_OK) return BrokenConnection(*c, "read");
  }
}

std::string OwnerToken() {
  std::random_device random;
  std::string bytes;
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = random();
    bytes.append(reinterpret_cast<const char*>(&word), sizeof(word));
  }
  return absl::BytesToHexString(bytes);
}

}  // namespace

struct RedisCache::State {
  RedisCacheOptions options;
  std::string name;  // host:port, for messages
  std::string value_prefix, lock_prefix;
  std::string fence_key;  // counts the locks taken: their fencing tokens
  std::string owner = OwnerToken();
  // Room for the largest value plus the reply's framing.
  uint64_t max_reply_bytes = 0;

  absl::Mutex mu;
  absl::CondVar changed;  // a connection came back, or stopping
  std::vector<Context> idle ABSL_GUARDED_BY(mu);
  int open ABSL_GUARDED_BY(mu) = 0;  // idle + lent out
  bool up ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // Lock keys this process holds -> the value it set ("<fence>:<owner>").
  std::map<std::string, std::string> held ABSL_GUARDED_BY(mu);

  std::atomic<uint64_t> hits{0}, misses{0}, errors{0}, skipped{0}, corrupt{0}, untrusted{0},
      stores{0}, stale_locks{0};
  std::thread keeper;

  void Log(std::string_view line) const {
    if (options.log) options.log(line);
  }

  // A new connection, authenticated, by `deadline`.
  absl::StatusOr<Context> Connect(absl::Time deadline) const {
    const absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(1));
    Context c(redisConnectWithTimeout(options.host.c_str(), options.port, absl::ToTimeval(left)));
    if (c == nullptr) return absl::UnavailableError("cannot allocate a connection");
    if (c->err != 0) return BrokenConnection(*c, "connect");
    if (redisSetTimeout(c.get(), absl::ToTimeval(options.timeout)) != REDIS_OK) {
      return BrokenConnection(*c, "set timeout");
    }
    if (!options.password.empty()) {
      absl::StatusOr<Reply> auth = Call(c.get(), {"AUTH", options.password}, deadline, 4096);
      if (!auth.ok()) return auth.status();
      if ((*auth)->type != REDIS_REPLY_STATUS) {
        return absl::UnavailableError(
            absl::StrCat("AUTH refused: ", AsAbsl(ReplyText(**auth)).substr(0, 200)));
      }
    }
    return c;
  }

  // Marks Redis down (once per outage, logged) and closes the idle
  // connections; the keeper thread brings it back.
  void MarkDown(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu) {
    std::vector<Context> closing;
    {
      absl::MutexLock lock(&mu);
      closing.swap(idle);
      open -= static_cast<int>(closing.size());
      if (!up) return;
      up = false;
    }
    Log(absl::StrCat("redis ", name, " is down (", why.message(),
                     "): serving from the local tiers; retrying every ",
                     absl::FormatDuration(options.reconnect_interval)));
  }

  // A pooled connection, or Unavailable at once while Redis is down.
  absl::StatusOr<Context> Take(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu) {
    {
      absl::MutexLock lock(&mu);
      for (;;) {
        if (!up || stopping) {
          ++skipped;
          return absl::UnavailableError(absl::StrCat("redis ", name, " is down"));
        }
        if (!idle.empty()) {
          Context c = std::move(idle.back());
          idle.pop_back();
          return c;
        }
        if (open < options.max_connections) {
          ++open;
          break;
        }
        if (changed.WaitWithDeadline(&mu, deadline)) {
          ++skipped;
          return absl::UnavailableError(absl::StrCat("all ", options.max_connections,
                                                     " connections to redis ", name, " are busy"));
        }
      }
    }
    absl::StatusOr<Context> c = Connect(deadline);
    if (!c.ok()) Lost(c.status());
    return c;
  }

  // A lent connection failed (it is closed): counted, and Redis marked
  // down.
  void Lost(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu) {
    {
      absl::MutexLock lock(&mu);
      --open;
      changed.Signal();
    }
    ++errors;
    MarkDown(why);
  }

  void Give(Context c) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    if (!up || stopping) {
      --open;
    } else {
      idle.push_back(std::move(c));
    }
    changed.Signal();
  }

  // One command on a pooled connection. A connection that fails is closed
  // and Redis marked down; an error reply (e.g. OOM when Redis is full) is
  // counted and answered as Unavailable, the connection kept.
  absl::StatusOr<Reply> Run(const std::vector<std::string_view>& argv) ABSL_LOCKS_EXCLUDED(mu) {
    const absl::Time deadline = absl::Now() + options.timeout;
    absl::StatusOr<Context> c = Take(deadline);
    if (!c.ok()) return c.status();
    absl::StatusOr<Reply> reply = Call(c->get(), argv, deadline, max_reply_bytes);
    if (!reply.ok()) {
      Lost(reply.status());
      return absl::UnavailableError(absl::StrCat("redis ", name, ": ", reply.status().message()));
    }
    Give(*std::move(c));
    if ((*reply)->type == REDIS_REPLY_ERROR) {
      ++errors;
      return absl::UnavailableError(
          absl::StrCat("redis ", name, " answered ", AsAbsl(ReplyText(**reply)).substr(0, 200)));
    }
    return reply;
  }

  // The keeper thread: while Redis is down, tries a connection every
  // reconnect_interval; while it is up, renews the locks this process holds.
  void Keep() ABSL_LOCKS_EXCLUDED(mu) {
    const absl::Duration period = std::min(options.reconnect_interval, options.lock_ttl / 3);
    absl::MutexLock lock(&mu);
    while (!stopping) {
      changed.WaitWithTimeout(&mu, period);
      if (stopping) break;
      const bool was_up = up;
      const std::map<std::string, std::string> renew = held;
      mu.Unlock();
      if (!was_up) {
        (void)Reconnect();
      } else {
        const std::string ttl_ms = absl::StrCat(absl::ToInt64Milliseconds(options.lock_ttl));
        for (const auto& [lock_key, value] : renew) {
          (void)Run({"EVAL", kRenewScript, "1", lock_key, value, ttl_ms});
        }
      }
      mu.Lock();
    }
  }

  // One attempt to reach Redis (connect, AUTH, PING); marks it up on
  // success, else says why not.
  absl::Status Reconnect() ABSL_LOCKS_EXCLUDED(mu) {
    const absl::Time deadline = absl::Now() + options.timeout;
    absl::StatusOr<Context> c = Connect(deadline);
    if (c.ok()) {
      absl::StatusOr<Reply> pong = Call(c->get(), {"PING"}, deadline, 4096);
      if (!pong.ok()) {
        c = pong.status();
      } else if ((*pong)->type != REDIS_REPLY_STATUS) {
        c = absl::UnavailableError(
            absl::StrCat("PING answered ", AsAbsl(ReplyText(**pong)).substr(0, 200)));
      }
    }
    if (!c.ok()) return c.status();
    {
      absl::MutexLock lock(&mu);
      if (stopping) return absl::UnavailableError("stopping");
      up = true;
      ++open;
      idle.push_back(*std::move(c));
      changed.Signal();
    }
    Log(absl::StrCat("redis ", name, " is up: shared tier on"));
    return absl::OkStatus();
  }
};

RedisCache::RedisCache(std::unique_ptr<State> state) : state_(std::move(state)) {}

absl::StatusOr<std::unique_ptr<RedisCache>> RedisCache::Create(RedisCacheOptions options) {
  if (options.host.empty()) return absl::InvalidArgumentError("redis host: empty");
  if (options.port <= 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("redis port: got ", options.port, ", expected 1..65535"));
  }
  if (options.timeout <= absl::ZeroDuration() || options.lock_ttl < absl::Milliseconds(3) ||
      options.reconnect_interval <= absl::ZeroDuration() || options.max_connections < 1) {
    return absl::InvalidArgumentError(
        "redis timeout, lock expiry, reconnect interval and connections must be positive");
  }
  if (options.trust.fleet_key.size() < kMinFleetKeyBytes ||
      options.trust.fleet_key.size() > kMaxFleetKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a shared Redis tier needs a fleet key of ", kMinFleetKeyBytes, "..", kMaxFleetKeyBytes,
        " bytes (--fleet-key FILE; `openssl rand -hex 32` makes one), so that no value is "
        "served that a server of the fleet did not write; got ",
        options.trust.fleet_key.size(), " bytes"));
  }
  auto state = std::make_unique<State>();
  state->name = absl::StrCat(options.host, ":", options.port);
  const std::string ns =
      absl::StrCat(options.key_prefix, ":f", kFormatVersion, ":e", kCacheEntryVersion, ":");
  state->value_prefix = ns + "kernel:";
  state->lock_prefix = ns + "lock:";
  state->fence_key = ns + "lock-fence";
  state->max_reply_bytes = options.max_value_bytes + 64;
  state->options = std::move(options);
  if (absl::Status reached = state->Reconnect(); !reached.ok()) {
    state->Log(absl::StrCat("redis ", state->name, " is not reachable (", reached.message(),
                            "): serving from the local tiers until it is"));
  }
  State* s = state.get();
  state->keeper = std::thread([s] { s->Keep(); });
  return std::unique_ptr<RedisCache>(new RedisCache(std::move(state)));
}

RedisCache::~RedisCache() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->stopping = true;
    state_->changed.SignalAll();
  }
  state_->keeper.join();
}

std::string RedisCache::ValueKey(const std::string& key) const {
  return state_->value_prefix + key;
}

absl::StatusOr<ArtifactPtr> RedisCache::Get(const std::string& key) {
  State& s = *state_;
  if (!IsValidCacheKey(key)) return CacheKeyError(key);
  const std::string value_key = ValueKey(key);
  absl::StatusOr<Reply> reply = s.Run({"GET", value_key});
  if (!reply.ok()) return reply.status();
  if ((*reply)->type == REDIS_REPLY_NIL) {
    ++s.misses;
    return absl::NotFoundError(absl::StrCat("no artifact ", key, " in redis"));
  }
  absl::StatusOr<DecodedEntry> entry =
      (*reply)->type == REDIS_REPLY_STRING
          ? DecodeCacheEntry(ReplyText(**reply), key, s.options.trust)
          : absl::DataLossError(absl::StrCat("reply of type ", (*reply)->type));
  if (!entry.ok()) return Drop(key, entry.status());
  ++s.hits;
  return std::make_shared<const v1::KernelArtifact>(std::move(entry->artifact));
}

absl::Status RedisCache::Drop(const std::string& key, const absl::Status& why) {
  State& s = *state_;
  if (!IsValidCacheKey(key)) return CacheKeyError(key);
  // Deleted so that the next compile stores a good one. (A good value
  // stored between the GET and this DEL is lost too: one more compile.)
  ++s.corrupt;
  if (IsUntrustedEntry(why)) ++s.untrusted;
  (void)s.Run({"DEL", ValueKey(key)});
  return DroppedCorruptEntry("redis", key, why);
}

absl::Status RedisCache::Put(const std::string& key, ArtifactPtr artifact) {
  State& s = *state_;
  if (!IsValidCacheKey(key)) return CacheKeyError(key);
  if (artifact == nullptr || artifact->key() != key) {
    return absl::InvalidArgumentError(absl::StrCat("artifact stored under another key: ", key));
  }
  absl::StatusOr<std::string> entry =
      EncodeCacheEntry(*artifact, EntryOrigin::kCompiled, s.options.trust);
  if (!entry.ok()) return entry.status();
  // Every reader would refuse it.
  if (entry->size() > s.options.max_value_bytes) return absl::OkStatus();
  absl::StatusOr<Reply> reply =
      s.Run({"SET", ValueKey(key), *entry, "PX",
             absl::StrCat(absl::ToInt64Milliseconds(s.options.value_ttl))});
  if (!reply.ok()) return reply.status();
  ++s.stores;
  return absl::OkStatus();
}

CacheUsage RedisCache::Usage() const {
  CacheUsage usage;
  usage.corrupt_entries = state_->corrupt;
  usage.untrusted_entries = state_->untrusted;
  return usage;
}

SharedArtifactCache::Lock RedisCache::TryLock(const std::string& key) {
  State& s = *state_;
  if (!IsValidCacheKey(key)) return Lock::kUnavailable;
  const std::string lock_key = s.lock_prefix + key;
  absl::StatusOr<Reply> reply =
      s.Run({"EVAL", kLockScript, "2", lock_key, s.fence_key, s.owner,
             absl::StrCat(absl::ToInt64Milliseconds(s.options.lock_ttl))});
  if (!reply.ok()) return Lock::kUnavailable;
  if ((*reply)->type != REDIS_REPLY_INTEGER) {
    ++s.errors;
    return Lock::kUnavailable;
  }
  const long long fence = (*reply)->integer;
  if (fence == -1) {
    ++s.stale_locks;
    s.Log(absl::StrCat("redis ", s.name, ": lock ", lock_key,
                       " has no expiry or no fencing token (an older kforge, or set by hand); "
                       "it is taken for stale in ",
                       absl::FormatDuration(s.options.lock_ttl)));
  }
  if (fence <= 0) return Lock::kHeldElsewhere;
  absl::MutexLock lock(&s.mu);
  s.held[lock_key] = absl::StrCat(fence, ":", s.owner);
  return Lock::kAcquired;
}

void RedisCache::Unlock(const std::string& key) {
  State& s = *state_;
  const std::string lock_key = s.lock_prefix + key;
  std::string value;
  {
    absl::MutexLock lock(&s.mu);
    auto it = s.held.find(lock_key);
    if (it == s.held.end()) return;
    value = std::move(it->second);
    s.held.erase(it);
  }
  // Failing, the lock lapses at its expiry.
  (void)s.Run({"EVAL", kUnlockScript, "1", lock_key, value});
}

RedisCounters RedisCache::Counters() const {
  const State& s = *state_;
  RedisCounters out;
  out.hits = s.hits;
  out.misses = s.misses;
  out.errors = s.errors;
  out.skipped = s.skipped;
  out.corrupt_entries = s.corrupt;
  out.untrusted_entries = s.untrusted;
  out.stores = s.stores;
  out.stale_locks = s.stale_locks;
  absl::MutexLock lock(&state_->mu);
  out.up = state_->up;
  return out;
}

}  // namespace kforge
