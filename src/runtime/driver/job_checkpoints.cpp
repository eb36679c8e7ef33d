// The job's snapshots on disk (runtime/driver/job_checkpoints.h).
#include "runtime/driver/job_checkpoints.h"

#include <chrono>
#include <filesystem>

#include "dsgd/common/error.h"
#include "control/log.h"
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

}  // namespace dsgd::runtime
