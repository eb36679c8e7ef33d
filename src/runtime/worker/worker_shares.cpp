// A worker's side of sharded checkpoints (runtime/worker/worker_shares.h).
#include "runtime/worker/worker_shares.h"

#include <chrono>
#include <cstring>
#include <filesystem>
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

constexpr size_t kStageAlign = 4096;  // as the share's file lays its regions out

size_t aligned(size_t n) { return (n + kStageAlign - 1) / kStageAlign * kStageAlign; }

// `share`'s regions copied into `buffer` (grown as needed, else reused): a share that points
// into it, so training may change the replica's tensors while the copy is written.
torch_glue::StateShare stage(const torch_glue::StateShare& share, const std::shared_ptr<std::vector<char>>& buffer) {
  size_t total = 0;
  for (const auto& r : share.regions) total = aligned(total) + r.bytes;
  if (buffer->size() < total) buffer->resize(total);
  torch_glue::StateShare out;
  out.keep = buffer;
  size_t at = 0;
  for (const auto& r : share.regions) {
    at = aligned(at);
    char* dest = buffer->data() + at;
    if (r.bytes > 0) std::memcpy(dest, r.data, r.bytes);
    torch_glue::StateRegion copy = r;
    copy.data = dest;
    out.regions.push_back(std::move(copy));
    at += r.bytes;
  }
  return out;
}

}  // namespace

BackgroundShares::~BackgroundShares() { wait(); }

void BackgroundShares::wait() {
  if (thread_.joinable()) thread_.join();
}

proto::ShareReply BackgroundShares::start(const Replicas& replicas, const proto::WriteShareRequest& in) {
  if (in_flight_) {
    wait();
    in_flight_ = false;
    control::log().debug("worker: an unfinished background share write was waited for and dropped");
  }
  proto::ShareReply out;
  std::error_code ec;
  out.set_visible(std::filesystem::is_directory(in.dir(), ec));
  if (!out.visible()) return out;
  const auto t0 = Clock::now();
  while (buffers_.size() < replicas.size()) buffers_.push_back(std::make_shared<std::vector<char>>());
  std::vector<Staged> staged;
  uint64_t bytes = 0;
  for (size_t i = 0; i < replicas.size(); ++i) {
    const auto& r = replicas[i];
    Staged s;
    s.path = (std::filesystem::path(in.dir()) / share_file_name(r->options().info.rank)).string();
    s.share = stage(r->write_share(in.spread()), buffers_[i]);
    for (const auto& region : s.share.regions) bytes += region.bytes;
    staged.push_back(std::move(s));
    if (!in.spread()) r->drop_server_state_copy();  // copied: the ps servers' state lives there again
  }
  out.set_bytes(bytes);
  out.set_seconds(std::chrono::duration<double>(Clock::now() - t0).count());
  control::log().debug("worker: share of {} bytes copied for {} in {:.3f} s", bytes, in.dir(), out.seconds());
  result_.Clear();
  error_ = nullptr;
  written_ = false;
  in_flight_ = true;
  thread_ = std::thread([this, st = std::move(staged)]() mutable { write(std::move(st)); });
  return out;
}

void BackgroundShares::write(std::vector<Staged> staged) {
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
