// dsgd/runtime/remote.h — the entry points of processes that join a driver started elsewhere: a worker
// (the driver's Trainer has `listen` set) or a parameter-server shard (strategy ps with
// ps_placement "processes"). `dsgd worker` and `dsgd ps-server` are these; so is any program that
// calls dsgd::init, when started with --dsgd-worker or --dsgd-ps-server.
//
//   dsgd::WorkerArgs a{.driver = "hostA:29500", .token = "s3cret"};
//   return dsgd::run_worker(a);              // serves the job; the process's exit code
//
// Both register with the driver over gRPC (the job token on every call; mutual TLS with the job's
// keys where the driver has it), retry until it answers
// or the registration timeout passes, and exit when the driver ends the job or has been
// unreachable for the job's heartbeat timeout (a shard: driver_timeout). Run the operators the
// job names: a worker constructs them by name from those registered in this binary.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dsgd {

struct WorkerArgs {
  std::string driver;          // HOST:PORT
  std::string token;           // --token, else $DSGD_TOKEN
  std::string address;         // address to bind for Gloo; "" = the one that routes to the driver
  std::string host_id;         // host identity for shared memory; "" = host name
  int64_t spawn_index = -1;    // set by a driver that spawned this worker; -1 otherwise
  // Mutual TLS with the driver: PEM files of the job's CA, a certificate of it and its key (`dsgd
  // tls-keys DIR` makes them), all three or none; none: $DSGD_TLS (the keys a driver that started
  // this process hands on), else plaintext.
  std::string tls_ca, tls_cert, tls_key;
  std::chrono::milliseconds registration_timeout{60000};
};

// Serves the job as a worker; returns the process exit code (0 after a normal shutdown, 2 when
// it could not register (TLS keys that cannot be read included), 3 when it lost the driver).
int run_worker(const WorkerArgs& args);

struct PsServerArgs {
  std::string driver;     // HOST:PORT
  std::string token;      // --token, else $DSGD_TOKEN
  std::string address;    // to bind for Gloo; "" = the one that routes to the driver
  std::string host_id;    // "" = host name
  int shard = -1;         // --shard: which slice of every bucket this process serves
  std::string tls_ca, tls_cert, tls_key;  // as WorkerArgs'
  std::chrono::milliseconds driver_timeout{30000};
};

// Makes a certificate authority and a certificate of it (EC P-256, valid `days`), and writes them
// with the certificate's key into `dir` as ca.pem, cert.pem and key.pem (key.pem its owner's
// only): the keys every process of a job shows where workers join by themselves (`dsgd train
// --tls-dir DIR`, `dsgd worker --tls-dir DIR`). The CA's own key is not kept: no other
// certificate of it can be made.
void write_tls_keys(const std::string& dir, int days = 365);

// Serves the job's generations as shard `args.shard`; returns the process exit code (0 once the
// driver said stop).
int run_ps_server(const PsServerArgs& args);

}  // namespace dsgd
