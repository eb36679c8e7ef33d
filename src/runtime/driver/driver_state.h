// What a driver keeps on disk so that a driver started again in its place goes on with its
// workers (TrainerConfig::recovery.driver_state_dir): <dir>/driver.json, the job's address, keys,
// members and generation, and where its newest snapshot is (a checkpoint). Rewritten atomically
// whenever one of those changes, readable by its owner only (it holds the job's token and keys),
// and touched about once a second while the driver lives, so that its successor can tell how
// long the job stood still. Torch-free.
//
//   DriverStateFile file(dir);
//   if (auto previous = file.resumable(job_fingerprint(spec))) { ... adopt previous->workers ... }
//   file.write(state);      // after each formation and each checkpoint
//   file.touch();           // on the driver's tick (the file's time set at most once a second)
//   file.write_ended();     // at the job's end: nothing to go on with
//
// Not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsgd::proto {
class JobSpec;  // dsgd/control.pb.h
}  // namespace dsgd::proto

namespace dsgd::runtime {

struct DriverState {
  std::string job;             // job_fingerprint of the job spec: a restart with other settings is refused
  int64_t driver_pid = 0;      // the driver that wrote it (one still running owns the directory)
  std::string address;         // HOST:PORT the driver listened on: where its workers call
  std::string token;
  std::string tls_keys;        // control::encode_keys of the job's keys; "" without TLS
  int64_t generation = 0;      // of the group last formed
  int64_t restarts = 0;        // drivers that took the job up from this file so far
  int64_t next_spawn_index = 0;
  std::string signature;       // of the members' models (SetupReply)
  int64_t parameters = 0;
  struct Worker {
    int64_t id = -1;           // its index with the driver
    int64_t spawn_index = -1;
    int64_t pid = 0;           // as it registered
    bool started = false;      // the driver started its process (launcher local): watched by pid
    std::string host;          // as it registered
    std::string address;
    int pseudo_host = -1;      // launch.local_hosts > 1: the pseudo-host it counts for
    bool member = true;        // false: a ready standby
  };
  std::vector<Worker> workers;  // the members in rank order, then the ready standbys
  std::string checkpoint;       // the checkpoint to go on from: the newest of the job's snapshots
  int64_t checkpoint_steps = 0; // steps the job had trained at that checkpoint (since first_epoch)
  int64_t first_epoch = 0;      // the epoch the job began at (0, or a load()ed checkpoint's)
  int64_t batches_per_epoch = 0; // at that checkpoint; 0 where not known yet
  bool ended = false;           // the job ended: a driver started with this directory starts a new one
  // When the driver was last known alive (the file's modification time), for the successor.
  std::chrono::system_clock::time_point last_alive{};
};

// A fingerprint of what a job computes (its spec less the recovery settings, which a restart
// may change), to tell a restart of the same job.
std::string job_fingerprint(const proto::JobSpec& spec);

class DriverStateFile {
 public:
  explicit DriverStateFile(std::string dir);

  // The state a driver should take up: nullopt when the directory holds none, or that of a job
  // that ended. ConfigError when it is another job's (another fingerprint), when the driver that
  // wrote it still runs, or when the file cannot be read (naming the file and what to do).
  std::optional<DriverState> resumable(const std::string& job) const;
  // Writes `state` (atomically, mode 0600); DataError when it cannot.
  void write(const DriverState& state);
  // Marks the last state written ended (a no-op before any write).
  void write_ended();
  // Sets the file's time to now, at most once a second; failures are ignored (the next try).
  void touch();
  std::string path() const;

 private:
  std::string dir_;
  std::optional<DriverState> last_;
  std::chrono::steady_clock::time_point touched_{};
};

}  // namespace dsgd::runtime
