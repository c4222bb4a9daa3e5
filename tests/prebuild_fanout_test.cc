// The Prebuild fan-out (service/prebuild_fanout.h) without a server: request
// expansion, completion order, parallelism, failures, cancellation. Kernels
// come from a fake getter, so nothing compiles.
#include "service/prebuild_fanout.h"

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "model/spec.h"
#include "service/blocking_executor.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

using ::kforge::testing::Contains;

v1::KernelSelector Preset(const std::string& name, int tp) {
  v1::KernelSelector selector;
  selector.mutable_preset()->set_name(name);
  selector.mutable_preset()->set_tensor_parallel(tp);
  return selector;
}

constexpr int kMaxJobs = 4096;

TEST(ExpandPrebuildRequestTest, EveryKernelOnEveryArch) {
  v1::PrebuildRequest request;
  *request.add_kernels() = Preset("glm-5", 8);
  *request.add_kernels() = Preset("deepseek-v3.2", 1);
  request.add_archs("sm_90a");
  request.add_archs("sm_120a");
  absl::StatusOr<std::vector<PrebuildJob>> jobs = ExpandPrebuildRequest(request, kMaxJobs);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 4u);
  EXPECT_EQ((*jobs)[0].arch, "sm_90a");
  EXPECT_EQ((*jobs)[1].arch, "sm_120a");
  EXPECT_EQ((*jobs)[0].spec.sparse_mla_decode().num_q_heads(),
            (*jobs)[1].spec.sparse_mla_decode().num_q_heads());
  EXPECT_NE((*jobs)[0].spec.sparse_mla_decode().num_q_heads(),
            (*jobs)[2].spec.sparse_mla_decode().num_q_heads());
}

TEST(ExpandPrebuildRequestTest, NoWorkOrABadKernelFailsTheWholeRequest) {
  v1::PrebuildRequest request;
  request.add_archs("sm_90a");
  EXPECT_TRUE(absl::IsInvalidArgument(ExpandPrebuildRequest(request, kMaxJobs).status()));
  *request.add_kernels() = Preset("glm-5", 8);
  *request.add_kernels() = Preset("no-such-model", 8);
  absl::Status bad = ExpandPrebuildRequest(request, kMaxJobs).status();
  EXPECT_TRUE(absl::IsInvalidArgument(bad)) << bad;
  EXPECT_EQ(bad.message().substr(0, 12), "kernels[1]: ") << bad;
  request.clear_archs();
  request.mutable_kernels()->DeleteSubrange(1, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(ExpandPrebuildRequest(request, kMaxJobs).status()));
}

// A kernel given as a spec that does not validate (here only num_q_heads) is
// refused with the request, like an unknown preset, instead of expanding
// into jobs that each fail (found by fuzz/warm_request_fuzzer.cc; the input
// is kept in fuzz/corpus/warm_request/).
TEST(ExpandPrebuildRequestTest, AnIncompleteSpecFailsTheWholeRequest) {
  v1::PrebuildRequest request;
  request.add_kernels()->mutable_spec()->mutable_sparse_mla_decode()->set_num_q_heads(8);
  *request.add_kernels() = Preset("glm-5", 8);
  request.add_archs("sm_90a");
  absl::Status bad = ExpandPrebuildRequest(request, kMaxJobs).status();
  EXPECT_TRUE(absl::IsInvalidArgument(bad)) << bad;
  EXPECT_EQ(bad.message().substr(0, 12), "kernels[0]: ") << bad;
}

// 2000 kernels x 2000 archs is a 42 KB request; it is refused from the
// counts alone, naming them and the limit, before any of the four million
// jobs exists (the server built them all first and grew to 1.2 GB).
TEST(ExpandPrebuildRequestTest, MoreJobsThanTheLimitAreRefusedFromTheCounts) {
  v1::PrebuildRequest request;
  for (int i = 0; i < 2000; ++i) {
    *request.add_kernels() = Preset("glm-5", 8);
    request.add_archs("sm_90a");
  }
  EXPECT_LT(request.ByteSizeLong(), 64u << 10);
  const absl::Time start = absl::Now();
  absl::Status refused = ExpandPrebuildRequest(request, kMaxJobs).status();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_TRUE(Contains(refused.message(), "2000 kernels x 2000 archs = 4000000 jobs")) << refused;
  EXPECT_TRUE(Contains(refused.message(), "limit of 4096")) << refused;

  // Exactly at the limit is accepted.
  request.mutable_archs()->DeleteSubrange(2, 1998);
  request.mutable_kernels()->DeleteSubrange(0, 1000);
  absl::StatusOr<std::vector<PrebuildJob>> jobs = ExpandPrebuildRequest(request, 2000);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->size(), 2000u);
  EXPECT_TRUE(absl::IsInvalidArgument(ExpandPrebuildRequest(request, 1999).status()));
}

