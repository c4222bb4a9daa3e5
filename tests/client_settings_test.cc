// The client settings rule (runtime/client_settings.h): every KFORGE_*
// variable read, given settings winning over it, pairs never mixed, and
// every error naming the variable (or the flag) it is about; the files read
// by LoadChannelSecurity; and the C++ engine's entry points
// (runtime/client.h OpenKernelSourceFromEnvironment,
// ServiceClientOptionsFromEnvironment). Certificates are made by the
// openssl CLI once for the suite; nothing connects to a server here
// (python_client_env_test.py does, over TLS with a token).
#include "runtime/client_settings.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/credentials.h"
#include "bundle/bundle.h"
#include "gtest/gtest.h"
#include "runtime/client.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using ::kforge::testing::Contains;
using ::kforge::testing::TempDir;

// A 16..4096-character token (base/credentials.h ParseTokens).
constexpr char kToken[] = "settings-test-token-0123456789abcdef";

void WriteFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

class ClientSettingsTest : public ::testing::Test {
 protected:
  // ca.pem/ca.key and client.pem/client.key: two self-signed certificates
  // with their keys (client.pem with ca.key is a mismatched pair).
  static void SetUpTestSuite() {
    tmp_ = new TempDir("kforge_client_settings_test");
    const std::string make = absl::StrCat(
        "cd '", tmp_->path().string(), "' && ",
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
        "-subj '/CN=kforge settings test ca' -keyout ca.key -out ca.pem 2>/dev/null && ",
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
        "-subj '/CN=kforge settings test client' -keyout client.key -out client.pem "
        "2>/dev/null");
    made_ = std::system(make.c_str()) == 0;
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(made_) << "openssl could not make the test certificates "
                          "(scripts/install_deps.sh installs it)";
  }

  static std::string Path(const std::string& name) { return (tmp_->path() / name).string(); }

  // A token file holding kToken.
  static std::string TokenFile() {
    const std::string path = Path("token");
    WriteFile(path, absl::StrCat("# the client's token\n", kToken, "\n"));
    return path;
  }

  // The settings of `env` alone (nothing given).
  absl::StatusOr<ClientSettings> FromEnv(ClientSource source = ClientSource::kServer) {
    return FromEnv(ClientSettings(), source);
  }
  absl::StatusOr<ClientSettings> FromEnv(const ClientSettings& given,
                                         ClientSource source = ClientSource::kServer) {
    return ClientSettingsFromEnvironment(given, source, [this](const char* name) -> const char* {
      auto it = env_.find(name);
      return it == env_.end() ? nullptr : it->second.c_str();
    });
  }

  // The error of resolving and then loading the settings of `env_`.
  absl::Status LoadError() {
    absl::StatusOr<ClientSettings> settings = FromEnv();
    if (!settings.ok()) return settings.status();
    return LoadChannelSecurity(settings->security).status();
  }

  static TempDir* tmp_;
  static bool made_;
  std::map<std::string, std::string> env_;
};

TempDir* ClientSettingsTest::tmp_ = nullptr;
bool ClientSettingsTest::made_ = false;

// The CLI's names for its flags (cli/connect_args.cc).
ClientSettings CliGiven() {
  ClientSettings given;
  given.names.server = "--server";
  given.security.names.tls_ca_file = "--tls-ca";
  given.security.names.tls_cert_file = "--tls-cert";
  given.security.names.tls_key_file = "--tls-key";
  given.security.names.token_file = "--token-file";
  return given;
}

TEST_F(ClientSettingsTest, NothingSetIsAPlainServerAtTheDefaultAddress) {
  for (ClientSource source : {ClientSource::kServer, ClientSource::kServerOrBundle}) {
    absl::StatusOr<ClientSettings> s = FromEnv(source);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->server, kDefaultServerAddress);
    EXPECT_EQ(s->bundle, "");
    EXPECT_EQ(s->local_copy_dir, "");
    EXPECT_FALSE(s->security.UsesTls());
    EXPECT_EQ(s->security.token, "");
    EXPECT_EQ(s->security.token_file, "");
  }
  EXPECT_EQ(std::string(kDefaultServerAddress), ServiceClientOptions().address);
}

