#include "service/compile_pool.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kforge/v1/worker.pb.h"
#include "model/spec.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

using ::kforge::testing::Contains;

// topk values that trigger the worker's test-only fault hooks (set in
// PoolOptions); both are valid topk values for any other spec.
constexpr uint32_t kCrashTopk = 1111;
constexpr uint32_t kHangTopk = 2222;

v1::CompileJob Glm5Job(uint32_t topk = 0) {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("glm-5", 8);
  EXPECT_TRUE(spec.ok()) << spec.status();
  v1::CompileJob job;
  if (spec.ok()) *job.mutable_spec() = KernelSpecOf(*spec);
  if (topk != 0) job.mutable_spec()->mutable_sparse_mla_decode()->set_topk(topk);
  job.set_arch("sm_90a");
  return job;
}

CompilePoolOptions PoolOptions(int workers = 1, absl::Duration timeout = absl::Seconds(60)) {
  CompilePoolOptions options;
  options.workers = workers;
  options.timeout = timeout;
  options.worker_binary = KFORGE_BINARY;
  options.faults.crash_topk = kCrashTopk;
  options.faults.hang_topk = kHangTopk;
  return options;
}

absl::StatusOr<v1::KernelArtifact> SubmitAndWait(CompilePool& pool, v1::CompileJob job) {
  absl::StatusOr<CompileFuture> future = pool.Submit(std::move(job));
  if (!future.ok()) return future.status();
  return future->get();
}

// Processes whose parent is this one, zombies included (from /proc, so that
// nothing is reaped by looking).
std::vector<int> ChildPids() {
  std::vector<int> pids;
  const std::string self = absl::StrCat(getpid());
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    // "pid (comm) state ppid ...": comm may hold spaces, so parse after ')'.
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (sscanf(stat.c_str() + paren + 1, " %c %d", &state, &ppid) == 2 && ppid == getpid()) {
      pids.push_back(pid);
    }
  }
  return pids;
}

bool WaitFor(const std::function<bool()>& cond, absl::Duration limit = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + limit;
  while (!cond()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// Writes an executable shell script that stands in for the worker binary.
std::string FakeWorker(const std::string& name, const std::string& body) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", getpid(), "_", name, ".sh");
  {
    std::ofstream out(path, std::ios::trunc);
    out << "#!/bin/sh\n" << body << "\n";
  }
  EXPECT_EQ(chmod(path.c_str(), 0755), 0) << path;
  return path;
}

class CompilePoolTest : public ::testing::Test {};

TEST_F(CompilePoolTest, CompilesInWorkerProcess) {
  CompilePool pool(PoolOptions());
  absl::StatusOr<v1::KernelArtifact> artifact = SubmitAndWait(pool, Glm5Job());
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  EXPECT_FALSE(artifact->cubin().empty());
  EXPECT_EQ(artifact->arch(), "sm_90a");
  EXPECT_EQ(artifact->cubin_info().arch(), "sm_90a");
  EXPECT_EQ(artifact->spec().sparse_mla_decode().num_q_heads(), 8u);
  EXPECT_FALSE(artifact->main_entry().empty());
  EXPECT_EQ(pool.in_flight(), 0);
  EXPECT_EQ(pool.queue_depth(), 0);
  EXPECT_TRUE(ChildPids().empty());
}

// Asked for one, the worker's first answer reaches `first` before the
// final result reaches `done`.
TEST_F(CompilePoolTest, FirstAnswerComesBeforeTheResult) {
  CompilePool pool(PoolOptions());
  v1::CompileJob job;
  *job.mutable_spec() = testing::Indexer64Spec();
  job.set_arch("sm_90a");
  absl::Mutex mu;
  std::vector<std::string> order;
  absl::StatusOr<v1::KernelArtifact> first = absl::UnknownError("none");
  absl::StatusOr<v1::KernelArtifact> final_result = absl::UnknownError("none");
  ASSERT_TRUE(pool.Submit(
                      job,
                      [&](absl::StatusOr<v1::KernelArtifact> r) {
                        absl::MutexLock lock(&mu);
                        order.push_back("done");
                        final_result = std::move(r);
                      },
                      nullptr,
                      [&](absl::StatusOr<v1::KernelArtifact> r) {
                        absl::MutexLock lock(&mu);
                        order.push_back("first");
                        first = std::move(r);
                      })
                  .ok());
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::MutexLock lock(&mu);
        return order.size() == 2;
      },
      absl::Seconds(60)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<std::string>{"first", "done"}));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(final_result.ok()) << final_result.status();
  EXPECT_TRUE(first->partial());
  EXPECT_FALSE(final_result->partial());
  EXPECT_EQ(first->cubin(), final_result->cubin());
  // Without a `first`, the worker writes only its result.
  absl::StatusOr<v1::KernelArtifact> plain = SubmitAndWait(pool, job);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->partial());
}

