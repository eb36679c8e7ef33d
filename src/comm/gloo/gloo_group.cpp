// Group over Gloo's TCP transport. One Gloo context per group, used only with Gloo's
// unbound-buffer API (mixing in the bound-buffer algorithm classes pins the socket buffers small
// and slows gloo::allreduce 150x on Debian's Gloo). Collectives run one at a time on the
// collective thread, tagged with their sequence number. Point-to-point operations are posted at
// once from the caller's thread (so a send and the matching recv never wait on each other's
// queue), and each gets a waiter thread: Gloo can only block on one buffer at a time, and
// completing them in posting order could deadlock two ranks that receive in different orders.
#include <gloo/allgather.h>
#include <gloo/alltoall.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/types.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <deque>
#include <type_traits>
#include <list>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/elastic_threads.h"
#include "comm/gloo/gloo_calls.h"
#include "comm/gloo/rendezvous.h"
#include "comm/process.h"
#include "comm/reduce_kernels.h"
#include "dsgd/comm/group.h"
#include "dsgd/common/error.h"

namespace dsgd::comm {
namespace {

using std::chrono::milliseconds;

// Point-to-point slots live above Gloo's collective prefixes (0x01-0x08).
constexpr uint8_t kP2pSlotPrefix = 0x40;
// How often the watchdog checks that same-host peers are alive while an operation is pending.
constexpr milliseconds kLivenessInterval{100};
// How long a dead same-host peer may take to show as exited after its sockets were reset.
constexpr milliseconds kExitVisibleWithin{300};

// Owned through shared_ptr: the collective thread holds a reference, so a group destroyed while
// a Gloo call is stuck (Gloo cannot interrupt one; it ends at its deadline) hands the thread
// its state instead of blocking the caller.
class GlooGroup : public Group, public std::enable_shared_from_this<GlooGroup> {
 public:
  GlooGroup(std::shared_ptr<Store> store, int rank, int size, const GroupOptions& options)
      : rank_(rank), size_(size), options_(options) {
    if (size < 1 || rank < 0 || rank >= size) {
      throw ConfigError("group: rank " + std::to_string(rank) + " is not in 0.." + std::to_string(size - 1) +
                        " (size " + std::to_string(size) + ")");
    }
    if (options_.timeout.count() <= 0) throw ConfigError("group: timeout must be positive");
    if (options_.host.empty()) options_.host = this_host();
    rendezvous(*store);
  }

  void start() {
    collective_thread_ = std::thread([self = shared_from_this()] { self->collective_loop(); });
    watchdog_thread_ = std::thread([this] { watchdog_loop(); });
  }

