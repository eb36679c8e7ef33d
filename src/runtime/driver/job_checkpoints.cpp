// The job's checkpoints on disk (runtime/driver/job_checkpoints.h).
#include "runtime/driver/job_checkpoints.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "dsgd/common/error.h"
#include "dsgd/runtime/trainer.h"
#include "control/log.h"
#include "runtime/checkpoint/sharded_checkpoint.h"
#include "runtime/driver/job.h"

namespace dsgd::runtime {

using Clock = std::chrono::steady_clock;

nlohmann::json JobCheckpoints::header(int64_t epoch, int64_t batch) const {
  // The operator's config and the seed: an evaluator (dsgd/runtime/evaluator.h) builds the same models.
  const auto& config = job_.config;
  return {{"epoch", epoch},
          {"batch", batch},
          {"operator", job_.op_name},
          {"operator_config", config.config},
          {"seed", config.seed},
          {"strategy", config.strategy.name()},
          {"num_workers", config.num_workers},
          {"devices_per_worker", config.devices_per_worker}};
}

JobCheckpoints::JobCheckpoints(Job& job) : job_(job) {
  const auto& c = job.config;
  // The ps servers' optimizer state would come back into the first member at every checkpoint
  // (a gather): those strategies keep the whole format's snapshot.
  const bool servers = c.ps.update_on_shards || c.strategy == Strategy::kPsAsync;
  by_workers_ = !c.checkpoints.dir.empty() && !servers;
  job.state.policy().checkpoints_by_workers(by_workers_);
  if (!c.checkpoints.dir.empty()) remove_unfinished_checkpoints(c.checkpoints.dir);  // of a driver killed mid-write
}

void JobCheckpoints::persist(int64_t epoch, int64_t batch, int64_t batches_per_epoch) {
  const auto& config = job_.config;
  if (config.checkpoints.dir.empty()) return;
  const auto t0 = Clock::now();
  const int64_t step = epoch * batches_per_epoch + batch;
  const CheckpointWriter::Job job{.step = step, .steps_done = job_.steps_done, .batches_per_epoch = batches_per_epoch};
  if (by_workers_) {
    const double waited = finish_by_workers();
    if (waited > 0) ++call_behind_;
    if (start_by_workers(epoch, batch, job)) {
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      call_waits_s_.push_back(s);
      job_.state.add_call_seconds(s);
      control::log().debug("trainer: checkpoint of step {} copied by the workers in {:.3f} s{}", step, s,
                           waited > 0 ? fmt::format(" ({:.3f} s of it waiting for the last one's write)", waited)
                                      : std::string());
      return;
    }
    by_workers_ = false;
    job_.state.policy().checkpoints_by_workers(false);
    control::log().info("trainer: a worker does not see {} (no storage shared with this driver): its checkpoints are "
                        "written whole, through this driver", config.checkpoints.dir);
    if (job_.state.policy().pending() > 0) job_.recovering([&] { job_.state.take(); });  // what it writes
  }
  collect(false);
  if (!writer_) writer_ = std::make_unique<CheckpointWriter>(config.checkpoints.dir, config.checkpoints.keep);
  std::string pickle = job_.state.model_pickle();  // a recovery restores the snapshot
  if (writer_->busy()) {
    ++call_behind_;
    control::log().debug("trainer: checkpoint of step {} waits for the last one's write", step);
  }
  writer_->submit(job, {header(epoch, batch), job_.state.snapshot(), job_.state.feedback()}, std::move(pickle));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  control::log().debug("trainer: checkpoint of step {} handed to its writer in {:.3f} s", step, s);
  call_waits_s_.push_back(s);
  job_.state.add_call_seconds(s);
}

bool JobCheckpoints::start_by_workers(int64_t epoch, int64_t batch, const CheckpointWriter::Job& job) {
  const auto& config = job_.config;
  InFlight f{job, "", header(epoch, batch), {}};
  const int64_t generation = job_.generation;
  f.header["zero_stage"] = config.step.zero_stage;
  try {
    f.tmp = sharded_temp_dir(checkpoint_path(config.checkpoints.dir, job.step));
  } catch (const DataError& e) {  // the root cannot be written: as a write that failed
    failed(job.step, e.what(), 0);
    return true;
  }
  proto::Command write;
  write.mutable_write_share()->set_dir(f.tmp);
  write.mutable_write_share()->set_spread(true);
  write.mutable_write_share()->set_background(true);
  bool seen = true;
  try {
    job_.recovering([&] {
      if (job_.generation != generation) return;  // recovered: the state is not this step's
      f.members = job_.pool->members();
      for (auto& r : job_.raw_call(write, f.members)) {
        seen = seen && r.share().visible();
        f.bytes += r.share().bytes();
      }
    });
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(f.tmp, ec);
    throw;
  }
  if (job_.generation != generation) {
    std::error_code ec;
    std::filesystem::remove_all(f.tmp, ec);
    failed(job.step, "a worker was lost while the shares were copied", 0, /*disk=*/false);
    return true;
  }
  if (!seen) {  // those that saw it started a write: waited for, then dropped
    job_.recovering([&] { job_.raw_call(command(&proto::Command::mutable_finish_share)); });
    std::error_code ec;
    std::filesystem::remove_all(f.tmp, ec);
    return false;
  }
  in_flight_ = std::move(f);
  return true;
}

double JobCheckpoints::finish_by_workers() {
  if (!in_flight_) return 0;
  const auto& config = job_.config;
  const InFlight f = std::move(*in_flight_);
  in_flight_.reset();
  std::vector<nlohmann::json> files;
  uint64_t bytes = 0;
  double waited = 0;
  std::string error;
  // Every member that started it, still here (a recovery or a scale-up may have come since).
  const auto here = [&] {
    const auto now = job_.pool->members();
    return std::all_of(f.members.begin(), f.members.end(),
                       [&](int id) { return std::find(now.begin(), now.end(), id) != now.end(); });
  };
  job_.recovering([&] {
    if (!here()) return;
    try {
      for (auto& r : job_.raw_call(command(&proto::Command::mutable_finish_share), f.members)) {
        if (!r.share().started()) throw DataError(f.tmp, "a worker has no share of it: it was restarted");
        bytes += r.share().bytes();
        waited = std::max(waited, r.share().waited_s());
        for (const auto& file : r.share().files()) files.push_back(nlohmann::json::parse(file));
      }
    } catch (const DataError& e) {  // a worker's disk: "No space left on device", named
      error = e.what();
    }
  });
  const std::string dir = checkpoint_path(config.checkpoints.dir, f.job.step);
  const bool lost = error.empty() && !here();
  if (lost) error = "a worker was lost while it was written";
  if (error.empty()) {
    try {
      commit_sharded_checkpoint(f.tmp, dir, make_manifest(f.header, files, static_cast<int>(files.size())), "");
      rotate_checkpoints(config.checkpoints.dir, config.checkpoints.keep);
    } catch (const Error& e) {  // the manifest's write or the rename (DataError), a share missing
      error = e.what();
    }
  }
  if (!error.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(f.tmp, ec);
    failed(f.job.step, error, std::max(bytes, f.bytes), !lost);
    return waited;
  }
  control::log().debug("trainer: checkpoint {} ({} bytes in {} shares) written by the workers", dir, bytes,
                       files.size());
  written(dir, f.job);
  return waited;
}

void JobCheckpoints::written(const std::string& path, const CheckpointWriter::Job& job) {
  last_ = path;
  job_.restart.checkpoint_written(last_, job.steps_done, job.batches_per_epoch);
}

void JobCheckpoints::failed(int64_t step, const std::string& error, uint64_t bytes, bool disk) {
  const auto& config = job_.config;
  if (config.checkpoints.fail_on_write_error) throw DataError(config.checkpoints.dir, error);
  ++call_failures_;
  ++total_failures_;
  if (!disk) {
    control::log().warn("trainer: checkpoint of step {} NOT written: {}. Training goes on; the newest checkpoint on "
                        "disk is {}; the next one is written by the group as it is now",
                        step, error, last_.empty() ? std::string("none of this job's") : last_);
    return;
  }
  std::error_code ec;
  const auto space = std::filesystem::space(config.checkpoints.dir, ec);
  const double mib = 1.0 / (1 << 20);
  control::log().warn(
      "trainer: checkpoint of step {} NOT written: {} ({}{}). Training goes on; the newest checkpoint on disk is "
      "{}; the next one tries again. Make room in {}, or set checkpoints.fail_on_write_error "
      "(--fail-on-checkpoint-error) to stop the job instead",
      step, error, bytes > 0 ? fmt::format("it takes {:.1f} MiB; ", static_cast<double>(bytes) * mib) : "",
      ec ? std::string("free space unknown") : fmt::format("{:.1f} MiB free there", space.available * mib),
      last_.empty() ? std::string("none of this job's") : last_, config.checkpoints.dir);
}

void JobCheckpoints::end_call(Results* r) {
  collect(/*wait=*/true);
  r->checkpoint_failures = call_failures_;
  r->checkpoint_waits_s = call_waits_s_;
  r->checkpoints_behind = call_behind_;
  if (call_behind_ == 0) return;
  control::log().info("trainer: {} of this call's {} checkpoints waited for the last one's write: the disk takes "
                      "longer than checkpoints.every_steps ({}) steps do; a larger interval keeps training from "
                      "waiting",
                      call_behind_, call_waits_s_.size(), job_.config.checkpoints.every_steps);
}

void JobCheckpoints::collect(bool wait) {
  if (wait) finish_by_workers();
  if (!writer_) return;
  for (const auto& done : writer_->take(wait)) {
    if (!done.error.empty()) {
      failed(done.job.step, done.error, done.bytes);
      continue;
    }
    control::log().debug("trainer: checkpoint {} written in {:.3f} s", done.path, done.seconds);
    written(done.path, done.job);
  }
}

bool JobCheckpoints::save_sharded(const std::string& path) {
  const auto& config = job_.config;
  const auto t0 = Clock::now();
  const std::string tmp = sharded_temp_dir(path);
  // The optimizer state on the ps servers comes back into the first member, which writes it (and,
  // with replicas that may differ, everything); ZeRO's shares are written where they are.
  const bool servers = config.ps.update_on_shards || config.strategy == Strategy::kPsAsync;
  try {
    std::vector<nlohmann::json> files;
    uint64_t bytes = 0;
    const bool seen = job_.recovering([&] {
      files.clear();
      bytes = 0;
      // Again after a recovery: the shares of a world that was, gone (a lost replica's among them).
      for (const auto& e : std::filesystem::directory_iterator(tmp)) std::filesystem::remove_all(e.path());
      if (servers) {
        proto::Command gather;
        gather.mutable_gather_state()->set_keep(job_.pool->members().at(0));
        job_.raw_call(gather);
      }
      proto::Command write;
      write.mutable_write_share()->set_dir(tmp);
      write.mutable_write_share()->set_spread(!servers);
      // model.pt from the first member itself, where its parameters are whole (stage 3: through here).
      write.mutable_write_share()->set_model_pt(config.step.zero_stage != 3);
      for (auto& r : job_.raw_call(write)) {
        if (!r.share().visible()) return false;
        bytes += r.share().bytes();
        for (const auto& f : r.share().files()) files.push_back(nlohmann::json::parse(f));
      }
      return true;
    });
    if (!seen) {
      std::filesystem::remove_all(tmp);
      control::log().info("trainer: a worker does not see {} (no storage shared with this driver): {} is written "
                          "whole, through this driver", tmp, path);
      return false;
    }
    const auto t1 = Clock::now();
    std::string pickle = config.step.zero_stage == 3 ? job_.state.model_pickle() : std::string();
    auto pos = job_.call(command(&proto::Command::mutable_position), true);
    nlohmann::json h = header(pos[0].position().epoch(), pos[0].position().batch());
    h["zero_stage"] = config.step.zero_stage;
    commit_sharded_checkpoint(tmp, path, make_manifest(std::move(h), files, static_cast<int>(files.size())), pickle);
    const auto s = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double>(b - a).count();
    };
    control::log().debug("trainer: saved {} ({} bytes in {} shares) in {:.3f} s: shares {:.3f} s, model.pt and "
                         "manifest {:.3f} s", path, bytes, files.size(), s(t0, Clock::now()), s(t0, t1),
                         s(t1, Clock::now()));
    return true;
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);
    throw;
  }
}

void JobCheckpoints::load_sharded(const std::string& path) {
  const auto t0 = Clock::now();
  check_share_files(path, read_manifest(path));
  proto::Command read;
  read.mutable_read_share()->set_dir(std::filesystem::absolute(path).string());
  uint64_t bytes = 0;
  std::optional<DataError> damaged;  // thrown here, not in recovering(): a damaged file breaks no job
  job_.recovering([&] {
    bytes = 0;
    try {
      for (const auto& r : job_.raw_call(read)) bytes += r.share().bytes();
    } catch (const DataError& e) {
      damaged = e;
    }
  });
  if (damaged) throw *damaged;
  const auto t1 = Clock::now();
  job_.recovering([&] { job_.state.take(); });  // what a recovery restores
  const auto s = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  control::log().debug("trainer: loaded {} ({} bytes read by the workers) in {:.3f} s: read {:.3f} s, snapshot "
                       "{:.3f} s",
                       path, bytes, s(t0, Clock::now()), s(t0, t1), s(t1, Clock::now()));
}

}  // namespace dsgd::runtime