TEST_F(ClientSettingsTest, EveryVariableIsReadAndNamesItsSetting) {
  env_ = {{"KFORGE_SERVER", "kforge-host:7000"},  {"KFORGE_LOCAL_COPY_DIR", Path("copy")},
          {"KFORGE_TLS_CA", Path("ca.pem")},      {"KFORGE_TLS_CERT", Path("client.pem")},
          {"KFORGE_TLS_KEY", Path("client.key")}, {"KFORGE_TOKEN", kToken}};
  absl::StatusOr<ClientSettings> s = FromEnv();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->server, "kforge-host:7000");
  EXPECT_EQ(s->names.server, "KFORGE_SERVER");
  EXPECT_EQ(s->local_copy_dir, Path("copy"));
  EXPECT_EQ(s->names.local_copy_dir, "KFORGE_LOCAL_COPY_DIR");
  EXPECT_EQ(s->security.tls_ca_file, Path("ca.pem"));
  EXPECT_EQ(s->security.names.tls_ca_file, "KFORGE_TLS_CA");
  EXPECT_EQ(s->security.tls_cert_file, Path("client.pem"));
  EXPECT_EQ(s->security.names.tls_cert_file, "KFORGE_TLS_CERT");
  EXPECT_EQ(s->security.tls_key_file, Path("client.key"));
  EXPECT_EQ(s->security.names.tls_key_file, "KFORGE_TLS_KEY");
  EXPECT_EQ(s->security.token, kToken);
  EXPECT_EQ(s->security.names.token, "KFORGE_TOKEN");

  absl::StatusOr<ChannelSecurity> loaded = LoadChannelSecurity(s->security);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->tls);
  EXPECT_EQ(loaded->root_certs_pem, testing::ReadFileOrEmpty(Path("ca.pem")));
  EXPECT_EQ(loaded->cert_chain_pem, testing::ReadFileOrEmpty(Path("client.pem")));
  EXPECT_EQ(loaded->private_key_pem, testing::ReadFileOrEmpty(Path("client.key")));
  EXPECT_EQ(loaded->token, kToken);

  env_ = {{"KFORGE_TLS_CA", Path("ca.pem")}, {"KFORGE_TOKEN_FILE", TokenFile()}};
  s = FromEnv();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->security.token_file, Path("token"));
  EXPECT_EQ(s->security.names.token_file, "KFORGE_TOKEN_FILE");
  loaded = LoadChannelSecurity(s->security);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->token, kToken);  // the file's first token, past its comment
  EXPECT_EQ(loaded->cert_chain_pem, "");

  TempDir bundle("kforge_settings_bundle");
  env_ = {{"KFORGE_BUNDLE", bundle.path().string()}};
  s = FromEnv(ClientSource::kServerOrBundle);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->bundle, bundle.path().string());
  EXPECT_EQ(s->names.bundle, "KFORGE_BUNDLE");
  EXPECT_EQ(s->server, "");
}

