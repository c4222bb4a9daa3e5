// The fleet's shared tier against a real redis-server on a free loopback
// port: RedisCache on its own (values, verification, limits, password,
// outages, the fleet lock), then three real `kforge serve` processes with
// separate disk caches sharing one Redis. Skips, saying why, where
// redis-server is not installed (scripts/install_deps.sh installs it).
#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/sha256.h"
#include "compiler/compiler.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kforge/v1/service.grpc.pb.h"
#include "model/spec.h"
#include "service/cache_entry.h"
#include "service/kernel_store.h"
#include "service/redis_cache.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using ::kforge::testing::FakeArtifact;
using ::kforge::testing::ServeProcess;
using ::kforge::testing::SpawnWithLog;
using ::kforge::testing::TempDir;
using ::kforge::testing::UnusedLoopbackPort;

constexpr char kBinary[] = KFORGE_BINARY;
constexpr char kArch[] = "sm_90a";

std::string FindRedisServer() {
  for (const char* dir : {"/usr/bin", "/usr/sbin", "/usr/local/bin"}) {
    const std::string path = absl::StrCat(dir, "/redis-server");
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

// A redis-server child with no persistence; killed when it goes out of
// scope.
class RedisServer {
 public:
  RedisServer(const fs::path& dir, int port, std::vector<std::string> extra = {})
      : port_(port), log_(dir / absl::StrCat("redis-", port, ".log")) {
    std::vector<std::string> argv = {
        FindRedisServer(), "--port", absl::StrCat(port), "--bind", "127.0.0.1",
        "--save",          "",       "--appendonly",     "no",     "--dir",
        dir.string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    password_ = extra.size() == 2 && extra[0] == "--requirepass" ? extra[1] : "";
    pid_ = SpawnWithLog(std::move(argv), {}, log_);
  }
  ~RedisServer() { Kill(); }

  bool WaitReady() {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      Reply pong = Command({"PING"});
      if (pong != nullptr && pong->type == REDIS_REPLY_STATUS) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << "redis-server did not start: " << testing::ReadFileOrEmpty(log_);
    return false;
  }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // One command on a fresh connection (AUTH first when the server has a
  // password); null when Redis cannot be reached.
  Reply Command(const std::vector<std::string>& argv) const {
    std::unique_ptr<redisContext, void (*)(redisContext*)> c(
        redisConnectWithTimeout("127.0.0.1", port_, timeval{2, 0}), redisFree);
    if (c == nullptr || c->err != 0) return nullptr;
    if (!password_.empty()) {
      Reply auth(static_cast<redisReply*>(redisCommand(c.get(), "AUTH %s", password_.c_str())));
    }
    std::vector<const char*> ptrs;
    std::vector<size_t> lens;
    for (const std::string& a : argv) {
      ptrs.push_back(a.data());
      lens.push_back(a.size());
    }
    return Reply(static_cast<redisReply*>(
        redisCommandArgv(c.get(), static_cast<int>(argv.size()), ptrs.data(), lens.data())));
  }

  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int port_;
  fs::path log_;
  std::string password_;
  pid_t pid_ = -1;
};

#define KFORGE_REQUIRE_REDIS_SERVER()                                                  \
  if (FindRedisServer().empty()) {                                                     \
    GTEST_SKIP() << "redis-server is not installed (scripts/install_deps.sh installs " \
                    "it): the Redis tier is not tested";                               \
  }

// The fleet's shared secret in these tests (service/cache_entry.h).
const std::string kFleetKey = "fleet-key-for-the-redis-tests-0123456789abcdef";

RedisCacheOptions OptionsFor(int port, const std::string& fleet_key = kFleetKey) {
  RedisCacheOptions options;
  options.trust.fleet_key = fleet_key;
  options.host = "127.0.0.1";
  options.port = port;
  options.timeout = absl::Milliseconds(300);
  options.reconnect_interval = absl::Milliseconds(100);
  return options;
}

std::string Key(char c) { return std::string(64, c); }

bool WaitUp(RedisCache& cache, bool up, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (cache.Counters().up == up) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// A fresh redis-server for each test.
class WithRedis : public ::testing::Test {
 protected:
  void SetUp() override {
    KFORGE_REQUIRE_REDIS_SERVER();
    redis_ = std::make_unique<RedisServer>(tmp_.path(), UnusedLoopbackPort());
    ASSERT_TRUE(redis_->WaitReady());
  }
  TempDir tmp_{"kforge_redis_test"};
  std::unique_ptr<RedisServer> redis_;
};

using RedisCacheTest = WithRedis;

TEST_F(RedisCacheTest, StoresUnderAVersionedKeyAndReadsBack) {
  auto cache = RedisCache::Create(OptionsFor(redis_->port()));
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_TRUE((*cache)->Counters().up);
  const std::string key = Key('a');
  EXPECT_TRUE(absl::IsNotFound((*cache)->Get(key).status()));
  ArtifactPtr artifact = FakeArtifact(key, 100000);
  ASSERT_TRUE((*cache)->Put(key, artifact).ok());
  absl::StatusOr<ArtifactPtr> back = (*cache)->Get(key);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE((*back)->SerializeAsString() == artifact->SerializeAsString());
  EXPECT_EQ((*cache)->ValueKey(key),
            absl::StrCat("kforge:f", kFormatVersion, ":e", kCacheEntryVersion, ":kernel:", key));
  Reply ttl = redis_->Command({"PTTL", (*cache)->ValueKey(key)});
  ASSERT_NE(ttl, nullptr);
  EXPECT_GT(ttl->integer, 0);  // values expire
  const RedisCounters counters = (*cache)->Counters();
  EXPECT_EQ(counters.hits, 1u);
  EXPECT_EQ(counters.misses, 1u);
  EXPECT_EQ(counters.stores, 1u);
  EXPECT_EQ(counters.errors, 0u);
  // Not a key: refused before Redis is asked.
  EXPECT_TRUE(absl::IsInvalidArgument((*cache)->Get("../../etc").status()));
}

TEST_F(RedisCacheTest, DamagedValuesAreCountedDeletedAndNeverServed) {
  auto cache = RedisCache::Create(OptionsFor(redis_->port()));
  ASSERT_TRUE(cache.ok()) << cache.status();
  const std::string key = Key('b');
  ASSERT_TRUE((*cache)->Put(key, FakeArtifact(key, 50000)).ok());
  const std::string value_key = (*cache)->ValueKey(key);
  Reply value = redis_->Command({"GET", value_key});
  ASSERT_NE(value, nullptr);
  ASSERT_EQ(value->type, REDIS_REPLY_STRING);
  const std::string good(value->str, value->len);
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x01;
  // Another key's valid entry stored under this key.
  const std::string other = Key('c');
  absl::StatusOr<std::string> foreign =
      EncodeCacheEntry(*FakeArtifact(other, 50000), EntryOrigin::kCompiled, OptionsFor(0).trust);
  ASSERT_TRUE(foreign.ok());
  int corrupt = 0;
  for (const std::string& bad :
       {flipped, good.substr(0, good.size() - 1), good.substr(0, 10), *foreign, std::string()}) {
    ASSERT_NE(redis_->Command({"SET", value_key, bad}), nullptr);
    absl::StatusOr<ArtifactPtr> got = (*cache)->Get(key);
    EXPECT_TRUE(absl::IsNotFound(got.status())) << got.status();
    EXPECT_EQ((*cache)->Counters().corrupt_entries, static_cast<uint64_t>(++corrupt));
    Reply exists = redis_->Command({"EXISTS", value_key});
    ASSERT_NE(exists, nullptr);
    EXPECT_EQ(exists->integer, 0) << "the damaged value was left in Redis";
  }
  EXPECT_EQ((*cache)->Counters().hits, 0u);
}

TEST_F(RedisCacheTest, OversizedAndUnexpectedRepliesAreRefused) {
  RedisCacheOptions options = OptionsFor(redis_->port());
  options.max_value_bytes = 4096;
  auto cache = RedisCache::Create(options);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const std::string key = Key('d');
  // Too big to store: skipped, not an error.
  EXPECT_TRUE((*cache)->Put(key, FakeArtifact(key, 10000)).ok());
  EXPECT_EQ((*cache)->Counters().stores, 0u);
  ASSERT_NE(redis_->Command({"SET", (*cache)->ValueKey(key), std::string(1 << 20, 'x')}), nullptr);
  absl::StatusOr<ArtifactPtr> got = (*cache)->Get(key);
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  EXPECT_GE((*cache)->Counters().errors, 1u);
  // Dropped the connection; the keeper reconnects.
  ASSERT_TRUE(WaitUp(**cache, true));
  // A list where a value belongs: an error reply, counted, connection kept.
  ASSERT_NE(redis_->Command({"DEL", (*cache)->ValueKey(key)}), nullptr);
  ASSERT_NE(redis_->Command({"RPUSH", (*cache)->ValueKey(key), "a", "b"}), nullptr);
  const uint64_t errors = (*cache)->Counters().errors;
  EXPECT_FALSE((*cache)->Get(key).ok());
  EXPECT_EQ((*cache)->Counters().errors, errors + 1);
}

TEST_F(RedisCacheTest, LockIsExclusiveRenewedWhileHeldAndLapsesWhenTheHolderDies) {
  RedisCacheOptions options = OptionsFor(redis_->port());
  options.lock_ttl = absl::Milliseconds(300);
  auto a = RedisCache::Create(options);
  auto b = RedisCache::Create(options);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string key = Key('e');
  EXPECT_EQ((*a)->TryLock(key), SharedArtifactCache::Lock::kAcquired);
  EXPECT_EQ((*b)->TryLock(key), SharedArtifactCache::Lock::kHeldElsewhere);
  (*a)->Unlock(key);
  EXPECT_EQ((*b)->TryLock(key), SharedArtifactCache::Lock::kAcquired);
  EXPECT_EQ((*a)->TryLock(key), SharedArtifactCache::Lock::kHeldElsewhere);
  // Held past several expiries: renewed by b's keeper.
  absl::SleepFor(absl::Seconds(1));
  EXPECT_EQ((*a)->TryLock(key), SharedArtifactCache::Lock::kHeldElsewhere);
  // a's Unlock of a lock it does not hold leaves b's alone.
  (*a)->Unlock(key);
  EXPECT_EQ((*a)->TryLock(key), SharedArtifactCache::Lock::kHeldElsewhere);
  // b dies without unlocking: the lock lapses within one expiry.
  b->reset();
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_EQ((*a)->TryLock(key), SharedArtifactCache::Lock::kAcquired);
}

// The Redis key of the fleet lock on `key`.
std::string LockKey(const RedisCache& cache, const std::string& key) {
  std::string name = cache.ValueKey(key);
  const size_t kernel = name.rfind(":kernel:");
  return name.replace(kernel, std::string(":kernel:").size(), ":lock:");
}

// Issue 43 (finding 5): a lock key without an expiry (written by an older
// server or by hand) was never taken over, so a miss behind it waited for a
// compile's timeout plus the lock's expiry. Our locks always expire and
// carry a fencing token that grows with each lock; a lock without an expiry
// or a fencing token is given the lock expiry when first seen, so it
// lapses one lock TTL later.
TEST_F(RedisCacheTest, LocksCarryExpiryAndFencingTokenAndForeignOnesLapseAfterOneTtl) {
  RedisCacheOptions options = OptionsFor(redis_->port());
  options.lock_ttl = absl::Milliseconds(300);
  auto a = RedisCache::Create(options);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(WaitUp(**a, true));
  const std::string key = Key('f');
  const std::string lock_key = LockKey(**a, key);
  // Fencing tokens: "<number>:<owner>", the number growing lock by lock.
  auto fence = [&]() -> long long {
    Reply value = redis_->Command({"GET", lock_key});
    if (value == nullptr || value->type != REDIS_REPLY_STRING) return -1;
    const std::string text(value->str, value->len);
    const size_t colon = text.find(':');
    long long n = -1;
    if (colon == std::string::npos || !absl::SimpleAtoi(text.substr(0, colon), &n)) return -1;
    return n;
  };
  ASSERT_EQ((*a)->TryLock(key), SharedArtifactCache::Lock::kAcquired);
  const long long first = fence();
  EXPECT_GT(first, 0);
  Reply ttl = redis_->Command({"PTTL", lock_key});
  ASSERT_NE(ttl, nullptr);
  EXPECT_GT(ttl->integer, 0);
  EXPECT_LE(ttl->integer, 300);
  (*a)->Unlock(key);
  ASSERT_EQ((*a)->TryLock(key), SharedArtifactCache::Lock::kAcquired);
  EXPECT_GT(fence(), first);
  (*a)->Unlock(key);

  // A lock set by hand, with no expiry and no fencing token: held for one
  // lock TTL from when it is seen, then taken.
  ASSERT_NE(redis_->Command({"SET", lock_key, "by-hand"}), nullptr);
  EXPECT_EQ((*a)->TryLock(key), SharedArtifactCache::Lock::kHeldElsewhere);
  absl::SleepFor(absl::Milliseconds(450));
  EXPECT_EQ((*a)->TryLock(key), SharedArtifactCache::Lock::kAcquired);
  (*a)->Unlock(key);
  // One without a fencing token that expires in an hour: the same.
  ASSERT_NE(redis_->Command({"SET", lock_key, "0123abcd", "PX", "3600000"}), nullptr);
  EXPECT_EQ((*a)->TryLock(key), SharedArtifactCache::Lock::kHeldElsewhere);
  absl::SleepFor(absl::Milliseconds(450));
  EXPECT_EQ((*a)->TryLock(key), SharedArtifactCache::Lock::kAcquired);
}

TEST_F(RedisCacheTest, PasswordIsSent) {
  TempDir dir{"kforge_redis_auth"};
  RedisServer locked(dir.path(), UnusedLoopbackPort(), {"--requirepass", "s3cret-fleet-password"});
  ASSERT_TRUE(locked.WaitReady());
  RedisCacheOptions options = OptionsFor(locked.port());
  auto without = RedisCache::Create(options);
  ASSERT_TRUE(without.ok());
  EXPECT_FALSE((*without)->Counters().up);
  EXPECT_TRUE(absl::IsUnavailable((*without)->Get(Key('f')).status()));
  options.password = "s3cret-fleet-password";
  auto with = RedisCache::Create(options);
  ASSERT_TRUE(with.ok());
  EXPECT_TRUE((*with)->Counters().up);
  ASSERT_TRUE((*with)->Put(Key('f'), FakeArtifact(Key('f'), 100)).ok());
  EXPECT_TRUE((*with)->Get(Key('f')).ok());
}

// A shared tier is never trusted blindly: no key, no Redis tier.
TEST_F(RedisCacheTest, RefusedWithoutAFleetKey) {
  for (const std::string& key : {std::string(), std::string(kMinFleetKeyBytes - 1, 'k')}) {
    auto cache = RedisCache::Create(OptionsFor(redis_->port(), key));
    EXPECT_TRUE(absl::IsInvalidArgument(cache.status())) << cache.status();
    EXPECT_TRUE(testing::Contains(cache.status().message(), "fleet key"));
  }
}

TEST_F(RedisCacheTest, ValuesNotSealedWithTheFleetKeyAreCountedDeletedAndNeverServed) {
  auto cache = RedisCache::Create(OptionsFor(redis_->port()));
  auto other = RedisCache::Create(OptionsFor(redis_->port(), std::string(48, 'o')));
  ASSERT_TRUE(cache.ok() && other.ok());
  const std::string key = Key('d');
  const std::string value_key = (*cache)->ValueKey(key);
  // Whole values: one from a server with another key, one with its digest
  // recomputed and no MAC at all.
  ASSERT_TRUE((*other)->Put(key, FakeArtifact(key, 5000)).ok());
  Reply sealed = redis_->Command({"GET", value_key});
  ASSERT_NE(sealed, nullptr);
  ASSERT_EQ(sealed->type, REDIS_REPLY_STRING);
  absl::StatusOr<std::string> unsealed =
      EncodeCacheEntry(*FakeArtifact(key, 5000), EntryOrigin::kCompiled, EntryTrust{});
  ASSERT_TRUE(unsealed.ok());
  int untrusted = 0;
  for (const std::string& value : {std::string(sealed->str, sealed->len), *unsealed}) {
    ASSERT_NE(redis_->Command({"SET", value_key, value}), nullptr);
    absl::StatusOr<ArtifactPtr> got = (*cache)->Get(key);
    EXPECT_TRUE(absl::IsNotFound(got.status())) << got.status();
    EXPECT_TRUE(testing::Contains(got.status().message(), "untrusted"));
    ++untrusted;
    EXPECT_EQ((*cache)->Counters().untrusted_entries, static_cast<uint64_t>(untrusted));
    EXPECT_EQ((*cache)->Counters().corrupt_entries, static_cast<uint64_t>(untrusted));
    Reply exists = redis_->Command({"EXISTS", value_key});
    ASSERT_NE(exists, nullptr);
    EXPECT_EQ(exists->integer, 0) << "the untrusted value was left in Redis";
  }
  EXPECT_EQ((*cache)->Counters().hits, 0u);
}

TEST(RedisCacheOutageTest, DownRedisAnswersAtOnceAndIsFoundAgain) {
  KFORGE_REQUIRE_REDIS_SERVER();
  TempDir dir{"kforge_redis_outage"};
  const int port = UnusedLoopbackPort();
  auto cache = RedisCache::Create(OptionsFor(port));
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_FALSE((*cache)->Counters().up);
  const absl::Time start = absl::Now();
  for (int i = 0; i < 100; ++i) {
    EXPECT_TRUE(absl::IsUnavailable((*cache)->Get(Key('a')).status()));
  }
  EXPECT_EQ((*cache)->TryLock(Key('a')), SharedArtifactCache::Lock::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "calls to a down Redis must not wait";
  EXPECT_GE((*cache)->Counters().skipped, 100u);

  RedisServer redis(dir.path(), port);
  ASSERT_TRUE(redis.WaitReady());
  ASSERT_TRUE(WaitUp(**cache, true));
  ASSERT_TRUE((*cache)->Put(Key('a'), FakeArtifact(Key('a'), 1000)).ok());
  redis.Kill();
  EXPECT_TRUE(absl::IsUnavailable((*cache)->Get(Key('a')).status()));
  EXPECT_FALSE((*cache)->Counters().up);
}

// ---- three kforge servers sharing one Redis ----

struct KernelReply {
  grpc::Status status;
  v1::GetKernelResponse response;
};

// Writes `key` to a 0600 file in `dir` and returns its path. Servers that
// share a key share the file, and one may be reading it while the next is
// set up: the file is written beside it and renamed into place, so a
// reader never sees it truncated (CI once saw "the file is empty").
std::string FleetKeyFile(const fs::path& dir, const std::string& key) {
  const fs::path path = dir / absl::StrCat("fleet-", Sha256Hex(key).substr(0, 8), ".key");
  const fs::path tmp = fs::path(path.string() + ".tmp");
  std::ofstream(tmp) << key << "\n";
  fs::permissions(tmp, fs::perms::owner_read | fs::perms::owner_write);
  fs::rename(tmp, path);
  return path.string();
}

class Fleet {
 public:
  // Server i uses fleet_keys[i] (kFleetKey for those not named).
  Fleet(const fs::path& dir, const std::string& redis, int servers,
        std::vector<std::string> fleet_keys = {}) {
    fleet_keys.resize(servers, kFleetKey);
    for (int i = 0; i < servers; ++i) {
      servers_.push_back(std::make_unique<ServeProcess>(
          kBinary, dir / absl::StrCat("cache", i), dir / absl::StrCat("server", i, ".log"),
          std::vector<std::string>{"--redis", redis, "--redis-timeout", "300ms", "--workers", "2",
                                   "--fleet-key", FleetKeyFile(dir, fleet_keys[i])}));
    }
    for (auto& s : servers_) {
      if (!s->WaitForAddress()) return;
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(256 << 20);
      stubs_.push_back(v1::KernelService::NewStub(
          grpc::CreateCustomChannel(s->address(), grpc::InsecureChannelCredentials(), args)));
    }
  }
  bool ok() const { return stubs_.size() == servers_.size(); }
  int size() const { return static_cast<int>(stubs_.size()); }

  KernelReply Get(int server, int tp = 8) {
    v1::GetKernelRequest request;
    request.mutable_kernel()->mutable_preset()->set_name("glm-5");
    request.mutable_kernel()->mutable_preset()->set_tensor_parallel(tp);
    request.set_arch(kArch);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    // A first connection can fail on a loaded 2-core CI machine (seen once:
    // one server's 16 concurrent requests failed "failed to connect to all
    // addresses" while its log shows it serving); a raw stub fails fast on
    // that, where kforge's own clients retry UNAVAILABLE. Wait for the
    // channel instead, within the deadline: a server that is really down
    // still fails the test.
    context.set_wait_for_ready(true);
    KernelReply reply;
    reply.status = stubs_[server]->GetKernel(&context, request, &reply.response);
    return reply;
  }

  v1::StatsResponse Stats(int server) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    context.set_wait_for_ready(true);  // as Get
    v1::StatsResponse stats;
    grpc::Status s = stubs_[server]->Stats(&context, v1::StatsRequest(), &stats);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return stats;
  }

 private:
  std::vector<std::unique_ptr<ServeProcess>> servers_;
  std::vector<std::unique_ptr<v1::KernelService::Stub>> stubs_;
};

using FleetTest = WithRedis;

TEST_F(FleetTest, FortyEightColdRequestsOnThreeServersCompileOnceFleetWide) {
  Fleet fleet(tmp_.path(), redis_->address(), 3);
  ASSERT_TRUE(fleet.ok());
  constexpr int kRequests = 48;
  std::vector<KernelReply> replies(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] { replies[i] = fleet.Get(i % 3); });
  }
  for (std::thread& t : threads) t.join();
  int compiled = 0;
  for (const KernelReply& r : replies) {
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_TRUE(r.response.artifact().cubin() == replies[0].response.artifact().cubin());
    if (r.response.source() == v1::ARTIFACT_SOURCE_COMPILED) ++compiled;
  }
  EXPECT_EQ(compiled, 1);
  uint64_t compiles = 0, waits = 0, local = 0;
  for (int i = 0; i < 3; ++i) {
    const v1::StatsResponse stats = fleet.Stats(i);
    compiles += stats.compiles();
    waits += stats.redis_lock_waits();
    local += stats.redis_local_compiles();
    EXPECT_EQ(stats.redis_up(), 1u);
    EXPECT_EQ(stats.redis_errors(), 0u);
  }
  EXPECT_EQ(compiles, 1u);
  EXPECT_EQ(waits, 2u);  // the two servers that did not compile
  EXPECT_EQ(local, 0u);
}

TEST_F(FleetTest, RedisKilledMidwayEveryRequestIsAnswered) {
  Fleet fleet(tmp_.path(), redis_->address(), 3);
  ASSERT_TRUE(fleet.ok());
  // Four kernels, 48 requests: compiles run when Redis dies.
  constexpr int kRequests = 48;
  const int tps[] = {1, 2, 4, 8};
  std::vector<KernelReply> replies(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] { replies[i] = fleet.Get(i % 3, tps[i % 4]); });
  }
  absl::SleepFor(absl::Milliseconds(300));
  redis_->Kill();
  for (std::thread& t : threads) t.join();
  for (const KernelReply& r : replies) {
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  }
  // Served from the local tiers afterwards, Redis still down.
  for (int i = 0; i < 3; ++i) {
    const KernelReply again = fleet.Get(i, 8);
    EXPECT_TRUE(again.status.ok()) << again.status.error_message();
    const v1::StatsResponse stats = fleet.Stats(i);
    EXPECT_EQ(stats.redis_up(), 0u);
    EXPECT_GE(stats.redis_errors() + stats.redis_skipped(), 1u);
  }
}

