// The synchronous parameter-server strategy: shards inside the worker processes (the host
// leaders), or shard processes of their own reached over ps_wire.h.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <vector>

#include "comm/op_queue.h"
#include "comm/reduce_kernels.h"
#include "dsgd/common/error.h"
#include "strategy/ps_wire.h"
#include "strategy/sgd.h"
#include "strategy/strategy.h"

namespace dsgd::strategy {
namespace {

using comm::DataType;
using comm::ReduceOp;

class PsStrategy final : public GradientStrategy, private ErrorFeedback, private ServerUpdates {
 public:
  PsStrategy(std::shared_ptr<comm::HierarchicalGroup> group, const PsOptions& o)
      : group_(std::move(group)), num_shards_(o.num_shards), update_on_shards_(o.update_on_shards),
        shard_processes_(o.shard_processes), servers_(o.servers), wire_(o.wire), powersgd_(o.powersgd),
        queue_("ps strategy") {
    // Compression only with the shards in the workers, averaging: strategy::validate's rule.
    if (num_shards_ < 1 || num_shards_ > kMaxShards) {
      throw ConfigError("num_ps_shards must be in 1.." + std::to_string(kMaxShards) + ", got " +
                        std::to_string(num_shards_));
    }
    if (shard_processes_ && is_host_leader() &&
        (servers_ == nullptr || servers_->size() != group_->num_hosts() + num_shards_ ||
         servers_->rank() != leader_index())) {
      throw ConfigError("ps with shard processes: a host leader needs the servers' group of the " +
                        std::to_string(group_->num_hosts()) + " leaders and " + std::to_string(num_shards_) +
                        " shards, with itself at its leader index " + std::to_string(leader_index()));
    }
  }
  ~PsStrategy() override = default;

  std::string name() const override { return "ps"; }

  std::shared_ptr<comm::Work> average_async(float* data, size_t count) override {
    if (update_on_shards_) throw Error("ps with update on shards takes update_async, not average_async");
    const uint64_t seq = next_seq_++;
    if (pipelined()) {
      return submit_pipelined("ps average #" + std::to_string(seq),
                              [=, this] { return post_remote(seq, ps_wire::Op::kAverage, data, count); });
    }
    return queue_.submit("ps average #" + std::to_string(seq), [this, seq, data, count] {
      check_not_aborted();
      average(seq, data, count);
    });
  }

  ErrorFeedback* error_feedback() override { return compresses() ? this : nullptr; }
  std::shared_ptr<comm::Work> average_with_feedback_async(float* data, size_t count, const Bucket& b) override {
    if (!compresses()) return average_async(data, count);
    const uint64_t seq = next_seq_++;
    return queue_.submit("ps average #" + std::to_string(seq), [this, seq, data, count, b] {
      check_not_aborted();
      average(seq, data, count, &b);
    });
  }
  // What this leader sent to the other leaders; shard processes' traffic is not counted.
  int64_t cross_host_bytes() const override {
    return shard_processes_ ? -1 : static_cast<int64_t>(cross_bytes_.load());
  }

  ServerUpdates* server_updates() override { return update_on_shards_ ? this : nullptr; }

  std::shared_ptr<comm::Work> update_async(const ShardUpdate& u, bool* all_applied) override {
    const uint64_t seq = next_seq_++;
    // The replica's parameters and momentum are read only during the call: copy them for the
    // queue (an owner needs its slices of them, and only at init).
    auto init = std::make_shared<std::pair<std::vector<float>, std::vector<float>>>();
    if (u.init) {
      init->first.assign(u.params, u.params + u.count);
      if (u.momentum != nullptr) init->second.assign(u.momentum, u.momentum + u.count);
    }
    if (pipelined()) {
      return submit_pipelined(
          "ps update #" + std::to_string(seq),
          [=, this] {
            auto r = post_remote(seq, ps_wire::Op::kUpdate, u.data, u.count, &u, init.get());
            r->keep = init;  // read by the sends
            return r;
          },
          [all_applied](const Remote& r) { *all_applied = r.all_flags(); });
    }
    return queue_.submit("ps update #" + std::to_string(seq), [this, seq, u, init, all_applied] {
      check_not_aborted();
      *all_applied = update(seq, u, *init);
    });
  }

