#include "service/kernel_store.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/absl_compat.h"
#include "base/file_lock.h"
#include "base/log.h"
#include "compiler/codegen.h"
#include "compiler/compiler.h"
#include "compiler/key.h"
#include "compiler/manifest.h"
#include "model/artifact_check.h"
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
// key meanwhile. No thread is set aside for it, and none waits on it: the
// caller that starts it drives its first phase on its own thread (taking
// the key's lock file, looking on disk again, handing the job to the pool),
// the pool's completion callback finishes it, and every caller is answered
// through its callback. Guarded by State::mu.
struct Flight {
  // Until the latest deadline of its callers: how long the driver keeps
  // trying the key's lock file while another process holds it, and waits
  // for the value of another server of the fleet that holds the key's Redis
  // lock; and, shared with the compile pool, whether its job may still
  // wait for a worker or start.
  std::shared_ptr<JobInterest> interest = std::make_shared<JobInterest>();
  std::vector<KernelStore::Done> callers;
  // Callers that take a first answer (GetKernelRequest.first_answer):
  // answered with it as soon as the worker writes it, else with the
  // flight's result.
  std::vector<KernelStore::Done> first_callers;
  ArtifactPtr first;  // the first answer, once there; never cached
};

// A failed compile answered from memory until `until` (failure_cache,
// worker_failure_cache).
struct CachedFailure {
  absl::Status status;
  absl::Time failed_at;
  absl::Time until;
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

  // key -> a compile that failed (the compiler rejected it, or its worker
  // crashed or timed out) and until when that answer stands
  // (options.failure_cache, worker_failure_cache). Bounded like the memo.
  std::map<std::string, CachedFailure> failures ABSL_GUARDED_BY(mu);

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
      redis_local_compiles{0}, rejected_deadline{0}, compiles_dropped{0}, disk_rejected{0},
      redis_rejected{0}, first_answers{0};

  // Counts a refusal by the pool (full queue, or too late for the deadline).
  void CountRefusal(const absl::Status& refused) {
    if (IsDeadlineShed(refused)) {
      ++rejected_deadline;
    } else if (absl::IsResourceExhausted(refused)) {
      ++rejected;
    }
  }

  // A kernel from the disk or the Redis tier, checked as every client checks
  // an answer (CheckArtifactForVariant) against the variant this server
  // plans for the key: a tier holds only what its entry's digest and MAC
  // vouch for, which a writer with the key (or, without one, anybody) could
  // have got wrong. One that fails is dropped from its tier (NotFound).
  template <typename Tier>
  absl::StatusOr<ArtifactPtr> Checked(Tier& tier, std::atomic<uint64_t>& rejected_count,
                                      const CompilePlan& plan) {
    absl::StatusOr<ArtifactPtr> hit = tier.Get(plan.key);
    if (!hit.ok()) return hit;
    if (absl::Status s = CheckArtifactForVariant(VariantOfPlan(plan), plan.arch.name, **hit);
        !s.ok()) {
      ++rejected_count;
      return tier.Drop(plan.key, s);
    }
    return hit;
  }
  absl::StatusOr<ArtifactPtr> DiskGet(const CompilePlan& plan) {
    return Checked(*disk, disk_rejected, plan);
  }
  absl::StatusOr<ArtifactPtr> RedisGet(const CompilePlan& plan) {
    return Checked(*redis, redis_rejected, plan);
  }

  // The memory tier, then the disk tier, then Redis if there is one (a hit
  // is kept in the tiers above it).
  std::optional<KernelStore::Result> FromCache(const CompilePlan& plan) {
    if (absl::StatusOr<ArtifactPtr> hit = memory->Get(plan.key); hit.ok()) {
      ++memory_hits;
      return KernelStore::Result{*hit, v1::ARTIFACT_SOURCE_MEMORY};
    }
    if (absl::StatusOr<ArtifactPtr> hit = DiskGet(plan); hit.ok()) {
      ++disk_hits;
      (void)memory->Put(plan.key, *hit);
      return KernelStore::Result{*hit, v1::ARTIFACT_SOURCE_DISK};
    }
    if (redis == nullptr) return std::nullopt;
    if (absl::StatusOr<ArtifactPtr> hit = RedisGet(plan); hit.ok()) {
      KeepShared(plan.key, *hit);
      return KernelStore::Result{*hit, v1::ARTIFACT_SOURCE_REDIS};
    }
    return std::nullopt;
  }

