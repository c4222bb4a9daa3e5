#include "service/compile_pool.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <iostream>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "base/absl_compat.h"
#include "compiler/compiler.h"

extern char** environ;

namespace kforge {
namespace {

// Marks a status that is the compiler's answer for the job (IsCompilerRejection).
constexpr char kCompilerRejectionPayload[] = "type.kforge.dev/compiler-rejection";
// Marks the failures of a job's worker run (IsWorkerFailure), a refusal by
// deadline (IsDeadlineShed) and a job dropped unstarted (IsDroppedJob).
constexpr char kWorkerFailurePayload[] = "type.kforge.dev/worker-failure";
constexpr char kDeadlineShedPayload[] = "type.kforge.dev/deadline-shed";
constexpr char kDroppedJobPayload[] = "type.kforge.dev/dropped-job";

absl::Status Marked(absl::Status status, const char* payload) {
  status.SetPayload(payload, absl::Cord("1"));
  return status;
}

using ArtifactOr = absl::StatusOr<v1::KernelArtifact>;

// How much of a worker's stderr an error message quotes: enough for an
// NVRTC log's last errors or an abort message, small enough for a status.
constexpr size_t kStderrTailBytes = 8 * 1024;
// A CompileResult holds one module's cubin images (a few MB at most today);
// more than this means a runaway worker, not a result.
constexpr size_t kMaxResultBytes = size_t{256} << 20;

std::string ErrnoText(int err) {
  char buf[256];
  // GNU strerror_r: returns a pointer to the text (maybe not buf).
  return strerror_r(err, buf, sizeof(buf));
}

// "SIGABRT (6)".
std::string SignalText(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? absl::StrCat("SIG", abbrev, " (", sig, ")") : absl::StrCat("signal ", sig);
}

// Owns one file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Close();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~Fd() { Close(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// A pipe whose ends are close-on-exec, so that a worker spawned by another
// pool thread at the same moment never inherits them (an inherited write end
// would keep this worker's stdout open past its exit).
absl::Status MakePipe(Fd& read_end, Fd& write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", ErrnoText(errno)));
  }
  // A server started with stdin/stdout/stderr closed gets pipe fds 0..2,
  // which the dup2 actions of the spawn would overwrite; move them up.
  for (int& fd : fds) {
    if (fd > STDERR_FILENO) continue;
    const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
    ::close(fd);
    fd = moved;
  }
  read_end = Fd(fds[0]);
  write_end = Fd(fds[1]);
  if (!read_end.valid() || !write_end.valid()) {
    return absl::InternalError(absl::StrCat("fcntl: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

void SetNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// A spawned child that is always reaped: the destructor kills and waits for
// one that has not been waited for yet, so no path leaves a zombie.
class Child {
 public:
  explicit Child(pid_t pid) : pid_(pid) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (!reaped_) Kill();
  }

  // Non-blocking; true once the child has exited and been reaped.
  bool TryReap() {
    if (reaped_) return true;
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      status_ = status;
    } else if (r < 0 && errno == ECHILD) {
      // Someone else reaped it (a SIGCHLD handler set to SIG_IGN, a
      // waitpid(-1)); nothing is left to wait for.
      reaped_ = true;
      status_ = -1;
    }
    return reaped_;
  }

  // SIGKILL, then a blocking wait.
  void Kill() {
    if (reaped_) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    pid_t r;
    do {
      r = ::waitpid(pid_, &status, 0);
    } while (r < 0 && errno == EINTR);
    reaped_ = true;
    status_ = r == pid_ ? status : -1;
  }

  // waitpid status; -1 when it could not be obtained.
  int status() const { return status_; }

 private:
  pid_t pid_;
  bool reaped_ = false;
  int status_ = -1;
};

// Writes without letting SIGPIPE kill the process when the reader is gone:
// the signal is blocked in this thread for the write, and a SIGPIPE the
// write raised is consumed before the old mask comes back. The caller sees
// EPIPE instead.
ssize_t WriteNoSigpipe(int fd, const char* data, size_t size) {
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  const ssize_t n = ::write(fd, data, size);
  const int err = errno;
  if (n < 0 && err == EPIPE && !sigismember(&old_set, SIGPIPE)) {
    const timespec zero = {0, 0};
    while (sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  errno = err;
  return n;
}

// Appends `data` to `tail`, keeping at most the last kStderrTailBytes.
void AppendTail(std::string& tail, const char* data, size_t size) {
  tail.append(data, size);
  if (tail.size() > 2 * kStderrTailBytes) {
    tail.erase(0, tail.size() - kStderrTailBytes);
  }
}

// How often a running compile looks whether the pool was abandoned.
constexpr absl::Duration kAbandonCheck = absl::Milliseconds(100);

struct ChildRun {
  int wait_status = -1;           // from waitpid; meaningless when timed_out
  bool timed_out = false;         // killed at the deadline
  bool output_too_large = false;  // killed for writing > kMaxResultBytes
  bool abandoned = false;         // killed because the pool was abandoned
  std::string out;                // all of stdout
  std::string err_tail;           // the end of stderr
};

// Runs `binary compile-worker` with `input` on its stdin and collects its
// stdout and the tail of its stderr until it exits or `deadline` passes
// (then SIGKILL), or `abandon` turns true (checked at least every
// kAbandonCheck). The child is reaped on every path. Fails only when the
// child cannot be started.
absl::StatusOr<ChildRun> RunChild(const std::string& binary,
                                  const std::vector<std::string>& extra_args,
                                  const std::string& input, absl::Time deadline,
                                  const std::atomic<bool>& abandon,
                                  const std::function<void(const std::string&)>& on_output) {
  Fd in_r, in_w, out_r, out_w, err_r, err_w;
  for (auto [r, w] : {std::pair<Fd*, Fd*>{&in_r, &in_w}, {&out_r, &out_w}, {&err_r, &err_w}}) {
    absl::Status s = MakePipe(*r, *w);
    if (!s.ok()) return s;
  }

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_r.get(), STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_w.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_w.get(), STDERR_FILENO);
  // Descriptors the rest of the server opened without O_CLOEXEC (sockets,
  // cache files) stay out of the worker too.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);

  // The worker starts with no blocked signals and default dispositions: a
  // server that ignores SIGPIPE or blocks signals in its threads must not
  // pass that on.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t signals;
  sigemptyset(&signals);
  posix_spawnattr_setsigmask(&attr, &signals);
  sigfillset(&signals);
  posix_spawnattr_setsigdefault(&attr, &signals);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::string arg0 = binary;
  std::string arg1 = "compile-worker";
  // Our pid, so the worker can tell whether we died before it asked to die
  // with us (see RunCompileWorker).
  std::string arg2 = std::to_string(::getpid());
  std::vector<std::string> extra = extra_args;
  std::vector<char*> argv = {arg0.data(), arg1.data(), arg2.data()};
  for (std::string& a : extra) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int spawn_error =
      ::posix_spawn(&pid, binary.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (spawn_error != 0) {
    return absl::InternalError(absl::StrCat("cannot start compile worker '", binary,
                                            " compile-worker': ", ErrnoText(spawn_error)));
  }
  Child child(pid);
  in_r.Close();
  out_w.Close();
  err_w.Close();
  SetNonBlocking(in_w.get());
  SetNonBlocking(out_r.get());
  SetNonBlocking(err_r.get());

  ChildRun run;
  // True, with the reason recorded in `r`, once the deadline has passed or
  // the pool was abandoned: the caller stops and the child is killed.
  const auto MustStop = [&](ChildRun& r) {
    if (absl::Now() >= deadline) {
      r.timed_out = true;
    } else if (abandon) {
      r.abandoned = true;
    }
    return r.timed_out || r.abandoned;
  };
  size_t written = 0;
  if (input.empty()) in_w.Close();
  char buf[64 * 1024];
  // Reads what is available; false at EOF or on an error.
  auto drain = [&buf](int fd, auto&& sink) {
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n > 0) {
        sink(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && errno == EAGAIN;
    }
  };
  while (in_w.valid() || out_r.valid() || err_r.valid()) {
    pollfd fds[3];
    Fd* owners[3];
    int n = 0;
    if (in_w.valid()) {
      fds[n] = {in_w.get(), POLLOUT, 0};
      owners[n++] = &in_w;
    }
    if (out_r.valid()) {
      fds[n] = {out_r.get(), POLLIN, 0};
      owners[n++] = &out_r;
    }
    if (err_r.valid()) {
      fds[n] = {err_r.get(), POLLIN, 0};
      owners[n++] = &err_r;
    }
    if (MustStop(run)) break;
    const absl::Duration left = deadline - absl::Now();
    // >= 0: a negative timeout would make poll wait forever.
    const int64_t wait_ms = absl::ToInt64Milliseconds(
        absl::Ceil(std::clamp(left, absl::ZeroDuration(), kAbandonCheck), absl::Milliseconds(1)));
    const int ready = ::poll(fds, n, static_cast<int>(wait_ms));
    if (ready < 0) {
      if (errno == EINTR) continue;
      break;  // cannot happen with valid fds; the wait below still reaps
    }
    for (int i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      Fd& fd = *owners[i];
      if (&fd == &in_w) {
        const ssize_t w =
            WriteNoSigpipe(in_w.get(), input.data() + written, input.size() - written);
        if (w > 0) written += static_cast<size_t>(w);
        // EPIPE: the worker closed stdin or exited; its exit status and
        // output say why, so stop writing and keep reading.
        if (written == input.size() || (w < 0 && errno != EAGAIN && errno != EINTR)) {
          in_w.Close();
        }
      } else if (&fd == &out_r) {
        if (!drain(out_r.get(), [&run](const char* d, size_t s) { run.out.append(d, s); })) {
          out_r.Close();
        }
        if (run.out.size() > kMaxResultBytes) {
          run.output_too_large = true;
          break;
        }
        if (on_output) on_output(run.out);
      } else {
        if (!drain(err_r.get(),
                   [&run](const char* d, size_t s) { AppendTail(run.err_tail, d, s); })) {
          err_r.Close();
        }
      }
    }
    if (run.output_too_large) break;
  }
  // Both outputs are at EOF, so the worker is exiting; wait for it, still
  // bounded by the deadline (a worker may close stdout and then hang).
  absl::Duration backoff = absl::Milliseconds(1);
  while (!run.timed_out && !run.output_too_large && !run.abandoned && !child.TryReap()) {
    if (MustStop(run)) break;
    const absl::Duration left = deadline - absl::Now();
    absl::SleepFor(std::min(backoff, left));
    backoff = std::min(backoff * 2, absl::Milliseconds(50));
  }
  child.Kill();  // no-op when reaped above
  run.wait_status = child.status();
  return run;
}

// The top-k of a spec of either kind (fault injection and labels key on it).
uint32_t TopkOf(const v1::KernelSpec& spec) {
  return spec.has_dsa_indexer() ? spec.dsa_indexer().topk() : spec.sparse_mla_decode().topk();
}

// Names a job in error messages: its module name when the spec is valid.
std::string JobLabel(const v1::CompileJob& job) {
  absl::string_view arch = job.arch();
  if (arch.size() > 32) arch = arch.substr(0, 32);
  absl::StatusOr<CompilePlan> plan =
      KernelCompiler().Plan(job.spec(), std::string_view(arch.data(), arch.size()),
                            PlanOptions{job.max_smem_per_block(), {}});
  if (plan.ok()) return absl::StrCat(plan->module_name, " (", arch, ")");
  return absl::StrCat("topk ", TopkOf(job.spec()), " kernel (", arch, ")");
}

std::string StderrSuffix(const std::string& tail) {
  absl::string_view text = tail;
  const bool cut = text.size() > kStderrTailBytes;
  if (cut) text = text.substr(text.size() - kStderrTailBytes);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) {
    text.remove_suffix(1);
  }
  if (text.empty()) return "; no stderr output";
  return absl::StrCat("; stderr", cut ? " (last 8 KB)" : "", ":\n", text);
}

// The frame of a worker's stdout (worker.proto: a 4-byte little-endian
// length, then a CompileResult) that starts at *pos, when all of it is
// there; *pos moves past it.
std::optional<std::string_view> NextFrame(std::string_view out, size_t* pos) {
  if (out.size() - *pos < 4) return std::nullopt;
  const auto* p = reinterpret_cast<const unsigned char*>(out.data() + *pos);
  const size_t length = static_cast<size_t>(p[0]) | static_cast<size_t>(p[1]) << 8 |
                        static_cast<size_t>(p[2]) << 16 | static_cast<size_t>(p[3]) << 24;
  if (out.size() - *pos - 4 < length) return std::nullopt;
  std::string_view frame = out.substr(*pos + 4, length);
  *pos += 4 + length;
  return frame;
}

std::string Frame(const std::string& bytes) {
  const uint32_t n = static_cast<uint32_t>(bytes.size());
  std::string out = {static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                     static_cast<char>((n >> 16) & 0xff), static_cast<char>((n >> 24) & 0xff)};
  return out + bytes;
}

// What a worker that ran to its end (or wrote too much) produced: its
// artifact (its last frame's), the compiler's answer, or why its output is
// unusable.
ArtifactOr ReadWorkerResult(const v1::CompileJob& job, const ChildRun& run) {
  if (run.output_too_large) {
    return absl::InternalError(absl::StrCat(
        "compile worker for ", JobLabel(job), " wrote more than ", kMaxResultBytes >> 20,
        " MB to stdout; worker killed", StderrSuffix(run.err_tail)));
  }
  const int st = run.wait_status;
  if (st == -1) {
    return absl::InternalError(absl::StrCat("compile worker for ", JobLabel(job),
                                            ": exit status lost", StderrSuffix(run.err_tail)));
  }
  if (WIFSIGNALED(st)) {
    return absl::InternalError(absl::StrCat("compile worker for ", JobLabel(job),
                                            " was killed by signal ", SignalText(WTERMSIG(st)),
                                            StderrSuffix(run.err_tail)));
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    return absl::InternalError(
        absl::StrCat("compile worker for ", JobLabel(job), " exited with code ",
                     WIFEXITED(st) ? WEXITSTATUS(st) : st, StderrSuffix(run.err_tail)));
  }
  if (run.out.empty()) {
    return absl::InternalError(absl::StrCat("compile worker for ", JobLabel(job),
                                            " exited 0 without an artifact (nothing on stdout)",
                                            StderrSuffix(run.err_tail)));
  }
  std::optional<std::string_view> last;
  size_t pos = 0;
  while (std::optional<std::string_view> frame = NextFrame(run.out, &pos)) last = frame;
  v1::CompileResult result;
  if (!last.has_value() || pos != run.out.size() || !result.ParseFromString(std::string(*last))) {
    return absl::InternalError(absl::StrCat("compile worker for ", JobLabel(job),
                                            " wrote an unparsable result (", run.out.size(),
                                            " bytes on stdout)", StderrSuffix(run.err_tail)));
  }
  if (result.artifact().partial()) {
    return absl::InternalError(absl::StrCat("compile worker for ", JobLabel(job),
                                            " exited after its first answer, without its result",
                                            StderrSuffix(run.err_tail)));
  }
  if (result.status_code() != 0) {
    const int code = result.status_code();
    if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
      return absl::InternalError(absl::StrCat("compile worker for ", JobLabel(job),
                                              " returned unknown status code ", code, ": ",
                                              result.status_message()));
    }
    return Marked(absl::Status(static_cast<absl::StatusCode>(code), result.status_message()),
                  kCompilerRejectionPayload);
  }
  if (!result.has_artifact()) {
    return absl::InternalError(absl::StrCat("compile worker for ", JobLabel(job),
                                            " reported success without an artifact",
                                            StderrSuffix(run.err_tail)));
  }
  return std::move(*result.mutable_artifact());
}

// One job, start to finish, in a fresh worker process.
// `first`, when set, gets the worker's first answer (a frame whose
// artifact is partial) while the worker goes on.
ArtifactOr RunJob(const v1::CompileJob& job, const std::string& binary,
                  const std::vector<std::string>& extra_args, absl::Duration timeout,
                  const std::atomic<bool>& abandon, const CompileCallback& first) {
  std::string input;
  if (!job.SerializeToString(&input)) {
    return absl::InternalError("cannot serialize the CompileJob");
  }
  size_t pos = 0;
  bool answered = false;
  auto on_output = [&](const std::string& out) {
    if (answered) return;
    // Only the first frame can be a first answer.
    std::optional<std::string_view> frame = NextFrame(out, &pos);
    if (!frame.has_value()) return;
    answered = true;
    v1::CompileResult early;
    if (early.ParseFromString(std::string(*frame)) && early.status_code() == 0 &&
        early.artifact().partial()) {
      first(std::move(*early.mutable_artifact()));
    }
  };
  absl::StatusOr<ChildRun> run =
      RunChild(binary, extra_args, input, absl::Now() + timeout, abandon,
               first ? std::function<void(const std::string&)>(on_output) : nullptr);
  if (!run.ok()) return run.status();
  if (run->abandoned) {
    return absl::UnavailableError(
        absl::StrCat("compile of ", JobLabel(job),
                     " abandoned: the server is shutting down and its grace period is over"));
  }
  if (run->timed_out) {
    return Marked(absl::DeadlineExceededError(
                      absl::StrFormat("compile of %s exceeded %g s; worker killed%s", JobLabel(job),
                                      absl::ToDoubleSeconds(timeout), StderrSuffix(run->err_tail))),
                  kWorkerFailurePayload);
  }
  ArtifactOr result = ReadWorkerResult(job, *run);
  if (!result.ok() && !IsCompilerRejection(result.status())) {
    return Marked(result.status(), kWorkerFailurePayload);
  }
  return result;
}

absl::StatusOr<std::string> ResolveWorkerBinary(const std::string& configured) {
  if (!configured.empty()) return configured;
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n < 0) {
    return absl::InternalError(
        absl::StrCat("compile pool: readlink /proc/self/exe: ", ErrnoText(errno)));
  }
  return std::string(path, static_cast<size_t>(n));
}

}  // namespace

constexpr std::string_view kCrashTopkArg = "--test-crash-topk=";
constexpr std::string_view kHangTopkArg = "--test-hang-topk=";
constexpr std::string_view kFailTopkArg = "--test-fail-topk=";

bool IsCompilerRejection(const absl::Status& status) {
  return status.GetPayload(kCompilerRejectionPayload).has_value();
}
bool IsWorkerFailure(const absl::Status& status) {
  return status.GetPayload(kWorkerFailurePayload).has_value();
}
bool IsDeadlineShed(const absl::Status& status) {
  return status.GetPayload(kDeadlineShedPayload).has_value();
}
bool IsDroppedJob(const absl::Status& status) {
  return status.GetPayload(kDroppedJobPayload).has_value();
}

int DefaultQueueLimit(int workers, absl::Duration compile) {
  workers = std::max(1, workers);
  if (compile <= absl::ZeroDuration()) compile = kTypicalCompile;
  const int64_t per_worker = std::max<int64_t>(1, kQueueWaitBudget / compile);
  return static_cast<int>(std::min<int64_t>(INT_MAX, per_worker * workers));
}

JobInterest::JobInterest(absl::Time until) : until_ns_(absl::ToUnixNanos(until)) {}

void JobInterest::Extend(absl::Time until) {
  const int64_t want = absl::ToUnixNanos(until);
  int64_t have = until_ns_.load();
  while (have < want && !until_ns_.compare_exchange_weak(have, want)) {
  }
}

absl::Time JobInterest::until() const {
  const int64_t ns = until_ns_.load();
  if (ns == std::numeric_limits<int64_t>::max()) return absl::InfiniteFuture();
  if (ns == std::numeric_limits<int64_t>::min()) return absl::InfinitePast();
  return absl::FromUnixNanos(ns);
}

std::vector<std::string> WorkerFaults::ToArgs() const {
  std::vector<std::string> args;
  if (crash_topk != 0) args.push_back(absl::StrCat(AsAbsl(kCrashTopkArg), crash_topk));
  if (hang_topk != 0) args.push_back(absl::StrCat(AsAbsl(kHangTopkArg), hang_topk));
  if (fail_topk != 0) args.push_back(absl::StrCat(AsAbsl(kFailTopkArg), fail_topk));
  return args;
}

absl::StatusOr<WorkerFaults> WorkerFaults::FromArgs(const std::vector<std::string>& args) {
  WorkerFaults faults;
  for (const std::string& arg : args) {
    absl::string_view value = arg;
    uint32_t* out = nullptr;
    if (absl::ConsumePrefix(&value, AsAbsl(kCrashTopkArg))) {
      out = &faults.crash_topk;
    } else if (absl::ConsumePrefix(&value, AsAbsl(kHangTopkArg))) {
      out = &faults.hang_topk;
    } else if (absl::ConsumePrefix(&value, AsAbsl(kFailTopkArg))) {
      out = &faults.fail_topk;
    }
    if (out == nullptr || !absl::SimpleAtoi(value, out)) {
      return absl::InvalidArgumentError(
          absl::StrCat("compile-worker: unexpected argument '", arg, "'"));
    }
  }
  return faults;
}

// How many recent runs the compile estimate averages: enough to smooth one
// odd compile, few enough to follow a change of load within seconds.
constexpr size_t kRecentRuns = 16;

struct CompilePool::State {
  struct Pending {
    v1::CompileJob job;
    CompileCallback done;
    std::shared_ptr<const JobInterest> interest;  // null: wanted until it runs
    CompileCallback first;                        // null: no first answer

