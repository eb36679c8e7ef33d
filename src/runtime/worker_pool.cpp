#include "runtime/worker_pool.h"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "dsgd/error.h"
#include "runtime/control/log.h"
#include "runtime/trainer_config.h"

namespace dsgd::runtime {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

WorkerPool::WorkerPool(const TrainerConfig& config, control::DriverServer& server, std::string binary,
                       std::string token)
    : config_(config), server_(server), binary_(std::move(binary)), token_(std::move(token)) {}

bool WorkerPool::is_member(int id) const { return std::find(members_.begin(), members_.end(), id) != members_.end(); }

void WorkerPool::drop(int id, pid_t pid) {
  if (local()) children_.kill(pid);
  members_.erase(std::remove(members_.begin(), members_.end(), id), members_.end());
}

proto::Placement WorkerPool::placement(int64_t generation) const {
  proto::Placement p;
  p.set_generation(generation);
  int i = 0;
  for (int id : members_) (*p.mutable_ranks())[id] = i++;
  p.set_num_workers(i);
  return p;
}

void WorkerPool::spawn_initial() {
  for (int i = 0; i < config_.num_workers; ++i) spawn_worker(i % config_.local_hosts);
  spawn_servers();
}

void WorkerPool::spawn_servers() {
  if (!local()) return;
  for (auto it = servers_.begin(); it != servers_.end();) {  // reap the lost ones
    it = children_.gone(it->first) ? servers_.erase(it) : std::next(it);
  }
  const std::string driver = "127.0.0.1:" + std::to_string(server_.port());
  for (int s = 0; s < ps_shard_processes(config_); ++s) {
    if (std::any_of(servers_.begin(), servers_.end(), [s](const auto& e) { return e.second == s; })) continue;
    std::vector<std::string> args = {"--dsgd-ps-server", "--driver", driver, "--shard", std::to_string(s)};
    if (config_.local_hosts > 1) {
      args.insert(args.end(), {"--host-id", "local-host-" + std::to_string(s % config_.local_hosts)});
    }
    // A shard sums and steps on one core; its wait for messages is not busy.
    servers_[children_.spawn(binary_, args, {"DSGD_TOKEN=" + token_, "DSGD_WORKER_OF=" + std::to_string(::getpid()),
                                             "OMP_NUM_THREADS=1"})] = s;
  }
}

bool WorkerPool::exited(pid_t pid) { return local() && children_.gone(pid); }

void WorkerPool::check_children() {
  while (auto gone = children_.check_exited()) {
    if (auto it = servers_.find(gone->pid); it != servers_.end()) {
      const int shard = it->second;
      servers_.erase(it);
      throw CommError("ps shard " + std::to_string(shard) + ": " + gone->what, "ps shard");
    }
    if (auto p = std::find(pending_.begin(), pending_.end(), gone->pid); p != pending_.end()) {
      pending_.erase(p);
      defer_replacements("replacement " + gone->what);
      continue;
    }
    for (const auto& w : server_.workers()) {
      if (w.pid == gone->pid) {
        throw CommError("worker " + std::to_string(w.index) + " (host " + w.host + "): " + gone->what, "worker",
                        static_cast<int>(w.index), w.host);
      }
    }
    // Killed: a failure like any other. Exited by itself: the binary or its set-up is wrong
    // ("worker start": the start-up does not try again).
    throw CommError(gone->what + " before registering; see its output above (does main() call dsgd::init(argc, argv) "
                                 "first?)",
                    gone->signaled ? "worker" : "worker start");
  }
}

void WorkerPool::defer_replacements(const std::string& why) {
  next_spawn_ = Clock::now() + backoff_;
  control::log().warn("trainer: {}; next attempt to get back to {} workers in {:.0f} s", why, config_.num_workers,
                      std::chrono::duration<double>(backoff_).count());
  backoff_ = std::min(backoff_ * 2, milliseconds(60000));
}

void WorkerPool::spawn_replacements() {
  if (!local() || !config_.replace_lost_workers || !pending_.empty() || Clock::now() < next_spawn_) return;
  int registered = 0;
  for (const auto& w : server_.workers()) registered += w.alive ? 1 : 0;
  for (int i = registered; i < config_.num_workers; ++i) pending_.push_back(spawn_worker());  // pending counts
  pending_since_ = Clock::now();
}

std::vector<int> WorkerPool::newcomers() {
  std::vector<int> out;
  for (const auto& w : server_.workers()) {
    if (!w.alive || is_member(static_cast<int>(w.index))) continue;
    out.push_back(static_cast<int>(w.index));
    pending_.erase(std::remove(pending_.begin(), pending_.end(), static_cast<pid_t>(w.pid)), pending_.end());
  }
  if (!pending_.empty() && Clock::now() - pending_since_ > config_.replacement_timeout) {
    for (pid_t pid : pending_) children_.kill(pid);
    pending_.clear();
    defer_replacements("replacements did not register within " + std::to_string(config_.replacement_timeout.count()) +
                       " ms");
  }
  return out;
}

void WorkerPool::stop(int grace_ms) {
  if (!children_.wait_all(grace_ms)) children_.kill_all();
}

void WorkerPool::restart() {
  for (pid_t pid : std::vector<pid_t>(children_.pids())) children_.kill(pid);
  members_.clear();
  pending_.clear();
  servers_.clear();
  pseudo_host_.clear();
  spawn_initial();
}

// The pseudo-host (local_hosts) short of its share of num_workers: where a replacement goes, so
// the job's layout (and its summation order) is what it was before the loss.
int WorkerPool::pseudo_host_for_next() const {
  const int n = config_.local_hosts;
  std::vector<int> deficit(static_cast<size_t>(n), 0);
  for (int i = 0; i < config_.num_workers; ++i) ++deficit[static_cast<size_t>(i % n)];
  auto count = [&](pid_t pid) {
    if (auto it = pseudo_host_.find(pid); it != pseudo_host_.end()) --deficit[static_cast<size_t>(it->second)];
  };
  const auto workers = server_.workers();
  for (int id : members_) count(static_cast<pid_t>(workers.at(static_cast<size_t>(id)).pid));
  for (pid_t pid : pending_) count(pid);
  for (int h = 0; h < n; ++h) {
    if (deficit[static_cast<size_t>(h)] > 0) return h;
  }
  return 0;
}

pid_t WorkerPool::spawn_worker(int host) {
  const std::string driver = "127.0.0.1:" + std::to_string(server_.port());
  std::vector<std::string> args = {"--dsgd-worker", "--driver", driver};
  if (config_.local_hosts > 1) {
    if (host < 0) host = pseudo_host_for_next();
    args.insert(args.end(), {"--host-id", "local-host-" + std::to_string(host)});
  }
  const int threads = std::max(1, config_.threads_per_worker > 0
                                      ? config_.threads_per_worker
                                      : static_cast<int>(std::thread::hardware_concurrency()) / config_.num_workers);
  const pid_t pid = children_.spawn(binary_, args,
                                    {"DSGD_TOKEN=" + token_, "DSGD_WORKER_OF=" + std::to_string(::getpid()),
                                     // one OpenMP team per worker, sized by the driver (see threads_per_worker)
                                     "OMP_NUM_THREADS=" + std::to_string(threads)});
  if (config_.local_hosts > 1) pseudo_host_[pid] = host;
  return pid;
}

}  // namespace dsgd::runtime