  // Stops the threads: fails what is queued, aborts p2p waits, and joins the collective thread
  // unless a Gloo call is in flight, which it then leaves to end at its own deadline.
  void shutdown() {
    bool in_flight = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      if (!error_) error_ = std::make_exception_ptr(CommError("group destroyed", "shutdown"));
      in_flight = current_ != nullptr;
    }
    queue_cv_.notify_all();
    watchdog_cv_.notify_all();
    watchdog_thread_.join();
    if (in_flight || p2p_pending()) close_transport();  // before the waits are woken (close_transport)
    abort_p2p();
    waiter_threads_.join();  // outside the lock: a waiter that is failing calls abort_p2p, which takes it
    if (in_flight) {
      collective_thread_.detach();
    } else {
      collective_thread_.join();
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& host(int rank) const override { return hosts_.at(static_cast<size_t>(rank)); }
  std::vector<int> local_ranks() const override {
    std::vector<int> out;
    for (int r = 0; r < size_; ++r) {
      if (hosts_[r] == options_.host) out.push_back(r);
    }
    return out;
  }
  milliseconds timeout() const override { return options_.timeout; }

  std::shared_ptr<Work> allreduce_async(void* data, size_t count, DataType type, ReduceOp op,
                                        AllreduceAlgorithm algorithm, milliseconds timeout) override {
    algorithm = resolve_allreduce_algorithm(algorithm, size_, count * element_size(type));
    const std::string what = std::to_string(count) + " x " + to_string(type) + ", " + to_string(op) + ", " +
                             to_string(algorithm);
    return enqueue("allreduce", what, timeout, [=, this](uint32_t tag, milliseconds t) {
      if (count == 0 || size_ == 1) return;
      gloo::AllreduceOptions o(context_);
      o.setTag(tag);
      o.setTimeout(t);
      o.setAlgorithm(algorithm == AllreduceAlgorithm::kRing ? gloo::AllreduceOptions::Algorithm::RING
                                                             : gloo::AllreduceOptions::Algorithm::BCUBE);
      configure_allreduce(o, data, count, type, op);
      gloo::allreduce(o);
      if (op == ReduceOp::kAverage) divide_by(data, count, type, size_);
    });
  }

  std::shared_ptr<Work> broadcast_async(void* data, size_t bytes, int root, milliseconds timeout) override {
    check_peer(root, "broadcast root");
    return enqueue("broadcast", std::to_string(bytes) + " bytes from rank " + std::to_string(root), timeout,
                   [=, this](uint32_t tag, milliseconds t) {
                     if (bytes == 0 || size_ == 1) return;
                     gloo::BroadcastOptions o(context_);
                     o.setTag(tag);
                     o.setTimeout(t);
                     o.setRoot(root);
                     o.setOutput<uint8_t>(static_cast<uint8_t*>(data), bytes);
                     gloo::broadcast(o);
                   });
  }

  std::shared_ptr<Work> allgather_async(const void* in, void* out, size_t bytes, milliseconds timeout) override {
    return exchange<gloo::AllgatherOptions>("allgather", bytes, "per rank", bytes, in, out, timeout);
  }

  std::shared_ptr<Work> alltoall_async(const void* in, void* out, size_t bytes, milliseconds timeout) override {
    return exchange<gloo::AlltoallOptions>("alltoall", bytes, "per pair", bytes * static_cast<size_t>(size_), in, out,
                                           timeout);
  }

  // allgather and alltoall: `in_bytes` in, size() * `bytes` out (a copy on one rank).
  template <typename Options>
  std::shared_ptr<Work> exchange(const char* op, size_t bytes, const char* per, size_t in_bytes, const void* in,
                                 void* out, milliseconds timeout) {
    return enqueue(op, std::to_string(bytes) + " bytes " + per, timeout, [=, this](uint32_t tag, milliseconds t) {
      if (bytes == 0) return;
      uint8_t* dst = static_cast<uint8_t*>(out);
      if (size_ == 1) {
        std::memmove(dst, in, bytes);
        return;
      }
      Options o(context_);
      o.setTag(tag);
      o.setTimeout(t);
      o.template setInput<uint8_t>(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), in_bytes);
      o.template setOutput<uint8_t>(dst, bytes * static_cast<size_t>(size_));
      if constexpr (std::is_same_v<Options, gloo::AllgatherOptions>) {
        gloo::allgather(o);
      } else {
        gloo::alltoall(o);
      }
    });
  }

  // Gloo's unbound API has no reduce-scatter: block j of every rank goes to rank j (Gloo's
  // alltoall), which reduces the blocks it gets in rank order. (n-1)/n of the data each way.
  std::shared_ptr<Work> reduce_scatter_async(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                                             milliseconds timeout) override {
    const size_t es = element_size(type);
    auto got = std::make_shared<std::vector<uint8_t>>(count * es * static_cast<size_t>(size_));
    return enqueue("reduce_scatter", std::to_string(count) + " x " + to_string(type) + " per rank, " + to_string(op),
                   timeout, [=, this](uint32_t tag, milliseconds t) {
                     if (count == 0) return;
                     if (size_ == 1) {
                       std::memmove(out, in, count * es);
                       return;
                     }
                     gloo::AlltoallOptions o(context_);
                     o.setTag(tag);
                     o.setTimeout(t);
                     o.setInput<uint8_t>(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), got->size());
                     o.setOutput<uint8_t>(got->data(), got->size());
                     gloo::alltoall(o);
                     std::memcpy(out, got->data(), count * es);
                     std::vector<const void*> others;
                     for (int r = 1; r < size_; ++r) {
                       others.push_back(got->data() + static_cast<size_t>(r) * count * es);
                     }
                     reduce_many(out, others.data(), static_cast<int>(others.size()), count, type, op,
                                 op == ReduceOp::kAverage ? size_ : 1);
                   });
  }

