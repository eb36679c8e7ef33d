// The job's snapshot and its state's transfers (runtime/driver/job_state.h).
#include "runtime/driver/job_state.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "dsgd/common/error.h"
#include "dsgd/torch/operator.h"
#include "control/log.h"
#include "runtime/checkpoint/sharded_checkpoint.h"
#include "runtime/driver/job.h"
#include "torch/replica/replica.h"

namespace dsgd::runtime {

using Clock = std::chrono::steady_clock;

JobState::JobState(Job& job) : job_(job), policy_(job.config) {}

JobState::~JobState() = default;

void JobState::send(const std::string& state, const Feedback& feedback, std::vector<int> targets) {
  if (targets.empty()) targets = job_.pool->members();
  for (size_t at = 0; at < state.size(); at += kChunkBytes) {
    proto::Command piece;
    piece.mutable_state_chunk()->set_offset(at);
    piece.mutable_state_chunk()->set_data(state.data() + at, std::min(kChunkBytes, state.size() - at));
    job_.raw_call(piece, targets);
  }
  proto::Command c;
  auto* set = c.mutable_set_state();  // loads what the pieces carried
  for (const auto& [rank, bytes] : feedback) (*set->mutable_feedback())[rank] = bytes;
  job_.raw_call(c, targets);
}

std::string JobState::fetch(int member) {
  proto::Command c;
  c.mutable_get_state()->set_chunk_bytes(kChunkBytes);
  auto first = std::move(*job_.raw_call(c, {member})[0].mutable_state());
  std::string state = std::move(*first.mutable_state());
  state.reserve(first.total());
  while (state.size() < first.total()) {
    proto::Command read;
    read.mutable_read_state()->set_offset(state.size());
    read.mutable_read_state()->set_bytes(kChunkBytes);
    const auto piece = job_.raw_call(read, {member});
    if (piece[0].state().state().empty()) {
      throw Error("worker " + std::to_string(member) + "'s state read stalled at byte " + std::to_string(state.size()));
    }
    state += piece[0].state().state();
  }
  return state;
}

std::string JobState::model_pickle() {
  if (job_.config.step.zero_stage == 3) {  // the first member's parameters whole, until the pickle is made
    proto::Command gather;
    gather.mutable_gather_state()->set_keep(job_.pool->members().at(0));
    job_.raw_call(gather);
  }
  auto reply = job_.call(command(&proto::Command::mutable_get_pickle), true);
  return std::move(*reply[0].mutable_pickle()->mutable_pickle());
}

std::string JobState::read(Feedback* feedback) {
  // The optimizer state lives split over the servers (ps) or the replicas (zero): made whole
  // in the member whose state is read.
  const auto& config = job_.config;
  const int first = job_.pool->members().at(0);
  if (config.ps.update_on_shards || config.strategy == Strategy::kPsAsync || config.step.zero_stage > 0) {
    proto::Command gather;
    gather.mutable_gather_state()->set_keep(first);
    job_.raw_call(gather);
  }
  if (feedback != nullptr) {
    feedback->clear();
    if (config.comm.compression != Compression::kNone) {
      for (auto& r : job_.raw_call(command(&proto::Command::mutable_get_feedback))) {
        for (auto& [rank, bytes] : *r.mutable_feedback()->mutable_feedback()) (*feedback)[rank] = std::move(bytes);
      }
    }
  }
  return fetch(first);
}

void JobState::take(bool before_steps) {
  const auto t0 = Clock::now();
  Feedback feedback;
  snapshot_ = read(&feedback);
  feedback_ = std::move(feedback);
  size_t bytes = snapshot_.size();
  for (const auto& [rank, b] : feedback_) bytes += b.size();
  policy_.taken(std::chrono::duration<double>(Clock::now() - t0).count(), bytes, before_steps);
  call_s_ += policy_.cost_s();
  control::log().debug("trainer: snapshot of {} bytes in {:.3f} s", snapshot_.size(), policy_.cost_s());
}

bool JobState::take_or_recover() {
  while (true) {
    try {
      take();
      return true;
    } catch (const std::exception& e) {
      job_.recovery.recover_or_rethrow(e);
    }
    // From a survivor the members stand where the chunk left them: the snapshot again. From the
    // last snapshot they went back to the chunk's start.
    const auto& events = job_.recovery.events();
    if (events.empty() || !events.back().from_peer) return false;
  }
}

void JobState::flush() {
  if (policy_.pending() > 0) job_.recovering([&] { take(); });
}

void JobState::replay() {
  const auto to = policy_.replay_to();
  for (int guard = 0; policy_.pending() > 0 && guard < 1000; ++guard) {
    const auto at =
        job_.raw_call(command(&proto::Command::mutable_position), {job_.pool->members().at(0)})[0].position();
    const std::pair<int64_t, int64_t> now{at.epoch(), at.batch()};
    if (now >= to) return;
    // To the end of the epoch (max_batches 0), or to the batch within it.
    const int64_t batches = now.first < to.first ? 0 : to.second - now.second;
    proto::Command train;
    train.mutable_train()->set_max_batches(batches);
    job_.raw_call(train);
  }
}

void JobState::set(std::string state, Feedback feedback) {
  snapshot_ = std::move(state);
  feedback_ = std::move(feedback);
  policy_.reset();
  policy_.resized(snapshot_.size());
}

std::shared_ptr<torch::nn::Module> JobState::model(size_t index) {
  // Read as a snapshot is: under zero the optimizers' state is made whole first, so the state
  // loads into a replica of its own (whose optimizers hold every parameter).
  const std::string state = job_.recovering([&] { return read(nullptr); });
  local().load_state(state);
  const auto& models = local_->op().models();
  if (index >= models.size()) {
    throw ConfigError("get_model(" + std::to_string(index) + "): the operator registered " +
                      std::to_string(models.size()) + " model(s)");
  }
  return models[index];
}

torch_glue::ReplicaRuntime& JobState::local() {
  if (!local_) {
    const auto& config = job_.config;
    torch_glue::ReplicaOptions o;
    o.global_batch = config.batch_size;
    o.seed = config.seed;
    o.info.seed = config.seed;
    o.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    local_ = std::make_unique<torch_glue::ReplicaRuntime>(make_operator(job_.op_name), o);
    local_->setup(config.config);
  }
  return *local_;
}

std::string JobState::whole_state(const std::string& sharded_dir, Feedback* feedback) {
  ShardReader reader(sharded_dir);
  check_share_files(sharded_dir, reader.manifest());
  local().read_share(reader);
  feedback->clear();
  for (int rank = 0; rank < reader.world(); ++rank) {
    const std::string name = "feedback/" + std::to_string(rank);
    if (reader.has_blob(name)) (*feedback)[rank] = reader.blob(name);
  }
  return local_->save_state();
}

}  // namespace dsgd::runtime
