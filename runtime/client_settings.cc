#include "runtime/client_settings.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/credentials.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;

constexpr char kPemCertificate[] = "-----BEGIN CERTIFICATE-----";

// The checks that need no file. `enable_tls` says how to turn TLS on, for a
// token that has none.
absl::Status CheckSecurityOptions(const ChannelSecurityOptions& o, const std::string& enable_tls) {
  const ChannelSecurityOptions::Names& n = o.names;
  if (!o.tls_cert_file.empty() && o.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(n.tls_cert_file, " is set without ", n.tls_key_file,
                     ": a client certificate goes with its private key"));
  }
  if (o.tls_cert_file.empty() && !o.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(n.tls_key_file, " is set without ", n.tls_cert_file,
                     ": a private key goes with its client certificate"));
  }
  if (!o.token.empty() && !o.token_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("both ", n.token, " and ", n.token_file, " are set: set one"));
  }
  if (!o.UsesTls() && (!o.token.empty() || !o.token_file.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.token.empty() ? n.token_file : n.token,
                     " is set but the connection is not TLS, and a bearer token is only sent "
                     "over TLS: ",
                     enable_tls));
  }
  return absl::OkStatus();
}

// A PEM file holding at least one certificate.
absl::StatusOr<std::string> ReadCertificates(const std::string& path, const std::string& name) {
  absl::StatusOr<std::string> pem = ReadCredentialFile(path, name);
  if (!pem.ok()) return pem.status();
  if (!absl::StrContains(*pem, kPemCertificate)) {
    return absl::InvalidArgumentError(absl::StrCat(name, " ", path, ": no PEM certificate in it"));
  }
  return pem;
}

// OK for an existing directory, and with `may_be_missing` for a path that
// does not exist yet; errors name the setting.
absl::Status CheckDirectory(const std::string& path, const std::string& name, bool may_be_missing) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) {
    if (may_be_missing) return absl::OkStatus();
    return absl::NotFoundError(absl::StrCat(name, ": ", path, ": no such directory"));
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": ", path, ": cannot stat: ", ec.message()));
  }
  if (status.type() != fs::file_type::directory) {
    return absl::FailedPreconditionError(absl::StrCat(name, ": ", path, ": not a directory"));
  }
  return absl::OkStatus();
}

bool GivesServerSettings(const ClientSettings& s) {
  const ChannelSecurityOptions& o = s.security;
  return !s.server.empty() || !s.local_copy_dir.empty() || !s.first_answer.empty() || o.tls ||
         !o.tls_ca_file.empty() || !o.tls_cert_file.empty() || !o.tls_key_file.empty() ||
         !o.token.empty() || !o.token_file.empty();
}

// A yes / no setting as "1" or "0" ("" stays ""); InvalidArgument naming
// it otherwise.
absl::Status NormalizeSwitch(std::string& value, const std::string& name) {
  if (value.empty()) return absl::OkStatus();
  const std::string lower = absl::AsciiStrToLower(value);
  for (const char* yes : {"1", "true", "yes", "on"}) {
    if (lower == yes) {
      value = "1";
      return absl::OkStatus();
    }
  }
  for (const char* no : {"0", "false", "no", "off"}) {
    if (lower == no) {
      value = "0";
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": got \"", absl::CHexEscape(value.substr(0, 64)),
                   "\", expected 1 or 0 (true/false, yes/no, on/off)"));
}

}  // namespace

const char* ProcessEnv(const char* name) { return std::getenv(name); }

absl::StatusOr<ChannelSecurity> LoadChannelSecurity(const ChannelSecurityOptions& options) {
  const ChannelSecurityOptions::Names& n = options.names;
  if (absl::Status s = CheckSecurityOptions(options, absl::StrCat("give ", n.tls_ca_file));
      !s.ok()) {
    return s;
  }
  ChannelSecurity out;
  if (!options.token_file.empty()) {
    absl::StatusOr<std::vector<std::string>> tokens =
        ReadTokenFile(options.token_file, n.token_file);
    if (!tokens.ok()) return tokens.status();
    out.token = tokens->front();
  } else if (!options.token.empty()) {
    absl::StatusOr<std::vector<std::string>> tokens = ParseTokens(options.token, n.token);
    if (!tokens.ok()) return tokens.status();
    out.token = tokens->front();
  }
  out.tls = options.UsesTls();
  if (!out.tls) return out;
  if (!options.tls_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadCertificates(options.tls_ca_file, n.tls_ca_file);
    if (!ca.ok()) return ca.status();
    out.root_certs_pem = *std::move(ca);
  }
  if (!options.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadCertificates(options.tls_cert_file, n.tls_cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadCredentialFile(options.tls_key_file, n.tls_key_file);
    if (!key.ok()) return key.status();
    // A certificate rotated without its key fails here, by name, rather
    // than as a handshake the server refuses.
    if (absl::Status match = CheckKeyMatchesCertificate(*cert, *key); !match.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(n.tls_cert_file, " ", options.tls_cert_file,
                                                     ", ", n.tls_key_file, " ",
                                                     options.tls_key_file, ": ", match.message()));
    }
    out.cert_chain_pem = *std::move(cert);
    out.private_key_pem = *std::move(key);
  }
  return out;
}

