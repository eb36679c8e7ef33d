// The driver's engine: one Job for each Trainer (dsgd/runtime/trainer.h), which turns each call
// into commands to the members. The Job holds what every part reads (the settings, the control
// plane's server, the pool of workers, the group's generation, the steps done) and its parts,
// each owning its own state and reaching the others through the Job:
//   state        JobState        the snapshot (the state at the last consistent point), transfers
//   group        GroupFormation  the job's start and each generation of the communication group
//   recovery     Recovery        a lost worker: the protocol, the failures, the events of a call
//   chunks       TrainChunks     a train() call's chunks: the one in flight, progress, traces
//   checkpoints  JobCheckpoints  snapshots on disk (checkpoints.dir)
//   monitor      JobMonitor      live figures for a scrape, the dashboard's history
//   stragglers   StragglerWatch  slow members named, cleared, evicted
//   restart      DriverRestart   what a driver keeps for one started in its place; taking a job up
// Private to the runtime's driver (runtime/driver/*.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsgd/runtime/trainer.h"
#include "control/driver_service.h"
#include "runtime/driver/driver_restart.h"
#include "runtime/driver/group_formation.h"
#include "runtime/driver/job_checkpoints.h"
#include "runtime/driver/job_monitor.h"
#include "runtime/driver/job_state.h"
#include "runtime/driver/recovery.h"
#include "runtime/driver/straggler_watch.h"
#include "runtime/driver/train_chunks.h"
#include "runtime/driver/worker_pool.h"
#include "runtime/launch/launcher.h"

namespace dsgd::runtime {

// A request without fields: command(&proto::Command::mutable_ping).
template <typename Request>
proto::Command command(Request* (proto::Command::*mutable_request)()) {
  proto::Command c;
  (c.*mutable_request)();
  return c;
}

class Job {
 public:
  using Clock = std::chrono::steady_clock;

  // `config` as validate_config left it; the Trainer's constructor starts the rest.
  Job(std::string op, TrainerConfig c) : op_name(std::move(op)), config(std::move(c)) {}
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // One command to every member (or `targets`); any failure throws. On its ticks the pool is
  // tended (lost processes reaped, standbys set up) and `extra_tick` runs.
  std::vector<proto::CommandResult> raw_call(const proto::Command& request, std::vector<int> targets = {},
                                             const std::function<void()>& extra_tick = {},
                                             std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  // A command that survives lost workers: on a recoverable failure the job is re-formed from the
  // last snapshot and the command is sent again. `first_only`: to the first live member.
  std::vector<proto::CommandResult> call(const proto::Command& request, bool first_only = false,
                                         const std::function<void()>& extra_tick = {});
  // f(), again after each recovery from a lost worker.
  template <typename F>
  auto recovering(F f) {
    ensure_usable();
    while (true) {
      try {
        return f();
      } catch (const std::exception& e) {
        recovery.recover_or_rethrow(e);
      }
    }
  }
  // Throws if the trainer was shut down or broken by an unrecoverable failure.
  void ensure_usable() const;
  // Leaves the trainer broken (workers told to stop) and throws Error(why).
  [[noreturn]] void fail(const std::string& why);
  bool tls() const { return !secrets.tls.empty(); }  // the control plane over mutual TLS

  const std::string op_name;
  TrainerConfig config;
  JobSecrets secrets;   // the token, and control::encode_keys of the TLS keys ("" without)
  std::string address;  // HOST:PORT the server listens on (Trainer::address)
  std::unique_ptr<control::DriverServer> server;
  std::unique_ptr<WorkerPool> pool;  // who is in the group; local mode: their processes
  int64_t parameters = 0;            // of one replica's models
  std::string signature;             // of the members' models (SetupReply): a newcomer's must match
  int64_t generation = 1;            // of the communication group; +1 per re-formation
  int64_t steps_done = 0;            // over the job's train() calls (RecoveryEvent::at_step)
  // Whether every member holds what the last command that changed a replica's state (train,
  // set_state, run, step_schedules, share_state) left in all of them: between calls a survivor's
  // state is then the job's (Recovery's donor). raw_call keeps it.
  bool members_settled = false;
  bool broken = false;
  bool stopped = false;

  // The parts, made last and destroyed first (the monitor's scrapes read the server).
  JobState state{*this};
  GroupFormation group{*this};
  Recovery recovery{*this};
  TrainChunks chunks{*this};
  JobCheckpoints checkpoints{*this};
  JobMonitor monitor{*this};
  StragglerWatch stragglers{*this};
  DriverRestart restart{*this};
};

}  // namespace dsgd::runtime