    bool Lapsed(absl::Time now) const { return interest != nullptr && interest->until() <= now; }
  };

  explicit State(CompilePoolOptions o)
      : options(std::move(o)),
        workers(std::max(1, options.workers)),
        queue_limit(options.queue_limit == kAutoQueueLimit
                        ? DefaultQueueLimit(workers, options.initial_compile_estimate)
                        : std::max(0, options.queue_limit)),
        binary(ResolveWorkerBinary(options.worker_binary)),
        worker_args(options.faults.ToArgs()) {}

  void WorkerLoop();

  const CompilePoolOptions options;
  const int workers;
  const int queue_limit;
  const absl::StatusOr<std::string> binary;
  const std::vector<std::string> worker_args;  // after `compile-worker PID`

  mutable absl::Mutex mu;
  absl::CondVar work_ready;
  std::deque<Pending> queue ABSL_GUARDED_BY(mu);
  int in_flight ABSL_GUARDED_BY(mu) = 0;
  bool shut_down ABSL_GUARDED_BY(mu) = false;
  std::atomic<bool> abandon{false};  // Abandon(): kill running workers
  // Wall times of the last kRecentRuns runs, newest last.
  std::deque<absl::Duration> recent ABSL_GUARDED_BY(mu);
  // When each running job started (one entry per running job).
  std::multiset<absl::Time> running_since ABSL_GUARDED_BY(mu);

