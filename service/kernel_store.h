#ifndef KFORGE_SERVICE_KERNEL_STORE_H_
#define KFORGE_SERVICE_KERNEL_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/service.pb.h"
#include "kforge/v1/spec.pb.h"
#include "service/artifact_cache.h"
#include "service/cache_entry.h"
#include "service/compile_pool.h"
#include "service/histogram.h"
#include "service/redis_cache.h"

namespace kforge {

struct KernelStoreOptions {
  std::string cache_dir;  // disk tier root
  uint64_t memory_cache_bytes = 1ull << 30;
  uint64_t disk_cache_bytes = 20ull << 30;
  CompilePoolOptions pool;
  // How long a compile the compiler rejected (IsCompilerRejection: not a
  // crash, timeout or full queue) is answered from memory with the same
  // error instead of being compiled again, so that a client repeating a
  // valid but failing spec does not keep the workers busy. 0: never.
  absl::Duration failure_cache = absl::Seconds(30);
  // The same for a compile whose worker crashed, was killed at the compile
  // timeout or wrote no usable result (IsWorkerFailure): retried on every
  // request, such a compile kept the workers busy for nothing (5 requests,
  // 5 crashing compiles). Shorter than failure_cache, as a crash or timeout
  // may come from the machine (memory, load) rather than the spec. 0: never.
  absl::Duration worker_failure_cache = absl::Seconds(10);
  // The fleet's shared tier between the disk and a compile; host "" = none.
  // Its `trust` is set from `trust` below.
  RedisCacheOptions redis;
  // How the disk and Redis tiers seal entries and what a read demands
  // (service/cache_entry.h): the fleet key, and whether entries from
  // unsigned bundles are refused (`serve --trust`).
  EntryTrust trust;
};

// The service's business logic, independent of gRPC: resolves a kernel
// through memory -> disk -> Redis (when configured) -> one compile per key
// (single flight across threads, across processes sharing the cache
// directory through a lock file, and across the fleet through a Redis lock
// key), builds manifests, counts everything. Every kernel a disk or Redis
// read hands over passes the clients' own check (CheckArtifactForVariant,
// against the variant this server plans for the key) before it is served
// or copied to another tier; one that fails is dropped from its tier,
// counted and rebuilt. Thread-safe.
class KernelStore {
 public:
  static absl::StatusOr<std::unique_ptr<KernelStore>> Create(KernelStoreOptions options);
  ~KernelStore();

  struct Result {
    ArtifactPtr artifact;
    v1::ArtifactSource source = v1::ARTIFACT_SOURCE_UNSPECIFIED;
  };

  // InvalidArgument (bad spec, names the field), FailedPrecondition
  // (unsupported arch), NotFound (lookup_only miss), ResourceExhausted
  // (compile queue full, or the compile would wait for a worker past
  // `deadline`: refused at once, with the wait estimate in the message),
  // DeadlineExceeded (this caller's deadline passed; the compile goes on for
  // the others, or, still queued when every caller's deadline has passed,
  // never starts), Internal (compile failure, with the NVRTC log),
  // Unavailable (shutting down). Blocks until answered: GetKernelAsync on a
  // waiting thread.
  absl::StatusOr<Result> GetKernel(const v1::KernelSpec& spec, std::string_view arch,
                                   bool lookup_only, absl::Time deadline = absl::InfiniteFuture());

  // What a request asks for.
  struct Ask {
    bool lookup_only = false;
    // On a miss, answer with the compile's first answer (the artifact's
    // `partial` set: the main and combine entries' images) as soon as the
    // worker has it, or at once where a compile in progress has one; the
    // whole module is still compiled and cached. Hits are whole modules.
    bool first_answer = false;
    absl::Time deadline = absl::InfiniteFuture();
  };
  absl::StatusOr<Result> GetKernel(const v1::KernelSpec& spec, std::string_view arch,
                                   const Ask& ask);

  // GetKernel without a thread waiting for a compile: `done` runs once,
  // with what GetKernel answers, either before this returns (a hit, an
  // error, or a compile that ended while this caller started it) or on the
  // thread that ends the compile (the pool's). A caller that joins a
  // compile in progress returns at once; the one that starts a compile
  // takes the key's lock file on its own thread first, which waits only
  // while another process sharing the cache directory compiles the key,
  // and then (with Redis) the fleet lock, which waits only while another
  // server of the fleet compiles it, each until the latest deadline of the
  // compile's callers. `deadline` bounds only those waits (past it, every
  // caller is answered DeadlineExceeded): a caller whose deadline passes during the compile
  // itself is answered when it ends (a gRPC client has gone by then).
  // `done` must not block; it may call the store.
  using Done = std::function<void(absl::StatusOr<Result>)>;
  void GetKernelAsync(const v1::KernelSpec& spec, std::string_view arch, bool lookup_only,
                      absl::Time deadline, Done done);
  void GetKernelAsync(const v1::KernelSpec& spec, std::string_view arch, const Ask& ask, Done done);

  // The memory tier, then the disk tier, then Redis, never a compile nor a
  // wait for one:
  // what GetKernel answers before it would compile. NotFound on a miss
  // (not counted as one: GetKernel, which the caller goes on to, counts
  // it); the errors of planning (bad spec, unknown arch) as GetKernel.
  absl::StatusOr<Result> CachedKernel(const v1::KernelSpec& spec, std::string_view arch);

  // The hot path for cache hits: the memory tier only, with the
  // (selector, arch) -> key mapping remembered so a hit skips planning and
  // hashing. NotFound when the memory tier does not hold the kernel (the
  // caller then goes through GetKernel, which validates and counts).
  absl::StatusOr<ArtifactPtr> MemoryHit(const v1::KernelSelector& selector,
                                        const std::string& arch);

  // Resolves a KernelSelector (spec or preset) to a spec.
  static absl::StatusOr<v1::KernelSpec> Resolve(const v1::KernelSelector& selector);

  // The selection manifest for a spec on an arch (no compile needed: keys,
  // tilings and launch rules come from planning).
  absl::StatusOr<v1::Manifest> GetManifest(const v1::KernelSpec& spec, std::string_view arch) const;

  // Warm-up from a bundle: puts a prebuilt kernel into the memory and disk
  // tiers, its disk entry recording `origin` (a signed or unsigned
  // bundle's). Only a kernel this server would build itself is accepted: the
  // key it computes for (artifact.spec, artifact.arch) must be the
  // artifact's key, else FailedPrecondition (a bundle from another kforge or
  // NVRTC version; its kernels would never be served). Returns true when the
  // kernel was already cached (in an entry this server trusts: one it
  // refuses is dropped and replaced by the bundle's).
  absl::StatusOr<bool> Preload(ArtifactPtr artifact, EntryOrigin origin);

  v1::StatsResponse Stats() const;

  // How long answered GetKernel, GetKernelAsync, CachedKernel (and
  // MemoryHit) calls took, by the source of the answer ("memory", "disk",
  // "redis", "compiled", "shared_compile"), and NVRTC's seconds per
  // successful compile.
  struct Timings {
    std::vector<std::pair<std::string, Histogram::Snapshot>> by_source;
    Histogram::Snapshot compile_seconds;
  };
  Timings ReadTimings() const;

  // Stops accepting compiles; in-flight ones finish.
  void Shutdown();

  // Stops accepting compiles and kills the running ones, whose callers get
  // Unavailable; returns at once (a shutdown past its grace period).
  void AbandonCompiles();

 private:
  struct State;
  explicit KernelStore(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kforge

#endif  // KFORGE_SERVICE_KERNEL_STORE_H_
