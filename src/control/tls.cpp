#include "control/tls.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dsgd/common/error.h"

namespace dsgd::control {
namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
  void operator()(BIGNUM* p) const { BN_free(p); }
};
template <typename T>
using Ptr = std::unique_ptr<T, Free>;

std::string openssl_error() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "no detail from OpenSSL";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

[[noreturn]] void fail(const std::string& what) { throw Error("tls: " + what + " (" + openssl_error() + ")"); }

void add_extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  Ptr<X509_EXTENSION> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value));
  if (!ext || X509_add_ext(cert, ext.get(), -1) != 1) fail(std::string("cannot add the extension ") + value);
}

// A certificate of `key` named `cn`, signed by `issuer_key` (self-signed when `issuer` is null: the CA).
Ptr<X509> certificate(const std::string& cn, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key, int days) {
  Ptr<X509> x(X509_new());
  if (!x) fail("cannot make a certificate");
  X509_set_version(x.get(), 2);  // v3: extensions
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) fail("no random bytes");
  serial[0] &= 0x7f;  // positive
  Ptr<BIGNUM> bn(BN_bin2bn(serial, sizeof(serial), nullptr));
  BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(x.get()));
  X509_gmtime_adj(X509_getm_notBefore(x.get()), -3600);  // hosts' clocks differ
  X509_gmtime_adj(X509_getm_notAfter(x.get()), static_cast<long>(days) * 86400);
  X509_set_pubkey(x.get(), key);
  X509_NAME* name = X509_get_subject_name(x.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("dsgd"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(x.get(), issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509* signer = issuer != nullptr ? issuer : x.get();
  add_extension(x.get(), signer, NID_subject_key_identifier, "hash");
  if (issuer == nullptr) {
    add_extension(x.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
    add_extension(x.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_extension(x.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    add_extension(x.get(), signer, NID_key_usage, "critical,digitalSignature");
    add_extension(x.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth");
    add_extension(x.get(), signer, NID_subject_alt_name, (std::string("DNS:") + kTlsServerName).c_str());
    add_extension(x.get(), signer, NID_authority_key_identifier, "keyid");
  }
  if (X509_sign(x.get(), issuer_key, EVP_sha256()) == 0) fail("cannot sign the certificate " + cn);
  return x;
}

std::string text_of(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string pem_of(X509* x) {
  Ptr<BIO> bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_X509(bio.get(), x) != 1) fail("cannot write a certificate");
  return text_of(bio.get());
}

std::string pem_of(EVP_PKEY* key) {
  Ptr<BIO> bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) fail("cannot write a key");
  return text_of(bio.get());
}

std::string hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) out += {digits[p[i] >> 4], digits[p[i] & 15]};
  return out;
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError("tls: cannot read the " + std::string(what) + " " + path + " (" +
                      (std::filesystem::exists(path) ? "not readable" : "no such file") +
                      "); dsgd tls-keys DIR makes a CA and a certificate of it");
  }
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Ptr<X509> parse_certificate(const std::string& pem, const std::string& what) {
  Ptr<BIO> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Ptr<X509> x(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!x) throw ConfigError("tls: the " + what + " is not a PEM certificate (" + openssl_error() + ")");
  return x;
}

Ptr<EVP_PKEY> parse_key(const std::string& pem, const std::string& what) {
  Ptr<BIO> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Ptr<EVP_PKEY> k(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!k) throw ConfigError("tls: the " + what + " is not an unencrypted PEM private key (" + openssl_error() + ")");
  return k;
}

// ConfigError unless `keys.cert` is signed by `keys.ca` and `keys.key` is its key; `where` says
// where the keys came from.
void check(const TlsKeys& keys, const std::string& where) {
  auto ca = parse_certificate(keys.ca, "CA certificate" + where);
  auto cert = parse_certificate(keys.cert, "certificate" + where);
  auto key = parse_key(keys.key, "key" + where);
  if (X509_verify(cert.get(), X509_get0_pubkey(ca.get())) != 1) {
    ERR_clear_error();
    throw ConfigError("tls: the certificate" + where + " is not signed by the CA certificate given with it");
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    throw ConfigError("tls: the key" + where + " is not the certificate's");
  }
}

std::string base64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string unbase64(const std::string& in) {
  std::string out(3 * (in.size() / 4) + 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  if (n < 0 || in.size() % 4 != 0) {
    throw ConfigError("tls: $" + std::string(kTlsEnv) + " is not what a driver hands on");
  }
  size_t pad = 0;
  for (size_t i = in.size(); i > 0 && in[i - 1] == '='; --i) ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

}  // namespace

TlsKeys make_job_keys(int days) {
  unsigned char id[6];
  if (RAND_bytes(id, sizeof(id)) != 1) fail("no random bytes");
  Ptr<EVP_PKEY> ca_key(EVP_EC_gen("P-256"));
  Ptr<EVP_PKEY> member_key(EVP_EC_gen("P-256"));
  if (!ca_key || !member_key) fail("cannot make a key");
  const std::string job = hex(id, sizeof(id));
  auto ca = certificate("dsgd job " + job + " CA", ca_key.get(), nullptr, ca_key.get(), days);
  auto member = certificate("dsgd job " + job + " member", member_key.get(), ca.get(), ca_key.get(), days);
  return {pem_of(ca.get()), pem_of(member.get()), pem_of(member_key.get())};  // the CA's key dies here
}

TlsKeys load_keys(const std::string& ca_file, const std::string& cert_file, const std::string& key_file) {
  if (ca_file.empty() || cert_file.empty() || key_file.empty()) {
    throw ConfigError("tls: a CA certificate, a certificate and its key are needed together (--tls-ca, --tls-cert, "
                      "--tls-key, or --tls-dir with ca.pem, cert.pem, key.pem)");
  }
  TlsKeys keys{read_file(ca_file, "CA certificate"), read_file(cert_file, "certificate"),
               read_file(key_file, "key")};
  check(keys, " " + cert_file);
  return keys;
}

void write_keys(const TlsKeys& keys, const std::string& dir) {
  std::filesystem::create_directories(dir);
  auto write = [&](const char* name, const std::string& text, mode_t mode) {
    const std::string path = dir + "/" + name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out || !(out << text) || !out.flush()) throw Error("tls: cannot write " + path);
    out.close();
    ::chmod(path.c_str(), mode);
  };
  write("ca.pem", keys.ca, 0644);
  write("cert.pem", keys.cert, 0644);
  write("key.pem", keys.key, 0600);
}

std::string encode_keys(const TlsKeys& keys) {
  if (!keys.enabled()) return "";
  return base64(keys.ca) + "." + base64(keys.cert) + "." + base64(keys.key);
}

TlsKeys decode_keys(const std::string& line) {
  if (line.empty()) return {};
  const auto a = line.find('.');
  const auto b = a == std::string::npos ? a : line.find('.', a + 1);
  if (b == std::string::npos || line.find('.', b + 1) != std::string::npos) {
    throw ConfigError("tls: $" + std::string(kTlsEnv) + " is not what a driver hands on (three parts)");
  }
  TlsKeys keys{unbase64(line.substr(0, a)), unbase64(line.substr(a + 1, b - a - 1)), unbase64(line.substr(b + 1))};
  check(keys, " in $" + std::string(kTlsEnv));
  return keys;
}

TlsKeys keys_from_environment() {
  const char* line = std::getenv(kTlsEnv);
  return decode_keys(line == nullptr ? "" : line);
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const TlsKeys& keys) {
  if (!keys.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = keys.ca;
  options.pem_key_cert_pairs.push_back({keys.key, keys.cert});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TlsKeys& keys) {
  if (!keys.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = keys.ca;
  options.pem_private_key = keys.key;
  options.pem_cert_chain = keys.cert;
  return grpc::SslCredentials(options);
}

}  // namespace dsgd::control
