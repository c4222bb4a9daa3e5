#ifndef KFORGE_SERVICE_COMPILE_POOL_H_
#define KFORGE_SERVICE_COMPILE_POOL_H_

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/worker.pb.h"

namespace kforge {

// Test-only fault injection into compile workers, so that tests can prove
// that a crashing or hanging worker fails only its own job. Set by tests
// (and by `kforge serve`/`prebuild`'s hidden --test-worker-* flags for the
// process-level ones); a worker gets them on its command line. 0 = off.
struct WorkerFaults {
  uint32_t crash_topk = 0;  // abort() on a job whose spec.topk is this
  uint32_t hang_topk = 0;   // sleep forever on a job whose spec.topk is this
  uint32_t fail_topk = 0;   // report a compile error on a job whose spec.topk is this

  // The worker command-line arguments that carry them; and back.
  std::vector<std::string> ToArgs() const;
  static absl::StatusOr<WorkerFaults> FromArgs(const std::vector<std::string>& args);
};

struct CompilePoolOptions {
  int workers = 1;  // concurrent worker processes
  // Jobs waiting for a busy worker; more -> ResourceExhausted. A job an idle
  // worker takes at once does not count: 0 is no waiting queue.
  int queue_limit = 256;
  absl::Duration timeout = absl::Seconds(120);  // per compile, then SIGKILL
  // The kforge binary; run as `<worker_binary> compile-worker`. Empty means
  // this process's own executable (/proc/self/exe).
  std::string worker_binary;
  WorkerFaults faults;  // tests only
};

// Whether a failed job's status is the compiler's own answer (the worker
// ran and reported an error for the job, e.g. NVRTC rejected the source),
// which the same job would get again, as opposed to a crash, a timeout or
// a full queue. The pool marks such statuses with a payload.
bool IsCompilerRejection(const absl::Status& status);

using CompileFuture = std::shared_future<absl::StatusOr<v1::KernelArtifact>>;
// Called once with a job's result, on a pool thread (or, for a job dropped
// at shutdown, on the thread that shuts the pool down). Must not call back
// into the pool's Shutdown.
using CompileCallback = std::function<void(absl::StatusOr<v1::KernelArtifact>)>;

// Runs compiles in isolated child processes (`kforge compile-worker`, job
// on stdin, CompileResult on stdout), at most `workers` at a time. A worker
// that crashes, exits non-zero, writes garbage or overruns the timeout
// fails its job with a clear status (Internal / DeadlineExceeded) and the
// pool carries on. Thread-safe.
class CompilePool {
 public:
  explicit CompilePool(CompilePoolOptions options);
  ~CompilePool();  // Shutdown()

  // Queues a job. ResourceExhausted at once when queue_limit jobs are
  // already waiting; Unavailable after Shutdown().
  absl::StatusOr<CompileFuture> Submit(v1::CompileJob job);
  // The same, with the result delivered to `done` instead of a future, so
  // that no thread has to wait for it. On an error `done` is not called.
  absl::Status Submit(v1::CompileJob job, CompileCallback done);

  // What Submit would answer about room for a job now (OK, ResourceExhausted
  // or Unavailable), for a caller that must not prepare a job (take a lock
  // file, say) that would be refused. The answer can change at once.
  absl::Status CheckRoom() const;

  int queue_depth() const;  // waiting for a worker
  int in_flight() const;    // running in a worker process now

  // Rejects new jobs, fails the queued ones with Unavailable, lets running
  // compiles finish, joins the threads.
  void Shutdown();

  // Rejects new jobs, fails the queued ones, and kills the running workers
  // within ~100 ms (their jobs fail with Unavailable); returns at once. For
  // a shutdown whose grace period is over: a hung compile must not hold
  // the process until its timeout. Shutdown() still joins afterwards.
  void Abandon();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Entry point of `kforge compile-worker [SERVER_PID] [fault flags]`: reads a
// CompileJob from stdin, compiles it in this process and writes a
// CompileResult to stdout. Exits at once if its parent is no longer
// expected_parent (> 0). Returns the process exit code.
int RunCompileWorker(int expected_parent = 0, WorkerFaults faults = {});

}  // namespace kforge

#endif  // KFORGE_SERVICE_COMPILE_POOL_H_