// Archs are checked once each before any kernel is resolved or expanded.
TEST(ExpandPrebuildRequestTest, AnUnknownArchFailsTheWholeRequestNamingIt) {
  v1::PrebuildRequest request;
  *request.add_kernels() = Preset("glm-5", 8);
  request.add_archs("sm_90a");
  request.add_archs("sm_99");
  absl::Status bad = ExpandPrebuildRequest(request, kMaxJobs).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(bad)) << bad;
  EXPECT_TRUE(Contains(bad.message(), "archs[1]: ")) << bad;
  EXPECT_TRUE(Contains(bad.message(), "sm_99")) << bad;
}

std::vector<PrebuildJob> Jobs(int n) {
  std::vector<PrebuildJob> jobs(n);
  for (int i = 0; i < n; ++i) {
    jobs[i].spec.mutable_sparse_mla_decode()->set_topk(1000 + i);
    jobs[i].arch = "sm_90a";
  }
  return jobs;
}

ArtifactPtr Artifact(uint32_t topk) {
  auto artifact = std::make_shared<v1::KernelArtifact>();
  artifact->set_key(absl::StrCat("key", topk));
  artifact->set_module_name(absl::StrCat("module", topk));
  return artifact;
}

// Drains a fan-out the way the gRPC stream does: takes messages whenever it
// says some are ready, until it has finished.
class Consumer {
 public:
  std::function<void()> Ready() {
    return [this] { ++ready_calls_; };
  }
  int ready_calls() const { return ready_calls_.load(); }
  void Attach(std::shared_ptr<PrebuildFanOut> fanout) { fanout_ = std::move(fanout); }

