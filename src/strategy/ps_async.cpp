// The asynchronous parameter-server strategy (ps_async): owners apply each replica's gradient
// as it arrives; a serving thread per client in every owner, request and reply over Gloo
// point-to-point on the global group.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/op_queue.h"
#include "dsgd/common/error.h"
#include "strategy/sgd.h"
#include "strategy/strategy.h"

namespace dsgd::strategy {
namespace {

using std::chrono::milliseconds;

// A serving thread waits for its client's next request without a deadline of its own: the
// runtime notices a lost worker (heartbeats, exited processes) and aborts the group.
constexpr milliseconds kServeWait{std::chrono::hours(24 * 7)};

enum class Kind : uint32_t { kPush = 1, kPull = 2 };

struct Request {  // client -> owner; a push's gradient follows
  Kind kind = Kind::kPush;
  uint32_t shard = 0;
  uint64_t key = 0;
  uint64_t count = 0;
  uint64_t version_seen = 0;  // the shard's version of the parameters the gradient was computed on
  SgdOptions sgd;
};

struct Reply {  // owner -> client; the parameters follow (and the momentum, for a pull)
  uint64_t version = 0;
  uint64_t staleness = 0;
  uint32_t applied = 1;
  uint32_t has_momentum = 0;
};

// One shard of one bucket, as its owner keeps it.
struct Shard {
  std::mutex mutex;
  std::condition_variable advanced;   // a client's clock moved
  std::vector<float> params;
  std::vector<float> momentum;        // empty until the first step with momentum
  uint64_t version = 0;               // updates applied since the start
  std::vector<int64_t> clock;         // per client: its updates applied here
};

class PsAsyncStrategy final : public GradientStrategy, private ServerUpdates {
 public:
  PsAsyncStrategy(std::shared_ptr<comm::HierarchicalGroup> group, int num_shards, int max_staleness)
      : group_(std::move(group)),
        g_(group_->global()),
        rank_(g_.rank()),
        world_(g_.size()),
        num_shards_(num_shards),
        max_staleness_(max_staleness),
        queue_("ps_async strategy") {
    if (num_shards_ < 1 || num_shards_ > 64) {
      throw ConfigError("num_ps_shards must be in 1..64, got " + std::to_string(num_shards_));
    }
    // Host index -> its lowest rank, hosts in order of their lowest rank (as HierarchicalGroup).
    std::vector<std::string> hosts;
    for (int r = 0; r < world_; ++r) {
      if (std::find(hosts.begin(), hosts.end(), g_.host(r)) == hosts.end()) {
        hosts.push_back(g_.host(r));
        host_leader_.push_back(r);
      }
    }
    to_owner_seq_.assign(static_cast<size_t>(world_), 0);
    bool owner = false;
    for (int s = 0; s < num_shards_; ++s) owner = owner || owner_of(s) == rank_;
    if (owner) {
      for (int c = 0; c < world_; ++c) {
        if (c != rank_) servers_.emplace_back([this, c] { serve(c); });
      }
    }
  }

  ~PsAsyncStrategy() override {
    stopping_ = true;
    wake_waiting_pushes();
    if (!servers_.empty()) group_->abort("ps_async strategy closed");  // wakes the serving threads
    for (auto& t : servers_) t.join();
  }

  std::string name() const override { return "ps_async"; }
  ServerUpdates* server_updates() override { return this; }
  bool starts_servers_eagerly() const override { return true; }

  std::shared_ptr<comm::Work> average_async(float*, size_t) override {
    throw Error("ps_async takes update_async, not average_async");
  }

  void start_servers(uint64_t key, const float* params, const float* momentum, size_t count) override {
    for (int s = 0; s < num_shards_; ++s) {
      const size_t b = begin(count, s), n = begin(count, s + 1) - b;
      seen_[{key, s}] = 0;
      if (owner_of(s) != rank_ || n == 0) continue;
      auto& shard = shard_of(key, s, /*create=*/true);
      std::lock_guard<std::mutex> lock(shard.mutex);
      shard.params.assign(params + b, params + b + n);
      shard.momentum.clear();
      if (momentum != nullptr) shard.momentum.assign(momentum + b, momentum + b + n);
      shard.version = 0;
      shard.clock.assign(static_cast<size_t>(world_), 0);
    }
  }