  std::shared_ptr<Work> barrier_async(milliseconds timeout) override {
    return enqueue("barrier", "", timeout, [this](uint32_t tag, milliseconds t) {
      if (size_ == 1) return;
      gloo::BarrierOptions o(context_);
      o.setTag(tag);
      o.setTimeout(t);
      gloo::barrier(o);
    });
  }

  std::shared_ptr<Work> send_async(const void* data, size_t bytes, int peer, uint32_t tag,
                                   milliseconds timeout) override {
    return post_p2p(/*send=*/true, const_cast<void*>(data), bytes, peer, tag, timeout);
  }

  std::shared_ptr<Work> recv_async(void* data, size_t bytes, int peer, uint32_t tag, milliseconds timeout) override {
    return post_p2p(/*send=*/false, data, bytes, peer, tag, timeout);
  }

  void abort(const std::string& reason) override {
    abort_with(std::make_exception_ptr(CommError("group aborted: " + reason, "abort")));
  }

 private:
  struct Op {
    std::shared_ptr<Work> work;
    uint32_t tag;
    milliseconds timeout;
    std::function<void(uint32_t, milliseconds)> run;
  };
  struct P2pOp {
    std::shared_ptr<Work> work;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    bool send;
    int peer;
    milliseconds timeout;
    std::atomic<bool> finished{false};
  };