TEST_F(CompilePoolTest, WorkerStatusComesBackWithItsCode) {
  CompilePool pool(PoolOptions());
  v1::CompileJob bad_spec = Glm5Job();
  bad_spec.mutable_spec()->mutable_sparse_mla_decode()->set_num_q_heads(0);
  absl::StatusOr<v1::KernelArtifact> r = SubmitAndWait(pool, bad_spec);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(Contains(r.status().message(), "num_q_heads"));

  v1::CompileJob bad_arch = Glm5Job();
  bad_arch.set_arch("sm_75");
  r = SubmitAndWait(pool, bad_arch);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_TRUE(Contains(r.status().message(), "sm_75"));
}

TEST_F(CompilePoolTest, CrashingWorkerFailsOnlyItsJob) {
  CompilePool pool(PoolOptions());
  absl::StatusOr<CompileFuture> crash = pool.Submit(Glm5Job(kCrashTopk));
  absl::StatusOr<CompileFuture> normal = pool.Submit(Glm5Job());
  ASSERT_TRUE(crash.ok()) << crash.status();
  ASSERT_TRUE(normal.ok()) << normal.status();

  const absl::Status crashed = crash->get().status();
  EXPECT_EQ(crashed.code(), absl::StatusCode::kInternal) << crashed;
  EXPECT_TRUE(Contains(crashed.message(), "killed by signal SIGABRT"));
  EXPECT_TRUE(Contains(crashed.message(), "topk1111"));  // the module name

  const absl::StatusOr<v1::KernelArtifact>& artifact = normal->get();
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  EXPECT_FALSE(artifact->cubin().empty());
}

TEST_F(CompilePoolTest, HangingWorkerIsKilledAtTheDeadline) {
  CompilePool pool(PoolOptions(1, absl::Seconds(2)));
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::KernelArtifact> r = SubmitAndWait(pool, Glm5Job(kHangTopk));
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_TRUE(Contains(r.status().message(), "exceeded 2 s"));
  EXPECT_TRUE(Contains(r.status().message(), "sm_90a"));
  EXPECT_GE(elapsed, absl::Seconds(2));
  EXPECT_LT(elapsed, absl::Seconds(3));
  // Killed and reaped: no child of ours is left, not even a zombie.
  EXPECT_TRUE(ChildPids().empty());
  int status = 0;
  const pid_t reaped = waitpid(-1, &status, WNOHANG);
  const int wait_errno = errno;
  EXPECT_EQ(reaped, -1);
  EXPECT_EQ(wait_errno, ECHILD);
}