  // Fails every queued job with Unavailable and rejects new ones.
  void CloseQueue();

  // The recent mean run time (the configured guess before any run), or
  // the mean time the running jobs have run so far when that is longer: a
  // machine that slows down (load, a larger kernel) shows in its running
  // compiles before any of them ends.
  absl::Duration Estimate(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const absl::Duration done =
        recent.empty() ? options.initial_compile_estimate
                       : std::accumulate(recent.begin(), recent.end(), absl::ZeroDuration()) /
                             static_cast<int64_t>(recent.size());
    if (running_since.empty()) return done;
    absl::Duration running = absl::ZeroDuration();
    for (absl::Time since : running_since) running += now - since;
    return std::max(done, running / static_cast<int64_t>(running_since.size()));
  }

  // Queued jobs somebody still waits for.
  int Wanted(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return static_cast<int>(std::count_if(queue.begin(), queue.end(),
                                          [now](const Pending& p) { return !p.Lapsed(now); }));
  }

  // Takes the queued jobs nobody waits for any more out of the queue; the
  // caller fails them (FailDropped) once it has let go of mu.
  std::vector<Pending> TakeLapsed(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<Pending> lapsed;
    for (auto it = queue.begin(); it != queue.end();) {
      if (it->Lapsed(now)) {
        lapsed.push_back(std::move(*it));
        it = queue.erase(it);
      } else {
        ++it;
      }
    }
    return lapsed;
  }
  // Without mu held.
  static void FailDropped(std::vector<Pending>& dropped) {
    for (Pending& p : dropped) {
      p.done(Marked(absl::DeadlineExceededError(absl::StrCat(
                        "compile of ", JobLabel(p.job),
                        " not started: every caller's deadline passed while it waited for a "
                        "worker")),
                    kDroppedJobPayload));
    }
  }

