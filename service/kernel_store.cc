#include "service/kernel_store.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/absl_compat.h"
#include "base/file_lock.h"
#include "compiler/codegen.h"
#include "compiler/compiler.h"
#include "compiler/key.h"
#include "compiler/manifest.h"
#include "model/spec.h"
#include "service/disk_cache.h"
#include "service/memory_cache.h"

namespace kforge {

namespace {

using FlightResult = absl::StatusOr<KernelStore::Result>;

// While another process holds a key's lock file (it is compiling the key),
// the flight's driver retries the lock this often at most: a cross-process
// wait costs a compile's time, so tens of milliseconds are noise.
constexpr absl::Duration kMaxLockRetry = absl::Milliseconds(50);
// Lock files are named by the key's first hex digits: 16^3 = 4096 at most.
constexpr size_t kLockStripeHexDigits = 3;
// While another server of the fleet compiles a key, its value is polled at
// most this often: a compile takes about a second, so 50 ms adds 5% at
// worst, and a fleet of tens of waiters makes a few hundred GETs a second.
constexpr absl::Duration kMaxFleetPoll = absl::Milliseconds(50);

// One compile per key in progress, shared by every caller that asks for the
// key meanwhile. No thread is set aside for it: a waiting caller drives its
// first phase (taking the key's lock file, looking on disk again, handing
// the job to the pool), and the pool's completion callback finishes it.
// Guarded by State::mu.
struct Flight {
  enum class Phase {
    kLocking,    // waiting for the key's lock file; needs a driver
    kCompiling,  // in the compile pool; its callback completes the flight
    kDone,       // `result` is set
  };
  Phase phase = Phase::kLocking;
  bool has_driver = false;  // a caller is running the kLocking phase
  int waiters = 0;          // callers in GetKernel waiting on it
  std::optional<FlightResult> result;
  absl::CondVar changed;  // phase or has_driver changed
};

}  // namespace

struct KernelStore::State {
  KernelStoreOptions options;
  KernelCompiler compiler;
  std::unique_ptr<MemoryCache> memory;
  std::unique_ptr<DiskCache> disk;
  std::unique_ptr<RedisCache> redis;  // null without --redis
  std::unique_ptr<CompilePool> pool;
  std::string lock_dir;

  // (serialized selector + arch) -> key, for MemoryHit. Bounded: cleared
  // when it reaches kMaxMemo entries (a deployment uses a handful).
  static constexpr size_t kMaxMemo = 4096;
  absl::Mutex memo_mu;
  std::map<std::string, std::string> memo ABSL_GUARDED_BY(memo_mu);

  absl::Mutex mu;
  absl::CondVar flights_done;  // running_flights reached 0
  // key -> compile in progress.
  std::map<std::string, std::shared_ptr<Flight>> flights ABSL_GUARDED_BY(mu);
  int running_flights ABSL_GUARDED_BY(mu) = 0;
  // No new compiles (Shutdown or AbandonCompiles).
  bool shutting_down ABSL_GUARDED_BY(mu) = false;
  bool shutdown_called ABSL_GUARDED_BY(mu) = false;  // Shutdown waits once

  // key -> a compile the compiler rejected and until when that answer
  // stands (options.failure_cache). Bounded like the memo.
  std::map<std::string, std::pair<absl::Status, absl::Time>> failures ABSL_GUARDED_BY(mu);

  // GetKernel's time by the ArtifactSource of its answer (bounded: one
  // histogram per enum value), and NVRTC's seconds per compile; buckets
  // from a tenth of a second (the smallest kernels) to the compile timeout.
  std::array<Histogram, v1::ArtifactSource_ARRAYSIZE> by_source;
  Histogram compile_seconds{{0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120}};

  void ObserveSource(v1::ArtifactSource source, absl::Duration took) {
    if (source >= 0 && source < v1::ArtifactSource_ARRAYSIZE) {
      by_source[source].Observe(absl::ToDoubleSeconds(took));
    }
  }

