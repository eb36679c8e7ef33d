// A driver that restarts in place (TrainerConfig::recovery.driver_state_dir): what a driver keeps
// on disk as the job goes (runtime/driver/driver_state.h: its members, generation, keys and the
// checkpoint to go on from), and how a driver started again with it takes the job up: the old
// driver's workers, which waited for it (recovery.driver_grace), are adopted under their old
// ids, those that did not wait are evicted and replaced as after any loss, and the group is
// re-formed under a new generation: the workers go on from where they stand where every one came
// back at one step's end, else from the newest checkpoint. A part of the driver's Job
// (runtime/driver/job.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dsgd/runtime/trainer.h"
#include "control/driver_service.h"
#include "runtime/driver/driver_state.h"
#include "runtime/driver/group_formation.h"

namespace dsgd::runtime {

class Job;

class DriverRestart {
 public:
  using Clock = std::chrono::steady_clock;
  explicit DriverRestart(Job& job) : job_(job) {}

  // With recovery.driver_state_dir: the state file, checkpoints.dir set if empty (snapshots go
  // to disk), and the state of a lost driver of the same job to take up, if any.
  std::optional<DriverState> open(const proto::JobSpec& job);
  // The control plane's server; taking a lost driver's job up (`previous`), at its address, with
  // command numbers beyond its, and its workers known as registered from the first call on.
  void start_server(control::DriverServerOptions* options, const std::optional<DriverState>& previous);
  // The state of a driver lost mid-job: adopt its workers, evict those that did not wait, restore
  // its newest checkpoint everywhere under a new generation (a RecoveryEvent of kind
  // "driver_restart" for the first call, timed from `started`, this driver's start). False, its
  // workers evicted, where the lost driver had written no checkpoint yet: the job starts anew.
  bool resume(const DriverState& previous, Clock::time_point started);

  bool enabled() const { return file_ != nullptr; }
  // Writes the driver's state; one that cannot be written is warned about (the job goes on, but
  // a restart would find less).
  void save();
  void touch() const;  // for a successor: this driver is alive
  void ended();        // its workers are told to stop: nothing for a later driver to take up
  // What a restart goes on from: a checkpoint written (`steps` done there, `batches_per_epoch`
  // where known, else 0), or one load()ed at `epoch`.
  void checkpoint_written(const std::string& path, int64_t steps, int64_t batches_per_epoch);
  void loaded(const std::string& path, int64_t epoch);
  std::optional<JobPosition> restarted_at() const { return restarted_at_; }

 private:
  struct Survivors {
    int64_t steps = 0;               // the furthest any trained past the checkpoint
    std::pair<int64_t, int64_t> at;  // where they stand (epoch, batch), when together
    bool together = false;           // every one at one step's end, none torn
  };
  // The old driver's members and standbys into the pool (their processes watched by pid where
  // it started them).
  void adopt_workers(const DriverState& previous);
  // The steps the members (but `lost`) trained past the checkpoint at (epoch, batch).
  Survivors survivors_past(const std::vector<int>& lost, int64_t epoch, int64_t batch);
  // Every member back and together: the group re-formed with nobody restored, their state the
  // snapshot and the newest checkpoint.
  void go_on_from_members(const Survivors& members, PhaseClock* clock);
  // The event recorded (`none_back`: no old worker answered, so those steps are unknown).
  void resumed(RecoveryEvent ev, Clock::time_point started, bool none_back);
  // When none of the old workers answered: start the job's processes again (the driver starts
  // its workers) and restore the checkpoint into them.
  void restart_without_workers(const std::string& why);

  Job& job_;
  std::unique_ptr<DriverStateFile> file_;
  std::string fingerprint_;       // of the job spec
  int64_t restarts_ = 0;          // drivers before this one that took the job up
  int64_t first_epoch_ = 0;       // where the job began (a load()ed checkpoint's epoch)
  std::string checkpoint_;        // what a restart goes on from: the newest checkpoint, or a load()ed one
  int64_t checkpoint_steps_ = 0;  // steps_done there
  int64_t checkpoint_bpe_ = 0;    // batches per epoch, where known (0: not yet)
  std::optional<JobPosition> restarted_at_;
};

}  // namespace dsgd::runtime
