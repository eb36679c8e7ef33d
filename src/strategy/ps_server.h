// One parameter-server shard that is its own process (ps with placement "processes"; the
// runtime's shard mode runs it): it sums what the host leaders push for its slice of every
// bucket, divides by the number of replicas and sends the average back, or, with update on
// shards, applies SGD to the slice (keeping its parameters and momentum) and sends back
// parameters. Speaks src/strategy/ps_wire.h with make_ps_strategy's leaders.
//
//   PsServer server(group, clients);      // group: leaders 0..clients-1, this shard after them
//   server.serve();                       // until the group fails or is aborted: CommError
//
// The wait for the next request has no deadline short of `idle_timeout` (a job may validate
// or sit idle between steps for long): the process's watchdog aborts the group when the job
// moves on to a new generation, and a leader that dies closes its connection. Every other wait
// has the group's timeout. Torch-free.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>

#include "dsgd/comm/group.h"
#include "strategy/sgd.h"

namespace dsgd::strategy {

class PsServer {
 public:
  PsServer(std::shared_ptr<comm::Group> group, int clients,
           std::chrono::milliseconds idle_timeout = std::chrono::hours(24 * 365));
  ~PsServer();

  // Serves requests until an error, which it throws (CommError when the group failed or was
  // aborted, Error for a malformed request).
  void serve();
  // Fails serve() from any thread.
  void abort(const std::string& reason) { group_->abort(reason); }

 private:
  struct Request;
  std::shared_ptr<Request> post_headers(uint64_t seq);
  void check_headers(const Request& q) const;
  void post_data(Request& q);
  void answer(Request& q);

  std::shared_ptr<comm::Group> group_;
  const int clients_;
  const int shard_;
  const std::chrono::milliseconds idle_timeout_;
  std::map<uint64_t, ShardState> state_;  // by bucket key (update on shards)
};

}  // namespace dsgd::strategy