  std::atomic<uint64_t> memory_hits{0}, disk_hits{0}, misses{0}, compiles{0}, compile_failures{0},
      shared_waits{0}, rejected{0}, disk_write_failures{0}, redis_lock_waits{0},
      redis_local_compiles{0};

  // Publishes a flight's result and wakes its waiters. Once running_flights
  // reaches 0 Shutdown may return and State be destroyed, so nothing here
  // touches State after the lock is released.
  void Complete(const std::shared_ptr<Flight>& flight, const std::string& key, FlightResult result)
      ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    flight->result = std::move(result);
    flight->phase = Flight::Phase::kDone;
    auto it = flights.find(key);
    if (it != flights.end() && it->second == flight) flights.erase(it);
    --running_flights;
    flight->changed.SignalAll();
    if (running_flights == 0) flights_done.SignalAll();
  }

  // The kLocking phase on a caller's thread. Takes the key's lock file, so
  // that server processes sharing the cache directory compile a key once
  // between them; while another process holds it, retries until `deadline`
  // (then returns with the phase unchanged, for another waiter to drive) or
  // until the store shuts down. With the lock: the disk tier again (the
  // other process may have built the key), else the compile pool, whose
  // callback completes the flight and releases the lock.
  void Drive(const std::shared_ptr<Flight>& flight, const CompilePlan& plan, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu);

  // The compile pool's callback for a flight's job: stores the kernel
  // (disk, then Redis), releases the fleet lock if it holds it and the key's
  // lock file, completes the flight.
  void FinishCompile(const std::shared_ptr<Flight>& flight, const CompilePlan& plan,
                     FileLock* key_lock, bool fleet_lock, absl::StatusOr<v1::KernelArtifact> built)
      ABSL_LOCKS_EXCLUDED(mu);

  // What the fleet said about a key this process is about to compile.
  enum class Fleet {
    kLocked,  // this process holds the fleet lock: compile, store, unlock
    kLocal,   // no lock to be had (Redis down or slow, holder hung): compile
    kDone,    // the flight is completed (another server's kernel, shutdown)
    kGaveUp,  // the driver's deadline passed; the flight is left as it was
  };
  // Takes the fleet lock on `plan.key`, or, while another server holds it,
  // waits for the value that server stores, until the driver's `deadline`,
  // or until a compile's time and the lock's expiry have passed (then the
  // key is compiled here).
  Fleet AwaitFleet(const std::shared_ptr<Flight>& flight, const CompilePlan& plan,
                   absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu);

  // A kernel from Redis, kept in the local tiers.
  void KeepShared(const std::string& key, const ArtifactPtr& artifact) {
    if (!disk->Put(key, artifact).ok()) ++disk_write_failures;
    (void)memory->Put(key, artifact);
  }
};

