// kforge_loadgen: a gRPC async load generator for kforge.v1.KernelService.
//
// Measures GetKernel cache hits at fixed concurrency levels (exactly N calls
// outstanding at all times, per-call latency, requests per second), then the
// latency of cold compiles (sequential, distinct specs that miss the cache),
// and prints a markdown table (also written to --out FILE).
//
// With --miss-fraction F, that share of each client's calls asks for a kernel
// nobody has asked for before (topk --miss-base and a softmax scale of its
// own: every miss is a compile), with a deadline from --miss-deadlines (cycled): the load of
// issue 43, hits and overloading misses at once. Misses are reported by
// deadline and outcome; after the load, once every client call has ended,
// the server's Stats show the compiles still queued or running for nobody
// and how long they keep the workers busy.
//
//   kforge_loadgen --server 127.0.0.1:50051 [--concurrency 1,16,64]
//                  [--seconds 5] [--warmup 0.5] [--arch sm_90a]
//                  [--preset glm-5] [--tp 8] [--cold 4] [--cold-base 2049]
//                  [--client-threads 2] [--wait 30] [--rpc getkernel|stats]
//                  [--miss-fraction 0.1] [--miss-deadlines 3,30]
//                  [--miss-base 4096] [--drain-wait 120] [--out FILE]
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "kforge/v1/service.grpc.pb.h"
#include "model/artifact_check.h"
#include "model/spec.h"

namespace {

namespace v1 = kforge::v1;
using Clock = std::chrono::steady_clock;

constexpr int kMaxMessageBytes = 256 << 20;

struct Options {
  std::string server = "127.0.0.1:50051";
  std::vector<int> concurrency = {1, 16, 64};
  double seconds = 5;
  double warmup = 0.5;  // per level, not recorded
  std::string arch = "sm_90a";
  std::string preset = "glm-5";
  int tp = 8;
  int cold = 4;
  int cold_base = 2049;  // cold spec k uses topk = cold_base + k (the preset has 2048)
  // Each client thread has its own completion queue and channel (its own
  // TCP connection); the outstanding calls are split between them. One
  // thread per core of a 2-core machine keeps the client from becoming the
  // bottleneck (it parses every 45 KB response).
  int client_threads = 2;
  double wait = 30;           // seconds to wait for the server to answer
  double cold_timeout = 600;  // per cold compile
  std::string out;
  // "getkernel" (default), or "stats": a tiny unary call answered on the
  // server's callback thread, which shows gRPC's own floor on this machine.
  std::string rpc = "getkernel";
  double miss_fraction = 0;                  // share of calls that miss
  std::vector<double> miss_deadlines = {3};  // seconds, cycled over the misses
  int miss_base = 4096;                      // topk of the first miss
  double drain_wait = 120;  // most seconds to watch the server drain after the load
};

[[noreturn]] void Usage(const std::string& error) {
  if (!error.empty()) std::cerr << "kforge_loadgen: " << error << "\n";
  std::cerr << "usage: kforge_loadgen [--server ADDR] [--concurrency 1,16,64]\n"
               "         [--seconds S] [--warmup S] [--arch sm_90a] [--preset glm-5]\n"
               "         [--tp 8] [--cold N] [--cold-base TOPK] [--client-threads N]\n"
               "         [--wait S] [--cold-timeout S] [--rpc getkernel|stats]\n"
               "         [--miss-fraction F] [--miss-deadlines S,S] [--miss-base TOPK]\n"
               "         [--drain-wait S] [--out FILE]\n";
  std::exit(error.empty() ? 0 : 2);
}

long ToInt(const std::string& flag, const std::string& v, long min) {
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || n < min) {
    Usage("--" + flag + ": bad value '" + v + "' (an integer >= " + std::to_string(min) + ")");
  }
  return n;
}

