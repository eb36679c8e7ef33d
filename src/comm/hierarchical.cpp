#include "dsgd/comm/hierarchical.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "comm/op_queue.h"
#include "comm/process.h"
#include "comm/reduce_kernels.h"
#include "dsgd/common/error.h"

namespace dsgd::comm {
namespace {

// Allreduces in flight at once with one rank per host. One ring leaves each link idle while a
// step's data is reduced and the next step is posted (at 256 KB buckets on 4 hosts shaped to
// 0.5 Gbit/s: 1.33x the transfer time); a second lane fills those gaps (1.14x); more gain
// little (3: 1.12x, 4: 1.13x). Measured with bench/cluster.sh, SIM_STEP_MS=0.
constexpr int kLanes = 2;

// One deadline for an operation's stages: left(stage) is what the stages before it left, and a
// TimeoutError naming the stage once nothing is.
class Stages {
 public:
  Stages(std::string op, std::chrono::milliseconds timeout)
      : op_(std::move(op)), deadline_(std::chrono::steady_clock::now() + timeout) {}
  std::chrono::milliseconds operator()(const char* stage) const {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline_) {
      throw TimeoutError(op_ + ": its deadline passed before the " + std::string(stage) + " stage", op_);
    }
    return std::chrono::ceil<std::chrono::milliseconds>(deadline_ - now);
  }

 private:
  std::string op_;
  std::chrono::steady_clock::time_point deadline_;
};

// Each host's ranks, ascending, hosts in order of their lowest rank (as create() numbers them).
std::vector<std::vector<int>> ranks_by_host(const std::vector<std::string>& hosts) {
  std::vector<std::string> seen;
  std::vector<std::vector<int>> out;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    const auto it = std::find(seen.begin(), seen.end(), hosts[static_cast<size_t>(r)]);
    const size_t h = static_cast<size_t>(it - seen.begin());
    if (it == seen.end()) {
      seen.push_back(hosts[static_cast<size_t>(r)]);
      out.emplace_back();
    }
    out[h].push_back(r);
  }
  return out;
}

size_t most_ranks(const std::vector<std::vector<int>>& by_host) {
  size_t most = 0;
  for (const auto& h : by_host) most = std::max(most, h.size());
  return most;
}

}  // namespace

HierarchicalGroup::HierarchicalGroup() : queue_(std::make_unique<OpQueue>("hierarchical group")) {}

HierarchicalGroup::~HierarchicalGroup() {  // stop before the groups they use
  queue_.reset();
  lane_queues_.clear();
}

std::shared_ptr<Work> HierarchicalGroup::allreduce_async(void* data, size_t count, DataType type, ReduceOp op,
                                                         std::chrono::milliseconds timeout, CrossHostWire wire) {
  const bool own_stage = static_cast<bool>(wire.stage);
  if ((wire.type != DataType::kFloat32 || own_stage) && (type != DataType::kFloat32 || op == ReduceOp::kMax)) {
    throw Error("hierarchical allreduce: a compressed across-host stage carries float32 sums and averages, not " +
                to_string(type) + " " + to_string(op));
  }
  const std::string what = "hierarchical allreduce (" + std::to_string(count) + " x " + to_string(type) + ", " +
                           to_string(op) +
                           (own_stage                         ? std::string(", compressed across hosts")
                            : wire.type != DataType::kFloat32 ? ", " + to_string(wire.type) + " across hosts"
                                                              : std::string()) +
                           ")";
  // Every rank makes the same calls in the same order, so they agree on each call's lane.
  const size_t lane = lanes_.empty() ? 0 : next_async_++ % (lanes_.size() + 1);
  if (lane > 0) {
    Group* g = lanes_[lane - 1].get();
    return lane_queues_[lane - 1]->submit(what, [=, this] {
      if (wire.type == DataType::kFloat32 && !own_stage) {
        g->allreduce(data, count, type, op, AllreduceAlgorithm::kAuto, timeout);
        count_ring_bytes(g->size(), count * element_size(type));
        return;
      }
      across_hosts(*g, data, count, type, ReduceOp::kSum, timeout, wire);
      if (op == ReduceOp::kAverage) divide_by(data, count, type, g->size());
    });
  }
  return queue_->submit(what, [=, this] { run_allreduce(data, count, type, op, timeout, wire); });
}

