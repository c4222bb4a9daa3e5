#include "base/ed25519.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kforge {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;

// libcrypto's queued errors are per thread; a failed parse must not leave
// them for an unrelated later caller (gRPC's TLS reads the same queue).
void ClearErrors() { ERR_clear_error(); }

enum class KeyKind { kPrivate, kPublic };

absl::StatusOr<Pkey> ParseKey(std::string_view pem, KeyKind kind) {
  const char* what = kind == KeyKind::kPrivate ? "private" : "public";
  if (pem.size() > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("not an Ed25519 ", what, " key (too large)"));
  }
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return absl::ResourceExhaustedError("BIO_new_mem_buf failed");
  Pkey key(kind == KeyKind::kPrivate ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr)
                                     : PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
  ClearErrors();
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not an Ed25519 ", what, " key in PEM (expected \"-----BEGIN ",
        kind == KeyKind::kPrivate ? "PRIVATE" : "PUBLIC", " KEY-----\", as `kforge keygen` or ",
        kind == KeyKind::kPrivate ? "`openssl genpkey -algorithm ed25519`"
                                  : "`openssl pkey -pubout`",
        " writes)"));
  }
  if (EVP_PKEY_id(key.get()) != EVP_PKEY_ED25519) {
    return absl::InvalidArgumentError(absl::StrCat("a ", what, " key of another type (",
                                                   OBJ_nid2sn(EVP_PKEY_id(key.get())),
                                                   "), expected Ed25519"));
  }
  return key;
}

absl::StatusOr<std::string> PemOf(EVP_PKEY* key, KeyKind kind) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr) return absl::ResourceExhaustedError("BIO_new failed");
  const int ok = kind == KeyKind::kPrivate ? PEM_write_bio_PrivateKey(bio.get(), key, nullptr,
                                                                      nullptr, 0, nullptr, nullptr)
                                           : PEM_write_bio_PUBKEY(bio.get(), key);
  ClearErrors();
  if (ok != 1) return absl::InternalError("cannot write an Ed25519 key as PEM");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

}  // namespace

absl::StatusOr<Ed25519KeyPair> GenerateEd25519KeyPair() {
  std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree> ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr));
  EVP_PKEY* raw = nullptr;
  if (ctx == nullptr || EVP_PKEY_keygen_init(ctx.get()) != 1 ||
      EVP_PKEY_keygen(ctx.get(), &raw) != 1) {
    ClearErrors();
    return absl::InternalError("Ed25519 key generation failed (libcrypto)");
  }
  Pkey key(raw);
  Ed25519KeyPair pair;
  absl::StatusOr<std::string> priv = PemOf(key.get(), KeyKind::kPrivate);
  if (!priv.ok()) return priv.status();
  absl::StatusOr<std::string> pub = PemOf(key.get(), KeyKind::kPublic);
  if (!pub.ok()) return pub.status();
  pair.private_pem = *std::move(priv);
  pair.public_pem = *std::move(pub);
  return pair;
}

absl::StatusOr<std::string> Ed25519PublicKeyOf(std::string_view private_pem) {
  absl::StatusOr<Pkey> key = ParseKey(private_pem, KeyKind::kPrivate);
  if (!key.ok()) return key.status();
  return PemOf(key->get(), KeyKind::kPublic);
}

absl::StatusOr<std::string> Ed25519Sign(std::string_view private_pem, std::string_view message) {
  absl::StatusOr<Pkey> key = ParseKey(private_pem, KeyKind::kPrivate);
  if (!key.ok()) return key.status();
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  std::string signature(kEd25519SignatureBytes, '\0');
  size_t size = signature.size();
  // Ed25519 is one-shot: no digest, the whole message at once.
  if (ctx == nullptr || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key->get()) != 1 ||
      EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &size,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1 ||
      size != kEd25519SignatureBytes) {
    ClearErrors();
    return absl::InternalError("Ed25519 signing failed (libcrypto)");
  }
  return signature;
}

absl::Status Ed25519Verify(std::string_view public_pem, std::string_view message,
                           std::string_view signature) {
  absl::StatusOr<Pkey> key = ParseKey(public_pem, KeyKind::kPublic);
  if (!key.ok()) return key.status();
  if (signature.size() != kEd25519SignatureBytes) {
    return absl::UnauthenticatedError(absl::StrCat("the signature has ", signature.size(),
                                                   " bytes, an Ed25519 signature has ",
                                                   kEd25519SignatureBytes));
  }
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  if (ctx == nullptr ||
      EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key->get()) != 1) {
    ClearErrors();
    return absl::InternalError("Ed25519 verification could not start (libcrypto)");
  }
  const int ok = EVP_DigestVerify(
      ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
      reinterpret_cast<const unsigned char*>(message.data()), message.size());
  ClearErrors();
  if (ok != 1) {
    return absl::UnauthenticatedError(
        "the signature does not match (another key, or the signed "
        "file was changed after signing)");
  }
  return absl::OkStatus();
}

}  // namespace kforge
