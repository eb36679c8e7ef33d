// The synchronous parameter-server strategy, with its shards inside the worker processes.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "comm/op_queue.h"
#include "dsgd/error.h"
#include "strategy/strategy.h"

namespace dsgd::strategy {
namespace {

using comm::DataType;
using comm::ReduceOp;

class PsStrategy final : public GradientStrategy {
 public:
  PsStrategy(std::shared_ptr<comm::HierarchicalGroup> group, int num_shards)
      : group_(std::move(group)), num_shards_(num_shards), queue_("ps strategy") {
    if (num_shards_ < 1 || num_shards_ > kMaxShards) {
      throw ConfigError("num_ps_shards must be in 1.." + std::to_string(kMaxShards) + ", got " +
                        std::to_string(num_shards_));
    }
  }
  ~PsStrategy() override = default;

  std::string name() const override { return "ps"; }

  std::shared_ptr<comm::Work> average_async(float* data, size_t count) override {
    const uint64_t seq = next_seq_++;
    return queue_.submit("ps average #" + std::to_string(seq), [this, seq, data, count] {
      if (aborted_) throw CommError("ps strategy aborted: " + reason_, "ps average");
      average(seq, data, count);
    });
  }

  void abort(const std::string& reason) override {
    reason_ = reason;
    aborted_ = true;
    group_->abort(reason);
  }

 private:
  static constexpr int kMaxShards = 64;

  void average(uint64_t seq, float* data, size_t count) {
    auto& local = group_->local();
    if (local.size() > 1) local.allreduce(data, count, DataType::kFloat32, ReduceOp::kSum);  // the host's sum
    if (group_->num_hosts() == 1) {  // the host's sum is everyone's (and identical on every rank)
      scale(data, count);
      return;
    }
    if (auto* leaders = group_->leaders()) exchange(*leaders, seq, data, count);
    if (local.size() > 1) local.broadcast(data, count * sizeof(float), /*root=*/0);  // the leader's average
  }

  void scale(float* data, size_t count) const {
    const float inv = 1.0f / static_cast<float>(group_->global().size());
    for (size_t i = 0; i < count; ++i) data[i] *= inv;
  }

  // Among host leaders: shard s of the bucket (a contiguous 1/num_shards of it) belongs to leader
  // s % hosts. Everyone pushes its shards to their owners; an owner sums the pushes in leader
  // order (the same order wherever it runs), divides by the number of replicas and sends the
  // average back. Every transfer of the bucket is in flight at once.
  void exchange(comm::Group& leaders, uint64_t seq, float* data, size_t count) {
    const int hosts = leaders.size(), me = leaders.rank();
    const uint32_t tag_base = static_cast<uint32_t>((seq % (1u << 20)) * 2 * kMaxShards);
    auto begin = [&](int s) { return count * static_cast<size_t>(s) / static_cast<size_t>(num_shards_); };
    // Push.
    std::vector<std::vector<float>> pushed(static_cast<size_t>(num_shards_ * hosts));
    std::vector<std::shared_ptr<comm::Work>> works;
    for (int s = 0; s < num_shards_; ++s) {
      const size_t b = begin(s), n = begin(s + 1) - b;
      if (n == 0) continue;
      const int owner = s % hosts;
      const uint32_t tag = tag_base + 2 * static_cast<uint32_t>(s);
      if (owner != me) {
        works.push_back(leaders.send_async(data + b, n * sizeof(float), owner, tag));
        continue;
      }
      for (int p = 0; p < hosts; ++p) {
        if (p == me) continue;
        auto& buf = pushed[static_cast<size_t>(s * hosts + p)];
        buf.resize(n);
        works.push_back(leaders.recv_async(buf.data(), n * sizeof(float), p, tag));
      }
    }
    for (auto& w : works) w->wait();
    works.clear();
    // Sum what this leader owns, then pull.
    const float inv = 1.0f / static_cast<float>(group_->global().size());
    std::vector<float> sum;
    for (int s = 0; s < num_shards_; ++s) {
      const size_t b = begin(s), n = begin(s + 1) - b;
      if (n == 0) continue;
      const int owner = s % hosts;
      const uint32_t tag = tag_base + 2 * static_cast<uint32_t>(s) + 1;
      if (owner != me) {
        works.push_back(leaders.recv_async(data + b, n * sizeof(float), owner, tag));
        continue;
      }
      sum.assign(n, 0.0f);
      for (int p = 0; p < hosts; ++p) {
        const float* part = p == me ? data + b : pushed[static_cast<size_t>(s * hosts + p)].data();
        for (size_t i = 0; i < n; ++i) sum[i] += part[i];
      }
      for (size_t i = 0; i < n; ++i) data[b + i] = sum[i] * inv;
      for (int p = 0; p < hosts; ++p) {
        if (p != me) works.push_back(leaders.send_async(data + b, n * sizeof(float), p, tag));
      }
    }
    for (auto& w : works) w->wait();
  }

  std::shared_ptr<comm::HierarchicalGroup> group_;
  const int num_shards_;
  std::atomic<uint64_t> next_seq_{0};
  std::atomic<bool> aborted_{false};
  std::string reason_;
  comm::OpQueue queue_;  // last: its thread stops before the members it uses go
};

}  // namespace

std::unique_ptr<GradientStrategy> make_ps_strategy(std::shared_ptr<comm::HierarchicalGroup> group, int num_shards) {
  return std::make_unique<PsStrategy>(std::move(group), num_shards);
}

}  // namespace dsgd::strategy