TEST_F(FleetTest, CorruptedValueIsDetectedAndNeverServed) {
  Fleet fleet(tmp_.path(), redis_->address(), 3);
  ASSERT_TRUE(fleet.ok());
  const KernelReply first = fleet.Get(0);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.response.source(), v1::ARTIFACT_SOURCE_COMPILED);
  // A second server takes it from Redis.
  const KernelReply shared = fleet.Get(1);
  ASSERT_TRUE(shared.status.ok()) << shared.status.error_message();
  EXPECT_EQ(shared.response.source(), v1::ARTIFACT_SOURCE_REDIS);
  EXPECT_TRUE(shared.response.artifact().cubin() == first.response.artifact().cubin());
  EXPECT_EQ(fleet.Stats(1).compiles(), 0u);

  // One bit of the cubin flipped in Redis.
  const std::string value_key = absl::StrCat("kforge:f", kFormatVersion, ":e", kCacheEntryVersion,
                                             ":kernel:", first.response.artifact().key());
  Reply value = redis_->Command({"GET", value_key});
  ASSERT_NE(value, nullptr);
  ASSERT_EQ(value->type, REDIS_REPLY_STRING);
  std::string bad(value->str, value->len);
  const size_t at = bad.find(first.response.artifact().cubin().substr(64, 16));
  ASSERT_NE(at, std::string::npos);
  bad[at] ^= 0x01;
  ASSERT_NE(redis_->Command({"SET", value_key, bad}), nullptr);

  const KernelReply third = fleet.Get(2);
  ASSERT_TRUE(third.status.ok()) << third.status.error_message();
  EXPECT_EQ(third.response.source(), v1::ARTIFACT_SOURCE_COMPILED);
  EXPECT_TRUE(third.response.artifact().cubin() == first.response.artifact().cubin());
  const v1::StatsResponse stats = fleet.Stats(2);
  EXPECT_EQ(stats.redis_corrupt_entries(), 1u);
  EXPECT_EQ(stats.compiles(), 1u);
  // The rebuilt kernel replaced the damaged value.
  Reply after = redis_->Command({"GET", value_key});
  ASSERT_NE(after, nullptr);
  ASSERT_EQ(after->type, REDIS_REPLY_STRING);
  const std::string stored(after->str, after->len);
  EXPECT_TRUE(stored != bad);
  EXPECT_TRUE(stored.find(first.response.artifact().cubin()) != std::string::npos);
}

