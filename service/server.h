#ifndef KFORGE_SERVICE_SERVER_H_
#define KFORGE_SERVICE_SERVER_H_

#include <string>

#include "absl/time/time.h"
#include "base/log.h"
#include "service/auth.h"
#include "service/kernel_service.h"
#include "service/kernel_store.h"

namespace kforge {

struct ServerOptions {
  // host:port; port 0 picks a free one (the chosen address is printed).
  std::string listen = "127.0.0.1:50051";
  KernelStoreOptions store;
  KernelServiceOptions service;
  // After SIGTERM/SIGINT, how long in-flight calls may take to finish
  // before they are cancelled.
  absl::Duration shutdown_grace = absl::Seconds(30);
  // A bundle directory (`kforge prebuild --out`) loaded into the cache at
  // start; health answers NOT_SERVING until it is done. "" = none.
  std::string warm_from;
  // With warm_from: an Ed25519 public key (PEM file); the bundle must be
  // signed by it (CheckBundleSignature) or the server does not start.
  std::string trust_key_file;
  // With trust_key_file: the bundle's signed sequence (release.json) must
  // be at least this, so an older bundle signed by the same key is refused
  // (CheckBundleSequence). 0 = any, a bundle without a sequence too.
  uint64_t trust_min_sequence = 0;
  // TLS, mTLS and bearer tokens (service/auth.h). Without TLS on an address
  // other hosts can reach, a warning is printed.
  ServerSecurityOptions security;
  // HOST:PORT for Prometheus metrics on GET /metrics (port 0: any free one,
  // printed); "" = none.
  std::string metrics_listen;
  // The log's format (base/log.h); text keeps kforge's "kforge: ..." lines.
  LogFormat log_format = LogFormat::kText;
};

// Runs `kforge serve`: opens the store, serves KernelService with gRPC
// health checking and server reflection, prints
//   kforge: serving on ADDR (cache DIR)
// once listening (with warm_from: health NOT_SERVING until the bundle is
// loaded, then a "kforge: warm-up done" line and SERVING), and on SIGTERM/SIGINT shuts down
// gracefully (health NOT_SERVING, no new calls, in-flight calls finish, then the store). Returns
// the process exit code: 0 after a graceful shutdown, 1 when the server cannot start (the reason is
// printed).
int RunServer(const ServerOptions& options);

}  // namespace kforge

#endif  // KFORGE_SERVICE_SERVER_H_