// What a server does when its shutdown grace period is over: the running
// (hung) compile is killed and its job fails Unavailable at once, not at
// the 60 s timeout; the queued one fails too; nothing new is taken.
TEST_F(CompilePoolTest, AbandonKillsRunningWorkersAndFailsQueuedJobs) {
  CompilePool pool(PoolOptions(1, absl::Seconds(60)));
  absl::StatusOr<CompileFuture> running = pool.Submit(Glm5Job(kHangTopk));
  absl::StatusOr<CompileFuture> queued = pool.Submit(Glm5Job());
  ASSERT_TRUE(running.ok() && queued.ok());
  ASSERT_TRUE(WaitFor([&] { return pool.in_flight() == 1; }));
  const absl::Time start = absl::Now();
  pool.Abandon();
  const absl::Status killed = running->get().status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(killed.code(), absl::StatusCode::kUnavailable) << killed;
  EXPECT_TRUE(Contains(killed.message(), "abandoned: the server is shutting down"));
  EXPECT_EQ(queued->get().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pool.Submit(Glm5Job()).status().code(), absl::StatusCode::kUnavailable);
  pool.Shutdown();
  EXPECT_TRUE(ChildPids().empty());
}

TEST_F(CompilePoolTest, WorkersRunJobsConcurrently) {
  CompilePool pool(PoolOptions(2, absl::Seconds(1)));
  const absl::Time start = absl::Now();
  absl::StatusOr<CompileFuture> a = pool.Submit(Glm5Job(kHangTopk));
  absl::StatusOr<CompileFuture> b = pool.Submit(Glm5Job(kHangTopk));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(WaitFor([&] { return pool.in_flight() == 2; }));
  EXPECT_EQ(pool.queue_depth(), 0);
  EXPECT_EQ(a->get().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(b->get().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1900));  // not 2 x 1 s
  EXPECT_EQ(pool.in_flight(), 0);
}