void KernelStore::State::Drive(const std::shared_ptr<Flight>& flight, const CompilePlan& plan,
                               absl::Time deadline) {
  // A request the pool would refuse leaves nothing on disk.
  if (absl::Status room = pool->CheckRoom(); !room.ok()) {
    if (absl::IsResourceExhausted(room)) ++rejected;
    Complete(flight, plan.key, room);
    return;
  }
  // Striped: keys share kLockStripes lock files (every key kept its own
  // file forever: 3000 files a second, outside the disk cap). Two keys of
  // one stripe compile one after the other, also within this process
  // (flock is per open file), which 4096 stripes make rare.
  const std::string path =
      absl::StrCat(lock_dir, "/", plan.key.substr(0, kLockStripeHexDigits), ".lock");
  absl::Duration backoff = absl::Milliseconds(1);
  absl::StatusOr<FileLock> key_lock;
  for (;;) {
    key_lock = FileLock::Acquire(path, FileLock::Wait::kTry);
    if (!absl::IsUnavailable(key_lock.status())) break;
    {
      absl::MutexLock lock(&mu);
      if (shutting_down) {
        Complete(flight, plan.key, absl::UnavailableError("kforge server is shutting down"));
        return;
      }
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) return;
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, kMaxLockRetry);
  }
  // No lock file (a read-only, full or vanished cache directory): compile
  // anyway, without the cross-process guard (this process's flight still
  // compiles the key once), and count it as the disk failure it is, as a
  // failed disk write is. It failed every miss with INTERNAL before.
  std::shared_ptr<FileLock> held;
  if (key_lock.ok()) {
    held = std::make_shared<FileLock>(*std::move(key_lock));
  } else {
    ++disk_write_failures;
  }
  // Another process on this cache directory may have built it meanwhile.
  if (absl::StatusOr<ArtifactPtr> on_disk = disk->Get(plan.key); on_disk.ok()) {
    (void)memory->Put(plan.key, *on_disk);
    Complete(flight, plan.key, KernelStore::Result{*on_disk, v1::ARTIFACT_SOURCE_SHARED_COMPILE});
    return;
  }
  bool fleet_lock = false;
  if (redis != nullptr) {
    switch (AwaitFleet(flight, plan, deadline)) {
      case Fleet::kDone:
      case Fleet::kGaveUp:
        return;
      case Fleet::kLocked:
        fleet_lock = true;
        break;
      case Fleet::kLocal:
        break;
    }
  }
  {
    absl::MutexLock lock(&mu);
    flight->phase = Flight::Phase::kCompiling;
  }
  v1::CompileJob job;
  *job.mutable_spec() = plan.spec;
  job.set_arch(plan.arch.name);
  // The callback owns the lock file (if any) from here.
  ++compiles;
  absl::Status submitted = pool->Submit(
      std::move(job),
      [this, flight, plan, held, fleet_lock](absl::StatusOr<v1::KernelArtifact> built) {
        FinishCompile(flight, plan, held.get(), fleet_lock, std::move(built));
      });
  if (!submitted.ok()) {
    --compiles;
    if (fleet_lock) redis->Unlock(plan.key);
    if (absl::IsResourceExhausted(submitted)) ++rejected;
    Complete(flight, plan.key, submitted);
  }
}

void KernelStore::State::FinishCompile(const std::shared_ptr<Flight>& flight,
                                       const CompilePlan& plan, FileLock* key_lock, bool fleet_lock,
                                       absl::StatusOr<v1::KernelArtifact> built) {
  auto release = [this, key_lock, fleet_lock, &plan] {
    if (fleet_lock) redis->Unlock(plan.key);
    if (key_lock != nullptr) key_lock->Release();
  };
  if (!built.ok()) {
    release();
    ++compile_failures;
    if (IsCompilerRejection(built.status()) && options.failure_cache > absl::ZeroDuration()) {
      absl::MutexLock lock(&mu);
      if (failures.size() >= kMaxMemo) failures.clear();
      failures[plan.key] = {built.status(), absl::Now() + options.failure_cache};
    }
    Complete(flight, plan.key, built.status());
    return;
  }
  if (built->key() != plan.key) {
    release();
    ++compile_failures;
    Complete(
        flight, plan.key,
        absl::InternalError(absl::StrCat(
            "compile worker returned key ", built->key(), " for ", plan.key, " (", plan.module_name,
            "): worker and server disagree on the compiler version or templates")));
    return;
  }
  compile_seconds.Observe(built->compile_seconds());
  auto artifact = std::make_shared<const v1::KernelArtifact>(*std::move(built));
  // Disk and Redis first: once the locks are released other processes
  // look there. A failed disk write (full disk) still serves the kernel
  // from memory; a failed Redis write is counted by the Redis tier, and
  // the other servers, finding no value, compile it themselves.
  if (!disk->Put(plan.key, artifact).ok()) ++disk_write_failures;
  if (redis != nullptr) (void)redis->Put(plan.key, artifact);
  release();
  (void)memory->Put(plan.key, artifact);
  Complete(flight, plan.key, KernelStore::Result{artifact, v1::ARTIFACT_SOURCE_COMPILED});
}

