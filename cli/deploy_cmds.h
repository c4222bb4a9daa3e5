#ifndef KFORGE_CLI_DEPLOY_CMDS_H_
#define KFORGE_CLI_DEPLOY_CMDS_H_

#include <string>
#include <vector>

namespace kforge::cli {

// `kforge warm --server ADDR [MATRIX]`: asks a running server to compile
// every kernel of a deployment matrix (the built-in default without MATRIX)
// through the Prebuild RPC, with a progress display. Exit 0 when every
// kernel is in the server's cache, 1 when some failed (each listed with its
// error), 2 for a usage error, a bad matrix or a server that cannot be
// reached.
int Warm(const std::vector<std::string>& argv);

// `kforge prebuild [MATRIX] --out DIR [-j N]`: compiles every kernel of a
// deployment matrix (the default without MATRIX) into a bundle directory
// (service/prebuild.h), with a progress display. Exit 0 when the bundle is
// complete, 1 when some kernels failed (each listed with its error; the
// rest of the bundle is written and verifies), 2 for a usage error, a bad
// matrix or a directory that cannot be a bundle, 128 + signal number when
// stopped by SIGINT or SIGTERM (the bundle is left without checksums; the
// same command completes it).
int Prebuild(const std::vector<std::string>& argv);

// `kforge verify DIR`: checks a bundle (VerifyBundle) and prints each
// problem as "path: message", then a count. Exit 0 clean, 1 on any
// problem, 2 for a usage error or a DIR that is not a bundle at all.
int Verify(const std::vector<std::string>& argv);
// `kforge keygen`: an Ed25519 key pair for signing bundles.
int Keygen(const std::vector<std::string>& argv);

}  // namespace kforge::cli

#endif  // KFORGE_CLI_DEPLOY_CMDS_H_