  // Until finished; returns the messages and whether it was cancelled.
  std::vector<v1::PrebuildProgress> Drain(bool* cancelled = nullptr) {
    std::vector<v1::PrebuildProgress> out;
    for (;;) {
      PrebuildFanOut::Event e = fanout_->Next();
      if (e.progress.has_value()) {
        out.push_back(*e.progress);
        continue;
      }
      if (e.finished) {
        if (cancelled != nullptr) *cancelled = e.cancelled;
        return out;
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

 private:
  std::atomic<int> ready_calls_{0};
  std::shared_ptr<PrebuildFanOut> fanout_;
};

TEST(PrebuildFanOutTest, OneMessagePerJobNumberedInCompletionOrder) {
  BlockingExecutor executor(8);
  Consumer consumer;
  std::atomic<int> running{0}, most{0};
  auto get = [&](const PrebuildJob& job, absl::Time) -> absl::StatusOr<KernelStore::Result> {
    const int now = ++running;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    absl::SleepFor(absl::Milliseconds(5));
    --running;
    const uint32_t topk = job.spec.sparse_mla_decode().topk();
    if (topk == 1003) return absl::InternalError("nvrtc: error: boom");
    return KernelStore::Result{
        Artifact(topk), topk % 2 == 0 ? v1::ARTIFACT_SOURCE_DISK : v1::ARTIFACT_SOURCE_COMPILED};
  };
  auto fanout = PrebuildFanOut::Create(Jobs(10), {.parallelism = 3}, get, consumer.Ready());
  consumer.Attach(fanout);
  fanout->Start(executor);
  bool cancelled = true;
  std::vector<v1::PrebuildProgress> messages = consumer.Drain(&cancelled);
  EXPECT_FALSE(cancelled);
  ASSERT_EQ(messages.size(), 10u);
  // Each message was announced before the fan-out said it had finished.
  EXPECT_GE(consumer.ready_calls(), 10);
  EXPECT_LE(most.load(), 3);
  std::set<std::string> keys;
  for (size_t i = 0; i < messages.size(); ++i) {
    const v1::PrebuildProgress& m = messages[i];
    EXPECT_EQ(m.done(), i + 1);
    EXPECT_EQ(m.total(), 10u);
    EXPECT_EQ(m.arch(), "sm_90a");
    if (m.state() == v1::PREBUILD_STATE_FAILED) {
      EXPECT_EQ(m.error(), "nvrtc: error: boom");
      EXPECT_TRUE(m.key().empty());
    } else {
      keys.insert(m.key());
      const bool even = (m.key().back() - '0') % 2 == 0;
      EXPECT_EQ(m.state(), even ? v1::PREBUILD_STATE_CACHED : v1::PREBUILD_STATE_COMPILED)
          << m.key();
      EXPECT_EQ(m.module_name(), "module" + m.key().substr(3));
    }
  }
  EXPECT_EQ(keys.size(), 9u);
}

TEST(PrebuildFanOutTest, PassesTheDeadlineToEveryJob) {
  BlockingExecutor executor(2);
  Consumer consumer;
  const absl::Time deadline = absl::Now() + absl::Hours(1);
  std::atomic<int> right{0};
  auto get = [&](const PrebuildJob& job, absl::Time d) -> absl::StatusOr<KernelStore::Result> {
    if (d == deadline) ++right;
    return KernelStore::Result{Artifact(job.spec.sparse_mla_decode().topk()),
                               v1::ARTIFACT_SOURCE_MEMORY};
  };
  auto fanout = PrebuildFanOut::Create(Jobs(3), {.parallelism = 2, .deadline = deadline}, get,
                                       consumer.Ready());
  consumer.Attach(fanout);
  fanout->Start(executor);
  EXPECT_EQ(consumer.Drain().size(), 3u);
  EXPECT_EQ(right.load(), 3);
}

TEST(PrebuildFanOutTest, CancelStartsNoFurtherJobAndDropsMessages) {
  BlockingExecutor executor(2);
  Consumer consumer;
  absl::Notification first_started, release;
  std::atomic<int> calls{0};
  auto get = [&](const PrebuildJob& job, absl::Time) -> absl::StatusOr<KernelStore::Result> {
    if (++calls == 1) first_started.Notify();
    release.WaitForNotification();
    return KernelStore::Result{Artifact(job.spec.sparse_mla_decode().topk()),
                               v1::ARTIFACT_SOURCE_COMPILED};
  };
  auto fanout = PrebuildFanOut::Create(Jobs(20), {.parallelism = 1}, get, consumer.Ready());
  consumer.Attach(fanout);
  fanout->Start(executor);
  first_started.WaitForNotification();
  fanout->Cancel();
  release.Notify();
  bool cancelled = false;
  EXPECT_TRUE(consumer.Drain(&cancelled).empty());
  EXPECT_TRUE(cancelled);
  EXPECT_EQ(calls.load(), 1);
}

TEST(PrebuildFanOutTest, NoJobsIsFinishedAtOnce) {
  BlockingExecutor executor(1);
  auto fanout = PrebuildFanOut::Create({}, {}, nullptr, [] {});
  fanout->Start(executor);
  PrebuildFanOut::Event e = fanout->Next();
  EXPECT_FALSE(e.progress.has_value());
  EXPECT_TRUE(e.finished);
  EXPECT_FALSE(e.cancelled);
}

TEST(BlockingExecutorTest, RunsEveryTaskBeforeItIsDestroyed) {
  std::atomic<int> ran{0};
  {
    BlockingExecutor executor(2);
    for (int i = 0; i < 50; ++i) {
      executor.Run([&] {
        absl::SleepFor(absl::Microseconds(100));
        ++ran;
      });
    }
  }
  EXPECT_EQ(ran.load(), 50);
}

TEST(BlockingExecutorTest, ABlockedTaskDoesNotHoldUpTheNext) {
  BlockingExecutor executor(2);
  absl::Notification release, second_ran;
  executor.Run([&] { release.WaitForNotification(); });
  executor.Run([&] { second_ran.Notify(); });
  EXPECT_TRUE(second_ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  release.Notify();
}

}  // namespace
}  // namespace kforge
