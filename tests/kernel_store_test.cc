// KernelStore without gRPC: tiers, single flight, deadlines, manifests.
// Compiles run in real `kforge compile-worker` processes (~1 s each).
#include "service/kernel_store.h"

#include "model/launch.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/file_lock.h"
#include "compiler/compiler.h"
#include "gtest/gtest.h"
#include "model/spec.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

using ::kforge::testing::Contains;

class KernelStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kforge_store_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<KernelStore> Open(int workers = 2, WorkerFaults faults = {}) {
    KernelStoreOptions o;
    o.cache_dir = dir_.string();
    o.pool.workers = workers;
    o.pool.faults = faults;
    o.pool.worker_binary = KFORGE_BINARY;
    o.pool.timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<KernelStore>> store = KernelStore::Create(o);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  static v1::AttentionSpec Glm5Tp8() {
    absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("glm-5", 8);
    EXPECT_TRUE(spec.ok());
    return *spec;
  }

  std::filesystem::path dir_;
};

TEST_F(KernelStoreTest, CompilesOnceThenServesFromMemoryThenDiskAfterRestart) {
  std::string cubin;
  {
    auto store = Open();
    auto first = store->GetKernel(KernelSpecOf(Glm5Tp8()), "sm_90a", false);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(first->source, v1::ARTIFACT_SOURCE_COMPILED);
    EXPECT_FALSE(first->artifact->cubin().empty());
    cubin = first->artifact->cubin();
    auto second = store->GetKernel(KernelSpecOf(Glm5Tp8()), "sm_90a", false);
    ASSERT_TRUE(second.ok());
    EXPECT_EQ(second->source, v1::ARTIFACT_SOURCE_MEMORY);
    EXPECT_EQ(second->artifact->cubin(), cubin);
    EXPECT_EQ(store->Stats().compiles(), 1u);
  }
  auto restarted = Open();
  auto third = restarted->GetKernel(KernelSpecOf(Glm5Tp8()), "sm_90a", true);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->source, v1::ARTIFACT_SOURCE_DISK);
  EXPECT_EQ(third->artifact->cubin(), cubin);
  EXPECT_EQ(restarted->Stats().compiles(), 0u);
  EXPECT_EQ(restarted->Stats().disk_hits(), 1u);
}

uint64_t TimedAnswers(const KernelStore& store, const std::string& source) {
  for (const auto& [name, snapshot] : store.ReadTimings().by_source) {
    if (name == source) return snapshot.count;
  }
  ADD_FAILURE() << "no timings for source " << source;
  return 0;
}

// The server answers disk and Redis hits from CachedKernel (its lookup
// threads), which went untimed: kforge_kernel_seconds{source="disk"} and
// {source="redis"} stayed 0 however many hits were served.
TEST_F(KernelStoreTest, CachedKernelHitsAreTimedBySource) {
  {
    auto store = Open();
    ASSERT_TRUE(store->GetKernel(KernelSpecOf(Glm5Tp8()), "sm_90a", false).ok());
    EXPECT_EQ(TimedAnswers(*store, "compiled"), 1u);
  }
  auto restarted = Open();
  auto disk = restarted->CachedKernel(KernelSpecOf(Glm5Tp8()), "sm_90a");
  ASSERT_TRUE(disk.ok()) << disk.status();
  EXPECT_EQ(disk->source, v1::ARTIFACT_SOURCE_DISK);
  auto memory = restarted->CachedKernel(KernelSpecOf(Glm5Tp8()), "sm_90a");
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ(memory->source, v1::ARTIFACT_SOURCE_MEMORY);
  EXPECT_EQ(TimedAnswers(*restarted, "disk"), 1u);
  EXPECT_EQ(TimedAnswers(*restarted, "memory"), 1u);
  // A miss is not an answer.
  v1::AttentionSpec other = Glm5Tp8();
  other.set_topk(other.topk() * 2);
  EXPECT_TRUE(absl::IsNotFound(restarted->CachedKernel(KernelSpecOf(other), "sm_90a").status()));
  EXPECT_EQ(TimedAnswers(*restarted, "disk") + TimedAnswers(*restarted, "memory"), 2u);
}