KernelStore::State::Fleet KernelStore::State::AwaitFleet(const std::shared_ptr<Flight>& flight,
                                                         const CompilePlan& plan,
                                                         absl::Time deadline) {
  // A holder that takes longer than a compile may (plus one lock expiry for
  // a holder that died) is hung, or Redis misbehaves: compile here.
  const absl::Time give_up = absl::Now() + options.pool.timeout + options.redis.lock_ttl;
  absl::Duration backoff = absl::Milliseconds(2);
  bool counted = false;
  for (;;) {
    switch (redis->TryLock(plan.key)) {
      case SharedArtifactCache::Lock::kAcquired:
        // The holder before may have stored it between this process's miss
        // and the lock.
        if (absl::StatusOr<ArtifactPtr> stored = redis->Get(plan.key); stored.ok()) {
          redis->Unlock(plan.key);
          KeepShared(plan.key, *stored);
          Complete(flight, plan.key,
                   KernelStore::Result{*stored, v1::ARTIFACT_SOURCE_SHARED_COMPILE});
          return Fleet::kDone;
        }
        return Fleet::kLocked;
      case SharedArtifactCache::Lock::kUnavailable:
        ++redis_local_compiles;
        return Fleet::kLocal;
      case SharedArtifactCache::Lock::kHeldElsewhere:
        break;
    }
    if (!counted) {
      ++redis_lock_waits;
      counted = true;
    }
    {
      absl::MutexLock lock(&mu);
      if (shutting_down) {
        Complete(flight, plan.key, absl::UnavailableError("kforge server is shutting down"));
        return Fleet::kDone;
      }
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) return Fleet::kGaveUp;
    if (now >= give_up) {
      ++redis_local_compiles;
      return Fleet::kLocal;
    }
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, kMaxFleetPoll);
    absl::StatusOr<ArtifactPtr> stored = redis->Get(plan.key);
    if (stored.ok()) {
      KeepShared(plan.key, *stored);
      Complete(flight, plan.key, KernelStore::Result{*stored, v1::ARTIFACT_SOURCE_SHARED_COMPILE});
      return Fleet::kDone;
    }
    // Redis went down while waiting: the holder's value may never come.
    if (!absl::IsNotFound(stored.status())) {
      ++redis_local_compiles;
      return Fleet::kLocal;
    }
  }
}

KernelStore::KernelStore(std::unique_ptr<State> state) : state_(std::move(state)) {}

KernelStore::~KernelStore() { Shutdown(); }

absl::StatusOr<std::unique_ptr<KernelStore>> KernelStore::Create(KernelStoreOptions options) {
  if (options.cache_dir.empty()) {
    return absl::InvalidArgumentError("cache_dir: empty; give a directory");
  }
  auto state = std::make_unique<State>();
  state->lock_dir = options.cache_dir + "/locks";
  // Without it (a read-only cache directory) compiles go on unguarded
  // across processes; Drive counts each as a disk failure.
  std::error_code ec;
  std::filesystem::create_directories(state->lock_dir, ec);
  absl::StatusOr<std::unique_ptr<DiskCache>> disk =
      DiskCache::Open(options.cache_dir, options.disk_cache_bytes);
  if (!disk.ok()) return disk.status();
  state->disk = *std::move(disk);
  state->memory = std::make_unique<MemoryCache>(options.memory_cache_bytes);
  if (!options.redis.host.empty()) {
    absl::StatusOr<std::unique_ptr<RedisCache>> redis = RedisCache::Create(options.redis);
    if (!redis.ok()) return redis.status();
    state->redis = *std::move(redis);
  }
  state->pool = std::make_unique<CompilePool>(options.pool);
  state->options = std::move(options);
  return std::unique_ptr<KernelStore>(new KernelStore(std::move(state)));
}