// Issue 43 (finding 5), end to end: a miss behind a lock key that never
// expires waited for the compile timeout plus the lock TTL (130 s at the
// defaults; a 120 s client got DEADLINE_EXCEEDED). It now waits about one
// lock TTL, then compiles.
TEST_F(WithRedis, MissBehindALockWithoutExpiryWaitsOneLockTtlNotACompileTimeout) {
  KernelStoreOptions o;
  o.cache_dir = (tmp_.path() / "cache").string();
  o.pool.workers = 1;
  o.pool.worker_binary = kBinary;
  o.pool.timeout = absl::Seconds(60);
  o.redis = OptionsFor(redis_->port());
  o.redis.lock_ttl = absl::Milliseconds(500);
  o.trust.fleet_key = kFleetKey;
  absl::StatusOr<std::unique_ptr<KernelStore>> store = KernelStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_EQ((*store)->Stats().redis_up(), 1u);
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("glm-5", 8);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<CompilePlan> plan = KernelCompiler().Plan(KernelSpecOf(*spec), kArch);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto probe = RedisCache::Create(OptionsFor(redis_->port()));
  ASSERT_TRUE(probe.ok());
  ASSERT_NE(redis_->Command({"SET", LockKey(**probe, plan->key), "left-by-an-old-server"}),
            nullptr);
  auto r = (*store)->GetKernel(KernelSpecOf(*spec), kArch, false, absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, v1::ARTIFACT_SOURCE_COMPILED);
  const v1::StatsResponse stats = (*store)->Stats();
  EXPECT_EQ(stats.compiles(), 1u);
  EXPECT_EQ(stats.redis_lock_waits(), 1u);
  EXPECT_EQ(stats.redis_local_compiles(), 0u);  // it took the lock
}