TEST_F(KernelStoreTest, ConcurrentColdRequestsShareOneCompile) {
  auto store = Open();
  constexpr int kThreads = 16;
  std::vector<std::thread> threads;
  std::vector<absl::StatusOr<KernelStore::Result>> results(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = store->GetKernel(KernelSpecOf(Glm5Tp8()), "sm_120a", false); });
  }
  for (auto& t : threads) t.join();
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->artifact->cubin(), results[0]->artifact->cubin());
  }
  const v1::StatsResponse stats = store->Stats();
  EXPECT_EQ(stats.compiles(), 1u);
  EXPECT_EQ(stats.memory_hits() + stats.shared_compile_waits() + 1, uint64_t{kThreads});
}

// A miss asked for a first answer is answered with the main and combine
// entries' images while the rest compile; the whole module is what gets
// cached, what later requests get, and what a restart finds on disk.
TEST_F(KernelStoreTest, FirstAnswerThenTheWholeModuleIsCached) {
  const v1::KernelSpec indexer = testing::Indexer64Spec();
  {
    auto store = Open(1);
    KernelStore::Ask ask;
    ask.first_answer = true;
    absl::StatusOr<KernelStore::Result> first = store->GetKernel(indexer, "sm_90a", ask);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_TRUE(first->artifact->partial());
    EXPECT_EQ(first->source, v1::ARTIFACT_SOURCE_COMPILED);
    // Joins the compile still running (or hits once it is cached): the
    // whole module.
    absl::StatusOr<KernelStore::Result> whole = store->GetKernel(indexer, "sm_90a", false);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_FALSE(whole->artifact->partial());
    EXPECT_EQ(whole->artifact->key(), first->artifact->key());
    EXPECT_EQ(whole->artifact->cubin(), first->artifact->cubin());
    EXPECT_GT(whole->artifact->more_cubins_size(), first->artifact->more_cubins_size());
    // Cached now: a first-answer request gets the whole module too.
    absl::StatusOr<KernelStore::Result> again = store->GetKernel(indexer, "sm_90a", ask);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_FALSE(again->artifact->partial());
    EXPECT_EQ(again->source, v1::ARTIFACT_SOURCE_MEMORY);
    const v1::StatsResponse stats = store->Stats();
    EXPECT_EQ(stats.compiles(), 1u);
    EXPECT_EQ(stats.first_answers(), 1u);
  }
  auto reopened = Open(1);
  absl::StatusOr<KernelStore::Result> on_disk = reopened->GetKernel(indexer, "sm_90a", true);
  ASSERT_TRUE(on_disk.ok()) << on_disk.status();
  EXPECT_EQ(on_disk->source, v1::ARTIFACT_SOURCE_DISK);
  EXPECT_FALSE(on_disk->artifact->partial());
}

TEST_F(KernelStoreTest, LookupOnlyMissIsNotFound) {
  auto store = Open();
  auto r = store->GetKernel(KernelSpecOf(Glm5Tp8()), "sm_90a", true);
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  EXPECT_TRUE(Contains(r.status().message(), "lookup_only"));
  EXPECT_EQ(store->Stats().compiles(), 0u);
}

TEST_F(KernelStoreTest, BadSpecAndArchAreRejectedBeforeAnyCompile) {
  auto store = Open();
  v1::AttentionSpec bad = Glm5Tp8();
  bad.set_num_q_heads(0);
  auto r = store->GetKernel(KernelSpecOf(bad), "sm_90a", false);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_TRUE(Contains(r.status().message(), "num_q_heads"));
  auto a = store->GetKernel(KernelSpecOf(Glm5Tp8()), "sm_75", false);
  EXPECT_TRUE(absl::IsFailedPrecondition(a.status())) << a.status();
  EXPECT_EQ(store->Stats().compiles(), 0u);
}