// KFORGE_FIRST_ANSWER or the given setting, spelled as a switch, comes out
// "1" or "0"; anything else is an error naming it; the given one wins; a
// bundle takes none.
TEST_F(ClientSettingsTest, FirstAnswerIsASwitch) {
  for (const auto& [value, want] : std::vector<std::pair<std::string, std::string>>{{"1", "1"},
                                                                                    {"TRUE", "1"},
                                                                                    {"yes", "1"},
                                                                                    {"On", "1"},
                                                                                    {"0", "0"},
                                                                                    {"false", "0"},
                                                                                    {"NO", "0"},
                                                                                    {"off", "0"}}) {
    env_ = {{"KFORGE_FIRST_ANSWER", value}};
    absl::StatusOr<ClientSettings> s = FromEnv();
    ASSERT_TRUE(s.ok()) << value << ": " << s.status();
    EXPECT_EQ(s->first_answer, want) << value;
    EXPECT_EQ(s->names.first_answer, "KFORGE_FIRST_ANSWER");
  }
  env_ = {};
  absl::StatusOr<ClientSettings> unset = FromEnv();
  ASSERT_TRUE(unset.ok());
  EXPECT_EQ(unset->first_answer, "");
  env_ = {{"KFORGE_FIRST_ANSWER", "maybe"}};
  absl::StatusOr<ClientSettings> bad = FromEnv();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad.status().message(), "KFORGE_FIRST_ANSWER: got \"maybe\""))
      << bad.status();
  ClientSettings given;
  given.first_answer = "0";
  env_ = {{"KFORGE_FIRST_ANSWER", "1"}};
  absl::StatusOr<ClientSettings> s = FromEnv(given);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->first_answer, "0");
  given.first_answer = "2";
  s = FromEnv(given);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.status().message(), "first_answer: got \"2\"")) << s.status();
  TempDir bundle("kforge_settings_bundle");
  ClientSettings to_bundle;
  to_bundle.bundle = bundle.path().string();
  to_bundle.first_answer = "1";
  s = FromEnv(to_bundle, ClientSource::kServerOrBundle);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.status().message(), "takes no server settings")) << s.status();
}

TEST_F(ClientSettingsTest, EmptyVariablesAreUnset) {
  env_ = {{"KFORGE_SERVER", ""}, {"KFORGE_BUNDLE", ""},    {"KFORGE_LOCAL_COPY_DIR", ""},
          {"KFORGE_TLS_CA", ""}, {"KFORGE_TLS_CERT", ""},  {"KFORGE_TLS_KEY", ""},
          {"KFORGE_TOKEN", ""},  {"KFORGE_TOKEN_FILE", ""}};
  absl::StatusOr<ClientSettings> s = FromEnv(ClientSource::kServerOrBundle);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->server, kDefaultServerAddress);
  EXPECT_EQ(s->bundle, "");
  EXPECT_FALSE(s->security.UsesTls());
}

TEST_F(ClientSettingsTest, GivenSettingsWin) {
  env_ = {{"KFORGE_SERVER", "env-host:1"},        {"KFORGE_LOCAL_COPY_DIR", Path("env-copy")},
          {"KFORGE_TLS_CA", Path("client.pem")},  {"KFORGE_TLS_CERT", Path("client.pem")},
          {"KFORGE_TLS_KEY", Path("client.key")}, {"KFORGE_TOKEN", kToken}};
  ClientSettings given = CliGiven();
  given.server = "flag-host:2";
  given.local_copy_dir = Path("flag-copy");
  given.security.tls_ca_file = Path("ca.pem");
  given.security.tls_cert_file = Path("ca.pem");
  given.security.tls_key_file = Path("ca.key");
  given.security.token_file = TokenFile();
  absl::StatusOr<ClientSettings> s = FromEnv(given);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->server, "flag-host:2");
  EXPECT_EQ(s->names.server, "--server");
  EXPECT_EQ(s->local_copy_dir, Path("flag-copy"));
  EXPECT_EQ(s->security.tls_ca_file, Path("ca.pem"));
  EXPECT_EQ(s->security.names.tls_ca_file, "--tls-ca");
  EXPECT_EQ(s->security.tls_cert_file, Path("ca.pem"));
  EXPECT_EQ(s->security.tls_key_file, Path("ca.key"));
  EXPECT_EQ(s->security.names.tls_key_file, "--tls-key");
  // A given token file keeps KFORGE_TOKEN out: the pair is one setting.
  EXPECT_EQ(s->security.token, "");
  EXPECT_EQ(s->security.token_file, Path("token"));

  // Settings given one by one: each of the others still comes from its
  // variable.
  ClientSettings ca_only = CliGiven();
  ca_only.security.tls_ca_file = Path("ca.pem");
  s = FromEnv(ca_only);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->server, "env-host:1");
  EXPECT_EQ(s->security.tls_ca_file, Path("ca.pem"));
  EXPECT_EQ(s->security.tls_cert_file, Path("client.pem"));
  EXPECT_EQ(s->security.token, kToken);
}