  void rendezvous(Store& store) {
    Rendezvous r = meet(store, rank_, size_, options_);
    hosts_ = std::move(r.hosts);
    pids_ = std::move(r.pids);
    context_ = std::move(r.context);
  }

  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size_) {
      throw ConfigError(std::string(what) + " " + std::to_string(peer) + " is not a rank of this group (0.." +
                        std::to_string(size_ - 1) + ")");
    }
  }

  std::shared_ptr<Work> enqueue(const std::string& name, const std::string& what, milliseconds timeout,
                                std::function<void(uint32_t, milliseconds)> run) {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint32_t tag = next_tag_++;
    auto work = std::make_shared<Work>(name + " #" + std::to_string(tag) + (what.empty() ? "" : " (" + what + ")"));
    if (error_) {
      work->complete(error_);
      return work;
    }
    queue_.push_back({work, tag, timeout.count() > 0 ? timeout : options_.timeout, std::move(run)});
    queue_cv_.notify_one();
    return work;
  }

  // Why this thread exists: collectives must run one at a time, in the same order on every
  // rank, while the caller goes on computing.
  void collective_loop() {
    while (true) {
      Op op;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        op = std::move(queue_.front());
        queue_.pop_front();
        if (error_) {
          op.work->complete(error_);
          continue;
        }
        current_ = op.work;
      }
      try {
        op.run(op.tag, op.timeout);
        {
          std::lock_guard<std::mutex> lock(mutex_);
          current_ = nullptr;
        }
        op.work->complete();
      } catch (const std::exception& e) {
        fail(op.work, from_gloo(e) ? translate(op.work->description(), e.what(), op.timeout, -1)
                                   : std::make_exception_ptr(CommError(op.work->description() + " failed: " + e.what(),
                                                                       op.work->description())));
      }
      std::lock_guard<std::mutex> lock(mutex_);
      current_ = nullptr;
    }
  }

  std::shared_ptr<Work> post_p2p(bool send, void* data, size_t bytes, int peer, uint32_t tag, milliseconds timeout) {
    check_peer(peer, send ? "send to" : "recv from");
    if (peer == rank_) throw ConfigError("point-to-point with oneself (rank " + std::to_string(rank_) + ")");
    auto op = std::make_shared<P2pOp>();
    op->work = std::make_shared<Work>(std::string(send ? "send to rank " : "recv from rank ") + std::to_string(peer) +
                                      " (tag " + std::to_string(tag) + ", " + std::to_string(bytes) + " bytes)");
    op->send = send;
    op->peer = peer;
    op->timeout = timeout.count() > 0 ? timeout : options_.timeout;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error_) {
        op->work->complete(error_);
        return op->work;
      }
    }
    try {
      op->buffer = context_->createUnboundBuffer(data, bytes);
      const uint64_t slot = gloo::Slot::build(kP2pSlotPrefix, tag);
      if (send) {
        op->buffer->send(peer, slot);
      } else {
        op->buffer->recv(peer, slot);
      }
    } catch (const std::exception& e) {
      if (!from_gloo(e)) throw;
      fail(op->work, translate(op->work->description(), e.what(), op->timeout, peer));
      return op->work;
    }
    {
      std::lock_guard<std::mutex> lock(waiters_mutex_);
      std::erase_if(waiters_, [](const auto& o) { return o->finished.load(); });
      waiters_.push_back(op);
      waiter_threads_.run([this, op] { wait_p2p(*op); });
    }
    // An abort between the check above and the registration found no waiter to wake: wake it
    // here (Gloo keeps an abort requested before the wait for the wait).
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) send ? op->buffer->abortWaitSend() : op->buffer->abortWaitRecv();
    return op->work;
  }

  // A waiter thread's body: blocks on one posted buffer until done, failed or aborted.
  void wait_p2p(P2pOp& op) {
    try {
      const bool ok = op.send ? op.buffer->waitSend(op.timeout) : op.buffer->waitRecv(op.timeout);
      if (ok) {
        op.work->complete();
      } else {
        close_transport();  // woken by an abort, which closes them too: wait until it has
        std::lock_guard<std::mutex> lock(mutex_);
        op.work->complete(error_ ? error_ : std::make_exception_ptr(CommError(op.work->description() + ": aborted")));
      }
    } catch (const std::exception& e) {
      if (!from_gloo(e)) throw;
      fail(op.work, translate(op.work->description(), e.what(), op.timeout, op.peer));
    }
    op.finished = true;
  }

  // Makes `error` the group's error (unless one is already set) and wakes everything. Gloo
  // cannot interrupt a collective in flight: its Work fails now, and the call itself ends at its
  // deadline on closed connections, with nothing left to touch. The connections close first:
  // until they do, Gloo may still deliver a peer's message into a pending receive's buffer,
  // which its caller frees once the Work has failed (a live peer's answer into a freed buffer
  // was heap corruption in a worker whose parameter-server shard process had died).
  void abort_with(std::exception_ptr error) {
    std::shared_ptr<Work> in_flight;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::move(error);
      in_flight = current_;
      error = error_;
    }
    close_transport();
    if (in_flight) in_flight->complete(error);
    abort_p2p();
    queue_cv_.notify_all();
  }

  // Why this thread exists: Debian's Gloo does not always notice a dead peer (a send waiting for
  // the peer's receive-ready notice sleeps until its deadline), so while anything is pending,
  // same-host peers' processes are checked every kLivenessInterval, and a dead one fails the
  // group at once, by name. Peers on other hosts are the runtime's heartbeats' business.
  void watchdog_loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      watchdog_cv_.wait_for(lock, kLivenessInterval);
      if (stopping_ || error_) continue;
      if (current_ == nullptr && !p2p_pending()) continue;
      const std::string op = current_ ? current_->description() : "point-to-point";
      lock.unlock();
      for (int r = 0; r < size_; ++r) {
        if (r == rank_ || hosts_[r] != options_.host || !process_gone(pids_[r])) continue;
        abort_with(std::make_exception_ptr(
            CommError("rank " + std::to_string(rank_) + ": " + op + " failed: rank " + std::to_string(r) + " (host " +
                          hosts_[r] + ", pid " + std::to_string(pids_[r]) + ") has exited; re-form the group",
                      op, r, hosts_[r])));
        break;
      }
      lock.lock();
    }
  }

  // Whether a posted point-to-point operation is still waiting.
  bool p2p_pending() {
    std::lock_guard<std::mutex> lock(waiters_mutex_);
    return std::any_of(waiters_.begin(), waiters_.end(), [](const auto& w) { return !w->finished; });
  }

  void abort_p2p() {
    std::lock_guard<std::mutex> lock(waiters_mutex_);
    for (auto& w : waiters_) {
      if (w->finished) continue;
      if (w->send) {
        w->buffer->abortWaitSend();
      } else {
        w->buffer->abortWaitRecv();
      }
    }
  }

  // Records the first error (sticky) and completes `work` with it. The first error also closes
  // every connection, then wakes every pending point-to-point wait (closed connections do not):
  // Gloo may still deliver into buffers of operations that timed out or are woken here, which
  // their callers free once their Works have failed, and the peers should learn at once that
  // this group is finished. So the connections close before any Work fails.
  void fail(const std::shared_ptr<Work>& work, std::exception_ptr error) {
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) {
        error_ = error;
        first = true;
      }
    }
    close_transport();  // the first error closes; a later one waits until that is done
    if (first) abort_p2p();
    work->complete(error);
  }

  // Closes every connection, once; a concurrent caller returns when the first is done. After
  // it Gloo writes into no buffer of this group's, so a Work may fail and its caller free its
  // buffer: every Work whose buffer Gloo holds fails only after this.
  void close_transport() {
    std::call_once(transport_closed_, [this] {
      if (size_ > 1) context_->closeConnections();  // a group of one has no transport
    });
  }

  // Turns a Gloo error into a CommError or TimeoutError naming the peer at fault when it can:
  // the op's own peer for point-to-point (unless it is alive here and another rank here has
  // exited), else a same-host rank whose process has exited.
  std::exception_ptr translate(const std::string& op, const std::string& gloo_message, milliseconds timeout,
                               int peer) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error_) return error_;  // aborted or failed already: keep the first cause
    }
    const bool timed_out = gloo_message.find("imed out") != std::string::npos;
    // A point-to-point peer that is alive on this host but closed the connection did so because
    // its group failed first (fail() closes every connection): the cause is then another rank,
    // which on this host shows as an exited process. Name that one, as the collectives do.
    const int op_peer = peer;
    if (peer >= 0 && hosts_[peer] == options_.host && !timed_out && !process_gone(pids_[peer])) peer = -1;
    // A killed peer's connections are reset while its process is still being torn down: give
    // it a moment to show as gone before concluding that no same-host peer died.
    const bool local_peers = local_ranks().size() > 1;
    const auto give_up = std::chrono::steady_clock::now() + kExitVisibleWithin;
    while (peer < 0 && local_peers) {
      for (int r = 0; r < size_ && peer < 0; ++r) {
        if (r != rank_ && hosts_[r] == options_.host && process_gone(pids_[r])) peer = r;
      }
      if (peer >= 0 || std::chrono::steady_clock::now() >= give_up) break;
      std::this_thread::sleep_for(milliseconds(10));
    }
    if (peer < 0) peer = op_peer;  // no other rank here has exited: the op's own peer it is
    std::string who = "a peer";
    if (peer >= 0) {
      who = "rank " + std::to_string(peer) + " (host " + hosts_[peer] + ", pid " + std::to_string(pids_[peer]) + ")";
    }
    if (timed_out) {
      return std::make_exception_ptr(TimeoutError(
          "rank " + std::to_string(rank_) + ": " + op + ": no progress for " + std::to_string(timeout.count()) +
              " ms; " + who + " is stopped, hung or unreachable (" + gloo_message + "); re-form the group",
          op, peer, peer >= 0 ? hosts_[peer] : ""));
    }
    return std::make_exception_ptr(CommError(
        "rank " + std::to_string(rank_) + ": " + op + " failed: " + who +
            (peer >= 0 && process_gone(pids_[peer]) ? " has exited" : " broke the connection") + " (" +
            gloo_message + "); re-form the group",
        op, peer, peer >= 0 ? hosts_[peer] : ""));
  }

  const int rank_;
  const int size_;
  GroupOptions options_;
  std::vector<std::string> hosts_;  // immutable after rendezvous
  std::vector<int> pids_;           // immutable after rendezvous
  std::shared_ptr<gloo::Context> context_;
  std::once_flag transport_closed_;  // close_transport

  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<Op> queue_;                           // guarded by mutex_
  std::exception_ptr error_;                       // guarded by mutex_; the first failure, sticky
  bool stopping_ = false;                          // guarded by mutex_
  uint32_t next_tag_ = 0;                          // guarded by mutex_; collectives' sequence number
  std::shared_ptr<Work> current_;                  // guarded by mutex_; the collective in flight
  std::condition_variable watchdog_cv_;
  std::thread watchdog_thread_;
  std::thread collective_thread_;

  std::mutex waiters_mutex_;
  std::list<std::shared_ptr<P2pOp>> waiters_;      // guarded by waiters_mutex_; posted p2p ops not yet seen done
  ElasticThreads waiter_threads_;                  // one blocked in wait_p2p per pending op
};