TEST_F(KernelStoreTest, WaiterDeadlineLeavesTheCompileRunning) {
  auto store = Open();
  auto r = store->GetKernel(KernelSpecOf(Glm5Tp8()), "sm_80", false,
                            absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  // The compile finishes for the next caller and is cached.
  auto later = store->GetKernel(KernelSpecOf(Glm5Tp8()), "sm_80", false);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(store->Stats().compiles(), 1u);
}

// Threads of this process now.
int ThreadCount() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

TEST_F(KernelStoreTest, AMissHoldsNoThreadOfItsOwn) {
  constexpr uint32_t kHangTopk = 1000;
  auto store = Open(/*workers=*/1, WorkerFaults{.hang_topk = kHangTopk});
  v1::AttentionSpec hanging = Glm5Tp8();
  hanging.set_topk(kHangTopk);
  const int before = ThreadCount();
  // The caller gives up; the compile goes on (hung) in the pool's worker,
  // with no thread of its own waiting for it.
  auto r = store->GetKernel(KernelSpecOf(hanging), "sm_90a", false,
                            absl::Now() + absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_EQ(store->Stats().in_flight_compiles(), 1u);
  EXPECT_EQ(ThreadCount(), before);
  // A second caller joins the flight rather than starting another compile.
  auto joined = store->GetKernel(KernelSpecOf(hanging), "sm_90a", false,
                                 absl::Now() + absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(joined.status())) << joined.status();
  EXPECT_EQ(store->Stats().shared_compile_waits(), 1u);
  EXPECT_EQ(store->Stats().compiles(), 1u);
  store->AbandonCompiles();
  store->Shutdown();
}

// Callers waiting on a compile in progress held a thread each (a gRPC
// server's 512 blocking threads filled at 512 waiters). GetKernelAsync
// returns at once for every caller, adds no thread, and the compile's end
// answers them all, from one compile.
TEST_F(KernelStoreTest, AsyncWaitersHoldNoThreadAndAreAnsweredByTheCompile) {
  constexpr uint32_t kHangTopk = 1000;
  constexpr int kCallers = 200;
  KernelStoreOptions o;
  o.cache_dir = dir_.string();
  o.pool.workers = 1;
  o.pool.faults.hang_topk = kHangTopk;
  o.pool.worker_binary = KFORGE_BINARY;
  o.pool.timeout = absl::Seconds(3);
  absl::StatusOr<std::unique_ptr<KernelStore>> store = KernelStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  v1::AttentionSpec hanging = Glm5Tp8();
  hanging.set_topk(kHangTopk);
  absl::Mutex mu;
  std::vector<absl::Status> answers;
  const int threads_before = ThreadCount();
  const absl::Time start = absl::Now();
  for (int i = 0; i < kCallers; ++i) {
    (*store)->GetKernelAsync(KernelSpecOf(hanging), "sm_90a", false,
                             absl::Now() + absl::Seconds(60),
                             [&](absl::StatusOr<KernelStore::Result> r) {
                               absl::MutexLock lock(&mu);
                               answers.push_back(r.status());
                             });
  }
  // Nobody was answered or held: the compile hangs for 3 s.
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(answers.empty());
  }
  EXPECT_EQ(ThreadCount(), threads_before);
  EXPECT_EQ((*store)->Stats().shared_compile_waits(), static_cast<uint64_t>(kCallers - 1));
  absl::MutexLock lock(&mu);
  ASSERT_TRUE(mu.AwaitWithTimeout(
      absl::Condition(
          +[](std::vector<absl::Status>* a) { return a->size() == static_cast<size_t>(kCallers); },
          &answers),
      absl::Seconds(60)));
  for (const absl::Status& a : answers) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(a)) << a;
    EXPECT_TRUE(Contains(std::string(a.message()), "exceeded 3 s")) << a;
  }
  EXPECT_EQ((*store)->Stats().compiles(), 1u);
}

