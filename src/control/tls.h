// Mutual TLS on the control plane: the keys a process proves itself with, where they come from,
// and gRPC credentials made of them. Torch-free.
//
//   TlsKeys keys = make_job_keys();                     // a CA of this job and a certificate of it
//   server builder: AddListeningPort(addr, server_credentials(keys), &port)
//   a worker:       TlsKeys mine = decode_keys(getenv("DSGD_TLS"));   // what the driver handed on
//
// A job's keys are one certificate authority's certificate, and one certificate it signed with
// its private key, which every member (driver, workers, shards) shows: each end of a connection
// accepts the other only with a certificate of the same CA, so a process without the job's keys
// fails at the handshake, before any call. The CA's own private key is thrown away once it has
// signed (make_job_keys): nobody can mint another member. The member certificate names
// kTlsServerName as its host; clients check that name, not the address they dialled, so the same
// keys serve a driver on any host.
#pragma once

#include <memory>
#include <string>

namespace grpc {
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace dsgd::control {

inline constexpr const char* kTlsServerName = "dsgd";

// PEM text. All empty: no TLS (plaintext; the job token still guards every call).
struct TlsKeys {
  std::string ca;    // the certificate authority's certificate: the peers this process accepts
  std::string cert;  // this process's certificate, signed by that CA
  std::string key;   // its private key
  bool enabled() const { return !ca.empty(); }
};

// A fresh CA (EC P-256) and a member certificate of it valid for `days`.
TlsKeys make_job_keys(int days = 30);

// Reads the three PEM files; ConfigError naming the file that is missing or is not what its
// flag says (a certificate, a private key), or a certificate not signed by the CA.
TlsKeys load_keys(const std::string& ca_file, const std::string& cert_file, const std::string& key_file);
// Writes ca.pem, cert.pem and key.pem (key.pem readable by its owner only) into `dir`.
void write_keys(const TlsKeys& keys, const std::string& dir);

// The keys as one line (base64 of the three PEMs), to hand to a process in an environment
// variable or a line of its input; "" for no TLS. decode_keys("") is no TLS; anything else that
// is not a line encode_keys made is a ConfigError.
std::string encode_keys(const TlsKeys& keys);
TlsKeys decode_keys(const std::string& line);

// The environment variable the driver hands a started worker's keys in.
inline constexpr const char* kTlsEnv = "DSGD_TLS";
// $DSGD_TLS decoded (no TLS when unset or empty).
TlsKeys keys_from_environment();

// Insecure credentials without keys; with them, mutual TLS where the server requires and checks
// the client's certificate.
std::shared_ptr<grpc::ServerCredentials> server_credentials(const TlsKeys& keys);
std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TlsKeys& keys);

}  // namespace dsgd::control