  // OK when Submit would take a job wanted until `until` now; else its
  // error.
  absl::Status Room(absl::Time until, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Separate from mu so that Shutdown can join while workers still take mu.
  absl::Mutex join_mu;
  std::vector<std::thread> threads ABSL_GUARDED_BY(join_mu);
};

void CompilePool::State::WorkerLoop() {
  for (;;) {
    Pending pending;
    std::vector<Pending> dropped;
    bool stop = false;
    absl::Time start;
    {
      absl::MutexLock lock(&mu);
      // A job whose callers have all gone is never started: nobody would
      // read its result, and it would hold a worker from those who would.
      for (;;) {
        while (queue.empty() && !shut_down && dropped.empty()) work_ready.Wait(&mu);
        if (queue.empty()) {
          stop = shut_down;
          break;
        }
        pending = std::move(queue.front());
        queue.pop_front();
        if (!pending.Lapsed(absl::Now())) break;
        dropped.push_back(std::move(pending));
        pending = Pending();
      }
      if (pending.done != nullptr) {
        ++in_flight;
        start = absl::Now();
        running_since.insert(start);
      }
    }
    FailDropped(dropped);
    if (pending.done == nullptr) {
      if (stop) return;
      continue;  // only dropped jobs this time
    }
    ArtifactOr result = binary.ok() ? RunJob(pending.job, *binary, worker_args, options.timeout,
                                             abandon, pending.first)
                                    : ArtifactOr(binary.status());
    {
      // Before the callback, so a caller it wakes sees the count without
      // this job.
      absl::MutexLock lock(&mu);
      --in_flight;
      running_since.erase(running_since.find(start));
      if (!abandon) {
        recent.push_back(absl::Now() - start);
        if (recent.size() > kRecentRuns) recent.pop_front();
      }
    }
    pending.done(std::move(result));
  }
}

CompilePool::CompilePool(CompilePoolOptions options)
    : state_(std::make_unique<State>(std::move(options))) {
  absl::MutexLock lock(&state_->join_mu);
  for (int i = 0; i < state_->workers; ++i) {
    state_->threads.emplace_back([s = state_.get()] { s->WorkerLoop(); });
  }
}

CompilePool::~CompilePool() { Shutdown(); }

absl::StatusOr<CompileFuture> CompilePool::Submit(v1::CompileJob job) {
  auto promise = std::make_shared<std::promise<ArtifactOr>>();
  CompileFuture future = promise->get_future().share();
  absl::Status submitted = Submit(
      std::move(job), [promise](ArtifactOr result) { promise->set_value(std::move(result)); });
  if (!submitted.ok()) return submitted;
  return future;
}

absl::Status CompilePool::State::Room(absl::Time until, absl::Time now) const {
  if (shut_down) return absl::UnavailableError("compile pool is shut down");
  // queue_limit counts jobs that wait for a worker; a job an idle worker
  // will take does not wait (so queue_limit 0 means no waiting queue, not
  // no compiles). Queued jobs not yet taken fill the idle workers first;
  // queued jobs nobody waits for will never start and do not count.
  const int queued = Wanted(now);
  const int idle = std::max(0, workers - in_flight);
  const int waiting = std::max(0, queued - idle);
  if (queued >= queue_limit + idle) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("compile queue is full: %d jobs waiting (limit %d), %d compiling", waiting,
                        queue_limit, in_flight));
  }
  if (queued < idle) return absl::OkStatus();  // starts at once
  // It would wait: for the running and queued jobs ahead of it to free a
  // worker, one compile time per `workers` jobs (the first of the running
  // ones frees one after about 1/workers of a compile), then its own.
  const absl::Duration each = Estimate(now);
  const int ahead = in_flight + queued - workers + 1;
  const absl::Duration start = each * ahead / workers;
  const absl::Duration answer = start + each;
  if (now + answer > until) {
    return Marked(
        absl::ResourceExhaustedError(absl::StrFormat(
            "compile queue: %d jobs waiting, %d compiling on %d workers at about %.1f s a "
            "compile (recent mean): this one would start in about %.1f s and be answered in "
            "about %.1f s, after its deadline (%.1f s from now); refused now rather than "
            "queued past it",
            waiting, in_flight, workers, absl::ToDoubleSeconds(each), absl::ToDoubleSeconds(start),
            absl::ToDoubleSeconds(answer),
            absl::ToDoubleSeconds(std::max(absl::ZeroDuration(), until - now)))),
        kDeadlineShedPayload);
  }
  return absl::OkStatus();
}