// Issue 43 (finding 4): with both workers busy, a miss queued behind them
// for tens of seconds although its caller gave up after 3. A miss whose
// compile would wait for a worker past its deadline is refused at once,
// with the estimate, and starts nothing.
TEST_F(KernelStoreTest, MissThatWouldWaitPastItsDeadlineIsRefusedAtOnce) {
  constexpr uint32_t kHangTopk = 1000;
  auto store = Open(/*workers=*/1, WorkerFaults{.hang_topk = kHangTopk});
  ASSERT_NE(store, nullptr);
  v1::AttentionSpec hanging = Glm5Tp8();
  hanging.set_topk(kHangTopk);
  // Takes the only worker until abandoned.
  store->GetKernelAsync(KernelSpecOf(hanging), "sm_90a", false, absl::InfiniteFuture(),
                        [](absl::StatusOr<KernelStore::Result>) {});
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (store->Stats().in_flight_compiles() == 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(store->Stats().in_flight_compiles(), 1u);
  // A compile takes about a second (before any has finished, the pool's
  // guess), and this one would first wait for the hung one: not within
  // 500 ms.
  const absl::Time start = absl::Now();
  auto r =
      store->GetKernel(KernelSpecOf(Glm5Tp8()), "sm_90a", false, start + absl::Milliseconds(500));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500)) << "answered before its deadline";
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_TRUE(Contains(std::string(r.status().message()), "after its deadline")) << r.status();
  EXPECT_TRUE(Contains(std::string(r.status().message()), "would start in about")) << r.status();
  const v1::StatsResponse stats = store->Stats();
  EXPECT_EQ(stats.queue_depth(), 0u);
  EXPECT_EQ(stats.compiles(), 1u);  // the hung one only
  store->AbandonCompiles();
  store->Shutdown();
}

// Issue 43 (finding 4): compiles whose callers had all given up still ran,
// keeping the workers from those still waiting. A queued compile whose every
// caller's deadline passes before a worker is free never starts; its
// callers are answered DeadlineExceeded, and no worker runs it.
TEST_F(KernelStoreTest, QueuedCompileWhoseCallersAllLeftNeverStarts) {
  constexpr uint32_t kHangTopk = 1000;
  constexpr uint32_t kCrashTopk = 1001;  // would crash if it ever ran
  KernelStoreOptions o;
  o.cache_dir = dir_.string();
  o.pool.workers = 1;
  o.pool.faults.hang_topk = kHangTopk;
  o.pool.faults.crash_topk = kCrashTopk;
  o.pool.worker_binary = KFORGE_BINARY;
  o.pool.timeout = absl::Seconds(3);  // the hung compile holds the worker 3 s
  absl::StatusOr<std::unique_ptr<KernelStore>> store = KernelStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  v1::AttentionSpec hanging = Glm5Tp8();
  hanging.set_topk(kHangTopk);
  v1::AttentionSpec crashing = Glm5Tp8();
  crashing.set_topk(kCrashTopk);
  absl::Mutex mu;
  std::vector<absl::Status> hung_answers, queued_answers;
  (*store)->GetKernelAsync(KernelSpecOf(hanging), "sm_90a", false, absl::InfiniteFuture(),
                           [&](absl::StatusOr<KernelStore::Result> r) {
                             absl::MutexLock lock(&mu);
                             hung_answers.push_back(r.status());
                           });
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while ((*store)->Stats().in_flight_compiles() == 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ((*store)->Stats().in_flight_compiles(), 1u);
  // Estimated at about 2 s (a second's wait, a second's compile): queued.
  (*store)->GetKernelAsync(KernelSpecOf(crashing), "sm_90a", false,
                           absl::Now() + absl::Milliseconds(2500),
                           [&](absl::StatusOr<KernelStore::Result> r) {
                             absl::MutexLock lock(&mu);
                             queued_answers.push_back(r.status());
                           });
  EXPECT_EQ((*store)->Stats().queue_depth(), 1u);
  {
    // Answered once the hung compile is killed (3 s), without running.
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(
        absl::Condition(
            +[](std::vector<absl::Status>* a) { return !a->empty(); }, &queued_answers),
        absl::Seconds(30)));
    EXPECT_TRUE(absl::IsDeadlineExceeded(queued_answers[0])) << queued_answers[0];
    EXPECT_TRUE(Contains(std::string(queued_answers[0].message()), "not started"))
        << queued_answers[0];
  }
  const v1::StatsResponse stats = (*store)->Stats();
  EXPECT_EQ(stats.compiles(), 1u);          // the hung one only
  EXPECT_EQ(stats.compile_failures(), 1u);  // its timeout; nothing crashed
  EXPECT_EQ(stats.in_flight_compiles(), 0u);
  EXPECT_EQ(stats.queue_depth(), 0u);
  absl::MutexLock lock(&mu);
  ASSERT_EQ(hung_answers.size(), 1u);
  EXPECT_TRUE(absl::IsDeadlineExceeded(hung_answers[0])) << hung_answers[0];
}