absl::StatusOr<v1::AttentionSpec> KernelStore::Resolve(const v1::KernelSelector& selector) {
  return SpecOfSelector(selector);
}

absl::StatusOr<ArtifactPtr> KernelStore::MemoryHit(const v1::KernelSelector& selector,
                                                   const std::string& arch) {
  State& s = *state_;
  const absl::Time start = absl::Now();
  std::string memo_key = selector.SerializeAsString();
  memo_key.push_back('\0');
  memo_key += arch;
  std::string key;
  {
    absl::MutexLock lock(&s.memo_mu);
    auto it = s.memo.find(memo_key);
    if (it != s.memo.end()) key = it->second;
  }
  if (key.empty()) {
    absl::StatusOr<v1::AttentionSpec> spec = Resolve(selector);
    if (!spec.ok()) return spec.status();
    absl::StatusOr<CompilePlan> plan = s.compiler.Plan(*spec, arch);
    if (!plan.ok()) return plan.status();
    key = plan->key;
    absl::MutexLock lock(&s.memo_mu);
    if (s.memo.size() >= State::kMaxMemo) s.memo.clear();
    s.memo.emplace(std::move(memo_key), key);
  }
  absl::StatusOr<ArtifactPtr> hit = s.memory->Get(key);
  if (hit.ok()) {
    ++s.memory_hits;
    s.ObserveSource(v1::ARTIFACT_SOURCE_MEMORY, absl::Now() - start);
  }
  return hit;
}