std::string ValueKeyOf(const std::string& key) {
  return absl::StrCat("kforge:f", kFormatVersion, ":e", kCacheEntryVersion, ":kernel:", key);
}

// Poisoned values (finding 1 of issue 43): a writer of Redis puts another
// real kernel's artifact (TP 4's, relabelled with TP 8's key) under TP 8's
// key with its digest recomputed, and a value sealed with the fleet key
// (a server with a bug, or the key leaked) whose cubin is not an ELF.
// Neither is served, each is counted by tier and deleted, and the kernel
// is compiled where it was asked for.
TEST_F(FleetTest, PoisonedValuesAreNeverServedCountedAndDeleted) {
  Fleet fleet(tmp_.path(), redis_->address(), 3);
  ASSERT_TRUE(fleet.ok());
  const KernelReply tp8 = fleet.Get(0, 8);
  const KernelReply tp4 = fleet.Get(0, 4);
  ASSERT_TRUE(tp8.status.ok() && tp4.status.ok()) << tp8.status.error_message();
  const std::string& key = tp8.response.artifact().key();
  const std::string& cubin = tp8.response.artifact().cubin();
  ASSERT_FALSE(tp4.response.artifact().cubin() == cubin);
  const std::string value_key = ValueKeyOf(key);

  v1::KernelArtifact swapped = tp4.response.artifact();
  swapped.set_key(key);
  absl::StatusOr<std::string> unsealed =
      EncodeCacheEntry(swapped, EntryOrigin::kCompiled, EntryTrust{});
  ASSERT_TRUE(unsealed.ok()) << unsealed.status();
  ASSERT_NE(redis_->Command({"SET", value_key, *unsealed}), nullptr);
  const KernelReply first = fleet.Get(1, 8);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.response.source(), v1::ARTIFACT_SOURCE_COMPILED);
  EXPECT_TRUE(first.response.artifact().cubin() == cubin);
  v1::StatsResponse stats = fleet.Stats(1);
  EXPECT_EQ(stats.redis_untrusted_entries(), 1u);
  EXPECT_EQ(stats.redis_corrupt_entries(), 1u);
  EXPECT_EQ(stats.redis_hits(), 0u);
  EXPECT_EQ(stats.compiles(), 1u);

  v1::KernelArtifact not_elf = tp8.response.artifact();
  not_elf.set_cubin("not an ELF, but its digest and MAC are right");
  absl::StatusOr<std::string> sealed =
      EncodeCacheEntry(not_elf, EntryOrigin::kCompiled, OptionsFor(0).trust);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  ASSERT_NE(redis_->Command({"SET", value_key, *sealed}), nullptr);
  const KernelReply second = fleet.Get(2, 8);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(second.response.source(), v1::ARTIFACT_SOURCE_COMPILED);
  EXPECT_TRUE(second.response.artifact().cubin() == cubin);
  stats = fleet.Stats(2);
  EXPECT_EQ(stats.redis_rejected_artifacts(), 1u);
  EXPECT_EQ(stats.redis_untrusted_entries(), 0u);
  EXPECT_EQ(stats.redis_corrupt_entries(), 1u);
  EXPECT_EQ(stats.disk_entries(), 1u);  // the compiled kernel, not the value
  EXPECT_EQ(stats.compiles(), 1u);

  // What Redis holds now is the rebuilt kernel, sealed with the fleet key.
  Reply after = redis_->Command({"GET", value_key});
  ASSERT_NE(after, nullptr);
  ASSERT_EQ(after->type, REDIS_REPLY_STRING);
  absl::StatusOr<DecodedEntry> stored =
      DecodeCacheEntry(std::string_view(after->str, after->len), key, OptionsFor(0).trust);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(stored->artifact.cubin() == cubin);
}

