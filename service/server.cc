#include "service/server.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "base/reload_signal.h"
#include "base/shutdown_signals.h"
#include "compiler/compiler.h"
#include "grpc/support/log.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "service/metrics.h"
#include "service/warm.h"

namespace kforge {
namespace {

// Answers: cubins of big tilings reach several MB; 256 MB leaves room for
// manifests and future multi-arch bundles. Requests are small and capped
// per method (kMaxRequestBytes and the handlers' checks), so that clients
// cannot make the server hold their big messages.
constexpr int kMaxResponseBytes = 256 << 20;

// What gRPC's transport may hold for all connections together (receive
// buffers, call arenas). gRPC 1.51 receives a whole message before any
// size check: it opens the stream's flow-control window to the length the
// message announces, so four parallel 100 MB requests raised RSS by
// ~280 MB although each was refused at 1 MB. Past this quota gRPC cancels
// streams (RESOURCE_EXHAUSTED, "Buffers full") until it is back under it.
// 64 MB is 64 of the largest legitimate requests (a 1 MB Warm) at once;
// a call's arena, also charged to it, is a few KB.
constexpr size_t kTransportMemoryBytes = 64 << 20;

// gRPC's own log lines, which it writes to stderr as raw dumps (a port in
// use printed a JSON error tree before kforge's message). While the server
// starts they are kept, and RunServer reports the failure in one line;
// afterwards they are printed as "kforge: gRPC <severity>: <message>".
struct GrpcLog {
  absl::Mutex mu;
  bool capturing ABSL_GUARDED_BY(mu) = false;
  std::vector<std::string> captured ABSL_GUARDED_BY(mu);
};

GrpcLog& TheGrpcLog() {
  static GrpcLog* log = new GrpcLog;
  return *log;
}

void LogGrpc(gpr_log_func_args* args) {
  GrpcLog& log = TheGrpcLog();
  {
    absl::MutexLock lock(&log.mu);
    if (log.capturing) {
      log.captured.emplace_back(args->message);
      return;
    }
  }
  // gRPC's own messages go through kforge's log (one line, escaped in JSON).
  const LogLevel level = args->severity == GPR_LOG_SEVERITY_ERROR  ? LogLevel::kError
                         : args->severity == GPR_LOG_SEVERITY_INFO ? LogLevel::kInfo
                                                                   : LogLevel::kWarning;
  LogEvent(level, "grpc",
           absl::StrCat("gRPC ", gpr_log_severity_string(args->severity), ": ", args->message),
           {{"file", args->file == nullptr ? "" : args->file}, {"line", args->line}});
}

void CaptureGrpcLog(bool on) {
  GrpcLog& log = TheGrpcLog();
  absl::MutexLock lock(&log.mu);
  log.capturing = on;
  if (on) log.captured.clear();
}

// Why gRPC could not listen, from what it logged: the errno text it names.
std::string ListenFailureReason() {
  GrpcLog& log = TheGrpcLog();
  absl::MutexLock lock(&log.mu);
  for (const std::string& line : log.captured) {
    for (const char* reason : {"Address already in use", "Cannot assign requested address",
                               "Permission denied", "Name or service not known"}) {
      if (absl::StrContains(line, reason)) return reason;
    }
  }
  return "the address is in use or is not a valid host:port";
}

// gRPC reads the port modulo 2^16 ("127.0.0.1:99999" served on 34463):
// a port outside 0..65535 is refused here. Unix sockets have no port.
absl::Status CheckListenAddress(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:")) {
    return absl::OkStatus();
  }
  const size_t colon = listen.rfind(':');
  const std::string port = colon == std::string::npos ? "" : listen.substr(colon + 1);
  int value = 0;
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(port, &value) || value > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port: got \"", port, "\", expected HOST:PORT with a port 0..65535"));
  }
  return absl::OkStatus();
}

// "host:0" names the port the kernel picked; print the real one. A unix
// socket has no port (gRPC reports 1 for it).
std::string BoundAddress(const std::string& listen, int port) {
  if (absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:")) {
    return listen;
  }
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return listen;
  return absl::StrCat(listen.substr(0, colon), ":", port);
}