double ToDouble(const std::string& flag, const std::string& v, double min) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(d >= min)) {
    Usage("--" + flag + ": bad value '" + v + "'");
  }
  return d;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") Usage("");
    if (arg.rfind("--", 0) != 0) Usage("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2), value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= argc) Usage("--" + name + " needs a value");
      value = argv[++i];
    }
    if (name == "server") {
      o.server = value;
    } else if (name == "concurrency") {
      o.concurrency.clear();
      std::stringstream ss(value);
      for (std::string item; std::getline(ss, item, ',');) {
        o.concurrency.push_back(static_cast<int>(ToInt(name, item, 1)));
      }
      if (o.concurrency.empty()) Usage("--concurrency: empty list");
    } else if (name == "seconds") {
      o.seconds = ToDouble(name, value, 0.01);
    } else if (name == "warmup") {
      o.warmup = ToDouble(name, value, 0);
    } else if (name == "arch") {
      o.arch = value;
    } else if (name == "preset") {
      o.preset = value;
    } else if (name == "tp") {
      o.tp = static_cast<int>(ToInt(name, value, 1));
    } else if (name == "cold") {
      o.cold = static_cast<int>(ToInt(name, value, 0));
    } else if (name == "cold-base") {
      o.cold_base = static_cast<int>(ToInt(name, value, 1));
    } else if (name == "client-threads") {
      o.client_threads = static_cast<int>(ToInt(name, value, 1));
    } else if (name == "wait") {
      o.wait = ToDouble(name, value, 0);
    } else if (name == "cold-timeout") {
      o.cold_timeout = ToDouble(name, value, 1);
    } else if (name == "rpc") {
      if (value != "getkernel" && value != "stats") Usage("--rpc: getkernel or stats");
      o.rpc = value;
    } else if (name == "miss-fraction") {
      o.miss_fraction = ToDouble(name, value, 0);
      if (o.miss_fraction > 1) Usage("--miss-fraction: 0..1");
    } else if (name == "miss-deadlines") {
      o.miss_deadlines.clear();
      std::stringstream ss(value);
      for (std::string item; std::getline(ss, item, ',');) {
        o.miss_deadlines.push_back(ToDouble(name, item, 0.001));
      }
      if (o.miss_deadlines.empty()) Usage("--miss-deadlines: empty list");
    } else if (name == "miss-base") {
      o.miss_base = static_cast<int>(ToInt(name, value, 1));
    } else if (name == "drain-wait") {
      o.drain_wait = ToDouble(name, value, 0);
    } else if (name == "out") {
      o.out = value;
    } else {
      Usage("unknown flag --" + name);
    }
  }
  return o;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& server, int index) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // A distinct argument per client thread: each gets its own connection
  // rather than sharing one subchannel.
  args.SetInt("kforge.loadgen.channel", index);
  return grpc::CreateCustomChannel(server, grpc::InsecureChannelCredentials(), args);
}

std::string StatusText(const grpc::Status& s) {
  return std::to_string(static_cast<int>(s.error_code())) + " " + s.error_message();
}

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