// What Group::create returns: forwards to the shared GlooGroup and shuts it down when destroyed.
class GroupHandle : public Group {
 public:
  explicit GroupHandle(std::shared_ptr<GlooGroup> group) : g_(std::move(group)) {}
  ~GroupHandle() override { g_->shutdown(); }

  int rank() const override { return g_->rank(); }
  int size() const override { return g_->size(); }
  const std::string& host(int rank) const override { return g_->host(rank); }
  std::vector<int> local_ranks() const override { return g_->local_ranks(); }
  milliseconds timeout() const override { return g_->timeout(); }
  std::shared_ptr<Work> allreduce_async(void* data, size_t count, DataType type, ReduceOp op,
                                        AllreduceAlgorithm algorithm, milliseconds timeout) override {
    return g_->allreduce_async(data, count, type, op, algorithm, timeout);
  }
  std::shared_ptr<Work> broadcast_async(void* data, size_t bytes, int root, milliseconds timeout) override {
    return g_->broadcast_async(data, bytes, root, timeout);
  }
  std::shared_ptr<Work> allgather_async(const void* in, void* out, size_t bytes, milliseconds timeout) override {
    return g_->allgather_async(in, out, bytes, timeout);
  }
  std::shared_ptr<Work> reduce_scatter_async(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                                             milliseconds timeout) override {
    return g_->reduce_scatter_async(in, out, count, type, op, timeout);
  }
  std::shared_ptr<Work> alltoall_async(const void* in, void* out, size_t bytes, milliseconds timeout) override {
    return g_->alltoall_async(in, out, bytes, timeout);
  }
  std::shared_ptr<Work> barrier_async(milliseconds timeout) override { return g_->barrier_async(timeout); }
  std::shared_ptr<Work> send_async(const void* data, size_t bytes, int peer, uint32_t tag,
                                   milliseconds timeout) override {
    return g_->send_async(data, bytes, peer, tag, timeout);
  }
  std::shared_ptr<Work> recv_async(void* data, size_t bytes, int peer, uint32_t tag, milliseconds timeout) override {
    return g_->recv_async(data, bytes, peer, tag, timeout);
  }
  void abort(const std::string& reason) override { g_->abort(reason); }

 private:
  std::shared_ptr<GlooGroup> g_;
};

}  // namespace

std::unique_ptr<Group> Group::create(std::shared_ptr<Store> store, int rank, int size, const GroupOptions& options) {
  // A write to a connection whose peer died raises SIGPIPE, which would kill this process
  // instead of failing the operation. Ignore it, unless the application installed a handler.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  auto group = std::make_shared<GlooGroup>(std::move(store), rank, size, options);
  group->start();
  return std::make_unique<GroupHandle>(std::move(group));
}

}  // namespace dsgd::comm