TEST_F(ClientSettingsTest, TheSourceIsABundleOrAServerNeverBoth) {
  TempDir bundle("kforge_settings_bundle");
  const std::string dir = bundle.path().string();
  // A server client does not read KFORGE_BUNDLE.
  env_ = {{"KFORGE_BUNDLE", dir}};
  absl::StatusOr<ClientSettings> s = FromEnv(ClientSource::kServer);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->server, kDefaultServerAddress);
  EXPECT_EQ(s->bundle, "");

  env_ = {{"KFORGE_BUNDLE", dir}, {"KFORGE_SERVER", "host:1"}};
  s = FromEnv(ClientSource::kServerOrBundle);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.status().message(),
                       "both KFORGE_BUNDLE (" + dir + ") and KFORGE_SERVER (host:1) are set"))
      << s.status();

  // Something given decides: a given server (or any server setting) over
  // KFORGE_BUNDLE, a given bundle over KFORGE_SERVER.
  ClientSettings server;
  server.server = "given:3";
  s = FromEnv(server, ClientSource::kServerOrBundle);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->server, "given:3");
  EXPECT_EQ(s->bundle, "");
  ClientSettings ca;
  ca.security.tls_ca_file = Path("ca.pem");
  s = FromEnv(ca, ClientSource::kServerOrBundle);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->server, "host:1");
  ClientSettings given_bundle;
  given_bundle.bundle = dir;
  s = FromEnv(given_bundle, ClientSource::kServerOrBundle);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->bundle, dir);
  EXPECT_EQ(s->names.bundle, "bundle");
  EXPECT_EQ(s->server, "");

  // A bundle takes no server settings: the server's variables are not read
  // (not even a token with no TLS), and given ones are refused.
  env_ = {{"KFORGE_BUNDLE", dir}, {"KFORGE_TOKEN", kToken}, {"KFORGE_TLS_CERT", Path("x")}};
  s = FromEnv(ClientSource::kServerOrBundle);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->bundle, dir);
  EXPECT_EQ(s->security.token, "");
  given_bundle.security.token = kToken;
  s = FromEnv(given_bundle, ClientSource::kServerOrBundle);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.status().message(), "bundle names a bundle, which takes no server"))
      << s.status();
  given_bundle.security.token.clear();
  s = FromEnv(given_bundle, ClientSource::kServer);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.status().message(), "bundle: this client reads from a server"))
      << s.status();
}

TEST_F(ClientSettingsTest, ABundlesTrustKeyIsGivenOrFromKforgeTrust) {
  TempDir bundle("kforge_settings_bundle");
  const std::string dir = bundle.path().string();
  env_ = {{"KFORGE_BUNDLE", dir}, {"KFORGE_TRUST", Path("signer.pub")}};
  absl::StatusOr<ClientSettings> s = FromEnv(ClientSource::kServerOrBundle);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->trust, Path("signer.pub"));
  EXPECT_EQ(s->names.trust, "KFORGE_TRUST");
  // A given bundle takes the variable's key too; a given key wins.
  ClientSettings given;
  given.bundle = dir;
  s = FromEnv(given, ClientSource::kServerOrBundle);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->trust, Path("signer.pub"));
  given.trust = Path("other.pub");
  s = FromEnv(given, ClientSource::kServerOrBundle);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->trust, Path("other.pub"));
  EXPECT_EQ(s->names.trust, "trust");
  // A server does not read it (it is also `kforge serve --trust`'s
  // variable), and a key given for a server is an error that names it.
  env_ = {{"KFORGE_TRUST", Path("signer.pub")}};
  s = FromEnv(ClientSource::kServerOrBundle);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->trust, "");
  ClientSettings server;
  server.server = "host:1";
  server.trust = Path("signer.pub");
  s = FromEnv(server, ClientSource::kServer);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.status().message(), "trust: a trust key checks a bundle's signature"))
      << s.status();
}