TEST_F(CompilePoolTest, FullQueueRejectsAtOnceAndShutdownFailsQueuedJobs) {
  CompilePoolOptions options = PoolOptions(1, absl::Seconds(2));
  options.queue_limit = 2;
  CompilePool pool(options);

  absl::StatusOr<CompileFuture> running = pool.Submit(Glm5Job(kHangTopk));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_TRUE(WaitFor([&] { return pool.in_flight() == 1; }));
  EXPECT_EQ(pool.queue_depth(), 0);

  absl::StatusOr<CompileFuture> queued1 = pool.Submit(Glm5Job(kHangTopk));
  absl::StatusOr<CompileFuture> queued2 = pool.Submit(Glm5Job(kHangTopk));
  ASSERT_TRUE(queued1.ok()) << queued1.status();
  ASSERT_TRUE(queued2.ok()) << queued2.status();
  EXPECT_EQ(pool.queue_depth(), 2);
  EXPECT_EQ(pool.in_flight(), 1);

  const absl::Time before = absl::Now();
  absl::StatusOr<CompileFuture> overflow = pool.Submit(Glm5Job(kHangTopk));
  EXPECT_LT(absl::Now() - before, absl::Milliseconds(100));
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kResourceExhausted) << overflow.status();
  EXPECT_TRUE(Contains(overflow.status().message(), "queue is full"));
  EXPECT_TRUE(Contains(overflow.status().message(), "limit 2"));

  pool.Shutdown();  // waits for the running job's 2 s deadline
  EXPECT_EQ(queued1->get().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(queued2->get().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(running->get().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(pool.queue_depth(), 0);
  EXPECT_EQ(pool.in_flight(), 0);
  EXPECT_TRUE(ChildPids().empty());
}

// The default queue bound: what the workers get through in 30 s at a
// typical compile's time, at least one job per worker.
TEST(DefaultQueueLimitTest, FollowsWorkersAndCompileTime) {
  EXPECT_EQ(DefaultQueueLimit(2), 60);
  EXPECT_EQ(DefaultQueueLimit(16), 480);
  EXPECT_EQ(DefaultQueueLimit(2, absl::Seconds(10)), 6);
  EXPECT_EQ(DefaultQueueLimit(3, absl::Minutes(5)), 3);
  EXPECT_EQ(DefaultQueueLimit(0), 30);
  CompilePoolOptions options = PoolOptions(4);
  EXPECT_EQ(CompilePool(options).queue_limit(), 120);
  options.queue_limit = 7;
  EXPECT_EQ(CompilePool(options).queue_limit(), 7);
}

absl::Status SubmitWanted(CompilePool& pool, v1::CompileJob job,
                          std::shared_ptr<const JobInterest> interest,
                          std::shared_ptr<std::promise<absl::Status>> result) {
  return pool.Submit(
      std::move(job),
      [result](absl::StatusOr<v1::KernelArtifact> r) { result->set_value(r.status()); },
      std::move(interest));
}

// A job that would wait for a worker is refused when its estimated answer
// falls after its caller's deadline; one an idle worker takes always
// starts, and one nobody waits for any more never does.
TEST_F(CompilePoolTest, ShedsByDeadlineAndDropsJobsNobodyWaitsFor) {
  CompilePoolOptions options = PoolOptions(1, absl::Seconds(2));
  options.initial_compile_estimate = absl::Milliseconds(300);
  CompilePool pool(options);
  // Idle worker: starts even with a deadline nearer than a compile's
  // estimate (it crashes: it ran).
  auto crashed = std::make_shared<std::promise<absl::Status>>();
  ASSERT_TRUE(SubmitWanted(pool, Glm5Job(kCrashTopk),
                           std::make_shared<JobInterest>(absl::Now() + absl::Milliseconds(200)),
                           crashed)
                  .ok());
  const absl::Status crash = crashed->get_future().get();
  EXPECT_TRUE(IsWorkerFailure(crash)) << crash;
  EXPECT_FALSE(IsCompilerRejection(crash));

  absl::StatusOr<CompileFuture> hung = pool.Submit(Glm5Job(kHangTopk));
  ASSERT_TRUE(hung.ok());
  ASSERT_TRUE(WaitFor([&] { return pool.in_flight() == 1; }));
  // The crash took well under the guess: the estimate is the recent mean.
  EXPECT_LT(pool.compile_estimate(), absl::Milliseconds(300));
  // Would wait: refused when the deadline is nearer than the estimate.
  auto refused = std::make_shared<std::promise<absl::Status>>();
  const absl::Status shed =
      SubmitWanted(pool, Glm5Job(kCrashTopk), std::make_shared<JobInterest>(absl::Now()), refused);
  EXPECT_TRUE(IsDeadlineShed(shed)) << shed;
  EXPECT_TRUE(absl::IsResourceExhausted(shed)) << shed;
  EXPECT_TRUE(pool.CheckRoom(absl::InfiniteFuture()).ok());
  EXPECT_TRUE(IsDeadlineShed(pool.CheckRoom(absl::Now())));
  // Queued with 300 ms of interest, then nobody waits: dropped, not run.
  auto dropped = std::make_shared<std::promise<absl::Status>>();
  auto short_interest = std::make_shared<JobInterest>(absl::Now() + absl::Milliseconds(300));
  ASSERT_TRUE(SubmitWanted(pool, Glm5Job(kCrashTopk), short_interest, dropped).ok());
  // Queued the same way, but a caller joins with no deadline: it runs.
  auto extended = std::make_shared<std::promise<absl::Status>>();
  auto joined = std::make_shared<JobInterest>(absl::Now() + absl::Milliseconds(300));
  ASSERT_TRUE(SubmitWanted(pool, Glm5Job(kCrashTopk), joined, extended).ok());
  joined->Extend(absl::InfiniteFuture());
  joined->Extend(absl::Now());  // never shortens
  EXPECT_EQ(pool.queue_depth(), 2);
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_EQ(pool.queue_depth(), 1);  // the lapsed one no longer counts
  const absl::Status not_run = dropped->get_future().get();
  EXPECT_TRUE(IsDroppedJob(not_run)) << not_run;
  EXPECT_TRUE(absl::IsDeadlineExceeded(not_run)) << not_run;
  const absl::Status ran = extended->get_future().get();
  EXPECT_TRUE(IsWorkerFailure(ran)) << ran;
  EXPECT_TRUE(IsWorkerFailure(hung->get().status()));  // killed at the timeout
}

TEST_F(CompilePoolTest, ShutdownIsIdempotentAndRejectsNewJobs) {
  CompilePool pool(PoolOptions(3));
  pool.Shutdown();
  pool.Shutdown();
  absl::StatusOr<CompileFuture> late = pool.Submit(Glm5Job());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable) << late.status();
}  // the destructor shuts down a third time

TEST_F(CompilePoolTest, MissingWorkerBinaryIsInternal) {
  CompilePoolOptions options = PoolOptions();
  options.worker_binary = "/nonexistent/kforge";
  CompilePool pool(options);
  absl::StatusOr<v1::KernelArtifact> r = SubmitAndWait(pool, Glm5Job());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_TRUE(Contains(r.status().message(), "/nonexistent/kforge"));
  EXPECT_TRUE(Contains(r.status().message(), "No such file or directory"));
}

TEST_F(CompilePoolTest, WorkerExitCodeAndStderrAreReported) {
  CompilePoolOptions options = PoolOptions();
  options.worker_binary =
      FakeWorker("exit3", "cat >/dev/null; echo \"out of cheese in $1\" >&2; exit 3");
  CompilePool pool(options);
  absl::StatusOr<v1::KernelArtifact> r = SubmitAndWait(pool, Glm5Job());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_TRUE(Contains(r.status().message(), "exited with code 3"));
  EXPECT_TRUE(Contains(r.status().message(), "out of cheese in compile-worker"));
}

TEST_F(CompilePoolTest, UnparsableWorkerOutputIsInternal) {
  CompilePoolOptions options = PoolOptions();
  options.worker_binary = FakeWorker("garbage", "cat >/dev/null; printf 'definitely not proto'");
  CompilePool pool(options);
  absl::StatusOr<v1::KernelArtifact> r = SubmitAndWait(pool, Glm5Job());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_TRUE(Contains(r.status().message(), "unparsable"));
}

TEST_F(CompilePoolTest, WorkerThatIgnoresStdinDoesNotRaiseSigpipe) {
  // The job is larger than a pipe buffer and the worker exits without
  // reading it, so the pool's write fails with EPIPE; SIGPIPE's default
  // action would end this test process.
  CompilePoolOptions options = PoolOptions();
  options.worker_binary = FakeWorker("deaf", "exit 0");
  CompilePool pool(options);
  v1::CompileJob job = Glm5Job();
  job.set_arch(std::string(1 << 20, 'x'));
  absl::StatusOr<v1::KernelArtifact> r = SubmitAndWait(pool, job);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_TRUE(Contains(r.status().message(), "without an artifact"));
}

TEST_F(CompilePoolTest, ServerFdsDoNotLeakIntoWorkers) {
  // Opened without O_CLOEXEC, as a careless library in the server might.
  const int fd = open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 3);
  CompilePoolOptions options = PoolOptions();
  options.worker_binary =
      FakeWorker("fds", absl::StrCat("cat >/dev/null; [ -e /proc/$$/fd/", fd, " ] && echo 'fd ", fd,
                                     " leaked' >&2; exit 4"));
  CompilePool pool(options);
  absl::StatusOr<v1::KernelArtifact> r = SubmitAndWait(pool, Glm5Job());
  close(fd);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_TRUE(Contains(r.status().message(), "exited with code 4"));
  EXPECT_FALSE(absl::StrContains(r.status().message(), "leaked")) << r.status();
}

TEST(CompileWorkerTest, RejectsGarbageOnStdin) {
  const std::string command =
      absl::StrCat("printf 'garbage' | '", KFORGE_BINARY, "' compile-worker 2>/dev/null");
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 2);
}

}  // namespace
}  // namespace kforge