// Loads the bundle, reports what it did, then turns health to SERVING.
void WarmUp(KernelStore& store, BundleSource& bundle, const std::string& dir, EntryOrigin origin,
            const std::atomic<bool>& stop, grpc::HealthCheckServiceInterface* health) {
  LogEvent(
      LogLevel::kInfo, "warm_start",
      absl::StrCat("warming the cache from ", dir, " (", bundle.manifests().size(), " manifests)"),
      {{"bundle", dir}, {"manifests", static_cast<long long>(bundle.manifests().size())}});
  const WarmReport report = WarmFromBundle(store, bundle, origin, stop);
  for (const std::string& skipped : report.skipped) {
    LogEvent(LogLevel::kWarning, "warm_skip", absl::StrCat("warm-up skipped ", skipped));
  }
  if (stop) return;
  LogEvent(LogLevel::kInfo, "warm_done",
           absl::StrFormat("warm-up done in %.2f s: %d kernels, %d loaded, %d "
                           "already cached, %d skipped; SERVING",
                           report.seconds, report.kernels, report.loaded, report.already_cached,
                           report.skipped.size()),
           {{"duration_s", report.seconds},
            {"kernels", report.kernels},
            {"loaded", report.loaded},
            {"skipped", static_cast<long long>(report.skipped.size())}});
  if (health != nullptr) health->SetServingStatus(true);
}

// A start-up failure: one error line, exit code 1.
int StartFailure(std::string_view message) {
  LogEvent(LogLevel::kError, "start_failure", message);
  return 1;
}

}  // namespace

