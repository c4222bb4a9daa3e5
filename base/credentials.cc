#include "base/credentials.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/io.h"

namespace kforge {
namespace {

constexpr size_t kMinTokenChars = 16;
constexpr size_t kMaxTokenChars = 4096;

bool IsTokenChar(char c) { return c > ' ' && c < 0x7f; }

}  // namespace

absl::StatusOr<std::string> ReadCredentialFile(const std::string& path, const std::string& what) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty path"));
  absl::StatusOr<std::string> text = ReadFile(path, kMaxCredentialFileBytes, Symlinks::kFollow);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat(what, ": ", text.status().message()));
  }
  if (text->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": the file is empty"));
  }
  return text;
}

absl::StatusOr<std::vector<std::string>> ParseTokens(const std::string& text,
                                                     const std::string& what) {
  std::vector<std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    bool printable = true;
    for (char c : line) printable = printable && IsTokenChar(c);
    if (!printable || line.size() < kMinTokenChars || line.size() > kMaxTokenChars) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": line ", line_number, ": a token is ", kMinTokenChars, "..", kMaxTokenChars,
          " printable ASCII characters without spaces (e.g. `openssl rand -hex 32`)"));
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": no token (one per line; '#' starts a comment)"));
  }
  return tokens;
}

absl::Status CheckKeyMatchesCertificate(const std::string& cert_chain_pem,
                                        const std::string& key_pem) {
  // A failed parse leaves errors in this thread's OpenSSL queue, where a
  // later TLS call on the thread would find them.
  struct ClearErrors {
    ~ClearErrors() { ERR_clear_error(); }
  } clear_errors;
  std::unique_ptr<BIO, decltype(&BIO_free)> cert_bio(
      BIO_new_mem_buf(cert_chain_pem.data(), static_cast<int>(cert_chain_pem.size())), BIO_free);
  std::unique_ptr<BIO, decltype(&BIO_free)> key_bio(
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())), BIO_free);
  if (cert_bio == nullptr || key_bio == nullptr) return absl::InternalError("BIO_new_mem_buf");
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (cert == nullptr) return absl::InvalidArgumentError("the certificate does not parse");
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (key == nullptr) return absl::InvalidArgumentError("the private key does not parse");
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError("the private key is not the certificate's key");
  }
  return absl::OkStatus();
}

absl::Status CheckSecretFileMode(const std::string& path, const std::string& what) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s %s is open to %s (mode %04o): a secret must be readable by its owner only; run "
      "`chmod 600 %s`",
      what, path, (st.st_mode & S_IRWXO) != 0 ? "every user" : "its group", st.st_mode & 07777,
      path));
}

absl::StatusOr<CertificateValidity> CheckCertificateValidNow(const std::string& cert_chain_pem) {
  struct ClearErrors {
    ~ClearErrors() { ERR_clear_error(); }
  } clear_errors;
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(cert_chain_pem.data(), static_cast<int>(cert_chain_pem.size())), BIO_free);
  if (bio == nullptr) return absl::InternalError("BIO_new_mem_buf");
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (cert == nullptr) return absl::InvalidArgumentError("the certificate does not parse");
  auto print = [](const ASN1_TIME* t) {
    std::unique_ptr<BIO, decltype(&BIO_free)> out(BIO_new(BIO_s_mem()), BIO_free);
    if (out == nullptr || ASN1_TIME_print(out.get(), t) != 1) return std::string("?");
    char* data = nullptr;
    const long n = BIO_get_mem_data(out.get(), &data);
    return std::string(data, static_cast<size_t>(n));
  };
  CertificateValidity validity{print(X509_get0_notBefore(cert.get())),
                               print(X509_get0_notAfter(cert.get()))};
  // X509_cmp_current_time: -1 when the time is before now, 1 after, 0 on
  // a malformed time.
  const int before = X509_cmp_current_time(X509_get0_notBefore(cert.get()));
  const int after = X509_cmp_current_time(X509_get0_notAfter(cert.get()));
  if (before == 0 || after == 0) {
    return absl::InvalidArgumentError("the certificate's validity dates do not parse");
  }
  if (after < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the certificate expired on ", validity.not_after, " (notAfter); renew it"));
  }
  if (before > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the certificate is not valid before ", validity.not_before,
        " (notBefore): check the clock of this host and of the machine that issued it"));
  }
  return validity;
}

absl::StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& path,
                                                       const std::string& what) {
  absl::StatusOr<std::string> text = ReadCredentialFile(path, what);
  if (!text.ok()) return text.status();
  return ParseTokens(*text, absl::StrCat(what, " ", path));
}

}  // namespace kforge
