// The job's snapshots on disk (runtime/driver/job_checkpoints.h).
#include "runtime/driver/job_checkpoints.h"

#include <chrono>
#include <filesystem>

#include "dsgd/common/error.h"
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

void JobCheckpoints::persist(int64_t epoch, int64_t batch, int64_t batches_per_epoch) {
  const auto& config = job_.config;
  if (config.checkpoints.dir.empty()) return;
  const auto t0 = Clock::now();
  collect(false);
  if (!writer_) writer_ = std::make_unique<CheckpointWriter>(config.checkpoints.dir, config.checkpoints.keep);
  std::string pickle = job_.state.model_pickle();  // a recovery restores the snapshot
  const int64_t step = epoch * batches_per_epoch + batch;
  if (writer_->busy()) control::log().debug("trainer: checkpoint of step {} waits for the last one's write", step);
  writer_->submit({.step = step, .steps_done = job_.steps_done, .batches_per_epoch = batches_per_epoch},
                  {header(epoch, batch), job_.state.snapshot(), job_.state.feedback()},
                  std::move(pickle));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  control::log().debug("trainer: checkpoint of step {} handed to its writer in {:.3f} s", step, s);
  job_.state.add_call_seconds(s);
}

void JobCheckpoints::collect(bool wait) {
  if (!writer_) return;
  const auto& config = job_.config;
  for (const auto& done : writer_->take(wait)) {
    const int64_t step = done.job.step;
    if (done.error.empty()) {
      last_ = done.path;
      control::log().debug("trainer: checkpoint {} written in {:.3f} s", last_, done.seconds);
      job_.restart.checkpoint_written(last_, done.job.steps_done, done.job.batches_per_epoch);
      continue;
    }
    if (config.checkpoints.fail_on_write_error) throw DataError(config.checkpoints.dir, done.error);
    ++call_failures_;
    ++total_failures_;
    std::error_code ec;
    const auto space = std::filesystem::space(config.checkpoints.dir, ec);
    const double mib = 1.0 / (1 << 20);
    control::log().warn(
        "trainer: checkpoint of step {} NOT written: {} (it takes {:.1f} MiB; {}). Training goes on; the "
        "newest checkpoint on disk is {}; the next snapshot tries again. Make room in {}, or set "
        "checkpoints.fail_on_write_error (--fail-on-checkpoint-error) to stop the job instead",
        step, done.error, static_cast<double>(done.bytes) * mib,
        ec ? std::string("free space unknown") : fmt::format("{:.1f} MiB free there", space.available * mib),
        last_.empty() ? std::string("none of this job's") : last_, config.checkpoints.dir);
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
  job_.recovering([&] {
    bytes = 0;
    for (const auto& r : job_.raw_call(read)) bytes += r.share().bytes();
  });
  const auto t1 = Clock::now();
  job_.recovering([&] { job_.state.take(); });  // what a recovery restores
  const auto s = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  control::log().debug("trainer: loaded {} ({} bytes read by the workers) in {:.3f} s: read {:.3f} s, snapshot "
                       "{:.3f} s",
                       path, bytes, s(t0, Clock::now()), s(t0, t1), s(t1, Clock::now()));
}

}  // namespace dsgd::runtime