TEST_F(ClientSettingsTest, ABundleOrALocalCopyThatIsNotADirectoryIsNamed) {
  env_ = {{"KFORGE_BUNDLE", Path("missing")}};
  absl::StatusOr<ClientSettings> s = FromEnv(ClientSource::kServerOrBundle);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.status().message(),
            absl::StrCat("KFORGE_BUNDLE: ", Path("missing"), ": no such directory"));
  env_ = {{"KFORGE_BUNDLE", Path("ca.pem")}};
  s = FromEnv(ClientSource::kServerOrBundle);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(),
            absl::StrCat("KFORGE_BUNDLE: ", Path("ca.pem"), ": not a directory"));

  // A local copy that does not exist yet is made on first use.
  env_ = {{"KFORGE_LOCAL_COPY_DIR", Path("not-yet")}};
  ASSERT_TRUE(FromEnv().ok());
  env_ = {{"KFORGE_LOCAL_COPY_DIR", Path("ca.pem")}};
  s = FromEnv();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.status().message(),
            absl::StrCat("KFORGE_LOCAL_COPY_DIR: ", Path("ca.pem"), ": not a directory"));
}

TEST_F(ClientSettingsTest, HalfACertificatePairIsNamed) {
  env_ = {{"KFORGE_TLS_CA", Path("ca.pem")}, {"KFORGE_TLS_CERT", Path("client.pem")}};
  absl::StatusOr<ClientSettings> s = FromEnv();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.status().message(), "KFORGE_TLS_CERT is set without KFORGE_TLS_KEY"))
      << s.status();
  env_ = {{"KFORGE_TLS_CA", Path("ca.pem")}, {"KFORGE_TLS_KEY", Path("client.key")}};
  s = FromEnv();
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.status().message(), "KFORGE_TLS_KEY is set without KFORGE_TLS_CERT"))
      << s.status();
  // A flag and a variable do not make a pair.
  ClientSettings given = CliGiven();
  given.security.tls_cert_file = Path("client.pem");
  s = FromEnv(given);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.status().message(), "--tls-cert is set without --tls-key")) << s.status();
}

TEST_F(ClientSettingsTest, BothTokenVariablesAreRefused) {
  env_ = {{"KFORGE_TLS_CA", Path("ca.pem")},
          {"KFORGE_TOKEN", kToken},
          {"KFORGE_TOKEN_FILE", TokenFile()}};
  absl::StatusOr<ClientSettings> s = FromEnv();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(), "both KFORGE_TOKEN and KFORGE_TOKEN_FILE are set: set one");
  ClientSettings given;
  given.security.tls_ca_file = Path("ca.pem");
  given.security.token = kToken;
  given.security.token_file = TokenFile();
  EXPECT_EQ(LoadChannelSecurity(given.security).status().message(),
            "both token and token_file are set: set one");
}

TEST_F(ClientSettingsTest, ATokenWithoutTlsIsNamed) {
  env_ = {{"KFORGE_TOKEN", kToken}};
  absl::StatusOr<ClientSettings> s = FromEnv();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "KFORGE_TOKEN is set but the connection is not TLS, and a bearer token is only sent "
            "over TLS: set KFORGE_TLS_CA (or give tls_ca_file)");
  env_ = {{"KFORGE_TOKEN_FILE", TokenFile()}};
  s = FromEnv(CliGiven());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(
      Contains(s.status().message(), "KFORGE_TOKEN_FILE is set but the connection is not TLS"))
      << s.status();
  EXPECT_TRUE(Contains(s.status().message(), "set KFORGE_TLS_CA (or give --tls-ca)")) << s.status();
  // With the CA from its variable, the token goes over TLS.
  env_["KFORGE_TLS_CA"] = Path("ca.pem");
  ASSERT_TRUE(FromEnv().ok());
  // Given options that never saw the environment say how to give a CA.
  ChannelSecurityOptions options;
  options.token = kToken;
  EXPECT_TRUE(Contains(LoadChannelSecurity(options).status().message(),
                       "token is set but the connection is not TLS, and a bearer token is only "
                       "sent over TLS: give tls_ca_file"));
}