  std::shared_ptr<comm::Work> gather_state_async(uint64_t key, float* params, float* momentum, size_t count,
                                                 bool* has_momentum) override {
    if (params != nullptr) throw Error("ps gathers its shards' momentum only: the replicas hold the parameters");
    const uint64_t seq = next_seq_++;
    if (pipelined()) {
      auto got = std::make_shared<std::vector<float>>(count);
      return submit_pipelined(
          "ps gather momentum #" + std::to_string(seq),
          [=, this] {
            ShardUpdate u{.key = key};
            auto r = post_remote(seq, ps_wire::Op::kGather, got->data(), count, &u);
            r->keep = got;
            return r;
          },
          [=](const Remote& r) {
            *has_momentum = r.all_flags();
            if (*has_momentum) std::copy(got->begin(), got->end(), momentum);
          });
    }
    return queue_.submit("ps gather momentum #" + std::to_string(seq), [=, this] {
      check_not_aborted();
      *has_momentum = gather(seq, key, momentum, count);
    });
  }

  bool compresses() const { return wire_ != DataType::kFloat32 || powersgd_ != nullptr; }
  float* gradient_buffer(size_t count) override {  // the host's sum then copies nothing in
    return static_cast<float*>(group_->take_shared(count * sizeof(float)));
  }

  void abort(const std::string& reason) override {
    reason_ = reason;
    aborted_ = true;
    group_->abort(reason);
    if (servers_) servers_->abort(reason);
  }

 private:
  static constexpr int kMaxShards = 64;

  void check_not_aborted() const {
    if (aborted_) throw CommError("ps strategy aborted: " + reason_, "ps");
  }

  size_t shard_begin(size_t count, int s) const {
    return count * static_cast<size_t>(s) / static_cast<size_t>(num_shards_);
  }
  // Per bucket and shard: the push, the pull, and the pull's flag (update on shards).
  enum class Leg : uint32_t { kPush = 0, kPull = 1, kFlag = 2 };
  uint32_t tag(uint64_t seq, int s, Leg leg) const {
    return static_cast<uint32_t>((seq % (1u << 20)) * 3 * kMaxShards) + 3 * static_cast<uint32_t>(s) +
           static_cast<uint32_t>(leg);
  }
  bool is_host_leader() { return group_->local().rank() == 0; }
  // This leader's index among the host leaders, and their number (1 on one host).
  int leader_index() { return group_->leaders() != nullptr ? group_->leaders()->rank() : 0; }
  int owner(int s) const { return s % group_->num_hosts(); }

  // `feedback`: this replica's error feedback and PowerSGD state, with compression.
  void average(uint64_t seq, float* data, size_t count, const Bucket* feedback = nullptr) {
    auto& local = group_->local();
    if (local.size() > 1) local.allreduce(data, count, DataType::kFloat32, ReduceOp::kSum);  // the host's sum
    if (shard_processes_) {
      if (is_host_leader()) remote(seq, ps_wire::Op::kAverage, data, count);
    } else if (group_->num_hosts() == 1) {  // the host's sum is everyone's (and identical on every rank)
      scale(data, count);
      return;
    } else if (auto* leaders = group_->leaders(); leaders != nullptr && feedback != nullptr && powersgd_ &&
                                                  feedback->powersgd != nullptr) {
      const PowerSgdBucket bucket{.index = feedback->index, .state = feedback->powersgd,
                                  .residual = feedback->residual, .matrices = feedback->matrices};
      cross_bytes_ += powersgd_->reduce(*leaders, bucket, data, count, leaders->timeout());  // the sum over hosts
      scale(data, count);
    } else if (leaders != nullptr && wire_ != DataType::kFloat32) {
      average_16(*leaders, seq, data, count, feedback != nullptr ? feedback->residual : nullptr);
    } else if (leaders != nullptr) {
      auto pushed = push(*leaders, seq, data, count);
      serve(leaders, seq, data, count, [&](int s, size_t b, size_t n) {
        sum_pushes(*leaders, s, data + b, n, pushed);
        const float inv = 1.0f / static_cast<float>(group_->size());
        for (size_t i = 0; i < n; ++i) data[b + i] *= inv;
        return true;
      });
    }
    if (local.size() > 1) local.broadcast(data, count * sizeof(float), /*root=*/0);  // the leader's average
  }