// A server with another key (a stale or a foreign one) cannot feed the
// fleet: its values read as untrusted and the kernel is compiled again. One
// without a key cannot use Redis at all.
TEST_F(FleetTest, AServerWithoutTheFleetKeyCannotFeedTheFleet) {
  Fleet fleet(tmp_.path(), redis_->address(), 2, {std::string(48, 'x')});
  ASSERT_TRUE(fleet.ok());
  const KernelReply outsider = fleet.Get(0, 8);
  ASSERT_TRUE(outsider.status.ok()) << outsider.status.error_message();
  EXPECT_EQ(outsider.response.source(), v1::ARTIFACT_SOURCE_COMPILED);
  const KernelReply member = fleet.Get(1, 8);
  ASSERT_TRUE(member.status.ok()) << member.status.error_message();
  EXPECT_EQ(member.response.source(), v1::ARTIFACT_SOURCE_COMPILED);
  const v1::StatsResponse stats = fleet.Stats(1);
  EXPECT_EQ(stats.redis_untrusted_entries(), 1u);
  EXPECT_EQ(stats.redis_hits(), 0u);
  EXPECT_EQ(stats.compiles(), 1u);

  ServeProcess keyless(kBinary, tmp_.path() / "keyless_cache", tmp_.path() / "keyless.log",
                       {"--redis", redis_->address()});
  EXPECT_EQ(keyless.WaitExit(absl::Seconds(30)), 1) << keyless.Log();
  EXPECT_TRUE(testing::Contains(keyless.Log(), "needs a fleet key"));
}