absl::StatusOr<ClientSettings> ClientSettingsFromEnvironment(const ClientSettings& given,
                                                             ClientSource source,
                                                             const GetEnv& getenv) {
  // A variable set to "" counts as unset, as a flag cannot be given empty.
  auto var = [&](const char* name) -> std::string {
    const char* value = getenv(name);
    return value == nullptr ? std::string() : std::string(value);
  };
  ClientSettings out = given;
  // A bundle's trust key: the caller's, else KFORGE_TRUST's. The variable
  // is not read for a server (it is also `kforge serve --trust`'s).
  auto bundle_source = [&]() -> absl::StatusOr<ClientSettings> {
    if (out.trust.empty()) {
      out.trust = var(kTrustVar);
      if (!out.trust.empty()) out.names.trust = kTrustVar;
    }
    if (absl::Status s = CheckDirectory(out.bundle, out.names.bundle, false); !s.ok()) return s;
    return out;
  };
  if (!given.bundle.empty()) {
    if (source == ClientSource::kServer) {
      return absl::InvalidArgumentError(
          absl::StrCat(given.names.bundle, ": this client reads from a server, not from a bundle"));
    }
    if (GivesServerSettings(given)) {
      return absl::InvalidArgumentError(
          absl::StrCat(given.names.bundle, " names a bundle, which takes no server settings (",
                       given.names.server, ", ", given.names.local_copy_dir, ", ",
                       given.names.first_answer, ", TLS, tokens)"));
    }
    return bundle_source();
  }
  if (source == ClientSource::kServerOrBundle && !GivesServerSettings(given)) {
    const std::string bundle = var(kBundleVar);
    if (!bundle.empty()) {
      const std::string server = var(kServerVar);
      if (!server.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("both ", kBundleVar, " (", bundle, ") and ",
                                                       kServerVar, " (", server,
                                                       ") are set: set one"));
      }
      out.bundle = bundle;
      out.names.bundle = kBundleVar;
      return bundle_source();
    }
  }

  // A server. A setting is taken from its variable only where `given` is
  // silent; a pair of settings only where `given` has neither.
  if (!given.trust.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(given.names.trust,
                     ": a trust key checks a bundle's signature, and this "
                     "client reads from a server (give a bundle, or set ",
                     kBundleVar, ")"));
  }
  auto fill = [&](std::string& value, std::string& name, const char* variable) {
    if (!value.empty()) return;
    value = var(variable);
    if (!value.empty()) name = variable;
  };
  fill(out.server, out.names.server, kServerVar);
  if (out.server.empty()) out.server = kDefaultServerAddress;
  fill(out.local_copy_dir, out.names.local_copy_dir, kLocalCopyDirVar);
  fill(out.first_answer, out.names.first_answer, kFirstAnswerVar);
  if (absl::Status s = NormalizeSwitch(out.first_answer, out.names.first_answer); !s.ok()) {
    return s;
  }
  ChannelSecurityOptions& security = out.security;
  ChannelSecurityOptions::Names& names = security.names;
  fill(security.tls_ca_file, names.tls_ca_file, kTlsCaVar);
  // A pair from the environment is named by its variables, the unset one
  // too ("KFORGE_TLS_CERT is set without KFORGE_TLS_KEY").
  auto fill_pair = [&](std::string& first, std::string& first_name, const char* first_variable,
                       std::string& second, std::string& second_name, const char* second_variable) {
    if (!first.empty() || !second.empty()) return;
    first = var(first_variable);
    second = var(second_variable);
    if (first.empty() && second.empty()) return;
    first_name = first_variable;
    second_name = second_variable;
  };
  fill_pair(security.tls_cert_file, names.tls_cert_file, kTlsCertVar, security.tls_key_file,
            names.tls_key_file, kTlsKeyVar);
  fill_pair(security.token, names.token, kTokenVar, security.token_file, names.token_file,
            kTokenFileVar);

  if (!out.local_copy_dir.empty()) {
    if (absl::Status s = CheckDirectory(out.local_copy_dir, out.names.local_copy_dir, true);
        !s.ok()) {
      return s;
    }
  }
  // The CA is what turns TLS on; where it is unset both ways name it.
  const std::string enable_tls =
      absl::StrCat("set ", kTlsCaVar, " (or give ", given.security.names.tls_ca_file, ")");
  if (absl::Status s = CheckSecurityOptions(security, enable_tls); !s.ok()) return s;
  return out;
}

}  // namespace kforge
