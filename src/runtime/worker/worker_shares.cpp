// A worker's side of sharded checkpoints (runtime/worker/worker_shares.h).
#include "runtime/worker/worker_shares.h"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <utility>

#include <torch/serialize.h>

#include "control/log.h"
#include "dsgd/torch/self_contained_model.h"
#include "runtime/checkpoint/model_file.h"
#include "runtime/checkpoint/sharded_checkpoint.h"
#include "torch/replica/replica.h"

namespace dsgd::runtime {

using Clock = std::chrono::steady_clock;

std::string model_pickle(const Replicas& replicas) {
  auto& first = *replicas.at(0);
  if (const auto* whole = dynamic_cast<const SelfContainedModel*>(&first.op().model(0))) return whole->model_file();
  c10::Dict<std::string, at::Tensor> dict;  // CPU tensors as they are: no step runs while this does
  for (auto& [name, t] : first.named_tensors()) dict.insert(name, t.detach().to(torch::kCPU));
  const auto bytes = torch::pickle_save(dict);
  return std::string(bytes.begin(), bytes.end());
}

proto::ShareReply write_shares(const Replicas& replicas, const proto::WriteShareRequest& in) {
  proto::ShareReply out;
  std::error_code ec;
  out.set_visible(std::filesystem::is_directory(in.dir(), ec));
  if (!out.visible()) return out;
  const auto t0 = Clock::now();
  uint64_t bytes = 0;
  double made_s = 0;
  for (const auto& r : replicas) {
    const int rank = r->options().info.rank;
    const std::string path = (std::filesystem::path(in.dir()) / share_file_name(rank)).string();
    const auto m0 = Clock::now();
    const torch_glue::StateShare share = r->write_share(in.spread());
    made_s += std::chrono::duration<double>(Clock::now() - m0).count();
    const nlohmann::json file = write_share_file(path, share);
    bytes += file.at("bytes").get<uint64_t>();
    out.add_files(file.dump());
    // Written: the optimizer state gathered from the ps servers lives there again (as after get_state).
    if (!in.spread()) r->drop_server_state_copy();
  }
  if (in.model_pt() && replicas.at(0)->options().info.rank == 0) {
    write_model_file(replicas.at(0)->op(), (std::filesystem::path(in.dir()) / "model.pt").string());
  }
  out.set_bytes(bytes);
  out.set_seconds(std::chrono::duration<double>(Clock::now() - t0).count());
  control::log().debug("worker: share of {} bytes written into {} in {:.3f} s ({:.3f} s of it making its regions)",
                       bytes, in.dir(), out.seconds(), made_s);
  return out;
}

proto::ShareReply read_shares(const Replicas& replicas, const proto::ReadShareRequest& in) {
  proto::ShareReply out;
  out.set_visible(true);
  const auto t0 = Clock::now();
  uint64_t bytes = 0;
  for (const auto& r : replicas) {
    ShardReader reader(in.dir());
    r->read_share(reader);
    bytes += reader.bytes_read();
  }
  out.set_bytes(bytes);
  out.set_seconds(std::chrono::duration<double>(Clock::now() - t0).count());
  control::log().debug("worker: {} bytes of {} read in {:.3f} s", bytes, in.dir(), out.seconds());
  return out;
}

namespace {

// A share's regions end to end in `buffer` (grown as needed, else reused; write_share_file lays
// out the file itself): its regions point there, to be filled by copy_regions.
template <typename Buffer>
torch_glue::StateShare lay_out(const torch_glue::StateShare& share, const std::shared_ptr<Buffer>& buffer) {
  size_t total = 0;
  for (const auto& r : share.regions) total += r.bytes;
  if (buffer->size < total) {  // uninitialised: a zero-fill of 0.5 GB held the first checkpoint 0.26 s
    buffer->data.reset(new char[total]);
    buffer->size = total;
  }
  torch_glue::StateShare out;
  out.keep = buffer;
  size_t at = 0;
  for (const auto& r : share.regions) {
    torch_glue::StateRegion copy = r;
    copy.data = buffer->data.get() + at;
    out.regions.push_back(std::move(copy));
    at += r.bytes;
  }
  return out;
}

// The regions of `from` that are (`until_update`) or are not StateRegion::until_update, into
// `to`'s (lay_out's) memory.
void copy_regions(const torch_glue::StateShare& from, const torch_glue::StateShare& to, bool until_update) {
  for (size_t k = 0; k < from.regions.size(); ++k) {
    const auto& r = from.regions[k];
    if (r.until_update != until_update || r.bytes == 0) continue;
    std::memcpy(const_cast<void*>(to.regions[k].data), r.data, r.bytes);
  }
}

}  // namespace

BackgroundShares::~BackgroundShares() { wait(); }

void BackgroundShares::wait() {
  if (thread_.joinable()) thread_.join();
}

proto::ShareReply BackgroundShares::start(const Replicas& replicas, const proto::WriteShareRequest& in,
                                          bool overlap) {
  if (in_flight_) {
    wait();
    in_flight_ = false;
    control::log().debug("worker: an unfinished background share write was waited for and dropped");
  }
  proto::ShareReply out;
  std::error_code ec;
  out.set_visible(std::filesystem::is_directory(in.dir(), ec));
  if (!out.visible()) return out;
  overlap = overlap && in.spread();  // a ps gather's copy is let go of below
  const auto t0 = Clock::now();
  while (buffers_.size() < replicas.size()) buffers_.push_back(std::make_shared<Buffer>());
  std::vector<Staged> staged;
  std::vector<torch_glue::StateShare> live;  // what the thread copies yet (overlap)
  uint64_t bytes = 0, later = 0;
  for (size_t i = 0; i < replicas.size(); ++i) {
    const auto& r = replicas[i];
    Staged s;
    s.path = (std::filesystem::path(in.dir()) / share_file_name(r->options().info.rank)).string();
    torch_glue::StateShare share = r->write_share(in.spread());
    s.share = lay_out(share, buffers_[i]);
    copy_regions(share, s.share, false);  // the buffers and blobs: forward changes them
    if (!overlap) copy_regions(share, s.share, true);
    for (const auto& region : share.regions) {
      bytes += region.bytes;
      if (overlap && region.until_update) later += region.bytes;
    }
    staged.push_back(std::move(s));
    if (overlap) live.push_back(std::move(share));
    if (!in.spread()) r->drop_server_state_copy();  // copied: the ps servers' state lives there again
  }
  std::promise<void> copied;
  copied_ = copied.get_future().share();
  if (overlap) {  // each replica's next update waits for the copy of what it changes
    for (const auto& r : replicas) r->boundary().gate_update([f = copied_] { f.wait(); });
  } else {
    copied.set_value();
  }
  out.set_bytes(bytes);
  out.set_seconds(std::chrono::duration<double>(Clock::now() - t0).count());
  control::log().debug("worker: share of {} bytes for {}: {} copied in {:.3f} s, {} to copy while forward runs",
                       bytes, in.dir(), bytes - later, out.seconds(), later);
  result_.Clear();
  error_ = nullptr;
  written_ = false;
  in_flight_ = true;
  thread_ = std::thread([this, st = std::move(staged), lv = std::move(live), p = std::move(copied)]() mutable {
    if (!lv.empty()) {
      const auto c0 = Clock::now();
      for (size_t i = 0; i < lv.size(); ++i) copy_regions(lv[i], st[i].share, true);
      lv.clear();  // the replicas' tensors let go of before their update goes on
      p.set_value();
      control::log().debug("worker: the rest of the share copied in {:.3f} s",
                           std::chrono::duration<double>(Clock::now() - c0).count());
    }
    write_files(std::move(st));
  });
  return out;
}

proto::ShareReply BackgroundShares::write(const Replicas& replicas, const proto::WriteShareRequest& in,
                                          const TrainerConfig& job) {
  if (!in.background()) return write_shares(replicas, in);
  // Forward overlap steps buckets during the next forward; stage 3's gathers write the pieces.
  return start(replicas, in, job.comm.forward_overlap_buckets == 0 && job.step.zero_stage < 3);
}

void BackgroundShares::wait_for_copy(const proto::Command& cmd) const {
  using C = proto::Command;
  switch (cmd.request_case()) {
    case C::kTrain:  // its replicas' updates wait (StepBoundary::gate_update)
    case C::kValidate:
    case C::kPing:
    case C::kPosition:
    case C::kFinishShare:
    case C::kWriteShare:
      return;
    default:  // a command that may change the state (a load, a worker function, a re-formation)
      if (copied_.valid()) copied_.wait();
  }
}

void BackgroundShares::write_files(std::vector<Staged> staged) {
  const auto t0 = Clock::now();
  try {
    uint64_t bytes = 0;
    for (const auto& s : staged) {
      const nlohmann::json file = write_share_file(s.path, s.share);
      bytes += file.at("bytes").get<uint64_t>();
      result_.add_files(file.dump());
    }
    result_.set_visible(true);
    result_.set_bytes(bytes);
    result_.set_seconds(std::chrono::duration<double>(Clock::now() - t0).count());
    control::log().debug("worker: share of {} bytes written in the background in {:.3f} s", bytes,
                         result_.seconds());
  } catch (...) {  // the disk's (DataError naming the file), or anything else: said at finish()
    error_ = std::current_exception();
  }
  written_ = true;
}

proto::ShareReply BackgroundShares::finish() {
  proto::ShareReply out;
  if (!in_flight_) return out;
  const bool writing = !written_;
  const auto t0 = Clock::now();
  wait();
  in_flight_ = false;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  out = std::move(result_);
  out.set_started(true);
  if (writing) out.set_waited_s(std::chrono::duration<double>(Clock::now() - t0).count());
  return out;
}

}  // namespace dsgd::runtime