void HierarchicalGroup::allreduce(void* data, size_t count, DataType type, ReduceOp op,
                                  std::chrono::milliseconds timeout, CrossHostWire wire) {
  queue_->run("hierarchical allreduce", [=, this] { run_allreduce(data, count, type, op, timeout, wire); });
}

std::unique_ptr<HierarchicalGroup> HierarchicalGroup::create(std::shared_ptr<Store> store, int rank, int size,
                                                             const GroupOptions& options,
                                                             const ShmOptions& shm_options) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw ConfigError("hierarchical group: rank " + std::to_string(rank) + " is not in 0.." +
                      std::to_string(size - 1) + " (size " + std::to_string(size) + ")");
  }
  std::unique_ptr<HierarchicalGroup> h(new HierarchicalGroup());
  h->store_ = store;
  h->options_ = options;
  if (h->options_.host.empty()) h->options_.host = this_host();
  h->rank_ = rank;
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("host/" + std::to_string(r));
  store->set(keys[static_cast<size_t>(rank)], h->options_.host);
  h->hosts_ = store->get_many(keys, h->options_.timeout);
  // Hosts in order of their lowest rank; each host's leader is its lowest rank.
  std::vector<std::string> hosts;
  std::vector<int> local;
  for (int r = 0; r < size; ++r) {
    const std::string& host = h->hosts_[static_cast<size_t>(r)];
    if (std::find(hosts.begin(), hosts.end(), host) == hosts.end()) hosts.push_back(host);
    if (host == h->options_.host) local.push_back(r);
  }
  h->num_hosts_ = static_cast<int>(hosts.size());
  const int local_rank = static_cast<int>(std::find(local.begin(), local.end(), rank) - local.begin());
  const int host_index = static_cast<int>(std::find(hosts.begin(), hosts.end(), h->options_.host) - hosts.begin());
  h->local_ = ShmGroup::create(std::make_shared<PrefixStore>(store, "local/" + std::to_string(host_index) + "/"),
                               local_rank, static_cast<int>(local.size()), shm_options);
  if (local_rank == 0 && h->num_hosts_ > 1) {
    h->leaders_ = Group::create(std::make_shared<PrefixStore>(store, "leaders/"), host_index, h->num_hosts_, options);
  }
  for (int l = 1; l < kLanes && h->num_hosts_ == size && size > 1; ++l) {  // one rank per host: more lanes
    h->lanes_.push_back(
        Group::create(std::make_shared<PrefixStore>(store, "lane" + std::to_string(l) + "/"), rank, size, options));
    h->lane_queues_.push_back(std::make_unique<OpQueue>("hierarchical group, lane " + std::to_string(l)));
  }
  return h;
}

void* HierarchicalGroup::take_shared(size_t bytes) {
  if (local_->size() < 2 || local_->shared_buffer() == nullptr) return nullptr;
  const size_t rounded = (bytes + 63) / 64 * 64;
  size_t at = shared_taken_.load();
  do {
    if (rounded > local_->shared_buffer_bytes() - at) return nullptr;
  } while (!shared_taken_.compare_exchange_weak(at, at + rounded));
  return static_cast<char*>(local_->shared_buffer()) + at;
}

Group& HierarchicalGroup::global() {
  std::lock_guard<std::mutex> lock(global_mutex_);
  if (!aborted_.empty()) throw CommError("group aborted: " + aborted_, "global group");
  if (!global_) global_ = Group::create(std::make_shared<PrefixStore>(store_, "global/"), rank_, size(), options_);
  return *global_;
}

void HierarchicalGroup::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(global_mutex_);
    if (aborted_.empty()) aborted_ = reason.empty() ? "aborted" : reason;
    if (global_) global_->abort(reason);
  }
  local_->abort(reason);
  if (leaders_) leaders_->abort(reason);
  for (auto& g : lanes_) g->abort(reason);
}

