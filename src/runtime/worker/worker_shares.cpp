// A worker's side of sharded checkpoints (runtime/worker/worker_shares.h).
#include "runtime/worker/worker_shares.h"

#include <chrono>
#include <filesystem>

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

}  // namespace dsgd::runtime