// Issue 43 (finding 9): a compile whose worker crashed was run again for
// every request (5 requests, 5 crashing compiles). Like the compiler's
// rejections, a crash is answered from memory for a while: 5 requests, 1
// compile, the same error for all.
TEST_F(KernelStoreTest, CrashingCompileRunsOnceForFiveRequests) {
  constexpr uint32_t kCrashTopk = 1001;
  auto store = Open(/*workers=*/2, WorkerFaults{.crash_topk = kCrashTopk});
  ASSERT_NE(store, nullptr);
  v1::AttentionSpec crashing = Glm5Tp8();
  crashing.set_topk(kCrashTopk);
  for (int i = 0; i < 5; ++i) {
    auto r =
        store->GetKernel(KernelSpecOf(crashing), "sm_90a", false, absl::Now() + absl::Seconds(60));
    EXPECT_TRUE(absl::IsInternal(r.status())) << i << ": " << r.status();
    EXPECT_TRUE(Contains(std::string(r.status().message()), "SIGABRT")) << r.status();
    if (i > 0) {
      EXPECT_TRUE(Contains(std::string(r.status().message()), "not retried for another"))
          << r.status();
    }
  }
  EXPECT_EQ(store->Stats().compiles(), 1u);
  EXPECT_EQ(store->Stats().compile_failures(), 1u);
}

// The same for a compile killed at the compile timeout.
TEST_F(KernelStoreTest, TimedOutCompileRunsOnceForThreeRequests) {
  constexpr uint32_t kHangTopk = 1000;
  KernelStoreOptions o;
  o.cache_dir = dir_.string();
  o.pool.workers = 1;
  o.pool.faults.hang_topk = kHangTopk;
  o.pool.worker_binary = KFORGE_BINARY;
  o.pool.timeout = absl::Milliseconds(500);
  absl::StatusOr<std::unique_ptr<KernelStore>> store = KernelStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  v1::AttentionSpec hanging = Glm5Tp8();
  hanging.set_topk(kHangTopk);
  for (int i = 0; i < 3; ++i) {
    auto r = (*store)->GetKernel(KernelSpecOf(hanging), "sm_90a", false,
                                 absl::Now() + absl::Seconds(60));
    EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << i << ": " << r.status();
    EXPECT_TRUE(Contains(std::string(r.status().message()), "exceeded 0.5 s")) << r.status();
  }
  EXPECT_EQ((*store)->Stats().compiles(), 1u);
}

TEST_F(KernelStoreTest, WaitsForAnotherProcessHoldingTheKeyLock) {
  auto store = Open();
  const v1::AttentionSpec spec = Glm5Tp8();
  absl::StatusOr<CompilePlan> plan = KernelCompiler().Plan(KernelSpecOf(spec), "sm_90a");
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string key = plan->key;
  // Another server process sharing the cache directory compiles this key:
  // it holds the key's lock file (another open file description excludes
  // us just like another process would).
  absl::StatusOr<FileLock> other = FileLock::Acquire(
      (dir_ / "locks" / (key.substr(0, 3) + ".lock")).string(), FileLock::Wait::kBlock);
  ASSERT_TRUE(other.ok()) << other.status();
  auto r =
      store->GetKernel(KernelSpecOf(spec), "sm_90a", false, absl::Now() + absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_EQ(store->Stats().compiles(), 0u);
  // Nobody waits any more: the flight is dropped, and the next caller
  // takes the lock once it is free and compiles.
  other->Release();
  auto later = store->GetKernel(KernelSpecOf(spec), "sm_90a", false);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->artifact->key(), key);
  EXPECT_EQ(store->Stats().compiles(), 1u);
}