void HierarchicalGroup::run_allreduce(void* data, size_t count, DataType type, ReduceOp op,
                                      std::chrono::milliseconds timeout, CrossHostWire wire) {
  if (num_hosts_ == 1) {
    // One host: the shared-memory allreduce divides each rank's block as it sums it (the same
    // sum-then-divide arithmetic as below, on 1/size of the data per rank, in the same pass).
    local_->allreduce(data, count, type, op, timeout);
    return;
  }
  const Stages left("hierarchical allreduce", timeout.count() > 0 ? timeout : options_.timeout);
  // Average = sum everywhere, then one division by the global size.
  const ReduceOp stage_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  local_->allreduce(data, count, type, stage_op, left("within-host sum"));
  if (leaders_) across_hosts(*leaders_, data, count, type, stage_op, left("across-host"), wire);
  local_->broadcast(data, count * element_size(type), /*root=*/0, left("within-host broadcast"));
  if (op == ReduceOp::kAverage) divide_by(data, count, type, size());
}

void HierarchicalGroup::broadcast(void* data, size_t bytes, int root, std::chrono::milliseconds timeout) {
  if (root < 0 || root >= size()) {
    throw ConfigError("hierarchical broadcast: root " + std::to_string(root) + " is not a rank (0.." +
                      std::to_string(size() - 1) + ")");
  }
  queue_->run("hierarchical broadcast", [=, this] { run_broadcast(data, bytes, root, timeout); });
}

void HierarchicalGroup::run_broadcast(void* data, size_t bytes, int root, std::chrono::milliseconds timeout) {
  const Stages left("hierarchical broadcast", timeout.count() > 0 ? timeout : options_.timeout);
  // Hosts in order of their lowest rank (the leaders' ranks), as create() numbered them.
  const std::string& root_host = hosts_[static_cast<size_t>(root)];
  std::vector<std::string> hosts;
  int root_local = 0;
  for (int r = 0; r < size(); ++r) {
    const std::string& host = hosts_[static_cast<size_t>(r)];
    if (std::find(hosts.begin(), hosts.end(), host) == hosts.end()) hosts.push_back(host);
    if (r < root && host == root_host) ++root_local;
  }
  const bool root_side = hosts_[static_cast<size_t>(rank_)] == root_host;
  if (root_side && local_->size() > 1) local_->broadcast(data, bytes, root_local, left("root's host"));
  if (leaders_) {
    const int root_leader = static_cast<int>(std::find(hosts.begin(), hosts.end(), root_host) - hosts.begin());
    leaders_->broadcast(data, bytes, root_leader, left("across-host"));
  }
  if (!root_side && local_->size() > 1) local_->broadcast(data, bytes, 0, left("within-host"));
}

std::shared_ptr<Work> HierarchicalGroup::reduce_scatter_async(const void* in, void* out, size_t count, DataType type,
                                                              ReduceOp op, std::chrono::milliseconds timeout) {
  const std::string what = "hierarchical reduce_scatter (" + std::to_string(count) + " x " + to_string(type) +
                           " a rank, " + to_string(op) + ")";
  return queue_->submit(what, [=, this] {
    const Stages left(what, timeout.count() > 0 ? timeout : options_.timeout);
    if (num_hosts_ == 1) {
      local_->reduce_scatter_async(in, out, count, type, op, left("within-host"))->wait();
      return;
    }
    const size_t es = element_size(type), n = static_cast<size_t>(size());
    const ReduceOp stage_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
    // Every block summed over this host's ranks, in every one of them.
    std::vector<char> host_sum(static_cast<const char*>(in), static_cast<const char*>(in) + n * count * es);
    if (local_->size() > 1) local_->allreduce(host_sum.data(), n * count, type, stage_op, left("within-host sum"));
    const auto by_host = ranks_by_host(hosts_);
    const size_t most = most_ranks(by_host), block = most * count * es;  // a host's blocks, padded
    std::vector<char> mine(block);  // this host's blocks, summed over every host (the leader's)
    if (leaders_) {
      std::vector<char> send(block * by_host.size(), 0), got(block * by_host.size());
      for (size_t h = 0; h < by_host.size(); ++h) {
        for (size_t k = 0; k < by_host[h].size(); ++k) {
          std::memcpy(send.data() + h * block + k * count * es,
                      host_sum.data() + static_cast<size_t>(by_host[h][k]) * count * es, count * es);
        }
      }
      leaders_->alltoall(send.data(), got.data(), block, left("across-host"));
      std::memcpy(mine.data(), got.data(), block);
      std::vector<const void*> others;
      for (size_t h = 1; h < by_host.size(); ++h) others.push_back(got.data() + h * block);
      reduce_many(mine.data(), others.data(), static_cast<int>(others.size()), most * count, type, stage_op, 1);
      cross_host_bytes_ += (by_host.size() - 1) * block;
    }
    if (local_->size() > 1) local_->broadcast(mine.data(), block, /*root=*/0, left("within-host broadcast"));
    const size_t k = static_cast<size_t>(local_->rank());  // this rank's place among its host's
    std::memcpy(out, mine.data() + k * count * es, count * es);
    if (op == ReduceOp::kAverage) divide_by(out, count, type, size());
  });
}

