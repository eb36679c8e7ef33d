// The communication group of the job's members: the job's start (registration, every replica's
// set-up, the first group and the first snapshot, given to replicas that did not set up equal)
// and each new generation (every member connects; a formation that fails while every member
// lives is formed again; the members then restore the snapshot or take a survivor's state). A
// part of the driver's Job (runtime/driver/job.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dsgd::proto {
class CommandResult;
}  // namespace dsgd::proto

namespace dsgd::runtime {

class Job;

// RecoveryEvent::phases as a recovery goes: mark(name) appends the seconds since the last mark
// (or since construction). Records nothing without a list.
using Phases = std::vector<std::pair<std::string, double>>;
class PhaseClock {
 public:
  using Clock = std::chrono::steady_clock;
  explicit PhaseClock(Phases* phases) : phases_(phases) {}
  void mark(const char* name) {
    const auto now = Clock::now();
    if (phases_ != nullptr) phases_->emplace_back(name, std::chrono::duration<double>(now - since_).count());
    since_ = now;
  }

 private:
  Phases* phases_;
  Clock::time_point since_ = Clock::now();
};

// A survivor whose state the others take in a new generation (Recovery: recovery.from_peer).
struct Donor {
  int id = -1;
  std::pair<int64_t, int64_t> at;  // its position (epoch, batch)
  std::vector<int> current;        // survivors at that position: they keep their state
  int64_t kept = 0;                // steps of the chunk in flight it completed
  bool completed = false;          // all of them: TrainRequest.results_only
};

class GroupFormation {
 public:
  explicit GroupFormation(Job& job) : job_(job) {}

  // The job's start. A worker lost before every replica is set up (local mode) costs a restart
  // of every process; lost after, it is an ordinary recovery (but a lone local worker without a
  // standby, which is started again). Both count as failures, reported by the first call.
  void start_up();
  // A new generation: `joining` (set up, from WorkerPool::ready) join the members, and everyone
  // restores the snapshot; or, given a donor, the members not at its position take its state
  // (TrainChunks::resume with its kept steps). Marks its phases on *clock if given.
  void form(const std::vector<int>& joining, PhaseClock* clock = nullptr, const Donor* donor = nullptr);
  // Every member joins the group of the current generation ("connect"). A formation that fails
  // (a connection refused, garbage from a peer, a timeout) while every member is alive is
  // aborted and formed again under the next generation, at most kFormationAttempts times; then
  // the job fails naming every attempt. A member lost meanwhile is rethrown, for the recovery.
  void connect();
  // True if every member's process is known alive: not evicted, exited or silent.
  bool members_alive();
  // Strategy ps with shard processes: tells them the generation to join (runtime/ps_server_process.h).
  void announce_to_servers(const std::string& generation_or_state);

 private:
  static constexpr int kFormationAttempts = 3;
  // Registration and setup: false when a lost worker restarted every process (go round again).
  bool set_up_members();
  // The first group and the first snapshot, given to every replica unless all set up equal;
  // `recover`: a lost worker is recovered from (else the CommError is thrown).
  void form_first_group(bool recover);
  // The workers this driver started (all on its machine) against `available` bytes
  // (runtime/driver/memory_check.h): ConfigError where they would not fit; logged where they do.
  void check_members_memory(const std::vector<proto::CommandResult>& setups, int64_t available) const;
  // Throws ConfigError naming the first line where worker `worker`'s model signature differs.
  void check_same_model(int worker, const std::string& sig) const;
  // Kills and starts again every process the driver started, after `failure` (kind "restart");
  // beyond max_failures the job fails naming every failure.
  void restart_every_worker(const std::string& failure);
  // The donor's state into the receivers (worker ids), peer to peer over the job's group where
  // the strategy has a broadcast (allreduce: ShareStateRequest), else through the driver.
  void share_state(int donor, const std::vector<int>& receivers);

  Job& job_;
  // Every member's replicas set up holding the same parameters and buffers (SetupReply's
  // start_digest): the start-up snapshot is not sent back to them.
  bool start_equal_ = false;
};

}  // namespace dsgd::runtime
