// Trainer's save and load: a checkpoint directory written from the members' state, and one read
// back into them (dsgd/runtime/trainer.h; the files: runtime/driver/checkpoint.h).
#include <chrono>
#include <string>
#include <vector>

#include "dsgd/common/error.h"
#include "dsgd/runtime/trainer.h"
#include "control/log.h"
#include "runtime/driver/checkpoint.h"
#include "runtime/driver/trainer_impl.h"

namespace dsgd {
namespace {

using Clock = std::chrono::steady_clock;

// "saved DIR (N bytes of state) in S s: read R s, written W s", the times from t0 and t1 to now.
void log_timed(const char* what, const std::string& path, size_t bytes, Clock::time_point t0, Clock::time_point t1,
               const char* second) {
  const auto s = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const auto t2 = Clock::now();
  control::log().debug("trainer: {} {} ({} bytes of state) in {:.3f} s: read {:.3f} s, {} {:.3f} s", what, path, bytes,
                       s(t0, t2), s(t0, t1), second, s(t1, t2));
}

}  // namespace

void Trainer::save(const std::string& path) {
  auto& d = *impl_;
  const auto t0 = Clock::now();
  Feedback feedback;
  std::string state = d.recovering([&] { return d.read_state(&feedback); });
  d.snapshot = state;  // as good as a snapshot: the state now
  d.snapshot_feedback = feedback;
  d.snapshots->reset();
  d.snapshots->resized(state.size());
  auto pickle = d.call(command(&proto::Command::mutable_get_pickle), true);
  auto pos = d.call(command(&proto::Command::mutable_position), true);
  const proto::Position& p = pos[0].position();
  const auto t1 = Clock::now();
  runtime::Checkpoint c{d.checkpoint_header(p.epoch(), p.batch()), std::move(state), std::move(feedback)};
  runtime::write_checkpoint(path, c, pickle[0].pickle().pickle());
  log_timed("saved", path, c.state.size(), t0, t1, "written");
}

void Trainer::load(const std::string& path) {
  const auto t0 = Clock::now();
  std::vector<std::string> skipped;
  runtime::Checkpoint c = runtime::read_checkpoint_at(path, &skipped);
  const auto t1 = Clock::now();
  for (const auto& s : skipped) control::log().warn("trainer: passed over a damaged checkpoint: {}", s);
  const auto field = c.header.find("operator");
  const std::string op = field != c.header.end() && field->is_string() ? field->get<std::string>() : "";
  if (op != impl_->op_name) {
    throw ConfigError(path + ": the checkpoint is of operator '" + op + "', this trainer runs '" + impl_->op_name +
                      "'");
  }
  impl_->recovering([&] { impl_->send_state(c.state, c.feedback); });
  log_timed("loaded", path, c.state.size(), t0, t1, "sent to the workers");
  impl_->snapshot = c.state;
  impl_->snapshot_feedback = c.feedback;
  impl_->snapshots->reset();
  impl_->snapshots->resized(c.state.size());
  if (impl_->driver_state) {  // a driver's restart goes on from here, until the next checkpoint
    impl_->first_epoch = c.header.value("epoch", int64_t{0});
    impl_->restart_checkpoint = path;
    impl_->checkpoint_steps = impl_->steps_done;
    impl_->save_driver_state();
  }
}

}  // namespace dsgd