namespace {

// The memory tier, then the disk tier, then Redis if there is one (a hit
// is kept in the tiers above it).
std::optional<KernelStore::Result> FromCache(MemoryCache& memory, DiskCache& disk,
                                             RedisCache* redis, const std::string& key,
                                             std::atomic<uint64_t>& memory_hits,
                                             std::atomic<uint64_t>& disk_hits,
                                             std::atomic<uint64_t>& disk_write_failures) {
  if (absl::StatusOr<ArtifactPtr> hit = memory.Get(key); hit.ok()) {
    ++memory_hits;
    return KernelStore::Result{*hit, v1::ARTIFACT_SOURCE_MEMORY};
  }
  if (absl::StatusOr<ArtifactPtr> hit = disk.Get(key); hit.ok()) {
    ++disk_hits;
    (void)memory.Put(key, *hit);
    return KernelStore::Result{*hit, v1::ARTIFACT_SOURCE_DISK};
  }
  if (redis == nullptr) return std::nullopt;
  if (absl::StatusOr<ArtifactPtr> hit = redis->Get(key); hit.ok()) {
    if (!disk.Put(key, *hit).ok()) ++disk_write_failures;
    (void)memory.Put(key, *hit);
    return KernelStore::Result{*hit, v1::ARTIFACT_SOURCE_REDIS};
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<KernelStore::Result> KernelStore::CachedKernel(const v1::AttentionSpec& spec,
                                                              std::string_view arch) {
  State& s = *state_;
  absl::StatusOr<CompilePlan> plan = s.compiler.Plan(spec, arch);
  if (!plan.ok()) return plan.status();
  if (std::optional<Result> hit = FromCache(*s.memory, *s.disk, s.redis.get(), plan->key,
                                            s.memory_hits, s.disk_hits, s.disk_write_failures)) {
    return *std::move(hit);
  }
  return absl::NotFoundError(
      absl::StrCat(plan->module_name, " (key ", plan->key, ") is not cached"));
}

absl::StatusOr<KernelStore::Result> KernelStore::GetKernel(const v1::AttentionSpec& spec,
                                                           std::string_view arch, bool lookup_only,
                                                           absl::Time deadline) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Result> result = GetKernelUntimed(spec, arch, lookup_only, deadline);
  if (result.ok()) state_->ObserveSource(result->source, absl::Now() - start);
  return result;
}

absl::StatusOr<KernelStore::Result> KernelStore::GetKernelUntimed(const v1::AttentionSpec& spec,
                                                                  std::string_view arch,
                                                                  bool lookup_only,
                                                                  absl::Time deadline) {
  State& s = *state_;
  absl::StatusOr<CompilePlan> plan = s.compiler.Plan(spec, arch);
  if (!plan.ok()) return plan.status();

  if (std::optional<Result> hit = FromCache(*s.memory, *s.disk, s.redis.get(), plan->key,
                                            s.memory_hits, s.disk_hits, s.disk_write_failures)) {
    return *std::move(hit);
  }
  ++s.misses;
  if (lookup_only) {
    return absl::NotFoundError(absl::StrCat(plan->module_name, " (key ", plan->key,
                                            ") is not cached and lookup_only was set"));
  }

  std::shared_ptr<Flight> flight;
  bool joined = false;
  FlightResult result = absl::UnknownError("unset");
  {
    absl::MutexLock lock(&s.mu);
    if (s.shutting_down) {
      return absl::UnavailableError("kforge server is shutting down");
    }
    if (auto failed = s.failures.find(plan->key); failed != s.failures.end()) {
      const absl::Duration left = failed->second.second - absl::Now();
      if (left > absl::ZeroDuration()) {
        const absl::Status& why = failed->second.first;
        return absl::Status(
            why.code(),
            absl::StrCat(why.message(), "\n(the same compile failed ",
                         absl::FormatDuration(
                             absl::Trunc(s.options.failure_cache - left, absl::Milliseconds(1))),
                         " ago; not retried for another ",
                         absl::FormatDuration(absl::Trunc(left, absl::Milliseconds(1))), ")"));
      }
      s.failures.erase(failed);
    }
    auto it = s.flights.find(plan->key);
    if (it != s.flights.end()) {
      flight = it->second;
      joined = true;
      ++s.shared_waits;
    } else {
      flight = std::make_shared<Flight>();
      s.flights.emplace(plan->key, flight);
      ++s.running_flights;
    }
    ++flight->waiters;
    bool timed_out = false;
    while (flight->phase != Flight::Phase::kDone && !timed_out) {
      if (flight->phase == Flight::Phase::kLocking && !flight->has_driver) {
        flight->has_driver = true;
        s.mu.Unlock();
        s.Drive(flight, *plan, deadline);
        s.mu.Lock();
        flight->has_driver = false;
        // Gave up at its deadline: another waiter takes over.
        if (flight->phase == Flight::Phase::kLocking) flight->changed.SignalAll();
        timed_out = absl::Now() >= deadline;
      } else {
        timed_out = flight->changed.WaitWithDeadline(&s.mu, deadline);
      }
    }
    --flight->waiters;
    if (flight->phase != Flight::Phase::kDone) {
      if (flight->phase == Flight::Phase::kLocking && flight->waiters == 0 && !flight->has_driver) {
        // Nobody is left to wait for the other process's lock; whatever it
        // builds lands on disk, and the next caller starts a new flight.
        s.flights.erase(plan->key);
        if (--s.running_flights == 0) s.flights_done.SignalAll();
      }
      return absl::DeadlineExceededError(
          absl::StrFormat("deadline passed while %s compiled; the compile goes on and its "
                          "result will be cached",
                          plan->module_name));
    }
    result = *flight->result;
  }
  if (result.ok() && joined) result->source = v1::ARTIFACT_SOURCE_SHARED_COMPILE;
  return result;
}

absl::StatusOr<v1::Manifest> KernelStore::GetManifest(const v1::AttentionSpec& spec,
                                                      std::string_view arch) const {
  return BuildManifest(state_->compiler, spec, arch);
}

absl::StatusOr<bool> KernelStore::Preload(ArtifactPtr artifact) {
  State& s = *state_;
  absl::StatusOr<CompilePlan> plan = s.compiler.Plan(artifact->spec(), artifact->arch());
  if (!plan.ok()) return plan.status();
  if (plan->key != artifact->key()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: key %s in the bundle, %s here: built by another kforge, template "
        "or NVRTC version (%s), so this server would never serve it",
        artifact->module_name(), artifact->key(), plan->key, artifact->compiler_version()));
  }
  if (s.memory->Get(plan->key).ok()) return true;
  const bool on_disk = s.disk->Get(plan->key).ok();
  if (!on_disk) {
    absl::Status put = s.disk->Put(plan->key, artifact);
    if (!put.ok()) ++s.disk_write_failures;
  }
  (void)s.memory->Put(plan->key, std::move(artifact));
  return on_disk;
}