TEST_F(ClientSettingsTest, FilesThatCannotBeUsedAreNamedByTheirVariable) {
  const std::string ca = Path("ca.pem");
  // A token file that is a directory, missing, or holds no token.
  env_ = {{"KFORGE_TLS_CA", ca}, {"KFORGE_TOKEN_FILE", tmp_->path().string()}};
  absl::Status error = LoadError();
  EXPECT_EQ(error.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(error.message(), absl::StrCat("KFORGE_TOKEN_FILE: ", tmp_->path().string(),
                                          ": is a directory, expected a regular file"));
  env_["KFORGE_TOKEN_FILE"] = Path("missing");
  error = LoadError();
  EXPECT_EQ(error.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(error.message(), "KFORGE_TOKEN_FILE: ")) << error;
  EXPECT_TRUE(Contains(error.message(), Path("missing"))) << error;
  WriteFile(Path("comments"), "# no token here\n");
  env_["KFORGE_TOKEN_FILE"] = Path("comments");
  error = LoadError();
  EXPECT_TRUE(Contains(error.message(), "KFORGE_TOKEN_FILE " + Path("comments") + ": no token"))
      << error;
  // A token that is not one (too short); its text is never repeated.
  env_ = {{"KFORGE_TLS_CA", ca}, {"KFORGE_TOKEN", "short"}};
  error = LoadError();
  EXPECT_EQ(error.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(error.message(), "KFORGE_TOKEN: line 1: a token is 16..4096")) << error;
  EXPECT_FALSE(Contains(error.message(), "short")) << error;

  // A CA that is missing, not PEM, or over the size cap.
  env_ = {{"KFORGE_TLS_CA", Path("missing.pem")}};
  error = LoadError();
  EXPECT_EQ(error.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(error.message(), "KFORGE_TLS_CA: ")) << error;
  env_["KFORGE_TLS_CA"] = Path("ca.key");
  EXPECT_EQ(LoadError().message(),
            absl::StrCat("KFORGE_TLS_CA ", Path("ca.key"), ": no PEM certificate in it"));
  WriteFile(Path("huge.pem"), std::string(kMaxCredentialFileBytes + 1, 'x'));
  env_["KFORGE_TLS_CA"] = Path("huge.pem");
  error = LoadError();
  EXPECT_EQ(error.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(error.message(), "KFORGE_TLS_CA: ")) << error;
  EXPECT_TRUE(Contains(error.message(), "bytes such a file may have")) << error;
  fs::remove(Path("fifo"));
  ASSERT_EQ(mkfifo(Path("fifo").c_str(), 0600), 0);
  env_["KFORGE_TLS_CA"] = Path("fifo");
  EXPECT_EQ(LoadError().message(),
            absl::StrCat("KFORGE_TLS_CA: ", Path("fifo"), ": is a FIFO, expected a regular file"));

  // A client certificate that is not one, a missing key, a key that is not
  // the certificate's.
  env_ = {{"KFORGE_TLS_CA", ca},
          {"KFORGE_TLS_CERT", Path("client.key")},
          {"KFORGE_TLS_KEY", Path("client.key")}};
  EXPECT_EQ(LoadError().message(),
            absl::StrCat("KFORGE_TLS_CERT ", Path("client.key"), ": no PEM certificate in it"));
  env_["KFORGE_TLS_CERT"] = Path("client.pem");
  env_["KFORGE_TLS_KEY"] = Path("missing.key");
  error = LoadError();
  EXPECT_TRUE(Contains(error.message(), "KFORGE_TLS_KEY: ")) << error;
  env_["KFORGE_TLS_KEY"] = Path("ca.key");
  EXPECT_EQ(LoadError().message(),
            absl::StrCat("KFORGE_TLS_CERT ", Path("client.pem"), ", KFORGE_TLS_KEY ",
                         Path("ca.key"), ": the private key is not the certificate's key"));
}

// The C++ engine's entry points read the process environment.
using Vars = std::map<std::string, std::string>;
class ScopedEnv {
 public:
  explicit ScopedEnv(const Vars& vars) {
    for (const char* name : {kServerVar, kBundleVar, kLocalCopyDirVar, kTlsCaVar, kTlsCertVar,
                             kTlsKeyVar, kTokenVar, kTokenFileVar}) {
      if (const char* old = std::getenv(name); old != nullptr) saved_[name] = old;
      unsetenv(name);
    }
    for (const auto& [name, value] : vars) setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const char* name : {kServerVar, kBundleVar, kLocalCopyDirVar, kTlsCaVar, kTlsCertVar,
                             kTlsKeyVar, kTokenVar, kTokenFileVar}) {
      unsetenv(name);
    }
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
};

TEST_F(ClientSettingsTest, TheEngineSourceFromTheEnvironment) {
  {
    ScopedEnv env(Vars{{"KFORGE_SERVER", "127.0.0.1:1"},
                       {"KFORGE_TLS_CA", Path("ca.pem")},
                       {"KFORGE_TOKEN_FILE", TokenFile()},
                       {"KFORGE_LOCAL_COPY_DIR", Path("engine-copy")},
                       {"KFORGE_FIRST_ANSWER", "yes"}});
    ServiceClientOptions tuning;
    tuning.max_attempts = 2;
    tuning.address = "ignored:9";
    absl::StatusOr<ServiceClientOptions> options = ServiceClientOptionsFromEnvironment({}, tuning);
    ASSERT_TRUE(options.ok()) << options.status();
    EXPECT_TRUE(options->first_answer);
    EXPECT_EQ(options->address, "127.0.0.1:1");
    EXPECT_EQ(options->max_attempts, 2);
    EXPECT_EQ(options->local_copy_dir, Path("engine-copy"));
    EXPECT_EQ(options->security.tls_ca_file, Path("ca.pem"));
    EXPECT_EQ(options->security.token_file, Path("token"));

    // Connects lazily: a ServiceClient with those settings, no server needed.
    absl::StatusOr<std::unique_ptr<KernelSource>> source = OpenKernelSourceFromEnvironment();
    ASSERT_TRUE(source.ok()) << source.status();
    auto* client = dynamic_cast<ServiceClient*>(source->get());
    ASSERT_NE(client, nullptr);
    EXPECT_EQ(client->options().address, "127.0.0.1:1");
    EXPECT_TRUE(client->options().security.UsesTls());
    EXPECT_TRUE(fs::is_directory(Path("engine-copy")));
  }
  {
    TempDir tmp("kforge_settings_bundle");
    const std::string bundle = (tmp.path() / "bundle").string();
    absl::StatusOr<std::unique_ptr<BundleWriter>> writer = BundleWriter::Open(bundle);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Finish().ok());
    writer->reset();
    ScopedEnv env(Vars{{"KFORGE_BUNDLE", bundle}});
    absl::StatusOr<std::unique_ptr<KernelSource>> source = OpenKernelSourceFromEnvironment();
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_NE(dynamic_cast<BundleSource*>(source->get()), nullptr);
  }
  {
    ScopedEnv env(Vars{{"KFORGE_TOKEN", kToken}});
    absl::StatusOr<std::unique_ptr<KernelSource>> source = OpenKernelSourceFromEnvironment();
    ASSERT_FALSE(source.ok());
    EXPECT_TRUE(Contains(source.status().message(), "KFORGE_TOKEN is set but the connection"))
        << source.status();
    EXPECT_FALSE(ServiceClientOptionsFromEnvironment().ok());
  }
  {
    ScopedEnv env(Vars{{"KFORGE_TLS_CA", Path("ca.key")}});
    absl::StatusOr<std::unique_ptr<KernelSource>> source = OpenKernelSourceFromEnvironment();
    ASSERT_FALSE(source.ok());
    EXPECT_TRUE(Contains(source.status().message(), "KFORGE_TLS_CA")) << source.status();
  }
}

}  // namespace
}  // namespace kforge