// Percentile (nearest rank) of sorted values.
template <typename T>
T Percentile(const std::vector<T>& sorted, double p) {
  if (sorted.empty()) return T{};
  size_t rank = static_cast<size_t>(p * static_cast<double>(sorted.size()) + 0.999999);
  rank = std::clamp<size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

// Waits until the server answers a lookup-only GetKernel (any answer but
// UNAVAILABLE / DEADLINE_EXCEEDED means it is serving).
bool WaitForServer(v1::KernelService::Stub& stub, const v1::GetKernelRequest& warm, double wait_s) {
  const auto give_up = Clock::now() + std::chrono::duration<double>(wait_s);
  v1::GetKernelRequest probe = warm;
  probe.set_lookup_only(true);
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::GetKernelResponse resp;
    const grpc::Status s = stub.GetKernel(&ctx, probe, &resp);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
        s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return true;
    }
    if (Clock::now() >= give_up) {
      std::cerr << "kforge_loadgen: server not answering: " << StatusText(s) << "\n";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// ---- the hit load -------------------------------------------------------

struct Call {
  grpc::ClientContext ctx;
  v1::GetKernelRequest miss_request;  // a miss's own request
  int miss_deadline = -1;             // index into --miss-deadlines; -1: a hit
  v1::GetKernelResponse resp;
  v1::StatsResponse stats_resp;  // --rpc stats
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::GetKernelResponse>> rpc;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::StatsResponse>> stats_rpc;
  Clock::time_point start;
};

// One miss: which deadline it had, how it ended and when.
struct MissSample {
  int deadline = 0;  // index into --miss-deadlines
  grpc::StatusCode code = grpc::StatusCode::OK;
  double seconds = 0;
};

// What a client thread needs for its misses (shared by the threads).
struct MissLoad {
  double fraction = 0;
  const v1::GetKernelRequest* base = nullptr;  // spec + arch; topk replaced
  std::vector<double> deadlines;
  int base_topk = 0;
  std::atomic<int>* next = nullptr;  // misses started, over all threads
};

struct ThreadResult {
  std::vector<MissSample> misses;      // all of them, warm-up included
  std::vector<uint32_t> latency_ns;    // completions inside the measured window
  std::vector<double> server_seconds;  // sampled server-side time of hits
  uint64_t errors = 0;
  uint64_t not_memory = 0;  // OK answers that were not memory hits
  std::string first_error;
};

// Keeps `outstanding` calls in flight on its own completion queue from
// `measure_start - warmup` until `measure_end`, then drains.
void DriveLoad(v1::KernelService::Stub* stub, const v1::GetKernelRequest* request, bool stats_rpc,
               const MissLoad* miss, int outstanding, Clock::time_point measure_start,
               Clock::time_point measure_end, ThreadResult* result) {
  grpc::CompletionQueue cq;
  uint64_t calls = 0;
  auto start_call = [&] {
    auto* call = new Call;
    call->start = Clock::now();
    // Every 1/fraction-th call of this thread misses (evenly spread).
    const double f = miss->fraction;
    const bool is_miss = !stats_rpc && f > 0 &&
                         static_cast<uint64_t>(static_cast<double>(calls + 1) * f) >
                             static_cast<uint64_t>(static_cast<double>(calls) * f);
    ++calls;
    if (is_miss) {
      const int n = miss->next->fetch_add(1);
      call->miss_deadline = n % static_cast<int>(miss->deadlines.size());
      call->miss_request = *miss->base;
      // A new key per miss: topk --miss-base and a softmax scale 1e-6 (8
      // float ulps) apart per miss.
      v1::AttentionSpec* spec =
          call->miss_request.mutable_kernel()->mutable_spec()->mutable_sparse_mla_decode();
      spec->set_topk(static_cast<uint32_t>(miss->base_topk));
      spec->set_softmax_scale(spec->softmax_scale() * (1.0f + 1e-6f * static_cast<float>(n + 1)));
      call->ctx.set_deadline(
          std::chrono::system_clock::now() +
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::duration<double>(miss->deadlines[call->miss_deadline])));
      call->rpc = stub->PrepareAsyncGetKernel(&call->ctx, call->miss_request, &cq);
      call->rpc->StartCall();
      call->rpc->Finish(&call->resp, &call->status, call);
      return;
    }
    if (stats_rpc) {
      static const v1::StatsRequest kStats;
      call->stats_rpc = stub->PrepareAsyncStats(&call->ctx, kStats, &cq);
      call->stats_rpc->StartCall();
      call->stats_rpc->Finish(&call->stats_resp, &call->status, call);
      return;
    }
    call->rpc = stub->PrepareAsyncGetKernel(&call->ctx, *request, &cq);
    call->rpc->StartCall();
    call->rpc->Finish(&call->resp, &call->status, call);
  };
  for (int i = 0; i < outstanding; ++i) start_call();
  int in_flight = outstanding;
  uint64_t seen = 0;
  result->latency_ns.reserve(1 << 20);
  while (in_flight > 0) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
    std::unique_ptr<Call> call(static_cast<Call*>(tag));
    const Clock::time_point now = Clock::now();
    --in_flight;
    if (now < measure_end) {
      start_call();
      ++in_flight;
    }
    if (call->miss_deadline >= 0) {
      // Every miss, warm-up included: the first burst of them, before the
      // server has timed a compile, is part of the story.
      result->misses.push_back(
          MissSample{call->miss_deadline, call->status.error_code(),
                     std::chrono::duration<double>(now - call->start).count()});
      continue;
    }
    if (!ok || !call->status.ok()) {
      if (result->errors++ == 0) result->first_error = StatusText(call->status);
      continue;
    }
    if (!stats_rpc && call->resp.source() != v1::ARTIFACT_SOURCE_MEMORY) {
      ++result->not_memory;
    }
    if (call->start >= measure_start && now <= measure_end) {
      result->latency_ns.push_back(static_cast<uint32_t>(std::min<int64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - call->start).count(),
          UINT32_MAX)));
      if ((seen++ & 63) == 0) result->server_seconds.push_back(call->resp.seconds());
    }
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
}