  std::shared_ptr<comm::Work> update_async(const ShardUpdate& u, bool* all_applied) override {
    return queue_.submit("ps_async update of bucket " + std::to_string(u.key), [this, u, all_applied] {
      check_not_aborted();
      *all_applied = exchange(Kind::kPush, u.key, u.data, nullptr, u.count, u.sgd, nullptr);
    });
  }

  std::shared_ptr<comm::Work> gather_state_async(uint64_t key, float* params, float* momentum, size_t count,
                                                 bool* has_momentum) override {
    return queue_.submit("ps_async pull of bucket " + std::to_string(key), [=, this] {
      check_not_aborted();
      std::vector<float> scratch;
      float* p = params;
      if (p == nullptr) {
        scratch.resize(count);
        p = scratch.data();
      }
      exchange(Kind::kPull, key, p, momentum, count, SgdOptions{}, has_momentum);
    });
  }

  Staleness take_staleness() override {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    Staleness s = stats_;
    stats_ = {};
    return s;
  }

  void abort(const std::string& reason) override {
    reason_ = reason;
    aborted_ = true;
    wake_waiting_pushes();
    group_->abort(reason);
  }

 private:
  // After stopping_ or aborted_ is set: pushes held back by the staleness bound give up.
  void wake_waiting_pushes() {
    std::lock_guard<std::mutex> lock(shards_mutex_);
    for (auto& [key, shard] : shards_) {
      { std::lock_guard<std::mutex> shard_lock(shard->mutex); }  // a waiter is either waiting or will see the flag
      shard->advanced.notify_all();
    }
  }

  int owner_of(int s) const { return host_leader_[static_cast<size_t>(s) % host_leader_.size()]; }
  size_t begin(size_t count, int s) const {
    return count * static_cast<size_t>(s) / static_cast<size_t>(num_shards_);
  }
  // Per (client, owner) pair, requests are numbered; legs of request `seq`.
  static uint32_t tag(uint64_t seq, uint32_t leg) { return static_cast<uint32_t>((seq % (1u << 24)) * 4 + leg); }

  void check_not_aborted() const {
    if (aborted_) throw CommError("ps_async strategy aborted: " + reason_, "ps_async");
  }

  Shard& shard_of(uint64_t key, int s, bool create = false) {
    std::lock_guard<std::mutex> lock(shards_mutex_);
    auto it = shards_.find({key, s});
    if (it == shards_.end()) {
      if (!create) {
        throw Error("ps_async: shard " + std::to_string(s) + " of bucket " + std::to_string(key) +
                    " was never started on its owner (rank " + std::to_string(rank_) + ")");
      }
      it = shards_.emplace(std::make_pair(key, s), std::make_unique<Shard>()).first;
    }
    return *it->second;
  }

  // The owner's side of a push: waits while `client` is too far ahead, applies SGD to g (n
  // floats) and leaves the shard's parameters in g. Returns whether the step was applied.
  bool apply(Shard& shard, int client, float* g, size_t n, const SgdOptions& sgd, uint64_t version_seen,
             Reply& reply) {
    std::unique_lock<std::mutex> lock(shard.mutex);
    if (shard.params.size() != n) throw Error("ps_async: a push of the wrong size for its shard");
    if (max_staleness_ >= 0) {
      const int64_t mine = shard.clock[static_cast<size_t>(client)];
      shard.advanced.wait(lock, [&] {
        return stopping_ || aborted_ ||
               mine - *std::min_element(shard.clock.begin(), shard.clock.end()) <= max_staleness_;
      });
      if (stopping_ || aborted_) throw CommError("ps_async strategy closed while a push waited", "ps_async");
    }
    reply.staleness = shard.version - std::min(shard.version, version_seen);
    const bool finite = scale_and_check(g, n, 1.0f);
    if (finite) {
      const bool first = shard.momentum.empty();
      if (sgd.momentum != 0 && first) shard.momentum.resize(n);
      sgd_pass(sgd, first, g, shard.params.data(), shard.momentum.data(), n);
      ++shard.version;
    } else {
      std::copy(shard.params.begin(), shard.params.end(), g);
    }
    ++shard.clock[static_cast<size_t>(client)];
    reply.version = shard.version;
    reply.applied = finite ? 1 : 0;
    lock.unlock();
    shard.advanced.notify_all();
    return finite;
  }