int RunServer(const ServerOptions& options) {
  SetLogFormat(options.log_format);
  // A second signal means "now": skip the grace period (exit 1).
  absl::StatusOr<std::unique_ptr<ShutdownSignals>> signals = ShutdownSignals::Install();
  if (!signals.ok()) {
    return StartFailure(
        absl::StrCat("cannot install signal handlers: ", signals.status().message()));
  }
  if (absl::Status s = CheckListenAddress(options.listen); !s.ok()) {
    return StartFailure(absl::StrCat("cannot listen on ", options.listen, ": ", s.message()));
  }
  gpr_set_log_function(LogGrpc);
  absl::StatusOr<ServerSecurity> security = MakeServerSecurity(options.security);
  if (!security.ok()) return StartFailure(std::string(security.status().message()));
  if (!options.security.tls() && !IsLoopbackAddress(options.listen)) {
    LogEvent(LogLevel::kWarning, "no_tls",
             absl::StrCat("warning: serving on ", options.listen,
                          " without TLS: any host that can reach it may ask for kernels, and "
                          "what it sends can be read and changed on the way; use "
                          "--tls-cert/--tls-key (and --auth-token-file), or listen on 127.0.0.1"),
             {{"address", options.listen}});
  }
  // Redis refuses to start without the key (RedisCache::Create); the disk
  // tier works without it, but then nothing tells a kernel this fleet wrote
  // from one planted with a recomputed digest. Said loudly where the server
  // is set up to be trusted (--trust) or reachable by others; a loopback
  // server on a private cache (a workstation) starts quietly.
  if (options.store.trust.fleet_key.empty() &&
      (!options.trust_key_file.empty() || !IsLoopbackAddress(options.listen))) {
    LogEvent(LogLevel::kWarning, "no_fleet_key",
             absl::StrCat("warning: no --fleet-key: entries in ", options.store.cache_dir,
                          " are checked for damage only, so whoever can write that directory "
                          "can plant a kernel",
                          options.trust_key_file.empty()
                              ? ""
                              : " (--trust drops unsigned bundles' entries, but cannot tell a "
                                "planted entry from one this server wrote)",
                          "; give every server of the fleet the same key file"),
             {{"cache_dir", options.store.cache_dir}});
  }
  // SIGHUP rereads the token files and the TLS files; a bad file keeps
  // what is in use.
  std::unique_ptr<ReloadSignal> reload;
  if (security->authenticator != nullptr || security->tls != nullptr) {
    std::shared_ptr<TokenAuthenticator> auth = security->authenticator;
    std::shared_ptr<ServerTlsFiles> tls = security->tls;
    absl::StatusOr<std::unique_ptr<ReloadSignal>> installed = ReloadSignal::Install([auth, tls] {
      if (tls != nullptr) {
        if (absl::Status s = tls->Reload(); !s.ok()) {
          LogEvent(LogLevel::kWarning, "reload_failure",
                   absl::StrCat("SIGHUP: TLS files not reloaded, the old ones stay: ", s.message()),
                   {{"what", "tls"}});
        } else {
          LogEvent(LogLevel::kInfo, "reload",
                   "SIGHUP: TLS files reloaded (new connections use them)", {{"what", "tls"}});
        }
      }
      if (auth == nullptr) return;
      if (absl::Status s = auth->Reload(); !s.ok()) {
        LogEvent(LogLevel::kWarning, "reload_failure",
                 absl::StrCat("SIGHUP: tokens not reloaded, the old ones stay: ", s.message()),
                 {{"what", "tokens"}});
        return;
      }
      const auto [user, admin] = auth->counts();
      LogEvent(LogLevel::kInfo, "reload",
               absl::StrCat("SIGHUP: tokens reloaded (", user, " user, ", admin, " admin)"),
               {{"what", "tokens"}});
    });
    if (!installed.ok()) {
      return StartFailure(
          absl::StrCat("cannot install the SIGHUP handler: ", installed.status().message()));
    }
    reload = *std::move(installed);
  }
  // A bundle that cannot be opened is a deployment mistake: refuse to start
  // rather than serve cold without saying so.
  std::unique_ptr<BundleSource> bundle;
  if (!options.warm_from.empty()) {
    absl::StatusOr<std::unique_ptr<BundleSource>> opened =
        BundleSource::Open(options.warm_from, options.trust_key_file, options.trust_min_sequence);
    if (!opened.ok()) {
      return StartFailure(
          absl::StrCat("--warm-from ", options.warm_from, ": ", opened.status().message()));
    }
    bundle = *std::move(opened);
    // What `kforge verify` refuses is refused here too, rather than
    // ignored: a stray file or link in a bundle is a packaging mistake or
    // tampering, and the bundle is what its signed list names.
    if (const std::vector<std::string> unlisted = bundle->UnlistedFiles(); !unlisted.empty()) {
      std::vector<std::string> named(unlisted.begin(),
                                     unlisted.begin() + std::min<size_t>(unlisted.size(), 5));
      return StartFailure(absl::StrCat(
          "--warm-from ", options.warm_from, ": ", unlisted.size(), " file",
          unlisted.size() == 1 ? " is" : "s are", " not listed in ", kBundleChecksumsFile, " (",
          absl::StrJoin(named, ", "), unlisted.size() > named.size() ? ", ..." : "",
          "): a bundle holds only what its list names; remove ",
          unlisted.size() == 1 ? "it" : "them", " or rebuild the bundle (`kforge verify ",
          options.warm_from, "` reports the same)"));
    }
  }
  KernelStoreOptions store_options = options.store;
  // --trust: no entry from an unsigned bundle is served, whenever it was
  // put in the cache.
  store_options.trust.signed_bundles_only = !options.trust_key_file.empty();
  store_options.redis.log = [](std::string_view line) {
    LogEvent(LogLevel::kWarning, "redis", line);
  };
  absl::StatusOr<std::unique_ptr<KernelStore>> store = KernelStore::Create(store_options);
  if (!store.ok()) {
    return StartFailure(absl::StrCat("cannot open the kernel store: ", store.status().message()));
  }
  auto service = std::make_unique<KernelServiceImpl>(store->get(), options.service);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, security->credentials, &port);
  // gRPC sets SO_REUSEPORT by default, which would let a second server
  // share a port that is in use instead of failing.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(kMaxRequestBytes));
  grpc::ResourceQuota quota("kforge-transport");
  quota.Resize(kTransportMemoryBytes);
  builder.SetResourceQuota(quota);
  builder.SetMaxSendMessageSize(kMaxResponseBytes);
  builder.RegisterService(service.get());
  // Every call counted and timed by an interceptor, with or without
  // --metrics-listen (Stats-only deployments pay a map update per call).
  RequestMetrics request_metrics;
  {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(MetricsInterceptorFactory(&request_metrics));
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  CaptureGrpcLog(true);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  CaptureGrpcLog(false);
  if (server == nullptr || port == 0) {
    (*store)->Shutdown();
    return StartFailure(
        absl::StrCat("cannot listen on ", options.listen, ": ", ListenFailureReason()));
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(bundle == nullptr);
  const std::string address = BoundAddress(options.listen, port);
  const char* transport = options.security.tls_client_ca_file.empty()
                              ? options.security.tls() ? "TLS" : "plain text"
                              : "mTLS";
  // Who may call what, one line per group of methods, so that an open
  // method is never a surprise (before the start line, which tells
  // scripts and tests that the server is up).
  for (const std::string& line : AccessLines(options.security)) {
    LogEvent(LogLevel::kInfo, "access", absl::StrCat("access: ", line));
  }
  LogEvent(LogLevel::kInfo, "start",
           absl::StrCat("serving on ", address, " (", transport,
                        security->authenticator != nullptr ? ", bearer tokens" : "", "; cache ",
                        options.store.cache_dir, ")"),
           {{"address", address},
            {"transport", transport},
            {"cache_dir", options.store.cache_dir},
            {"version", KforgeVersion()}});
  std::unique_ptr<MetricsHttpServer> metrics;
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> started =
        MetricsHttpServer::Start(options.metrics_listen, [&request_metrics, &store, &security] {
          const AuthFailureCounts auth_failures = security->authenticator == nullptr
                                                      ? AuthFailureCounts{}
                                                      : security->authenticator->failures();
          return RenderMetrics(request_metrics, auth_failures, (*store)->Stats(),
                               (*store)->ReadTimings());
        });
    if (!started.ok()) {
      server->Shutdown();
      (*store)->Shutdown();
      return StartFailure(std::string(started.status().message()));
    }
    metrics = *std::move(started);
    const std::string metrics_address = BoundAddress(options.metrics_listen, metrics->port());
    LogEvent(LogLevel::kInfo, "metrics_start",
             absl::StrCat("metrics on http://", metrics_address, "/metrics"),
             {{"address", metrics_address}});
  }
  std::atomic<bool> stop_warm{false};
  std::thread warm;
  if (bundle != nullptr) {
    warm = std::thread([&] {
      WarmUp(**store, *bundle, options.warm_from,
             options.trust_key_file.empty() ? EntryOrigin::kUnsignedBundle
                                            : EntryOrigin::kSignedBundle,
             stop_warm, health);
    });
  }

  const int signo = (*signals)->Wait();
  LogEvent(
      LogLevel::kInfo, "shutdown",
      absl::StrCat(signo == SIGINT ? "SIGINT" : "SIGTERM", ": shutting down (in-flight calls get ",
                   absl::FormatDuration(options.shutdown_grace), ")"),
      {{"signal", signo == SIGINT ? "SIGINT" : "SIGTERM"}, {"grace", options.shutdown_grace}});

  stop_warm = true;
  if (warm.joinable()) warm.join();
  if (health != nullptr) health->SetServingStatus(false);
  // A call waiting on a hung compile would hold Shutdown until the compile
  // timeout: once the grace period is over, running compiles are killed and
  // their callers answered UNAVAILABLE.
  absl::Notification drained;
  std::thread watchdog([&] {
    if (drained.WaitForNotificationWithTimeout(options.shutdown_grace)) return;
    LogEvent(LogLevel::kWarning, "grace_over", "grace period over: abandoning running compiles");
    (*store)->AbandonCompiles();
  });
  // Stops accepting calls, waits for in-flight ones until the deadline,
  // then cancels the rest; returns when every call is done.
  server->Shutdown(absl::ToChronoTime(absl::Now() + options.shutdown_grace));
  drained.Notify();
  watchdog.join();
  (*store)->Shutdown();
  server->Wait();
  metrics.reset();  // renders from the store: gone before it is
  server.reset();
  service.reset();  // joins its threads: no store call is left after this
  store->reset();
  LogEvent(LogLevel::kInfo, "stop", "stopped");
  return 0;
}

}  // namespace kforge
