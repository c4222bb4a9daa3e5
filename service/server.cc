#include "service/server.h"

#include <signal.h>

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
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/reload_signal.h"
#include "base/shutdown_signals.h"
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
  std::cerr << "kforge: gRPC " << gpr_log_severity_string(args->severity) << ": " << args->message
            << std::endl;
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

// "host:0" names the port the kernel picked; print the real one.
std::string BoundAddress(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return listen;
  return absl::StrCat(listen.substr(0, colon), ":", port);
}

// Loads the bundle, reports what it did, then turns health to SERVING.
void WarmUp(KernelStore& store, BundleSource& bundle, const std::string& dir,
            const std::atomic<bool>& stop, grpc::HealthCheckServiceInterface* health) {
  std::cout << "kforge: warming the cache from " << dir << " (" << bundle.manifests().size()
            << " manifests)" << std::endl;
  const WarmReport report = WarmFromBundle(store, bundle, stop);
  for (const std::string& skipped : report.skipped) {
    std::cerr << "kforge: warm-up skipped " << skipped << "\n";
  }
  if (stop) return;
  std::cout << absl::StrFormat(
                   "kforge: warm-up done in %.2f s: %d kernels, %d loaded, %d "
                   "already cached, %d skipped; SERVING",
                   report.seconds, report.kernels, report.loaded, report.already_cached,
                   report.skipped.size())
            << std::endl;
  if (health != nullptr) health->SetServingStatus(true);
}

}  // namespace

int RunServer(const ServerOptions& options) {
  // A second signal means "now": skip the grace period (exit 1).
  absl::StatusOr<std::unique_ptr<ShutdownSignals>> signals = ShutdownSignals::Install();
  if (!signals.ok()) {
    std::cerr << "kforge: cannot install signal handlers: " << signals.status().message() << "\n";
    return 1;
  }
  if (absl::Status s = CheckListenAddress(options.listen); !s.ok()) {
    std::cerr << "kforge: cannot listen on " << options.listen << ": " << s.message() << "\n";
    return 1;
  }
  gpr_set_log_function(LogGrpc);
  absl::StatusOr<ServerSecurity> security = MakeServerSecurity(options.security);
  if (!security.ok()) {
    std::cerr << "kforge: " << security.status().message() << "\n";
    return 1;
  }
  if (!options.security.tls() && !IsLoopbackAddress(options.listen)) {
    std::cerr << "kforge: warning: serving on " << options.listen
              << " without TLS: any host that can reach it may ask for kernels, and what it "
                 "sends can be read and changed on the way; use --tls-cert/--tls-key (and "
                 "--auth-token-file), or listen on 127.0.0.1"
              << std::endl;
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
          std::cerr << "kforge: SIGHUP: TLS files not reloaded, the old ones stay: " << s.message()
                    << std::endl;
        } else {
          std::cerr << "kforge: SIGHUP: TLS files reloaded (new connections use them)" << std::endl;
        }
      }
      if (auth == nullptr) return;
      if (absl::Status s = auth->Reload(); !s.ok()) {
        std::cerr << "kforge: SIGHUP: tokens not reloaded, the old ones stay: " << s.message()
                  << std::endl;
        return;
      }
      const auto [user, admin] = auth->counts();
      std::cerr << "kforge: SIGHUP: tokens reloaded (" << user << " user, " << admin << " admin)"
                << std::endl;
    });
    if (!installed.ok()) {
      std::cerr << "kforge: cannot install the SIGHUP handler: " << installed.status().message()
                << "\n";
      return 1;
    }
    reload = *std::move(installed);
  }
  // A bundle that cannot be opened is a deployment mistake: refuse to start
  // rather than serve cold without saying so.
  std::unique_ptr<BundleSource> bundle;
  if (!options.warm_from.empty()) {
    absl::StatusOr<std::unique_ptr<BundleSource>> opened =
        BundleSource::Open(options.warm_from, options.trust_key_file);
    if (!opened.ok()) {
      std::cerr << "kforge: --warm-from " << options.warm_from << ": " << opened.status().message()
                << "\n";
      return 1;
    }
    bundle = *std::move(opened);
  }
  KernelStoreOptions store_options = options.store;
  store_options.redis.log = [](std::string_view line) {
    std::cerr << "kforge: " << line << std::endl;
  };
  absl::StatusOr<std::unique_ptr<KernelStore>> store = KernelStore::Create(store_options);
  if (!store.ok()) {
    std::cerr << "kforge: cannot open the kernel store: " << store.status().message() << "\n";
    return 1;
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
    std::cerr << "kforge: cannot listen on " << options.listen << ": " << ListenFailureReason()
              << "\n";
    (*store)->Shutdown();
    return 1;
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(bundle == nullptr);
  std::cout << "kforge: serving on " << BoundAddress(options.listen, port)
            << (options.security.tls_client_ca_file.empty()
                    ? options.security.tls() ? " (TLS" : " (plain text"
                    : " (mTLS")
            << (security->authenticator != nullptr ? ", bearer tokens" : "") << "; cache "
            << options.store.cache_dir << ")" << std::endl;
  std::unique_ptr<MetricsHttpServer> metrics;
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> started =
        MetricsHttpServer::Start(options.metrics_listen, [&request_metrics, &store] {
          return RenderMetrics(request_metrics, (*store)->Stats(), (*store)->ReadTimings());
        });
    if (!started.ok()) {
      std::cerr << "kforge: " << started.status().message() << "\n";
      server->Shutdown();
      (*store)->Shutdown();
      return 1;
    }
    metrics = *std::move(started);
    std::cout << "kforge: metrics on http://"
              << BoundAddress(options.metrics_listen, metrics->port()) << "/metrics" << std::endl;
  }
  std::atomic<bool> stop_warm{false};
  std::thread warm;
  if (bundle != nullptr) {
    warm = std::thread([&] { WarmUp(**store, *bundle, options.warm_from, stop_warm, health); });
  }

  const int signo = (*signals)->Wait();
  std::cerr << "kforge: " << (signo == SIGINT ? "SIGINT" : "SIGTERM")
            << ": shutting down (in-flight calls get "
            << absl::FormatDuration(options.shutdown_grace) << ")" << std::endl;

  stop_warm = true;
  if (warm.joinable()) warm.join();
  if (health != nullptr) health->SetServingStatus(false);
  // A call waiting on a hung compile would hold Shutdown until the compile
  // timeout: once the grace period is over, running compiles are killed and
  // their callers answered UNAVAILABLE.
  absl::Notification drained;
  std::thread watchdog([&] {
    if (drained.WaitForNotificationWithTimeout(options.shutdown_grace)) return;
    std::cerr << "kforge: grace period over: abandoning running compiles" << std::endl;
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
  std::cerr << "kforge: stopped" << std::endl;
  return 0;
}

}  // namespace kforge