  void read(Shard& shard, float* params, float* momentum, size_t n, Reply& reply) {
    std::lock_guard<std::mutex> lock(shard.mutex);
    std::copy(shard.params.begin(), shard.params.end(), params);
    reply.has_momentum = shard.momentum.size() == n ? 1 : 0;
    if (reply.has_momentum != 0) std::copy(shard.momentum.begin(), shard.momentum.end(), momentum);
    reply.version = shard.version;
  }

  // The serving thread for `client`: its requests, in order, until the group goes.
  void serve(int client) {
    try {
      for (uint64_t seq = 0;; ++seq) {
        Request req;
        g_.recv_async(&req, sizeof(req), client, tag(seq, 0), kServeWait)->wait();
        const size_t n = req.count;
        Reply reply;
        std::vector<float> data(req.kind == Kind::kPull ? 2 * n : n);
        if (req.kind == Kind::kPush) {
          g_.recv_async(data.data(), n * sizeof(float), client, tag(seq, 1))->wait();
          apply(shard_of(req.key, static_cast<int>(req.shard)), client, data.data(), n, req.sgd, req.version_seen,
                reply);
        } else {
          read(shard_of(req.key, static_cast<int>(req.shard)), data.data(), data.data() + n, n, reply);
        }
        g_.send_async(&reply, sizeof(reply), client, tag(seq, 2))->wait();
        g_.send_async(data.data(), data.size() * sizeof(float), client, tag(seq, 3))->wait();
      }
    } catch (const std::exception&) {
      // The group was aborted or a peer went: the runtime re-forms the job; nothing to report
      // here (the clients' own requests fail with the cause).
    }
  }

