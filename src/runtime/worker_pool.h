// The driver's workers: which registered workers form the current group (members, in rank
// order) and, in local mode, the processes behind them: the job's first workers, spread over
// pseudo-hosts, and replacements for lost ones, spawned with exponential back-off. Trainer's
// recovery protocol (trainer_recovery.cpp) decides when; this decides who and where. Torch-free.
//
//   WorkerPool pool(config, server, binary, token);
//   pool.spawn_initial();                       // local mode
//   server.wait_registered(timeout, [&] { pool.check_children(); });
//   pool.set_members(server.alive());
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsgd/trainer.h"
#include "runtime/control/driver_service.h"
#include "runtime/spawn.h"

namespace dsgd::runtime {

class WorkerPool {
 public:
  // `binary` and `token`: what spawned workers run, and the job token they get. Keeps references
  // to `config` and `server`, which must outlive the pool.
  WorkerPool(const TrainerConfig& config, control::DriverServer& server, std::string binary, std::string token);

  bool local() const { return config_.listen.empty(); }  // the driver spawns its workers

  const std::vector<int>& members() const { return members_; }
  bool is_member(int id) const;
  void set_members(std::vector<int> ids) { members_ = std::move(ids); }
  void add_members(const std::vector<int>& ids) { members_.insert(members_.end(), ids.begin(), ids.end()); }
  // Takes worker `id` out of the group; in local mode its process (`pid`) is killed.
  void drop(int id, pid_t pid);
  // Where every member sits in `generation`: its position among the members, in order.
  proto::Placement placement(int64_t generation) const;

  // Local mode: num_workers workers, worker i on pseudo-host i % local_hosts, and the ps shard
  // processes (spawn_servers).
  void spawn_initial();
  // Local mode, strategy ps with shard processes: starts those not running (every one at first,
  // a lost one during recovery); shard s on pseudo-host s % local_hosts.
  void spawn_servers();
  // Local mode: true if process `pid` has exited (it is reaped).
  bool exited(pid_t pid);
  // Liveness of spawned workers, checked while waiting on them. A member's or a shard process's
  // exit throws CommError (the job recovers); a pending replacement's exit only defers the next
  // attempt. A worker that exits by itself before registering throws CommError with op()
  // "worker start" (a wrong binary or set-up: starting again would not help).
  void check_children();
  // Local mode, below num_workers: spawns the missing workers, unless some are still pending or
  // the back-off since a failed attempt has not passed.
  void spawn_replacements();
  bool replacements_pending() const { return !pending_.empty(); }
  // Registered workers not yet in the group: replacements, or in remote mode workers that joined
  // later. Pending replacements that ran past replacement_timeout are killed (and deferred).
  std::vector<int> newcomers();
  // Back to num_workers: the next failed attempt waits the initial back-off again.
  void reset_backoff() { backoff_ = std::chrono::milliseconds(1000); }
  // Shutdown: up to `grace_ms` for spawned workers to exit by themselves, then SIGKILL.
  void stop(int grace_ms);
  // Local mode, a start-up that lost a process: kills every spawned process (workers and shard
  // processes) and spawns them all again, as spawn_initial. Members are cleared.
  void restart();

 private:
  pid_t spawn_worker(int host = -1);
  int pseudo_host_for_next() const;
  void defer_replacements(const std::string& why);

  const TrainerConfig& config_;
  control::DriverServer& server_;
  const std::string binary_, token_;
  LocalProcesses children_;
  std::vector<int> members_;
  std::vector<pid_t> pending_;  // replacements spawned, not yet registered
  std::chrono::steady_clock::time_point pending_since_{}, next_spawn_{};
  std::chrono::milliseconds backoff_{1000};
  std::map<pid_t, int> pseudo_host_;  // local_hosts > 1: each spawned worker's pseudo-host
  std::map<pid_t, int> servers_;      // running ps shard processes: pid -> shard
};

}  // namespace dsgd::runtime