absl::Status CompilePool::CheckRoom(absl::Time until) const {
  absl::MutexLock lock(&state_->mu);
  return state_->Room(until, absl::Now());
}

absl::Status CompilePool::Submit(v1::CompileJob job, CompileCallback done,
                                 std::shared_ptr<const JobInterest> interest,
                                 CompileCallback first) {
  const absl::Time until = interest != nullptr ? interest->until() : absl::InfiniteFuture();
  job.set_first_answer(first != nullptr);
  State::Pending pending{std::move(job), std::move(done), std::move(interest), std::move(first)};
  std::vector<State::Pending> dropped;
  absl::Status room;
  {
    absl::MutexLock lock(&state_->mu);
    const absl::Time now = absl::Now();
    // Jobs nobody waits for leave the queue now rather than when a worker
    // reaches them: their flights end and release their locks.
    if (!state_->shut_down) dropped = state_->TakeLapsed(now);
    room = state_->Room(until, now);
    if (room.ok()) {
      state_->queue.push_back(std::move(pending));
      state_->work_ready.Signal();
    }
  }
  State::FailDropped(dropped);
  return room;
}

int CompilePool::queue_depth() const {
  absl::MutexLock lock(&state_->mu);
  return state_->Wanted(absl::Now());
}

absl::Duration CompilePool::compile_estimate() const {
  absl::MutexLock lock(&state_->mu);
  return state_->Estimate(absl::Now());
}

