#include "service/kernel_store.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
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

// One compile per key in progress, shared by every caller that asks for the
// key meanwhile. No thread is set aside for it, and none waits on it: the
// caller that starts it drives its first phase on its own thread (taking
// the key's lock file, looking on disk again, handing the job to the pool),
// the pool's completion callback finishes it, and every caller is answered
// through its callback. Guarded by State::mu.
struct Flight {
  // The latest deadline of its callers: how long the driver keeps trying
  // the key's lock file while another process holds it.
  absl::Time drive_until = absl::InfinitePast();
  std::vector<KernelStore::Done> callers;
};

}  // namespace

struct KernelStore::State {
  KernelStoreOptions options;
  KernelCompiler compiler;
  std::unique_ptr<MemoryCache> memory;
  std::unique_ptr<DiskCache> disk;
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

  std::atomic<uint64_t> memory_hits{0}, disk_hits{0}, misses{0}, compiles{0}, compile_failures{0},
      shared_waits{0}, rejected{0}, disk_write_failures{0};

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
    }
    for (KernelStore::Done& done : callers) done(result);
    absl::MutexLock lock(&mu);
    if (--running_flights == 0) flights_done.SignalAll();
  }

  // A flight's first phase, on the thread of the caller that started it.
  // Takes the key's lock file, so that server processes sharing the cache
  // directory compile a key once between them; while another process holds
  // it, retries until the flight's drive_until (then completes it with
  // DeadlineExceeded: every caller's deadline has passed) or until the
  // store shuts down. With the lock: the disk tier again (the other process
  // may have built the key), else the compile pool, whose callback
  // completes the flight and releases the lock.
  void Drive(const std::shared_ptr<Flight>& flight, const CompilePlan& plan)
      ABSL_LOCKS_EXCLUDED(mu);

  // GetKernel and GetKernelAsync once planned.
  void Start(const CompilePlan& plan, bool lookup_only, absl::Time deadline, KernelStore::Done done)
      ABSL_LOCKS_EXCLUDED(mu);

  // The compile pool's callback for a flight's job: stores the kernel,
  // releases the key's lock file, completes the flight.
  void FinishCompile(const std::shared_ptr<Flight>& flight, const CompilePlan& plan,
                     FileLock* key_lock, absl::StatusOr<v1::KernelArtifact> built)
      ABSL_LOCKS_EXCLUDED(mu);
};

void KernelStore::State::Drive(const std::shared_ptr<Flight>& flight, const CompilePlan& plan) {
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
    bool stopping = false;
    absl::Time until;
    {
      absl::MutexLock lock(&mu);
      stopping = shutting_down;
      until = flight->drive_until;
    }
    if (stopping) {
      Complete(flight, plan.key, absl::UnavailableError("kforge server is shutting down"));
      return;
    }
    const absl::Time now = absl::Now();
    if (now >= until) {
      // A caller joining now may have a later deadline; it is answered
      // too, and the next caller starts a new flight.
      Complete(flight, plan.key,
               absl::DeadlineExceededError(absl::StrFormat(
                   "deadline passed while another kforge process sharing the cache directory "
                   "compiled %s; its result will be cached on disk",
                   plan.module_name)));
      return;
    }
    absl::SleepFor(std::min(backoff, until - now));
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
  v1::CompileJob job;
  *job.mutable_spec() = plan.spec;
  job.set_arch(plan.arch.name);
  // The callback owns the lock file (if any) from here.
  ++compiles;
  absl::Status submitted = pool->Submit(
      std::move(job), [this, flight, plan, held](absl::StatusOr<v1::KernelArtifact> built) {
        FinishCompile(flight, plan, held.get(), std::move(built));
      });
  if (!submitted.ok()) {
    --compiles;
    if (absl::IsResourceExhausted(submitted)) ++rejected;
    Complete(flight, plan.key, submitted);
  }
}