  bool update(uint64_t seq, const ShardUpdate& u, const std::pair<std::vector<float>, std::vector<float>>& init) {
    auto& local = group_->local();
    if (local.size() > 1) local.allreduce(u.data, u.count, DataType::kFloat32, ReduceOp::kSum);
    float applied = 1;
    if (shard_processes_) {
      if (is_host_leader()) applied = remote(seq, ps_wire::Op::kUpdate, u.data, u.count, &u, &init) ? 1.0f : 0.0f;
    } else if (is_host_leader()) {
      auto* leaders = group_->leaders();  // null on one host: this leader owns every shard
      std::vector<std::vector<float>> pushed;
      if (leaders != nullptr) pushed = push(*leaders, seq, u.data, u.count);
      applied = serve(leaders, seq, u.data, u.count, [&](int s, size_t b, size_t n) {
        if (leaders != nullptr) sum_pushes(*leaders, s, u.data + b, n, pushed);
        return sgd_step(u, init, s, b, n);
      }) ? 1.0f : 0.0f;
    }
    if (local.size() > 1) {
      local.broadcast(u.data, u.count * sizeof(float), /*root=*/0);
      local.broadcast(&applied, sizeof(applied), /*root=*/0);
    }
    return applied != 0;
  }

  bool gather(uint64_t seq, uint64_t key, float* momentum, size_t count) {
    auto& local = group_->local();
    float has = 1;
    if (shard_processes_) {
      if (is_host_leader()) {
        ShardUpdate u{.key = key};
        std::vector<float> got(count);
        has = remote(seq, ps_wire::Op::kGather, got.data(), count, &u) ? 1.0f : 0.0f;
        if (has != 0) std::copy(got.begin(), got.end(), momentum);
      }
    } else if (is_host_leader()) {
      has = serve(group_->leaders(), seq, momentum, count, [&](int s, size_t b, size_t n) {
        auto it = state_.find({key, s});
        if (it == state_.end() || it->second.momentum.size() != n) return false;
        std::copy(it->second.momentum.begin(), it->second.momentum.end(), momentum + b);
        return true;
      }) ? 1.0f : 0.0f;
    }
    if (local.size() > 1) {
      local.broadcast(&has, sizeof(has), /*root=*/0);
      if (has != 0) local.broadcast(momentum, count * sizeof(float), /*root=*/0);
    }
    return has != 0;
  }