int CompilePool::queue_limit() const { return state_->queue_limit; }

int CompilePool::in_flight() const {
  absl::MutexLock lock(&state_->mu);
  return state_->in_flight;
}

void CompilePool::State::CloseQueue() {
  std::deque<Pending> dropped;
  {
    absl::MutexLock lock(&mu);
    shut_down = true;
    dropped.swap(queue);
    work_ready.SignalAll();
  }
  for (Pending& p : dropped) {
    p.done(absl::UnavailableError("compile pool shut down before the job started"));
  }
}

void CompilePool::Abandon() {
  state_->abandon = true;
  state_->CloseQueue();
}

void CompilePool::Shutdown() {
  state_->CloseQueue();
  absl::MutexLock lock(&state_->join_mu);
  for (std::thread& t : state_->threads) t.join();
  state_->threads.clear();
}

namespace {

bool WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

int RunCompileWorker(int expected_parent, WorkerFaults faults) {
  // Die with the pool thread that spawned us instead of compiling for a
  // server that is gone. If the server died between spawning us and this
  // call, the death signal will never come: we have been re-parented.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (expected_parent > 0 && ::getppid() != expected_parent) {
    std::cerr << "kforge compile-worker: the server that started this worker "
                 "(pid "
              << expected_parent << ") is gone\n";
    return 1;
  }
  // Stdout carries the CompileResult and nothing else: keep a private copy
  // of it and point fd 1 at stderr, so anything the compiler or a library
  // prints cannot corrupt the result.
  const int result_fd = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (result_fd < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    std::cerr << "kforge compile-worker: cannot set up stdout: " << ErrnoText(errno) << "\n";
    return 1;
  }