void KernelStore::State::FinishCompile(const std::shared_ptr<Flight>& flight,
                                       const CompilePlan& plan, FileLock* key_lock,
                                       absl::StatusOr<v1::KernelArtifact> built) {
  auto release = [key_lock] {
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
  auto artifact = std::make_shared<const v1::KernelArtifact>(*std::move(built));
  // Disk first: once the lock is released other processes look there. A
  // failed disk write (full disk) still serves the kernel from memory.
  if (!disk->Put(plan.key, artifact).ok()) ++disk_write_failures;
  release();
  (void)memory->Put(plan.key, artifact);
  Complete(flight, plan.key, KernelStore::Result{artifact, v1::ARTIFACT_SOURCE_COMPILED});
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
  if (hit.ok()) ++s.memory_hits;
  return hit;
}

namespace {

// The memory tier, then the disk tier (a disk hit is kept in memory).
std::optional<KernelStore::Result> FromCache(MemoryCache& memory, DiskCache& disk,
                                             const std::string& key,
                                             std::atomic<uint64_t>& memory_hits,
                                             std::atomic<uint64_t>& disk_hits) {
  if (absl::StatusOr<ArtifactPtr> hit = memory.Get(key); hit.ok()) {
    ++memory_hits;
    return KernelStore::Result{*hit, v1::ARTIFACT_SOURCE_MEMORY};
  }
  if (absl::StatusOr<ArtifactPtr> hit = disk.Get(key); hit.ok()) {
    ++disk_hits;
    (void)memory.Put(key, *hit);
    return KernelStore::Result{*hit, v1::ARTIFACT_SOURCE_DISK};
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<KernelStore::Result> KernelStore::CachedKernel(const v1::AttentionSpec& spec,
                                                              std::string_view arch) {
  State& s = *state_;
  absl::StatusOr<CompilePlan> plan = s.compiler.Plan(spec, arch);
  if (!plan.ok()) return plan.status();
  if (std::optional<Result> hit =
          FromCache(*s.memory, *s.disk, plan->key, s.memory_hits, s.disk_hits)) {
    return *std::move(hit);
  }
  return absl::NotFoundError(
      absl::StrCat(plan->module_name, " (key ", plan->key, ") is not cached"));
}

void KernelStore::State::Start(const CompilePlan& plan, bool lookup_only, absl::Time deadline,
                               Done done) {
  if (std::optional<Result> hit = FromCache(*memory, *disk, plan.key, memory_hits, disk_hits)) {
    return done(*std::move(hit));
  }
  ++misses;
  if (lookup_only) {
    return done(absl::NotFoundError(absl::StrCat(plan.module_name, " (key ", plan.key,
                                                 ") is not cached and lookup_only was set")));
  }
  std::shared_ptr<Flight> flight;
  bool starts = false;
  std::optional<absl::Status> refused;
  {
    absl::MutexLock lock(&mu);
    if (shutting_down) {
      refused = absl::UnavailableError("kforge server is shutting down");
    } else if (auto failed = failures.find(plan.key); failed != failures.end()) {
      const absl::Duration left = failed->second.second - absl::Now();
      if (left > absl::ZeroDuration()) {
        const absl::Status& why = failed->second.first;
        refused = absl::Status(
            why.code(),
            absl::StrCat(why.message(), "\n(the same compile failed ",
                         absl::FormatDuration(
                             absl::Trunc(options.failure_cache - left, absl::Milliseconds(1))),
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
      flight->drive_until = std::max(flight->drive_until, deadline);
      flight->callers.push_back(std::move(done));
    }
  }
  if (refused.has_value()) return done(*std::move(refused));
  if (starts) Drive(flight, plan);
}

void KernelStore::GetKernelAsync(const v1::AttentionSpec& spec, std::string_view arch,
                                 bool lookup_only, absl::Time deadline, Done done) {
  absl::StatusOr<CompilePlan> plan = state_->compiler.Plan(spec, arch);
  if (!plan.ok()) return done(plan.status());
  state_->Start(*plan, lookup_only, deadline, std::move(done));
}

absl::StatusOr<KernelStore::Result> KernelStore::GetKernel(const v1::AttentionSpec& spec,
                                                           std::string_view arch, bool lookup_only,
                                                           absl::Time deadline) {
  absl::StatusOr<CompilePlan> plan = state_->compiler.Plan(spec, arch);
  if (!plan.ok()) return plan.status();
  // Shared with the callback, which may run after this caller gave up.
  struct Answer {
    absl::Mutex mu;
    std::optional<FlightResult> result ABSL_GUARDED_BY(mu);
  };
  auto answer = std::make_shared<Answer>();
  state_->Start(*plan, lookup_only, deadline, [answer](FlightResult result) {
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