// ---- a KernelStore while another server of the fleet holds the lock ----

// A store on Redis, and the key of glm-5 TP 8 locked in Redis as another
// server compiling it would hold it.
class FleetWaitTest : public WithRedis {
 protected:
  void SetUp() override {
    WithRedis::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    KernelStoreOptions o;
    o.cache_dir = (tmp_.path() / "cache").string();
    o.pool.workers = 1;
    o.pool.worker_binary = kBinary;
    o.pool.timeout = absl::Seconds(60);
    o.redis = OptionsFor(redis_->port());
    o.trust.fleet_key = kFleetKey;  // the store's tiers take theirs from here
    absl::StatusOr<std::unique_ptr<KernelStore>> store = KernelStore::Create(o);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("glm-5", 8);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *spec;
    absl::StatusOr<CompilePlan> plan = KernelCompiler().Plan(KernelSpecOf(spec_), kArch);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto other = RedisCache::Create(OptionsFor(redis_->port()));
    ASSERT_TRUE(other.ok()) << other.status();
    other_ = *std::move(other);
    ASSERT_TRUE(WaitUp(*other_, true));
    ASSERT_EQ(store_->Stats().redis_up(), 1u);
    key_ = plan->key;
    ASSERT_EQ(other_->TryLock(key_), SharedArtifactCache::Lock::kAcquired);
  }

