// dsgd/remote.h — the entry points of processes that join a driver started elsewhere: a worker
// (the driver's Trainer has `listen` set) or a parameter-server shard (strategy ps with
// ps_placement "processes"). `dsgd worker` and `dsgd ps-server` are these; so is any program that
// calls dsgd::init, when started with --dsgd-worker or --dsgd-ps-server.
//
//   dsgd::WorkerArgs a{.driver = "hostA:29500", .token = "s3cret"};
//   return dsgd::run_worker(a);              // serves the job; the process's exit code
//
// Both register with the driver over gRPC (the job token on every call), retry until it answers
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
  std::chrono::milliseconds registration_timeout{60000};
};

// Serves the job as a worker; returns the process exit code (0 after a normal shutdown, 2 when
// it could not register, 3 when it lost the driver).
int run_worker(const WorkerArgs& args);

struct PsServerArgs {
  std::string driver;     // HOST:PORT
  std::string token;      // --token, else $DSGD_TOKEN
  std::string address;    // to bind for Gloo; "" = the one that routes to the driver
  std::string host_id;    // "" = host name
  int shard = -1;         // --shard: which slice of every bucket this process serves
  std::chrono::milliseconds driver_timeout{30000};
};

// Serves the job's generations as shard `args.shard`; returns the process exit code (0 once the
// driver said stop).
int run_ps_server(const PsServerArgs& args);

}  // namespace dsgd