  // average()'s exchange among the leaders with a 16-bit wire (PsOptions::wire): push this
  // host's rounded sum, sum each owned shard's pushes in float32 in leader order, round the
  // average once, pull it.
  void average_16(comm::Group& leaders, uint64_t seq, float* data, size_t count, float* residual) {
    const int hosts = leaders.size(), me = leaders.rank();
    constexpr size_t kHalf = sizeof(uint16_t);
    std::vector<uint16_t> mine(count);
    comm::encode_16(data, residual, mine.data(), count, wire_);
    std::vector<std::vector<uint16_t>> pushed(static_cast<size_t>(num_shards_ * hosts));
    std::vector<std::shared_ptr<comm::Work>> works;
    uint64_t sent = 0;
    for (int s = 0; s < num_shards_; ++s) {
      const size_t b = shard_begin(count, s), n = shard_begin(count, s + 1) - b;
      if (n == 0) continue;
      if (owner(s) != me) {
        works.push_back(leaders.send_async(mine.data() + b, n * kHalf, owner(s), tag(seq, s, Leg::kPush)));
        sent += n * kHalf;
        continue;
      }
      for (int p = 0; p < hosts; ++p) {
        if (p == me) continue;
        auto& buf = pushed[static_cast<size_t>(s * hosts + p)];
        buf.resize(n);
        works.push_back(leaders.recv_async(buf.data(), n * kHalf, p, tag(seq, s, Leg::kPush)));
      }
    }
    comm::wait_all(works);
    works.clear();
    const float inv = 1.0f / static_cast<float>(group_->size());
    std::vector<float> sum;
    for (int s = 0; s < num_shards_; ++s) {
      const size_t b = shard_begin(count, s), n = shard_begin(count, s + 1) - b;
      if (n == 0) continue;
      if (owner(s) != me) {  // its slot of `mine` went out with the push: the average lands there
        works.push_back(leaders.recv_async(mine.data() + b, n * kHalf, owner(s), tag(seq, s, Leg::kPull)));
        continue;
      }
      sum.assign(n, 0.0f);
      for (int p = 0; p < hosts; ++p) {
        const uint16_t* part = p == me ? mine.data() + b : pushed[static_cast<size_t>(s * hosts + p)].data();
        comm::decode_16(part, sum.data(), n, wire_, /*accumulate=*/true);
      }
      for (float& x : sum) x *= inv;
      comm::encode_16(sum.data(), nullptr, mine.data() + b, n, wire_);
      for (int p = 0; p < hosts; ++p) {
        if (p == me) continue;
        works.push_back(leaders.send_async(mine.data() + b, n * kHalf, p, tag(seq, s, Leg::kPull)));
        sent += n * kHalf;
      }
    }
    comm::wait_all(works);
    comm::decode_16(mine.data(), data, count, wire_, /*accumulate=*/false);
    cross_bytes_ += sent;
  }

  void scale(float* data, size_t count) const {
    const float inv = 1.0f / static_cast<float>(group_->size());
    for (size_t i = 0; i < count; ++i) data[i] *= inv;
  }

  // Among host leaders: shard s of the bucket (a contiguous 1/num_shards of it) belongs to leader
  // s % hosts. Everyone pushes its shards to their owners, all at once; returns what this leader
  // received for the shards it owns, indexed s * hosts + sender.
  std::vector<std::vector<float>> push(comm::Group& leaders, uint64_t seq, const float* data, size_t count) {
    const int hosts = leaders.size(), me = leaders.rank();
    std::vector<std::vector<float>> pushed(static_cast<size_t>(num_shards_ * hosts));
    std::vector<std::shared_ptr<comm::Work>> works;
    for (int s = 0; s < num_shards_; ++s) {
      const size_t b = shard_begin(count, s), n = shard_begin(count, s + 1) - b;
      if (n == 0) continue;
      if (owner(s) != me) {
        works.push_back(leaders.send_async(data + b, n * sizeof(float), owner(s), tag(seq, s, Leg::kPush)));
        cross_bytes_ += n * sizeof(float);
        continue;
      }
      for (int p = 0; p < hosts; ++p) {
        if (p == me) continue;
        auto& buf = pushed[static_cast<size_t>(s * hosts + p)];
        buf.resize(n);
        works.push_back(leaders.recv_async(buf.data(), n * sizeof(float), p, tag(seq, s, Leg::kPush)));
      }
    }
    comm::wait_all(works);
    return pushed;
  }

  // data[b, b+n) += the other leaders' pushes of shard s, summed in leader order (the same
  // order wherever the owner runs).
  static void sum_pushes(comm::Group& leaders, int s, float* slice, size_t n,
                         const std::vector<std::vector<float>>& pushed) {
    const int hosts = leaders.size(), me = leaders.rank();
    std::vector<float> sum(n, 0.0f);
    for (int p = 0; p < hosts; ++p) {
      const float* part = p == me ? slice : pushed[static_cast<size_t>(s * hosts + p)].data();
      for (size_t i = 0; i < n; ++i) sum[i] += part[i];
    }
    std::copy(sum.begin(), sum.end(), slice);
  }

