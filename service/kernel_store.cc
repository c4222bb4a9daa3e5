#include "service/kernel_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/absl_compat.h"
#include "compiler/codegen.h"
#include "compiler/compiler.h"
#include "compiler/key.h"
#include "model/spec.h"
#include "compiler/manifest.h"
#include "service/disk_cache.h"
#include "service/memory_cache.h"

namespace kforge {

namespace {

using FlightResult = absl::StatusOr<KernelStore::Result>;
using FlightFuture = std::shared_future<FlightResult>;

std::chrono::system_clock::time_point ToChrono(absl::Time t) {
  if (t == absl::InfiniteFuture()) return std::chrono::system_clock::time_point::max();
  return absl::ToChronoTime(t);
}

// Holds an exclusive flock on a per-key lock file, so that server processes
// sharing one cache directory compile a key once between them.
class KeyLock {
 public:
  static absl::StatusOr<KeyLock> Acquire(const std::string& path) {
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::InternalError(absl::StrCat("cannot open lock file ", path));
    }
    while (flock(fd, LOCK_EX) != 0) {
      if (errno != EINTR) {
        close(fd);
        return absl::InternalError(absl::StrCat("cannot lock ", path));
      }
    }
    return KeyLock(fd);
  }
  KeyLock(KeyLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  KeyLock& operator=(KeyLock&&) = delete;
  ~KeyLock() {
    if (fd_ >= 0) close(fd_);  // releases the flock
  }

 private:
  explicit KeyLock(int fd) : fd_(fd) {}
  int fd_;
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
  std::mutex memo_mu;
  std::map<std::string, std::string> memo;

  std::mutex mu;
  std::condition_variable flights_done;
  std::map<std::string, FlightFuture> flights;  // key -> compile in progress
  int running_flights = 0;
  bool shutting_down = false;   // no new compiles (Shutdown or AbandonCompiles)
  bool shutdown_called = false;  // Shutdown ran: it waits for flights once

  std::atomic<uint64_t> memory_hits{0}, disk_hits{0}, misses{0}, compiles{0},
      compile_failures{0}, shared_waits{0}, rejected{0}, disk_write_failures{0};

  // Runs on its own thread so the compile outlives any one caller's
  // deadline: every waiter, the first included, only waits on the future.
  FlightResult Fly(const CompilePlan& plan) {
    absl::StatusOr<KeyLock> lock =
        KeyLock::Acquire(absl::StrCat(lock_dir, "/", plan.key, ".lock"));
    if (!lock.ok()) return lock.status();
    // Another process on this cache directory may have built it meanwhile.
    absl::StatusOr<ArtifactPtr> on_disk = disk->Get(plan.key);
    if (on_disk.ok()) {
      (void)memory->Put(plan.key, *on_disk);
      return KernelStore::Result{*on_disk, v1::ARTIFACT_SOURCE_SHARED_COMPILE};
    }
    v1::CompileJob job;
    *job.mutable_spec() = plan.spec;
    job.set_arch(plan.arch.name);
    absl::StatusOr<CompileFuture> submitted = pool->Submit(std::move(job));
    if (!submitted.ok()) {
      if (absl::IsResourceExhausted(submitted.status())) ++rejected;
      return submitted.status();
    }
    ++compiles;
    absl::StatusOr<v1::KernelArtifact> built = submitted->get();
    if (!built.ok()) {
      ++compile_failures;
      return built.status();
    }
    if (built->key() != plan.key) {
      ++compile_failures;
      return absl::InternalError(absl::StrCat(
          "compile worker returned key ", built->key(), " for ", plan.key,
          " (", plan.module_name, "): worker and server disagree on the "
          "compiler version or templates"));
    }
    auto artifact = std::make_shared<const v1::KernelArtifact>(*std::move(built));
    // Disk first: once the lock is released other processes look there. A
    // failed disk write (full disk) still serves the kernel from memory.
    if (!disk->Put(plan.key, artifact).ok()) ++disk_write_failures;
    (void)memory->Put(plan.key, artifact);
    return KernelStore::Result{artifact, v1::ARTIFACT_SOURCE_COMPILED};
  }
};

KernelStore::KernelStore(std::unique_ptr<State> state) : state_(std::move(state)) {}

KernelStore::~KernelStore() { Shutdown(); }

absl::StatusOr<std::unique_ptr<KernelStore>> KernelStore::Create(
    KernelStoreOptions options) {
  if (options.cache_dir.empty()) {
    return absl::InvalidArgumentError("cache_dir: empty; give a directory");
  }
  auto state = std::make_unique<State>();
  state->lock_dir = options.cache_dir + "/locks";
  std::error_code ec;
  std::filesystem::create_directories(state->lock_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create cache directory ", state->lock_dir, ": ", ec.message()));
  }
  absl::StatusOr<std::unique_ptr<DiskCache>> disk =
      DiskCache::Open(options.cache_dir, options.disk_cache_bytes);
  if (!disk.ok()) return disk.status();
  state->disk = *std::move(disk);
  state->memory = std::make_unique<MemoryCache>(options.memory_cache_bytes);
  state->pool = std::make_unique<CompilePool>(options.pool);
  state->options = std::move(options);
  return std::unique_ptr<KernelStore>(new KernelStore(std::move(state)));
}

absl::StatusOr<v1::AttentionSpec> KernelStore::Resolve(
    const v1::KernelSelector& selector) {
  switch (selector.source_case()) {
    case v1::KernelSelector::kSpec:
      return selector.spec();
    case v1::KernelSelector::kPreset:
      return SpecFromPreset(selector.preset().name(),
                            static_cast<int>(selector.preset().tensor_parallel()));
    default:
      return absl::InvalidArgumentError(
          "kernel: got nothing, supported a spec or a preset (name + "
          "tensor_parallel)");
  }
}

absl::StatusOr<ArtifactPtr> KernelStore::MemoryHit(
    const v1::KernelSelector& selector, const std::string& arch) {
  State& s = *state_;
  std::string memo_key = selector.SerializeAsString();
  memo_key.push_back('\0');
  memo_key += arch;
  std::string key;
  {
    std::lock_guard<std::mutex> lock(s.memo_mu);
    auto it = s.memo.find(memo_key);
    if (it != s.memo.end()) key = it->second;
  }
  if (key.empty()) {
    absl::StatusOr<v1::AttentionSpec> spec = Resolve(selector);
    if (!spec.ok()) return spec.status();
    absl::StatusOr<CompilePlan> plan = s.compiler.Plan(*spec, arch);
    if (!plan.ok()) return plan.status();
    key = plan->key;
    std::lock_guard<std::mutex> lock(s.memo_mu);
    if (s.memo.size() >= State::kMaxMemo) s.memo.clear();
    s.memo.emplace(std::move(memo_key), key);
  }
  absl::StatusOr<ArtifactPtr> hit = s.memory->Get(key);
  if (hit.ok()) ++s.memory_hits;
  return hit;
}

absl::StatusOr<KernelStore::Result> KernelStore::GetKernel(
    const v1::AttentionSpec& spec, std::string_view arch, bool lookup_only,
    absl::Time deadline) {
  State& s = *state_;
  absl::StatusOr<CompilePlan> plan = s.compiler.Plan(spec, arch);
  if (!plan.ok()) return plan.status();

  if (absl::StatusOr<ArtifactPtr> hit = s.memory->Get(plan->key); hit.ok()) {
    ++s.memory_hits;
    return Result{*hit, v1::ARTIFACT_SOURCE_MEMORY};
  }
  if (absl::StatusOr<ArtifactPtr> hit = s.disk->Get(plan->key); hit.ok()) {
    ++s.disk_hits;
    (void)s.memory->Put(plan->key, *hit);
    return Result{*hit, v1::ARTIFACT_SOURCE_DISK};
  }
  ++s.misses;
  if (lookup_only) {
    return absl::NotFoundError(absl::StrCat(
        plan->module_name, " (key ", plan->key,
        ") is not cached and lookup_only was set"));
  }

  FlightFuture flight;
  bool joined = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.shutting_down) {
      return absl::UnavailableError("kforge server is shutting down");
    }
    auto it = s.flights.find(plan->key);
    if (it != s.flights.end()) {
      flight = it->second;
      joined = true;
      ++s.shared_waits;
    } else {
      auto promise = std::make_shared<std::promise<FlightResult>>();
      flight = promise->get_future().share();
      s.flights.emplace(plan->key, flight);
      ++s.running_flights;
      std::thread([&s, promise, p = *plan]() {
        FlightResult result = s.Fly(p);
        // Notify under the lock: once running_flights reaches 0 Shutdown may
        // return and the State be destroyed.
        std::lock_guard<std::mutex> lock(s.mu);
        s.flights.erase(p.key);
        promise->set_value(std::move(result));
        --s.running_flights;
        s.flights_done.notify_all();
      }).detach();
    }
  }
  if (flight.wait_until(ToChrono(deadline)) != std::future_status::ready) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "deadline passed while %s compiled; the compile goes on and its "
        "result will be cached",
        plan->module_name));
  }
  FlightResult result = flight.get();
  if (result.ok() && joined) result->source = v1::ARTIFACT_SOURCE_SHARED_COMPILE;
  return result;
}

absl::StatusOr<v1::Manifest> KernelStore::GetManifest(
    const v1::AttentionSpec& spec, std::string_view arch) const {
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
        artifact->module_name(), artifact->key(), plan->key,
        artifact->compiler_version()));
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
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->shutting_down = true;
  }
  state_->pool->Abandon();
}

void KernelStore::Shutdown() {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.shutdown_called) return;
    s.shutdown_called = true;
    s.shutting_down = true;
  }
  // Queued compiles fail with Unavailable, running ones finish; then every
  // flight thread has published its result and no longer touches State.
  s.pool->Shutdown();
  std::unique_lock<std::mutex> lock(s.mu);
  s.flights_done.wait(lock, [&] { return s.running_flights == 0; });
}

}  // namespace kforge
