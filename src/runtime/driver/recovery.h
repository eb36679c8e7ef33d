// The recovery from a lost worker: abort the old generation, find and evict the lost workers,
// put ready standbys in their places (else go on with the survivors, or with
// wait_for_replacements wait for new ones), re-form the group under a new generation, and restore
// the snapshot everywhere or, where recovery.from_peer allows, let a survivor's state stand.
// Between chunks and calls, grows back to num_workers. Counts every failure against
// recovery.max_failures, and keeps the RecoveryEvents the current call reports. A part of the
// driver's Job (runtime/driver/job.h).
#pragma once

#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dsgd/runtime/trainer.h"
#include "runtime/driver/failure_budget.h"
#include "runtime/driver/group_formation.h"

namespace dsgd::runtime {

class Job;

class Recovery {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Recovery(Job& job);

  // Inside a catch block: a recoverable failure (a CommError) re-forms the job; anything else
  // leaves the trainer broken (workers told to stop) and is rethrown.
  void recover_or_rethrow(const std::exception& e);
  // Between chunks and calls: tends the pool (lost processes reaped, newcomers set up, new ones
  // started) and, below num_workers, grows back with the workers set up since (new processes in
  // local mode, spawned with back-off); a failure on the way is recovered from like any call's.
  void try_scale_up();

  // A recovery's steps a driver's restart takes too. drain: waits until every member is idle or
  // known lost, noting the lost ones in *ev (returned). replace_lost: evicts them, promotes
  // standbys to their places (or drops them), starts new processes and, with
  // wait_for_replacements, waits for them.
  std::vector<int> drain(Clock::time_point detected, RecoveryEvent* ev);
  void replace_lost(const std::vector<int>& lost, const std::string& failure, RecoveryEvent* ev);
  // Whether a replica's state is all a job's state (a survivor can give it whole): allreduce or
  // simple, one device a worker, no ZeRO, compression or forward overlap.
  bool replicas_hold_whole_state() const;

  FailureBudget& failures() { return failures_; }
  // The current call's events: the first call's begin with the start-up's (begin_call).
  void begin_call() { events_ = std::exchange(start_events_, {}); }
  std::vector<RecoveryEvent>& events() { return events_; }
  // An event of the start-up (or of a driver's restart), reported by the next call.
  void add_start_event(RecoveryEvent ev) { start_events_.push_back(std::move(ev)); }
  // The recoveries so far happened during the start-up: they go to the first call's report.
  void move_to_start_up();

 private:
  // The protocol, attempt after attempt while workers are lost during it.
  void recover(std::string failure);
  // One attempt, its phases appended to *phases: throws if another worker is lost meanwhile.
  // *from_peer: whether this attempt may take a survivor's state (find_donor); false once an
  // attempt restored the snapshot (survivors part-way through it hold older states).
  RecoveryEvent reform(const std::string& failure, Phases* phases, Clock::time_point detected, bool* from_peer);
  // After the drain of a loss during a chunk: the survivors' positions, whose furthest sets
  // ev->rolled_back_steps for a restore of the snapshot (the lost worker's last report may lag).
  // Returns, where `allowed` (recovery.from_peer), the survivor whose state the others take:
  // only where every survivor's last call ended at a step's end (none torn), and where
  // replicas_hold_whole_state; nullopt otherwise. Where it trained the chunk to its end, the
  // retry trains nothing and takes the survivors' replies (Donor::completed). Between calls (no
  // chunk in flight: a loss in a validation, a snapshot, a checkpoint's read), any survivor,
  // where the members are settled and every survivor is at one position; nothing is redone.
  std::optional<Donor> find_donor(const std::vector<int>& lost, bool allowed, RecoveryEvent* ev);
  // try_scale_up's step: the event, or nullopt if nothing changed.
  std::optional<RecoveryEvent> scale_up();
  // New workers started (local mode) and waited for, up to replacement_timeout, until `target` are
  // members or ready; then the ready ones join, up to num_workers. `whoever_comes`: wait the whole
  // timeout for workers that join by themselves, not only for the processes this driver started.
  void take_in_replacements(int target, bool whoever_comes);

  Job& job_;
  FailureBudget failures_;                   // every lost worker, against recovery.max_failures
  std::vector<RecoveryEvent> events_;        // of the current call
  std::vector<RecoveryEvent> start_events_;  // of the start-up, reported by the first call
};

}  // namespace dsgd::runtime