std::shared_ptr<Work> HierarchicalGroup::allgather_async(const void* in, void* out, size_t bytes,
                                                         std::chrono::milliseconds timeout) {
  const std::string what = "hierarchical allgather (" + std::to_string(bytes) + " bytes a rank)";
  return queue_->submit(what, [=, this] {
    const Stages left(what, timeout.count() > 0 ? timeout : options_.timeout);
    if (num_hosts_ == 1) {
      local_->allgather_async(in, out, bytes, left("within-host"))->wait();
      return;
    }
    const auto by_host = ranks_by_host(hosts_);
    const size_t most = most_ranks(by_host), block = most * bytes;  // a host's blocks, padded
    std::vector<char> host(block, 0), all(block * by_host.size());
    local_->allgather_async(in, host.data(), bytes, left("within-host"))->wait();
    if (leaders_) {
      leaders_->allgather(host.data(), all.data(), block, left("across-host"));
      cross_host_bytes_ += (by_host.size() - 1) * block;
    }
    if (local_->size() > 1) local_->broadcast(all.data(), all.size(), /*root=*/0, left("within-host broadcast"));
    for (size_t h = 0; h < by_host.size(); ++h) {
      for (size_t k = 0; k < by_host[h].size(); ++k) {
        std::memcpy(static_cast<char*>(out) + static_cast<size_t>(by_host[h][k]) * bytes,
                    all.data() + h * block + k * bytes, bytes);
      }
    }
  });
}

void HierarchicalGroup::count_ring_bytes(int ranks, size_t bytes) {
  cross_host_bytes_ += 2 * static_cast<uint64_t>(ranks - 1) * bytes / static_cast<uint64_t>(ranks);
}

void HierarchicalGroup::across_hosts(Group& group, void* data, size_t count, DataType type, ReduceOp op,
                                     std::chrono::milliseconds timeout, CrossHostWire wire) {
  const int n = group.size();
  if (wire.stage) {
    cross_host_bytes_ += wire.stage(group, static_cast<float*>(data), count,
                                    timeout.count() > 0 ? timeout : group.timeout());
    return;
  }
  if (wire.type == DataType::kFloat32) {
    group.allreduce(data, count, type, op, AllreduceAlgorithm::kAuto, timeout);
    count_ring_bytes(n, count * element_size(type));
    return;
  }
  // Block j of this host's rounded sum goes to leader j, which sums block j of every host in
  // float32, in leader order, and rounds the sum once more for everyone (header comment).
  const auto deadline = std::chrono::steady_clock::now() + (timeout.count() > 0 ? timeout : group.timeout());
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
  };
  const size_t block = (count + static_cast<size_t>(n) - 1) / static_cast<size_t>(n);
  const size_t padded = block * static_cast<size_t>(n);
  std::vector<uint16_t> mine(padded, 0), got(padded), all(padded);
  auto* x = static_cast<float*>(data);
  encode_16(x, wire.residual, mine.data(), count, wire.type);
  group.alltoall(mine.data(), got.data(), block * sizeof(uint16_t), left());
  std::vector<float> sum(block, 0.0f);
  for (int j = 0; j < n; ++j)
    decode_16(got.data() + static_cast<size_t>(j) * block, sum.data(), block, wire.type, true);
  std::vector<uint16_t> rounded(block);
  encode_16(sum.data(), nullptr, rounded.data(), block, wire.type);
  group.allgather(rounded.data(), all.data(), block * sizeof(uint16_t), left());
  decode_16(all.data(), x, count, wire.type, /*accumulate=*/false);
  cross_host_bytes_ += 2 * static_cast<uint64_t>(n - 1) * block * sizeof(uint16_t);
}

}  // namespace dsgd::comm
