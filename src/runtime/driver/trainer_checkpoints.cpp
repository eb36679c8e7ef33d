// Trainer's save and load: a checkpoint directory written from the members' state, and one read
// back into them (dsgd/runtime/trainer.h; the files: runtime/driver/checkpoint.h).
#include <chrono>
#include <string>
#include <vector>

#include "dsgd/common/error.h"
#include "dsgd/runtime/trainer.h"
#include "control/log.h"
#include "runtime/checkpoint/sharded_checkpoint.h"
#include "runtime/driver/checkpoint.h"
#include "runtime/driver/job.h"

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

void check_operator(const nlohmann::json& header, const std::string& path, const std::string& runs) {
  const auto field = header.find("operator");
  const std::string op = field != header.end() && field->is_string() ? field->get<std::string>() : "";
  if (op != runs) {
    throw ConfigError(path + ": the checkpoint is of operator '" + op + "', this trainer runs '" + runs + "'");
  }
}

// Every member loads checkpoint directory `dir` (either format); DataError naming the file where
// it is damaged.
void load_checkpoint(runtime::Job& d, const std::string& dir) {
  if (runtime::is_sharded_checkpoint(dir)) {
    const nlohmann::json header = runtime::read_manifest(dir).at("header");
    check_operator(header, dir, d.op_name);
    d.checkpoints.load_sharded(dir);
    d.restart.loaded(dir, header.value("epoch", int64_t{0}));
    return;
  }
  const auto t0 = Clock::now();
  runtime::Checkpoint c = runtime::read_checkpoint(dir);
  const auto t1 = Clock::now();
  check_operator(c.header, dir, d.op_name);
  d.recovering([&] { d.state.send(c.state, c.feedback); });
  log_timed("loaded", dir, c.state.size(), t0, t1, "sent to the workers");
  d.state.set(std::move(c.state), std::move(c.feedback));
  // A driver's restart goes on from here, until the next checkpoint.
  d.restart.loaded(dir, c.header.value("epoch", int64_t{0}));
}

}  // namespace

void Trainer::save(const std::string& path) {
  auto& d = *job_;
  if (d.checkpoints.save_sharded(path)) return;
  const auto t0 = Clock::now();
  runtime::Feedback feedback;
  std::string state = d.recovering([&] { return d.state.read(&feedback); });
  d.state.set(state, feedback);  // as good as a snapshot: the state now
  const std::string pickle = d.state.model_pickle();
  auto pos = d.call(runtime::command(&proto::Command::mutable_position), true);
  const proto::Position& p = pos[0].position();
  const auto t1 = Clock::now();
  runtime::Checkpoint c{d.checkpoints.header(p.epoch(), p.batch()), std::move(state), std::move(feedback)};
  runtime::write_checkpoint(path, c, pickle);
  log_timed("saved", path, c.state.size(), t0, t1, "written");
}

void Trainer::load(const std::string& path) {
  auto& d = *job_;
  // A checkpoint directory, or a root: its newest intact step-* one (either format).
  runtime::load_first_intact(
      path, [&](const std::string& dir) { load_checkpoint(d, dir); },
      [](const std::string& s) { control::log().warn("trainer: passed over a damaged checkpoint: {}", s); });
}

}  // namespace dsgd