// Every distinct key left a lock file forever, refused requests too (3000
// files a second). Lock files are now striped by the key's first three hex
// digits, and a request the pool refuses creates none.
TEST_F(KernelStoreTest, LockFilesAreStripedAndRefusedRequestsMakeNone) {
  KernelStoreOptions o;
  o.cache_dir = dir_.string();
  o.pool.workers = 1;
  o.pool.queue_limit = 0;
  o.pool.faults.hang_topk = 1000;
  o.pool.worker_binary = KFORGE_BINARY;
  o.pool.timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<KernelStore>> store = KernelStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  v1::AttentionSpec hanging = Glm5Tp8();
  hanging.set_topk(1000);
  // Takes the only worker (and one lock file) until abandoned.
  auto r = (*store)->GetKernel(KernelSpecOf(hanging), "sm_90a", false,
                               absl::Now() + absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  auto lock_files = [&] {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_ / "locks")) {
      names.push_back(e.path().filename().string());
    }
    return names;
  };
  ASSERT_EQ(lock_files().size(), 1u);
  for (int i = 0; i < 50; ++i) {
    v1::AttentionSpec spec = Glm5Tp8();
    spec.set_softmax_scale(0.05f + 0.001f * static_cast<float>(i));
    auto refused =
        (*store)->GetKernel(KernelSpecOf(spec), "sm_90a", false, absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  }
  const std::vector<std::string> names = lock_files();
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0].size(), 3u + 5u) << names[0];  // "abc.lock"
  EXPECT_EQ((*store)->Stats().rejected_queue_full(), 50u);
  (*store)->AbandonCompiles();
  (*store)->Shutdown();
}

// With a cache directory that cannot hold lock files (read-only: the test
// runs as root, so an unusable locks/ stands in for it), every miss failed
// with INTERNAL "cannot open lock file". It compiles, serves, and counts the
// disk failure.
TEST_F(KernelStoreTest, MissesCompileWhenNoLockFileCanBeMade) {
  std::filesystem::create_directories(dir_);
  { std::ofstream(dir_ / "locks") << "not a directory"; }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  auto r = store->GetKernel(KernelSpecOf(Glm5Tp8()), "sm_90a", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, v1::ARTIFACT_SOURCE_COMPILED);
  EXPECT_EQ(store->Stats().compiles(), 1u);
  EXPECT_GE(store->Stats().disk_write_failures(), 1u);
}

TEST_F(KernelStoreTest, ManifestHasOneVariantForEverySq) {
  auto store = Open();
  v1::AttentionSpec spec = Glm5Tp8();
  spec.set_s_q(2);
  auto m = store->GetManifest(KernelSpecOf(spec), "sm_90a");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->variants_size(), 1);
  EXPECT_EQ(m->arch(), "sm_90a");
  ASSERT_EQ(m->choice_order_size(), 1);
  EXPECT_EQ(m->variants(m->choice_order(0)).spec().sparse_mla_decode().s_q(), 0u);
  const auto& v = m->variants(m->choice_order(0));
  EXPECT_FALSE(v.key().empty());
  spec.set_s_q(1);
  auto m1 = store->GetManifest(KernelSpecOf(spec), "sm_90a");
  ASSERT_TRUE(m1.ok()) << m1.status();
  EXPECT_EQ(m1->variants(0).key(), v.key());  // s_q 1 and 2: one kernel
  // The split count is the selector's, for the device it runs on: 8 heads,
  // one token on 132 SMs splits 16 ways.
  EXPECT_EQ(NumSplits(v.spec().sparse_mla_decode(), v.tiling(), v.launch(), 1, 132), 16);
  EXPECT_EQ(store->Stats().compiles(), 0u);  // planning only
}

TEST_F(KernelStoreTest, ResolveSelector) {
  v1::KernelSelector sel;
  sel.mutable_preset()->set_name("deepseek-v3.2");
  sel.mutable_preset()->set_tensor_parallel(8);
  auto spec = KernelStore::Resolve(sel);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->sparse_mla_decode().num_q_heads(), 16u);
  EXPECT_TRUE(absl::IsInvalidArgument(KernelStore::Resolve(v1::KernelSelector()).status()));
}

}  // namespace
}  // namespace kforge