  // The client's side, for every shard of a bucket: a push (gradient in data, parameters back
  // into it) or a pull (parameters into data, momentum into `momentum`). Own shards are served
  // in place; the others' requests are all in flight at once. Returns whether every push was
  // applied; *has_momentum (pulls) whether every shard had momentum.
  bool exchange(Kind kind, uint64_t key, float* data, float* momentum, size_t count, const SgdOptions& sgd,
                bool* has_momentum) {
    struct Pending {
      int s = 0;
      size_t b = 0, n = 0;
      Request req;
      Reply reply;
      std::vector<float> back;
      std::vector<std::shared_ptr<comm::Work>> works;
    };
    std::vector<Pending> pending(static_cast<size_t>(num_shards_));
    bool applied = true, has = true;
    auto account = [&](int s, const Reply& r) {
      seen_[{key, s}] = r.version;
      if (kind == Kind::kPush) {
        applied = applied && r.applied != 0;
        std::lock_guard<std::mutex> lock(stats_mutex_);
        ++stats_.updates;
        stats_.sum += static_cast<int64_t>(r.staleness);
        stats_.max = std::max(stats_.max, static_cast<int64_t>(r.staleness));
      } else {
        has = has && r.has_momentum != 0;
      }
    };
    for (int s = 0; s < num_shards_; ++s) {
      auto& p = pending[static_cast<size_t>(s)];
      p.s = s;
      p.b = begin(count, s);
      p.n = begin(count, s + 1) - p.b;
      if (p.n == 0 || owner_of(s) == rank_) continue;
      const int owner = owner_of(s);
      const uint64_t seq = to_owner_seq_[static_cast<size_t>(owner)]++;
      p.req = Request{kind, static_cast<uint32_t>(s), key, p.n, seen_[{key, s}], sgd};
      p.back.resize(kind == Kind::kPull ? 2 * p.n : p.n);
      p.works.push_back(g_.send_async(&p.req, sizeof(p.req), owner, tag(seq, 0)));
      if (kind == Kind::kPush) p.works.push_back(g_.send_async(data + p.b, p.n * sizeof(float), owner, tag(seq, 1)));
      p.works.push_back(g_.recv_async(&p.reply, sizeof(p.reply), owner, tag(seq, 2)));
      p.works.push_back(g_.recv_async(p.back.data(), p.back.size() * sizeof(float), owner, tag(seq, 3)));
    }
    std::exception_ptr own_error;  // raised only once the requests in flight are over (their buffers are here)
    try {
      for (int s = 0; s < num_shards_; ++s) {  // own shards meanwhile
        auto& p = pending[static_cast<size_t>(s)];
        if (p.n == 0 || owner_of(s) != rank_) continue;
        Reply r;
        if (kind == Kind::kPush) {
          apply(shard_of(key, s), rank_, data + p.b, p.n, sgd, seen_[{key, s}], r);
        } else {
          std::vector<float> m(p.n);
          read(shard_of(key, s), data + p.b, m.data(), p.n, r);
          if (momentum != nullptr && r.has_momentum != 0) std::copy(m.begin(), m.end(), momentum + p.b);
        }
        account(s, r);
      }
    } catch (...) {
      own_error = std::current_exception();
      abort("ps_async: this replica's own shard failed");  // ends the requests in flight at once
    }
    std::vector<std::shared_ptr<comm::Work>> all;
    for (auto& p : pending) all.insert(all.end(), p.works.begin(), p.works.end());
    if (own_error) {
      try {
        comm::wait_all(all);
      } catch (...) {
      }
      std::rethrow_exception(own_error);
    }
    comm::wait_all(all);
    for (auto& p : pending) {
      if (p.works.empty()) continue;
      std::copy(p.back.begin(), p.back.begin() + static_cast<ptrdiff_t>(p.n), data + p.b);
      if (kind == Kind::kPull && momentum != nullptr && p.reply.has_momentum != 0) {
        std::copy(p.back.begin() + static_cast<ptrdiff_t>(p.n), p.back.end(), momentum + p.b);
      }
      account(p.s, p.reply);
    }
    if (has_momentum != nullptr) *has_momentum = has;
    return applied;
  }

  std::shared_ptr<comm::HierarchicalGroup> group_;
  comm::Group& g_;
  const int rank_;
  const int world_;
  const int num_shards_;
  const int max_staleness_;
  std::vector<int> host_leader_;             // per host index: its lowest rank (the shards' owners)
  std::vector<uint64_t> to_owner_seq_;       // per owner: this client's next request number (queue thread)
  std::map<std::pair<uint64_t, int>, uint64_t> seen_;  // (bucket, shard): version last received (queue thread)

  std::mutex shards_mutex_;
  std::map<std::pair<uint64_t, int>, std::unique_ptr<Shard>> shards_;  // owned here

  std::mutex stats_mutex_;
  Staleness stats_;

  std::atomic<bool> stopping_{false};
  std::atomic<bool> aborted_{false};
  std::string reason_;
  std::vector<std::thread> servers_;         // one per client, in owners
  comm::OpQueue queue_;                      // last: its thread stops first
};

}  // namespace

std::unique_ptr<GradientStrategy> make_ps_async_strategy(std::shared_ptr<comm::HierarchicalGroup> group,
                                                         int num_shards, int max_staleness) {
  return std::make_unique<PsAsyncStrategy>(std::move(group), num_shards, max_staleness);
}

}  // namespace dsgd::strategy