  // The pull: an owner computes each of its shards in place (`own(s, b, n)` writes data[b, b+n)
  // and returns a flag) and sends it to every other leader, and the flag too when updating on
  // shards; the others receive them into data. Returns whether every shard's flag was set.
  // `leaders` null: one host, every shard is this leader's.
  template <typename Own>
  bool serve(comm::Group* leaders, uint64_t seq, float* data, size_t count, Own own) {
    const int me = leader_index(), hosts = leaders != nullptr ? leaders->size() : 1;
    const bool flagged = update_on_shards_;  // plain averages carry no flag
    std::vector<float> flags(static_cast<size_t>(num_shards_), 1.0f);
    std::vector<std::shared_ptr<comm::Work>> works;
    for (int s = 0; s < num_shards_; ++s) {
      const size_t b = shard_begin(count, s), n = shard_begin(count, s + 1) - b;
      if (n == 0) continue;
      float* flag = &flags[static_cast<size_t>(s)];
      if (owner(s) != me) {
        works.push_back(leaders->recv_async(data + b, n * sizeof(float), owner(s), tag(seq, s, Leg::kPull)));
        if (flagged) works.push_back(leaders->recv_async(flag, sizeof(float), owner(s), tag(seq, s, Leg::kFlag)));
        continue;
      }
      *flag = own(s, b, n) ? 1.0f : 0.0f;
      for (int p = 0; p < hosts; ++p) {
        if (p == me) continue;
        works.push_back(leaders->send_async(data + b, n * sizeof(float), p, tag(seq, s, Leg::kPull)));
        cross_bytes_ += n * sizeof(float);
        if (flagged) works.push_back(leaders->send_async(flag, sizeof(float), p, tag(seq, s, Leg::kFlag)));
      }
    }
    comm::wait_all(works);
    return std::all_of(flags.begin(), flags.end(), [](float f) { return f != 0; });
  }

  // One SGD step on shard s = u.data[b, b+n), which holds the sum of every replica's gradient;
  // leaves the shard's parameters there. torch::optim::SGD's arithmetic, element by element.
  bool sgd_step(const ShardUpdate& u, const std::pair<std::vector<float>, std::vector<float>>& init, int s,
                size_t b, size_t n) {
    auto& st = state_[{u.key, s}];
    if (u.init) {
      st.start(init.first.data() + b, init.second.empty() ? nullptr : init.second.data() + b, n);
    } else if (st.params.size() != n) {
      throw Error("ps shard " + std::to_string(s) + " of bucket " + std::to_string(u.key) +
                  " was asked to update parameters it never received (the replica must start it with init)");
    }
    return st.step(u.sgd, u.data + b, n, 1.0f / static_cast<float>(group_->size()));
  }

  // Placement "processes": one request to every shard process (ps_wire.h), all its messages
  // posted at once: data[0, count) holds the host's sum (average, update) and receives the
  // answer once `works` are done.
  struct Remote {
    std::vector<ps_wire::Request> headers;
    std::vector<float> flags;  // per shard: stepped / has momentum
    std::vector<std::shared_ptr<comm::Work>> works;
    std::shared_ptr<void> keep;  // buffers the sends read
    bool all_flags() const { return std::all_of(flags.begin(), flags.end(), [](float f) { return f != 0; }); }
  };
  std::shared_ptr<Remote> post_remote(uint64_t seq, ps_wire::Op op, float* data, size_t count,
                                      const ShardUpdate* u = nullptr,
                                      const std::pair<std::vector<float>, std::vector<float>>* init = nullptr) {
    auto& g = *servers_;
    const int clients = group_->num_hosts();
    const bool lead = g.rank() == 0;  // sends the start state
    auto out = std::make_shared<Remote>();
    out->headers.resize(static_cast<size_t>(num_shards_));
    out->flags.assign(static_cast<size_t>(num_shards_), 1.0f);
    auto& works = out->works;
    for (int s = 0; s < num_shards_; ++s) {
      const size_t b = shard_begin(count, s), n = shard_begin(count, s + 1) - b;
      const int server = clients + s;
      auto& r = out->headers[static_cast<size_t>(s)];
      r.op = op;
      r.count = n;
      r.replicas = static_cast<uint32_t>(group_->size());
      if (u != nullptr) {
        r.key = u->key;
        r.set_sgd(u->sgd);
        if (u->init) r.flags |= ps_wire::kInit;
        if (init != nullptr && !init->second.empty()) r.flags |= ps_wire::kHasMomentum;
      }
      works.push_back(g.send_async(&r, sizeof(r), server, ps_wire::tag(seq, ps_wire::Leg::kRequest)));
      if (n > 0 && op != ps_wire::Op::kGather) {
        works.push_back(g.send_async(data + b, n * sizeof(float), server, ps_wire::tag(seq, ps_wire::Leg::kData)));
      }
      if (n > 0 && lead && (r.flags & ps_wire::kInit) != 0) {
        works.push_back(g.send_async(init->first.data() + b, n * sizeof(float), server,
                                     ps_wire::tag(seq, ps_wire::Leg::kParams)));
        if ((r.flags & ps_wire::kHasMomentum) != 0) {
          works.push_back(g.send_async(init->second.data() + b, n * sizeof(float), server,
                                       ps_wire::tag(seq, ps_wire::Leg::kMomentum)));
        }
      }
      // The answer lands where the sum was: the shard answers only after it has all the sums.
      if (n > 0) {
        works.push_back(g.recv_async(data + b, n * sizeof(float), server, ps_wire::tag(seq, ps_wire::Leg::kReply)));
      }
      works.push_back(g.recv_async(&out->flags[static_cast<size_t>(s)], sizeof(float), server,
                                   ps_wire::tag(seq, ps_wire::Leg::kFlag)));
    }
    return out;
  }
  // post_remote, waited for; returns whether every shard's flag was set.
  bool remote(uint64_t seq, ps_wire::Op op, float* data, size_t count, const ShardUpdate* u = nullptr,
              const std::pair<std::vector<float>, std::vector<float>>* init = nullptr) {
    auto r = post_remote(seq, op, data, count, u, init);
    comm::wait_all(r->works);
    return r->all_flags();
  }