  std::string input;
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(STDIN_FILENO, buf, sizeof(buf));
    if (n > 0) {
      input.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      std::cerr << "kforge compile-worker: reading stdin: " << ErrnoText(errno) << "\n";
      return 1;
    }
  }
  v1::CompileJob job;
  if (!job.ParseFromString(input)) {
    std::cerr << "kforge compile-worker: stdin (" << input.size()
              << " bytes) is not a serialized kforge.v1.CompileJob; this "
                 "command is run by the kforge server, not by hand\n";
    return 2;
  }

  if (faults.crash_topk != 0 && TopkOf(job.spec()) == faults.crash_topk) {
    std::abort();
  }
  if (faults.hang_topk != 0 && TopkOf(job.spec()) == faults.hang_topk) {
    for (;;) ::pause();
  }

  PlanOptions plan_options;
  plan_options.max_smem_per_block = job.max_smem_per_block();
  // The first answer is written from the compile thread that finished it,
  // before Build returns; the final result after.
  bool write_failed = false;
  KernelCompiler::FirstAnswerSink first;
  if (job.first_answer()) {
    first = [&](v1::KernelArtifact partial) {
      v1::CompileResult early;
      *early.mutable_artifact() = std::move(partial);
      std::string bytes;
      write_failed = !early.SerializeToString(&bytes) || !WriteAll(result_fd, Frame(bytes));
    };
  }
  ArtifactOr artifact = absl::UnknownError("not compiled");
  if (faults.fail_topk != 0 && TopkOf(job.spec()) == faults.fail_topk) {
    artifact = absl::InternalError("kforge_unit.cu(1): error: injected compile failure");
  } else if (absl::StatusOr<CompilePlan> plan =
                 KernelCompiler().Plan(job.spec(), job.arch(), plan_options);
             !plan.ok()) {
    artifact = plan.status();
  } else {
    artifact = KernelCompiler().Build(*plan, first);
  }
  if (write_failed) {
    std::cerr << "kforge compile-worker: writing the first answer: " << ErrnoText(errno) << "\n";
    return 1;
  }
  v1::CompileResult result;
  if (artifact.ok()) {
    *result.mutable_artifact() = *std::move(artifact);
  } else {
    result.set_status_code(static_cast<int>(artifact.status().code()));
    result.set_status_message(std::string(artifact.status().message()));
  }
  std::string bytes;
  if (!result.SerializeToString(&bytes) || !WriteAll(result_fd, Frame(bytes))) {
    std::cerr << "kforge compile-worker: writing the result: " << ErrnoText(errno) << "\n";
    return 1;
  }
  ::close(result_fd);
  return 0;
}

}  // namespace kforge