struct LevelResult {
  int concurrency = 0;
  uint64_t calls = 0;
  double rps = 0;
  double p50_us = 0, p90_us = 0, p99_us = 0, max_us = 0;
  double server_p50_us = 0;
  double client_cpu = 0;  // client CPU seconds per wall second
  uint64_t errors = 0;
  uint64_t not_memory = 0;
  std::vector<MissSample> misses;
  // After every client call has ended (misses only): compiles the server
  // still had queued and running then, and how long until it was idle.
  uint64_t queued_after = 0, running_after = 0;
  uint64_t dropped_after = 0;  // of queued_after: never started (compiles_dropped)
  double busy_after_s = 0;
  bool drained = true;
};

LevelResult RunLevel(const Options& o, std::vector<std::unique_ptr<v1::KernelService::Stub>>& stubs,
                     const v1::GetKernelRequest& request, const MissLoad& miss, int concurrency) {
  const int threads = std::min<int>(o.client_threads, concurrency);
  const Clock::time_point measure_start =
      Clock::now() +
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.warmup));
  const Clock::time_point measure_end =
      measure_start +
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  std::vector<ThreadResult> results(threads);
  std::vector<std::thread> workers;
  double cpu0 = 0;
  bool cpu_started = false;
  for (int t = 0; t < threads; ++t) {
    const int share = concurrency / threads + (t < concurrency % threads ? 1 : 0);
    workers.emplace_back(DriveLoad, stubs[t].get(), &request, o.rpc == "stats", &miss, share,
                         measure_start, measure_end, &results[t]);
  }
  // Client CPU over the measured window only.
  std::this_thread::sleep_until(measure_start);
  cpu0 = CpuSeconds();
  cpu_started = true;
  std::this_thread::sleep_until(measure_end);
  const double cpu1 = CpuSeconds();
  for (std::thread& w : workers) w.join();

  LevelResult r;
  r.concurrency = concurrency;
  std::vector<uint32_t> all;
  std::vector<double> server;
  for (ThreadResult& tr : results) {
    all.insert(all.end(), tr.latency_ns.begin(), tr.latency_ns.end());
    server.insert(server.end(), tr.server_seconds.begin(), tr.server_seconds.end());
    r.errors += tr.errors;
    r.not_memory += tr.not_memory;
    r.misses.insert(r.misses.end(), tr.misses.begin(), tr.misses.end());
    if (tr.errors > 0) {
      std::cerr << "kforge_loadgen: " << tr.errors << " failed calls at concurrency " << concurrency
                << ", first: " << tr.first_error << "\n";
    }
  }
  std::sort(all.begin(), all.end());
  std::sort(server.begin(), server.end());
  r.calls = all.size();
  r.rps = static_cast<double>(all.size()) / o.seconds;
  r.p50_us = Percentile(all, 0.50) / 1e3;
  r.p90_us = Percentile(all, 0.90) / 1e3;
  r.p99_us = Percentile(all, 0.99) / 1e3;
  r.max_us = all.empty() ? 0 : all.back() / 1e3;
  r.server_p50_us = Percentile(server, 0.50) * 1e6;
  r.client_cpu = cpu_started ? (cpu1 - cpu0) / o.seconds : 0;
  if (miss.fraction > 0) {
    // Every call has ended, so no caller is left: whatever the server still
    // has queued or running is work for nobody.
    const Clock::time_point idle_from = Clock::now();
    const Clock::time_point give_up = idle_from + std::chrono::duration_cast<Clock::duration>(
                                                      std::chrono::duration<double>(o.drain_wait));
    r.drained = false;
    uint64_t dropped_before = 0;
    for (bool first = true;; first = false) {
      v1::StatsResponse stats;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      if (stubs[0]->Stats(&ctx, v1::StatsRequest(), &stats).ok()) {
        if (first) {
          r.queued_after = stats.queue_depth();
          r.running_after = stats.in_flight_compiles();
          dropped_before = stats.compiles_dropped();
        }
        r.dropped_after = stats.compiles_dropped() - dropped_before;
        if (stats.queue_depth() == 0 && stats.in_flight_compiles() == 0) {
          r.drained = true;
          break;
        }
      }
      if (Clock::now() >= give_up) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    r.busy_after_s = std::chrono::duration<double>(Clock::now() - idle_from).count();
  }
  return r;
}