  // Ends a flight: later callers start a new one, and each of its callers
  // is answered here, on this thread, outside the lock. Shutdown waits for
  // running_flights to reach 0, so State outlives the callbacks; nothing
  // touches it once that count is decremented.
  void Complete(const std::shared_ptr<Flight>& flight, const std::string& key, FlightResult result)
      ABSL_LOCKS_EXCLUDED(mu) {
    std::vector<KernelStore::Done> callers;
    {
      absl::MutexLock lock(&mu);
      auto it = flights.find(key);
      if (it != flights.end() && it->second == flight) flights.erase(it);
      callers.swap(flight->callers);
      callers.insert(callers.end(), std::make_move_iterator(flight->first_callers.begin()),
                     std::make_move_iterator(flight->first_callers.end()));
      flight->first_callers.clear();
    }
    for (KernelStore::Done& done : callers) done(result);
    absl::MutexLock lock(&mu);
    if (--running_flights == 0) flights_done.SignalAll();
  }

  // A flight's first phase, on the thread of the caller that started it.
  // Takes the key's lock file, so that server processes sharing the cache
  // directory compile a key once between them; while another process holds
  // it, retries until the latest deadline of the flight's callers (then completes it with
  // DeadlineExceeded: every caller's deadline has passed) or until the
  // store shuts down. With the lock: the disk tier again (the other process
  // may have built the key), then the fleet (AwaitFleet, with Redis), else
  // the compile pool, whose callback completes the flight and releases the
  // locks.
  void Drive(const std::shared_ptr<Flight>& flight, const CompilePlan& plan)
      ABSL_LOCKS_EXCLUDED(mu);

  // One step of a driver's wait for another process (the key's lock file)
  // or another server (its value in Redis): once the store shuts down, or
  // the latest deadline of the flight's callers has passed (nothing
  // else would answer them), completes the flight (Unavailable,
  // DeadlineExceeded saying that `other` compiles the key and where its
  // result will be) and returns nullopt; else how long to sleep now, at
  // most `backoff`. A caller joining as it ends is answered too, and the
  // next caller starts a new flight.
  std::optional<absl::Duration> WaitStep(const std::shared_ptr<Flight>& flight,
                                         const CompilePlan& plan, absl::Duration backoff,
                                         const char* other, const char* result_goes)
      ABSL_LOCKS_EXCLUDED(mu) {
    bool stopping = false;
    {
      absl::MutexLock lock(&mu);
      stopping = shutting_down;
    }
    const absl::Time until = flight->interest->until();
    if (stopping) {
      Complete(flight, plan.key, absl::UnavailableError("kforge server is shutting down"));
      return std::nullopt;
    }
    const absl::Time now = absl::Now();
    if (now >= until) {
      Complete(flight, plan.key,
               absl::DeadlineExceededError(
                   absl::StrFormat("deadline passed while %s compiled %s; its result will be %s",
                                   other, plan.module_name, result_goes)));
      return std::nullopt;
    }
    return std::min(backoff, until - now);
  }

  // GetKernel and GetKernelAsync once planned; `start` is when the caller
  // asked (its answer's time goes to by_source).
  void Start(const CompilePlan& plan, const KernelStore::Ask& ask, absl::Time start,
             KernelStore::Done done) ABSL_LOCKS_EXCLUDED(mu);