  // Answers of GetKernelAsync callers.
  struct Answers {
    absl::Mutex mu;
    std::vector<absl::StatusOr<KernelStore::Result>> got ABSL_GUARDED_BY(mu);
    size_t want ABSL_GUARDED_BY(mu) = 0;
    bool AwaitCount(size_t n, absl::Duration timeout) {
      absl::MutexLock lock(&mu);
      want = n;
      return mu.AwaitWithTimeout(
          absl::Condition(
              +[](Answers* a) ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->got.size() >= a->want; },
              this),
          timeout);
    }
  };

  // Until the driving caller waits for the other server's value.
  bool AwaitFleetWait() {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (store_->Stats().redis_lock_waits() == 0) {
      if (absl::Now() >= until) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }
  KernelStore::Done Answer(Answers* answers) {
    return [answers](absl::StatusOr<KernelStore::Result> r) {
      absl::MutexLock lock(&answers->mu);
      answers->got.push_back(std::move(r));
    };
  }

  std::unique_ptr<KernelStore> store_;
  std::unique_ptr<RedisCache> other_;
  v1::AttentionSpec spec_;
  std::string key_;
};

// Waiting for another server's value ran until the driving caller's
// deadline and then left the flight "for another waiter to drive"; callers
// now wait on no thread, so nothing would have answered them. The wait
// runs until the latest deadline of the flight's callers, then completes
// the flight: every caller is answered, nothing was compiled, and the next
// caller starts a new flight.
TEST_F(FleetWaitTest, WaitEndsAtTheLatestCallerDeadlineAndAnswersEveryCaller) {
  Answers answers;
  const absl::Time start = absl::Now();
  // The first caller drives the flight on its own thread.
  std::thread driver([&] {
    store_->GetKernelAsync(KernelSpecOf(spec_), kArch, false, start + absl::Seconds(1),
                           Answer(&answers));
  });
  ASSERT_TRUE(AwaitFleetWait());
  // A caller joining with a later deadline returns at once.
  const absl::Time joined = absl::Now();
  store_->GetKernelAsync(KernelSpecOf(spec_), kArch, false, start + absl::Seconds(2),
                         Answer(&answers));
  EXPECT_LT(absl::Now() - joined, absl::Milliseconds(500));
  ASSERT_TRUE(answers.AwaitCount(2, absl::Seconds(30)));
  driver.join();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(1900))
      << "the joiner's deadline bounds the wait";
  {
    absl::MutexLock lock(&answers.mu);
    for (const auto& r : answers.got) {
      EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
      EXPECT_TRUE(testing::Contains(std::string(r.status().message()), "fleet")) << r.status();
    }
  }
  v1::StatsResponse stats = store_->Stats();
  EXPECT_EQ(stats.compiles(), 0u);
  EXPECT_EQ(stats.redis_lock_waits(), 1u);
  EXPECT_EQ(stats.shared_compile_waits(), 1u);
  // The other server gives up without storing it: a new flight takes the
  // lock and compiles, once.
  other_->Unlock(key_);
  auto later =
      store_->GetKernel(KernelSpecOf(spec_), kArch, false, absl::Now() + absl::Seconds(120));
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->source, v1::ARTIFACT_SOURCE_COMPILED);
  EXPECT_EQ(later->artifact->key(), key_);
  stats = store_->Stats();
  EXPECT_EQ(stats.compiles(), 1u);
  EXPECT_EQ(stats.redis_local_compiles(), 0u);
}