// ---- cold compiles ------------------------------------------------------

struct ColdResult {
  int topk = 0;
  double wall_s = 0;
  double server_s = 0;
  double compile_s = 0;
  std::string source;
  std::string error;
};

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseArgs(argc, argv);

  absl::StatusOr<v1::AttentionSpec> base = kforge::SpecFromPreset(o.preset, o.tp);
  if (!base.ok()) {
    std::cerr << "kforge_loadgen: " << base.status().message() << "\n";
    return 2;
  }
  v1::GetKernelRequest request;
  request.set_arch(o.arch);
  v1::PresetRef* preset = request.mutable_kernel()->mutable_preset();
  preset->set_name(o.preset);
  preset->set_tensor_parallel(static_cast<uint32_t>(o.tp));

  const int max_threads = std::max(1, o.client_threads);
  std::vector<std::unique_ptr<v1::KernelService::Stub>> stubs;
  for (int t = 0; t < max_threads; ++t) {
    stubs.push_back(v1::KernelService::NewStub(MakeChannel(o.server, t)));
  }
  v1::KernelService::Stub& stub = *stubs[0];
  if (!WaitForServer(stub, request, o.wait)) return 1;

  // Warm: the first call may compile; every later one is a memory hit.
  size_t response_bytes = 0, cubin_bytes = 0;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::duration<double>(o.cold_timeout)));
    v1::GetKernelResponse resp;
    const auto t0 = Clock::now();
    const grpc::Status s = stub.GetKernel(&ctx, request, &resp);
    if (!s.ok()) {
      std::cerr << "kforge_loadgen: warm-up GetKernel failed: " << StatusText(s) << "\n";
      return 1;
    }
    response_bytes = resp.ByteSizeLong();
    cubin_bytes = resp.artifact().cubin().size();
    std::cerr << "warm-up: " << resp.artifact().module_name() << " ("
              << kforge::ArtifactSourceName(resp.source()) << ", "
              << Fixed(std::chrono::duration<double>(Clock::now() - t0).count(), 3)
              << " s), response " << response_bytes << " bytes, cubin " << cubin_bytes
              << " bytes\n";
  }
  // Connect every client thread's channel before measuring.
  for (auto& s : stubs) {
    grpc::ClientContext ctx;
    v1::GetKernelResponse resp;
    (void)s->GetKernel(&ctx, request, &resp);
  }

  v1::GetKernelRequest miss_base;
  miss_base.set_arch(o.arch);
  *miss_base.mutable_kernel()->mutable_spec() = kforge::KernelSpecOf(*base);
  std::atomic<int> misses_started{0};
  MissLoad miss{o.miss_fraction, &miss_base, o.miss_deadlines, o.miss_base, &misses_started};

  std::vector<LevelResult> levels;
  for (int c : o.concurrency) {
    LevelResult r = RunLevel(o, stubs, request, miss, c);
    std::cerr << "concurrency " << c << ": " << r.calls << " calls, " << Fixed(r.rps, 0)
              << " req/s, p50 " << Fixed(r.p50_us, 0) << " us, p99 " << Fixed(r.p99_us, 0)
              << " us, server p50 " << Fixed(r.server_p50_us, 0) << " us, client CPU "
              << Fixed(r.client_cpu, 2) << " cores"
              << (r.errors ? ", errors " + std::to_string(r.errors) : "")
              << (r.not_memory ? ", non-memory " + std::to_string(r.not_memory) : "") << "\n";
    if (o.miss_fraction > 0) {
      std::cerr << "  misses: " << r.misses.size()
                << "; after the last call ended: " << r.queued_after << " queued, "
                << r.running_after << " running, busy " << Fixed(r.busy_after_s, 1) << " s"
                << (r.drained ? "" : " (not drained)") << "\n";
    }
    levels.push_back(r);
  }

  std::vector<ColdResult> colds;
  for (int k = 0; k < o.cold; ++k) {
    ColdResult c;
    c.topk = o.cold_base + k;
    v1::GetKernelRequest cold;
    cold.set_arch(o.arch);
    v1::AttentionSpec spec = *base;
    spec.set_topk(static_cast<uint32_t>(c.topk));
    *cold.mutable_kernel()->mutable_spec() = kforge::KernelSpecOf(spec);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::duration<double>(o.cold_timeout)));
    v1::GetKernelResponse resp;
    const auto t0 = Clock::now();
    const grpc::Status s = stub.GetKernel(&ctx, cold, &resp);
    c.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s.ok()) {
      c.server_s = resp.seconds();
      c.compile_s = resp.artifact().compile_seconds();
      c.source = kforge::ArtifactSourceName(resp.source());
    } else {
      c.error = StatusText(s);
    }
    std::cerr << "cold topk=" << c.topk << ": " << Fixed(c.wall_s, 3) << " s"
              << (s.ok() ? " (" + c.source + ", compile " + Fixed(c.compile_s, 3) + " s)"
                         : " FAILED: " + c.error)
              << "\n";
    colds.push_back(c);
  }

  v1::StatsResponse stats;
  {
    grpc::ClientContext ctx;
    (void)stub.Stats(&ctx, v1::StatsRequest(), &stats);
  }

  // ---- report ----
  std::ostringstream md;
  md << (o.rpc == "stats" ? "### Stats calls (gRPC floor, no kernel)\n\n"
                          : "### GetKernel cache hits\n\n")
     << "Preset " << o.preset << " tp " << o.tp << ", " << o.arch << "; response " << response_bytes
     << " bytes (cubin " << cubin_bytes << "); " << o.seconds << " s per level after " << o.warmup
     << " s warm-up; " << max_threads << " client thread(s); "
     << std::thread::hardware_concurrency()
     << " cores, client and server on one machine, loopback.\n\n"
     << "| Concurrency | Calls | Hits/s | p50 (us) | p90 (us) | p99 (us) | max (us) "
        "| server p50 (us) | client CPU (cores) | errors |\n"
     << "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const LevelResult& r : levels) {
    md << "| " << r.concurrency << " | " << r.calls << " | " << Fixed(r.rps, 0) << " | "
       << Fixed(r.p50_us, 0) << " | " << Fixed(r.p90_us, 0) << " | " << Fixed(r.p99_us, 0) << " | "
       << Fixed(r.max_us, 0) << " | " << (o.rpc == "stats" ? "-" : Fixed(r.server_p50_us, 0))
       << " | " << Fixed(r.client_cpu, 2) << " | " << r.errors + r.not_memory << " |\n";
  }
  if (o.miss_fraction > 0) {
    md << "\n### Misses under the hit load\n\n"
       << "Every " << Fixed(1 / o.miss_fraction, 1)
       << "th call of each client asks for a new kernel (" << o.preset << " tp " << o.tp
       << " with topk " << o.miss_base
       << " and a softmax scale of its own, so each miss is a compile), with the deadline of its "
          "row (all misses, warm-up included); latency is from sending to the answer "
          "(RESOURCE_EXHAUSTED: refused; DEADLINE_EXCEEDED: waited out "
          "its deadline).\n\n"
       << "| Concurrency | deadline (s) | misses | OK | RESOURCE_EXHAUSTED | DEADLINE_EXCEEDED "
          "| other | p50 (s) | p99 (s) | max (s) | OK p50 (s) | refused p50 (s) |\n"
       << "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const LevelResult& r : levels) {
      for (size_t d = 0; d < o.miss_deadlines.size(); ++d) {
        std::vector<double> all, ok, refused;
        uint64_t n_ok = 0, n_re = 0, n_de = 0, n_other = 0;
        for (const MissSample& m : r.misses) {
          if (m.deadline != static_cast<int>(d)) continue;
          all.push_back(m.seconds);
          if (m.code == grpc::StatusCode::OK) {
            ++n_ok;
            ok.push_back(m.seconds);
          } else if (m.code == grpc::StatusCode::RESOURCE_EXHAUSTED) {
            ++n_re;
            refused.push_back(m.seconds);
          } else if (m.code == grpc::StatusCode::DEADLINE_EXCEEDED) {
            ++n_de;
          } else {
            ++n_other;
          }
        }
        for (auto* v : {&all, &ok, &refused}) std::sort(v->begin(), v->end());
        md << "| " << r.concurrency << " | " << Fixed(o.miss_deadlines[d], 1) << " | " << all.size()
           << " | " << n_ok << " | " << n_re << " | " << n_de << " | " << n_other << " | "
           << Fixed(Percentile(all, 0.5), 3) << " | " << Fixed(Percentile(all, 0.99), 3) << " | "
           << Fixed(all.empty() ? 0 : all.back(), 3) << " | "
           << (ok.empty() ? "-" : Fixed(Percentile(ok, 0.5), 3)) << " | "
           << (refused.empty() ? "-" : Fixed(Percentile(refused, 0.5), 3)) << " |\n";
      }
    }
    md << "\nAfter every client call had ended (no caller left):\n\n"
       << "| Concurrency | compiles still queued | of those, never started | still running "
          "| workers busy for (s) |\n"
       << "|---:|---:|---:|---:|---:|\n";
    for (const LevelResult& r : levels) {
      md << "| " << r.concurrency << " | " << r.queued_after << " | " << r.dropped_after << " | "
         << r.running_after << " | " << Fixed(r.busy_after_s, 1)
         << (r.drained ? "" : " (not drained)") << " |\n";
    }
  }
  if (!colds.empty()) {
    std::vector<double> wall;
    for (const ColdResult& c : colds) {
      if (c.error.empty()) wall.push_back(c.wall_s);
    }
    std::sort(wall.begin(), wall.end());
    double median = 0;
    if (!wall.empty()) {
      median = wall.size() % 2 ? wall[wall.size() / 2]
                               : (wall[wall.size() / 2 - 1] + wall[wall.size() / 2]) / 2;
    }
    md << "\n### Cold compiles\n\n"
       << o.cold << " distinct specs (" << o.preset << " tp " << o.tp << ", topk " << o.cold_base
       << ".." << o.cold_base + o.cold - 1 << "), one at a time, end-to-end GetKernel latency.\n\n"
       << "| Kernels | OK | median (s) | max (s) |\n|---:|---:|---:|---:|\n"
       << "| " << colds.size() << " | " << wall.size() << " | " << Fixed(median, 3) << " | "
       << Fixed(wall.empty() ? 0 : wall.back(), 3) << " |\n\n"
       << "| topk | source | GetKernel (s) | server (s) | NVRTC compile (s) |\n"
       << "|---:|---|---:|---:|---:|\n";
    for (const ColdResult& c : colds) {
      md << "| " << c.topk << " | " << (c.error.empty() ? c.source : "FAILED: " + c.error) << " | "
         << Fixed(c.wall_s, 3) << " | " << Fixed(c.server_s, 3) << " | " << Fixed(c.compile_s, 3)
         << " |\n";
    }
  }
  md << "\nServer stats: memory_hits " << stats.memory_hits() << ", disk_hits " << stats.disk_hits()
     << ", misses " << stats.misses() << ", compiles " << stats.compiles() << ", compile_failures "
     << stats.compile_failures() << ", rejected_queue_full " << stats.rejected_queue_full()
     << ", rejected_deadline " << stats.rejected_deadline() << ", compiles_dropped "
     << stats.compiles_dropped() << "\n";

  std::cout << md.str();
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    f << md.str();
    if (!f) {
      std::cerr << "kforge_loadgen: cannot write " << o.out << "\n";
      return 1;
    }
  }
  bool failed = false;
  // Misses may fail by design (refused, deadline); only hits count.
  for (const LevelResult& r : levels) failed |= r.errors > 0;
  for (const ColdResult& c : colds) failed |= !c.error.empty();
  return failed ? 1 : 0;
}