  // The compile pool's callback for a flight job's first answer: answers
  // the flight's first_callers with it (and those who join later), caches
  // it nowhere.
  void FinishFirst(const std::shared_ptr<Flight>& flight, const CompilePlan& plan,
                   absl::StatusOr<v1::KernelArtifact> partial) ABSL_LOCKS_EXCLUDED(mu);

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
    kDone,    // the flight is completed (another server's kernel, the
              // callers' deadlines passed, shutdown)
  };
  // Part of Drive, on the same thread: takes the fleet lock on `plan.key`,
  // or, while another server holds it, waits for the value that server
  // stores, until the latest deadline of the flight's callers (then completes the flight with
  // DeadlineExceeded, as Drive does for the lock file: no caller is left to
  // wait, and nothing else would ever answer them), until the store shuts
  // down, or until a compile's time and the lock's expiry have passed (then
  // the key is compiled here).
  Fleet AwaitFleet(const std::shared_ptr<Flight>& flight, const CompilePlan& plan)
      ABSL_LOCKS_EXCLUDED(mu);

  // A kernel from Redis, kept in the local tiers.
  void KeepShared(const std::string& key, const ArtifactPtr& artifact) {
    if (!disk->Put(key, artifact).ok()) ++disk_write_failures;
    (void)memory->Put(key, artifact);
  }
};