// The other server stores the kernel while this one waits: every caller
// gets it, nothing is compiled here, and it is kept on disk.
TEST_F(FleetWaitTest, ValueStoredByTheHolderAnswersEveryCaller) {
  // A real artifact for the key: compiled by a store without Redis.
  ArtifactPtr built;
  {
    KernelStoreOptions o;
    o.cache_dir = (tmp_.path() / "other_cache").string();
    o.pool.workers = 1;
    o.pool.worker_binary = kBinary;
    o.pool.timeout = absl::Seconds(60);
    auto other_store = KernelStore::Create(o);
    ASSERT_TRUE(other_store.ok()) << other_store.status();
    auto r = (*other_store)->GetKernel(KernelSpecOf(spec_), kArch, false);
    ASSERT_TRUE(r.ok()) << r.status();
    built = r->artifact;
  }
  Answers answers;
  std::thread driver([&] {
    store_->GetKernelAsync(KernelSpecOf(spec_), kArch, false, absl::Now() + absl::Seconds(60),
                           Answer(&answers));
  });
  ASSERT_TRUE(AwaitFleetWait());
  store_->GetKernelAsync(KernelSpecOf(spec_), kArch, false, absl::Now() + absl::Seconds(60),
                         Answer(&answers));
  ASSERT_TRUE(other_->Put(key_, built).ok());
  other_->Unlock(key_);
  ASSERT_TRUE(answers.AwaitCount(2, absl::Seconds(30)));
  driver.join();
  {
    absl::MutexLock lock(&answers.mu);
    for (const auto& r : answers.got) {
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->source, v1::ARTIFACT_SOURCE_SHARED_COMPILE);
      EXPECT_EQ(r->artifact->cubin(), built->cubin());
    }
  }
  EXPECT_EQ(store_->Stats().compiles(), 0u);
  auto cached = store_->CachedKernel(KernelSpecOf(spec_), kArch);
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_EQ(cached->source, v1::ARTIFACT_SOURCE_MEMORY);
}

// Shutdown waits for running flights; one waiting for another server's
// value ends at once, its callers answered Unavailable.
TEST_F(FleetWaitTest, ShutdownEndsTheWaitAndAnswersItsCallers) {
  Answers answers;
  std::thread driver([&] {
    store_->GetKernelAsync(KernelSpecOf(spec_), kArch, false, absl::InfiniteFuture(),
                           Answer(&answers));
  });
  ASSERT_TRUE(AwaitFleetWait());
  const absl::Time start = absl::Now();
  store_->Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_TRUE(answers.AwaitCount(1, absl::Seconds(1)));
  driver.join();
  absl::MutexLock lock(&answers.mu);
  EXPECT_TRUE(absl::IsUnavailable(answers.got[0].status())) << answers.got[0].status();
  EXPECT_EQ(store_->Stats().compiles(), 0u);
}

}  // namespace
}  // namespace kforge