  // Shard processes and one replica per host (no shared-memory stage, whose collectives must
  // keep one order): a request is posted on the strategy's thread and its answer awaited on a
  // second one, in order, so bucket i+1's pushes go out while bucket i's answers come in (both
  // directions of every link busy). Neither thread's tasks throw (a sticky failure would leave
  // later Works never completed): errors complete the returned Work.
  bool pipelined() const { return shard_processes_ && group_->local().size() == 1; }
  std::shared_ptr<comm::Work> submit_pipelined(const std::string& what, std::function<std::shared_ptr<Remote>()> post,
                                               std::function<void(const Remote&)> then = {}) {
    auto done = std::make_shared<comm::Work>(what);
    queue_.submit(what + ": request", [this, done, post = std::move(post), then = std::move(then), what] {
      try {
        check_not_aborted();
        std::shared_ptr<Remote> r = post();
        answers_.submit(what + ": answer", [r, done, then] {
          try {
            comm::wait_all(r->works);
            if (then) then(*r);
            done->complete();
          } catch (...) {
            done->complete(std::current_exception());
          }
        });
      } catch (...) {
        done->complete(std::current_exception());
      }
    });
    return done;
  }

  std::shared_ptr<comm::HierarchicalGroup> group_;
  const int num_shards_;
  const bool update_on_shards_;
  const bool shard_processes_;
  std::shared_ptr<comm::Group> servers_;  // shard processes: the leaders' and shards' group (leaders only)
  const DataType wire_;                    // across hosts: float32, or 16 bits with error feedback
  const std::shared_ptr<PowerSgd> powersgd_;  // or PowerSGD's factors, summed among the leaders
  std::atomic<uint64_t> cross_bytes_{0};   // sent to other leaders
  std::atomic<uint64_t> next_seq_{0};
  std::atomic<bool> aborted_{false};
  std::string reason_;
  std::map<std::pair<uint64_t, int>, ShardState> state_;  // (bucket key, shard) owned here; queue thread only
  comm::OpQueue answers_{"ps strategy answers"};  // pipelined(): before queue_, which submits to it
  comm::OpQueue queue_;  // last: its thread stops before the members it uses go
};

}  // namespace

std::unique_ptr<GradientStrategy> make_ps_strategy(std::shared_ptr<comm::HierarchicalGroup> group,
                                                   const PsOptions& options) {
  return std::make_unique<PsStrategy>(std::move(group), options);
}

}  // namespace dsgd::strategy