void KernelStore::State::Drive(const std::shared_ptr<Flight>& flight, const CompilePlan& plan) {
  // A request the pool would refuse (full, or too late for every caller's
  // deadline) leaves nothing on disk.
  if (absl::Status room = pool->CheckRoom(flight->interest->until()); !room.ok()) {
    CountRefusal(room);
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
    std::optional<absl::Duration> nap =
        WaitStep(flight, plan, backoff, "another kforge process sharing the cache directory",
                 "cached on disk");
    if (!nap.has_value()) return;
    absl::SleepFor(*nap);
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
  if (absl::StatusOr<ArtifactPtr> on_disk = DiskGet(plan); on_disk.ok()) {
    (void)memory->Put(plan.key, *on_disk);
    Complete(flight, plan.key, KernelStore::Result{*on_disk, v1::ARTIFACT_SOURCE_SHARED_COMPILE});
    return;
  }
  // The fleet: another server may be compiling it, or have stored it.
  bool fleet_lock = false;
  if (redis != nullptr) {
    switch (AwaitFleet(flight, plan)) {
      case Fleet::kDone:
        return;
      case Fleet::kLocked:
        fleet_lock = true;
        break;
      case Fleet::kLocal:
        break;
    }
  }
  v1::CompileJob job;
  *job.mutable_spec() = plan.spec;
  job.set_arch(plan.arch.name);
  // The callback owns the locks (if any) from here.
  ++compiles;
  absl::Status submitted = pool->Submit(
      std::move(job),
      [this, flight, plan, held, fleet_lock](absl::StatusOr<v1::KernelArtifact> built) {
        FinishCompile(flight, plan, held.get(), fleet_lock, std::move(built));
      },
      flight->interest,
      // Asked for whoever wants it, now or joining later: it costs the
      // worker one more write, and the programs' order does not lengthen
      // the whole compile (BENCH.md, "First answer").
      [this, flight, plan](absl::StatusOr<v1::KernelArtifact> partial) {
        FinishFirst(flight, plan, std::move(partial));
      });
  if (!submitted.ok()) {
    --compiles;
    if (fleet_lock) redis->Unlock(plan.key);
    CountRefusal(submitted);
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
  if (!built.ok() && IsDroppedJob(built.status())) {
    // Never started: no compile, no failure to remember.
    release();
    --compiles;
    ++compiles_dropped;
    Complete(flight, plan.key, built.status());
    return;
  }
  if (!built.ok()) {
    release();
    ++compile_failures;
    // The first line of the error (an NVRTC log can be long).
    const std::string error(built.status().message());
    LogEvent(LogLevel::kWarning, "compile_failure",
             absl::StrCat("compile of ", plan.module_name,
                          " failed: ", error.substr(0, std::min(error.find('\n'), size_t{500}))),
             {{"key", plan.key},
              {"module", plan.module_name},
              {"arch", plan.arch.name},
              {"code", absl::StatusCodeToString(built.status().code())}});
    // The compiler's answer, or a worker that crashed or hung on this job,
    // would come again: answer it from memory for a while.
    const absl::Duration remember = IsCompilerRejection(built.status()) ? options.failure_cache
                                    : IsWorkerFailure(built.status()) ? options.worker_failure_cache
                                                                      : absl::ZeroDuration();
    if (remember > absl::ZeroDuration()) {
      const absl::Time now = absl::Now();
      absl::MutexLock lock(&mu);
      if (failures.size() >= kMaxMemo) failures.clear();
      failures[plan.key] = {built.status(), now, now + remember};
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
  LogEvent(LogLevel::kInfo, "compile",
           absl::StrFormat("compiled %s in %.2f s", plan.module_name, built->compile_seconds()),
           {{"key", plan.key},
            {"module", plan.module_name},
            {"arch", plan.arch.name},
            {"duration_s", built->compile_seconds()},
            {"source", "compile"}});
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

void KernelStore::State::FinishFirst(const std::shared_ptr<Flight>& flight, const CompilePlan& plan,
                                     absl::StatusOr<v1::KernelArtifact> partial) {
  // Only the answer the clients would accept (the first answer of the
  // variant this server plans) goes out; else its callers wait for the
  // whole module.
  if (!partial.ok() || partial->key() != plan.key || !partial->partial() ||
      !CheckAnswerForVariant(VariantOfPlan(plan), plan.arch.name, *partial, true).ok()) {
    return;
  }
  auto artifact = std::make_shared<const v1::KernelArtifact>(*std::move(partial));
  std::vector<KernelStore::Done> callers;
  {
    absl::MutexLock lock(&mu);
    flight->first = artifact;
    callers.swap(flight->first_callers);
  }
  first_answers += callers.size();
  for (KernelStore::Done& done : callers) {
    done(KernelStore::Result{artifact, v1::ARTIFACT_SOURCE_COMPILED});
  }
}

KernelStore::State::Fleet KernelStore::State::AwaitFleet(const std::shared_ptr<Flight>& flight,
                                                         const CompilePlan& plan) {
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
        if (absl::StatusOr<ArtifactPtr> stored = RedisGet(plan); stored.ok()) {
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
    // The next caller's new flight finds the holder's value, or waits
    // for it again.
    std::optional<absl::Duration> nap =
        WaitStep(flight, plan, backoff, "another kforge server of the fleet", "stored in Redis");
    if (!nap.has_value()) return Fleet::kDone;
    const absl::Time now = absl::Now();
    if (now >= give_up) {
      ++redis_local_compiles;
      return Fleet::kLocal;
    }
    absl::SleepFor(std::min(*nap, give_up - now));
    backoff = std::min(backoff * 2, kMaxFleetPoll);
    absl::StatusOr<ArtifactPtr> stored = RedisGet(plan);
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
      DiskCache::Open(options.cache_dir, options.disk_cache_bytes, options.trust);
  if (!disk.ok()) return disk.status();
  state->disk = *std::move(disk);
  state->memory = std::make_unique<MemoryCache>(options.memory_cache_bytes);
  if (!options.redis.host.empty()) {
    options.redis.trust = options.trust;
    absl::StatusOr<std::unique_ptr<RedisCache>> redis = RedisCache::Create(options.redis);
    if (!redis.ok()) return redis.status();
    state->redis = *std::move(redis);
  }
  state->pool = std::make_unique<CompilePool>(options.pool);
  state->options = std::move(options);
  return std::unique_ptr<KernelStore>(new KernelStore(std::move(state)));
}

absl::StatusOr<v1::KernelSpec> KernelStore::Resolve(const v1::KernelSelector& selector) {
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
    absl::StatusOr<v1::KernelSpec> spec = Resolve(selector);
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

absl::StatusOr<KernelStore::Result> KernelStore::CachedKernel(const v1::KernelSpec& spec,
                                                              std::string_view arch) {
  State& s = *state_;
  const absl::Time start = absl::Now();
  absl::StatusOr<CompilePlan> plan = s.compiler.Plan(spec, arch);
  if (!plan.ok()) return plan.status();
  // Timed as GetKernel's hits are: the server answers disk and Redis hits
  // from here, never from GetKernel.
  if (std::optional<Result> hit = s.FromCache(*plan)) {
    s.ObserveSource(hit->source, absl::Now() - start);
    return *std::move(hit);
  }
  return absl::NotFoundError(
      absl::StrCat(plan->module_name, " (key ", plan->key, ") is not cached"));
}

void KernelStore::State::Start(const CompilePlan& plan, const Ask& ask, absl::Time start,
                               Done done) {
  const absl::Time deadline = ask.deadline;
  // Timed by the source of the answer, whichever thread gives it: State
  // outlives the callbacks (Complete).
  done = [this, start, done = std::move(done)](FlightResult result) mutable {
    if (result.ok()) ObserveSource(result->source, absl::Now() - start);
    done(std::move(result));
  };
  if (std::optional<Result> hit = FromCache(plan)) {
    return done(*std::move(hit));
  }
  ++misses;
  if (ask.lookup_only) {
    return done(absl::NotFoundError(absl::StrCat(plan.module_name, " (key ", plan.key,
                                                 ") is not cached and lookup_only was set")));
  }
  std::shared_ptr<Flight> flight;
  bool starts = false;
  std::optional<absl::Status> refused;
  ArtifactPtr first;  // a first answer there already, for this caller
  {
    absl::MutexLock lock(&mu);
    if (shutting_down) {
      refused = absl::UnavailableError("kforge server is shutting down");
    } else if (auto failed = failures.find(plan.key); failed != failures.end()) {
      const absl::Time now = absl::Now();
      const absl::Duration left = failed->second.until - now;
      if (left > absl::ZeroDuration()) {
        const absl::Status& why = failed->second.status;
        refused = absl::Status(
            why.code(),
            absl::StrCat(why.message(), "\n(the same compile failed ",
                         absl::FormatDuration(
                             absl::Trunc(now - failed->second.failed_at, absl::Milliseconds(1))),
                         " ago; not retried for another ",
                         absl::FormatDuration(absl::Trunc(left, absl::Milliseconds(1))), ")"));
      } else {
        failures.erase(failed);
      }
    }
    if (!refused.has_value()) {
      if (auto it = flights.find(plan.key); it != flights.end()) {
        flight = it->second;
        ++shared_waits;
        // Joined: answered as a shared compile.
        done = [done = std::move(done)](FlightResult result) mutable {
          if (result.ok()) result->source = v1::ARTIFACT_SOURCE_SHARED_COMPILE;
          done(std::move(result));
        };
      } else {
        flight = std::make_shared<Flight>();
        flights.emplace(plan.key, flight);
        ++running_flights;
        starts = true;
      }
      if (ask.first_answer && flight->first != nullptr) {
        first = flight->first;
      } else {
        flight->interest->Extend(deadline);
        (ask.first_answer ? flight->first_callers : flight->callers).push_back(std::move(done));
      }
    }
  }
  if (refused.has_value()) return done(*std::move(refused));
  if (first != nullptr) {
    ++first_answers;
    return done(KernelStore::Result{first, v1::ARTIFACT_SOURCE_SHARED_COMPILE});
  }
  if (starts) Drive(flight, plan);
}

void KernelStore::GetKernelAsync(const v1::KernelSpec& spec, std::string_view arch,
                                 bool lookup_only, absl::Time deadline, Done done) {
  GetKernelAsync(spec, arch, Ask{lookup_only, false, deadline}, std::move(done));
}

void KernelStore::GetKernelAsync(const v1::KernelSpec& spec, std::string_view arch, const Ask& ask,
                                 Done done) {
  const absl::Time start = absl::Now();
  absl::StatusOr<CompilePlan> plan = state_->compiler.Plan(spec, arch);
  if (!plan.ok()) return done(plan.status());
  state_->Start(*plan, ask, start, std::move(done));
}

absl::StatusOr<KernelStore::Result> KernelStore::GetKernel(const v1::KernelSpec& spec,
                                                           std::string_view arch, bool lookup_only,
                                                           absl::Time deadline) {
  return GetKernel(spec, arch, Ask{lookup_only, false, deadline});
}

absl::StatusOr<KernelStore::Result> KernelStore::GetKernel(const v1::KernelSpec& spec,
                                                           std::string_view arch, const Ask& ask) {
  const absl::Time deadline = ask.deadline;
  const bool lookup_only = ask.lookup_only;
  const absl::Time start = absl::Now();
  absl::StatusOr<CompilePlan> plan = state_->compiler.Plan(spec, arch);
  if (!plan.ok()) return plan.status();
  // Shared with the callback, which may run after this caller gave up.
  struct Answer {
    absl::Mutex mu;
    std::optional<FlightResult> result ABSL_GUARDED_BY(mu);
  };
  auto answer = std::make_shared<Answer>();
  state_->Start(*plan, Ask{lookup_only, ask.first_answer, deadline}, start,
                [answer](FlightResult result) {
                  absl::MutexLock lock(&answer->mu);
                  answer->result = std::move(result);
                });
  absl::MutexLock lock(&answer->mu);
  auto answered = [](Answer* a) ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->result.has_value(); };
  if (!answer->mu.AwaitWithDeadline(absl::Condition(+answered, answer.get()), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrFormat("deadline passed while %s compiled; the compile goes on and its "
                        "result will be cached",
                        plan->module_name));
  }
  return *std::move(answer->result);
}

absl::StatusOr<v1::Manifest> KernelStore::GetManifest(const v1::KernelSpec& spec,
                                                      std::string_view arch) const {
  return BuildManifest(state_->compiler, spec, arch);
}

absl::StatusOr<bool> KernelStore::Preload(ArtifactPtr artifact, EntryOrigin origin) {
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
  // An entry this server does not trust (an unsigned bundle's under
  // --trust, one without the fleet key's MAC) is dropped here and replaced.
  const bool on_disk = s.DiskGet(*plan).ok();
  if (!on_disk) {
    absl::Status put = s.disk->PutFrom(plan->key, artifact, origin);
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
  out.set_disk_untrusted_entries(disk.untrusted_entries);
  out.set_disk_rejected_artifacts(s.disk_rejected);
  out.set_redis_rejected_artifacts(s.redis_rejected);
  if (s.redis != nullptr) {
    const RedisCounters redis = s.redis->Counters();
    out.set_redis_hits(redis.hits);
    out.set_redis_errors(redis.errors);
    out.set_redis_skipped(redis.skipped);
    out.set_redis_corrupt_entries(redis.corrupt_entries);
    out.set_redis_untrusted_entries(redis.untrusted_entries);
    out.set_redis_up(redis.up ? 1 : 0);
  }
  out.set_redis_lock_waits(s.redis_lock_waits);
  out.set_redis_local_compiles(s.redis_local_compiles);
  out.set_rejected_deadline(s.rejected_deadline);
  out.set_compiles_dropped(s.compiles_dropped);
  out.set_first_answers(s.first_answers);
  return out;
}

KernelStore::Timings KernelStore::ReadTimings() const {
  const State& s = *state_;
  Timings out;
  for (int source = v1::ARTIFACT_SOURCE_MEMORY; source < v1::ArtifactSource_ARRAYSIZE; ++source) {
    out.by_source.emplace_back(ArtifactSourceName(static_cast<v1::ArtifactSource>(source)),
                               s.by_source[source].Read());
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
  // process's lock file, or for another server's value (AwaitFleet), is
  // completed by its driver, which sees shutting_down. Then nothing touches State any more.
  s.pool->Shutdown();
  absl::MutexLock lock(&s.mu);
  while (s.running_flights > 0) s.flights_done.Wait(&s.mu);
}

}  // namespace kforge