v1::StatsResponse KernelStore::Stats() const {
  const State& s = *state_;
  v1::StatsResponse out;
  out.set_memory_hits(s.memory_hits);
  out.set_disk_hits(s.disk_hits);
  out.set_misses(s.misses);
  out.set_compiles(s.compiles);
  out.set_compile_failures(s.compile_failures);
  out.set_shared_compile_waits(s.shared_waits);
  out.set_rejected_queue_full(s.rejected);
  out.set_disk_write_failures(s.disk_write_failures);
  out.set_queue_depth(s.pool->queue_depth());
  out.set_in_flight_compiles(s.pool->in_flight());
  const CacheUsage mem = s.memory->Usage();
  const CacheUsage disk = s.disk->Usage();
  out.set_memory_bytes(mem.bytes);
  out.set_memory_entries(mem.entries);
  out.set_disk_bytes(disk.bytes);
  out.set_disk_entries(disk.entries);
  out.set_corrupt_entries(mem.corrupt_entries + disk.corrupt_entries);
  if (s.redis != nullptr) {
    const RedisCounters redis = s.redis->Counters();
    out.set_redis_hits(redis.hits);
    out.set_redis_errors(redis.errors);
    out.set_redis_skipped(redis.skipped);
    out.set_redis_corrupt_entries(redis.corrupt_entries);
    out.set_redis_up(redis.up ? 1 : 0);
  }
  out.set_redis_lock_waits(s.redis_lock_waits);
  out.set_redis_local_compiles(s.redis_local_compiles);
  return out;
}

KernelStore::Timings KernelStore::ReadTimings() const {
  const State& s = *state_;
  Timings out;
  for (int source = v1::ARTIFACT_SOURCE_MEMORY; source < v1::ArtifactSource_ARRAYSIZE; ++source) {
    // "ARTIFACT_SOURCE_SHARED_COMPILE" -> "shared_compile"
    std::string name = v1::ArtifactSource_Name(static_cast<v1::ArtifactSource>(source));
    name = absl::AsciiStrToLower(name.substr(std::string_view("ARTIFACT_SOURCE_").size()));
    out.by_source.emplace_back(std::move(name), s.by_source[source].Read());
  }
  out.compile_seconds = s.compile_seconds.Read();
  return out;
}

void KernelStore::AbandonCompiles() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->shutting_down = true;
  }
  state_->pool->Abandon();
}

void KernelStore::Shutdown() {
  State& s = *state_;
  {
    absl::MutexLock lock(&s.mu);
    if (s.shutdown_called) return;
    s.shutdown_called = true;
    s.shutting_down = true;
  }
  // Queued compiles fail with Unavailable, running ones finish, and their
  // callbacks complete the flights; a flight still waiting for another
  // process's lock file is completed by its driver, which sees
  // shutting_down. Then nothing touches State any more.
  s.pool->Shutdown();
  absl::MutexLock lock(&s.mu);
  while (s.running_flights > 0) s.flights_done.Wait(&s.mu);
}

}  // namespace kforge
