#include "runtime/driver/worker_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <thread>

#include "dsgd/common/error.h"
#include "control/log.h"

namespace dsgd::runtime {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

WorkerPool::WorkerPool(const TrainerConfig& config, control::DriverServer& server, std::string binary,
                       const JobSecrets& secrets)
    : config_(config),
      server_(server),
      binary_(std::move(binary)),
      launcher_(make_launcher(config, children_, secrets)) {}

bool WorkerPool::is_member(int id) const { return std::find(members_.begin(), members_.end(), id) != members_.end(); }

int WorkerPool::initial_count() const {
  if (spawns()) return worker_processes(config_);
  return config_.recovery.min_workers > 0 ? config_.recovery.min_workers : config_.num_workers;
}

void WorkerPool::choose_members() {
  members_.clear();
  auto workers = server_.workers();
  if (spawns()) {  // in start order: position i on pseudo-host i % local_hosts, whoever registered first
    auto rank = [](const control::WorkerInfo& w) {
      return w.spawn_index >= 0 ? w.spawn_index : std::numeric_limits<int64_t>::max();
    };
    std::stable_sort(workers.begin(), workers.end(), [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  }
  for (const auto& w : workers) {
    if (!w.alive) continue;
    // spawn_initial started the workers first, then the standbys.
    const int64_t after_workers = w.spawn_index - initial_base_ - config_.num_workers;
    const bool standby =
        spawns() && w.spawn_index >= 0 && after_workers >= 0 && after_workers < config_.recovery.standby_workers;
    if (!standby && static_cast<int>(members_.size()) < config_.num_workers)
      members_.push_back(static_cast<int>(w.index));
  }
}

void WorkerPool::drop(int id) {
  end_worker(id, /*failed=*/true);
  members_.erase(std::remove(members_.begin(), members_.end(), id), members_.end());
}

proto::Placement WorkerPool::placement(int64_t generation) const {
  proto::Placement p;
  p.set_generation(generation);
  int i = 0;
  for (int id : members_) {
    (*p.mutable_ranks())[id] = i++;
    if (auto h = pseudo_host_.find(pid_of(id)); h != pseudo_host_.end()) {
      (*p.mutable_hosts())[id] = "local-host-" + std::to_string(h->second);
    }
  }
  p.set_num_workers(i);
  return p;
}

pid_t WorkerPool::pid_of(int id) const {
  const auto workers = server_.workers();
  if (id < 0 || id >= static_cast<int>(workers.size())) return 0;
  const auto it = launched_.find(workers[static_cast<size_t>(id)].spawn_index);
  return it == launched_.end() ? 0 : it->second;
}

std::string WorkerPool::registered_host(pid_t pid) const {
  for (const auto& w : server_.workers()) {
    const auto it = launched_.find(w.spawn_index);
    if (it != launched_.end() && it->second == pid) return w.host;
  }
  return "";
}

void WorkerPool::end_process(pid_t pid, bool failed) { end_process(pid, failed, registered_host(pid)); }

void WorkerPool::end_process(pid_t pid, bool failed, const std::string& host) {
  if (pid <= 0) return;
  if (launcher_) launcher_->released(pid, failed, host);
  children_.kill(pid);
}

void WorkerPool::end_worker(int id, bool failed) {
  const pid_t pid = pid_of(id);
  if (pid <= 0) return;
  const auto w = server_.workers().at(static_cast<size_t>(id));
  launched_.erase(w.spawn_index);
  // One process for several workers (mpirun): the others go on; this one, evicted, exits.
  const bool shared = std::any_of(launched_.begin(), launched_.end(), [pid](const auto& e) { return e.second == pid; });
  if (!shared) end_process(pid, failed, w.host);
}

void WorkerPool::tend(int64_t generation, const std::string& signature) {
  if (signature.empty()) return;
  if (!pending_.empty() && Clock::now() - pending_since_ > config_.recovery.replacement_timeout) {
    for (pid_t pid : pending_) end_process(pid, /*failed=*/true);
    pending_.clear();
    defer_replacements("new workers did not register within " +
                       std::to_string(config_.recovery.replacement_timeout.count()) + " ms");
  }
  for (const auto& w : server_.workers()) {
    const int id = static_cast<int>(w.index);
    if (!w.alive || is_member(id) || preparing_.count(id) != 0 ||
        std::find(ready_.begin(), ready_.end(), id) != ready_.end()) {
      continue;
    }
    pending_.erase(std::remove(pending_.begin(), pending_.end(), pid_of(id)), pending_.end());
    proto::Command setup;
    proto::Placement& p = *setup.mutable_setup()->mutable_placement();
    p.set_generation(generation);
    p.set_num_workers(static_cast<int32_t>(std::max<size_t>(1, members_.size())));
    (*p.mutable_ranks())[id] = 0;  // its place is known when it joins (connect)
    // A survivor's state may come straight into it (ShareStateRequest): its buffers made now.
    const auto& c = config_;
    setup.mutable_setup()->set_standby(c.recovery.standby_workers > 0 && c.recovery.from_peer &&
                                       c.strategy == Strategy::kAllreduce && c.step.zero_stage == 0);
    preparing_[id] = server_.send(setup, {id});
  }
  for (auto it = preparing_.begin(); it != preparing_.end();) {
    const int id = it->first;
    std::string failed;
    try {
      auto done = server_.collect(it->second);
      if (!done) {
        ++it;
        continue;
      }
      if ((*done)[0].setup().signature() != signature) {
        failed = "it built a different model than the members (another build or configuration?)";
      }
    } catch (const std::exception& e) {
      failed = e.what();
    }
    it = preparing_.erase(it);
    if (!failed.empty()) {
      discard(id, "its setup failed: " + failed);
      continue;
    }
    ready_.push_back(id);
    const int64_t rss = resident_bytes(id);
    control::log().info("trainer: worker {} is set up and ready outside the group{}", id,
                        rss > 0 ? fmt::format(" ({:.0f} MiB resident)", static_cast<double>(rss) / (1 << 20)) : "");
  }
  spawn_replacements();  // after a loss, or for a standby let go
  // A ready worker that went silent (a host's trouble; exits are check_children's) is no standby.
  for (const auto& w : server_.workers()) {
    const int id = static_cast<int>(w.index);
    if (w.alive && std::find(ready_.begin(), ready_.end(), id) != ready_.end() &&
        w.since_heartbeat_s * 1000 > static_cast<double>(config_.recovery.heartbeat_timeout.count())) {
      discard(id, "no heartbeat for " + fmt::format("{:.1f}", w.since_heartbeat_s) + " s");
    }
  }
}

void WorkerPool::discard(int id, const std::string& why) {
  control::log().warn("trainer: worker {} outside the group is let go: {}", id, why);
  server_.evict(id, why);
  end_worker(id, /*failed=*/true);
  preparing_.erase(id);
  ready_.erase(std::remove(ready_.begin(), ready_.end(), id), ready_.end());
  defer_replacements("worker " + std::to_string(id) + " was let go");
}

bool WorkerPool::promote(int lost) {
  auto pos = std::find(members_.begin(), members_.end(), lost);
  if (ready_.empty() || pos == members_.end()) return false;
  const int id = ready_.front();
  ready_.erase(ready_.begin());
  const pid_t lost_pid = pid_of(lost);
  if (auto h = pseudo_host_.find(lost_pid); h != pseudo_host_.end()) pseudo_host_[pid_of(id)] = h->second;
  *pos = id;
  end_worker(lost, /*failed=*/true);
  return true;
}

std::vector<int> WorkerPool::first_ready(size_t n) const {
  return {ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(std::min(n, ready_.size()))};
}

void WorkerPool::add_members(const std::vector<int>& ids) {
  for (int id : ids) {
    ready_.erase(std::remove(ready_.begin(), ready_.end(), id), ready_.end());
    members_.push_back(id);
  }
}

int64_t WorkerPool::resident_bytes(int id) const {
  const pid_t pid = pid_of(id);
  if (launcher_of(config_) != Launcher::kLocal || pid <= 0) return 0;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;  // "VmRSS:   12345 kB"
  }
  return 0;
}

void WorkerPool::spawn_initial() {
  initial_base_ = next_spawn_index_;
  if (launcher_->starts_all_at_once()) {
    const int count = worker_processes(config_);
    const pid_t pid = launcher_->start_all(binary_,
                                           {"--dsgd-worker", "--driver", driver_address(config_, server_.port()),
                                            "--spawn-index", "mpi:" + std::to_string(initial_base_)},
                                           worker_env(), count);
    for (int i = 0; i < count; ++i) launched_[next_spawn_index_++] = pid;
    control::log().info("trainer: starting {} worker(s) at once ({})", count, launcher_->name());
    return;
  }
  for (int i = 0; i < config_.num_workers; ++i) spawn_worker(i % config_.launch.local_hosts);
  for (int i = 0; i < config_.recovery.standby_workers; ++i) {
    spawn_worker((config_.num_workers + i) % config_.launch.local_hosts);
  }
  spawn_servers();
}

void WorkerPool::spawn_servers() {
  if (!launcher_ || launcher_->starts_all_at_once()) return;  // mpirun: trainer_config refuses shard processes
  for (auto it = servers_.begin(); it != servers_.end();) {  // reap the lost ones
    it = children_.gone(it->first) ? servers_.erase(it) : std::next(it);
  }
  for (int s = 0; s < ps_shard_processes(config_); ++s) {
    if (std::any_of(servers_.begin(), servers_.end(), [s](const auto& e) { return e.second == s; })) continue;
    std::vector<std::string> args = {"--dsgd-ps-server", "--driver", driver_address(config_, server_.port()), "--shard",
                                     std::to_string(s)};
    if (config_.launch.local_hosts > 1) {
      args.insert(args.end(), {"--host-id", "local-host-" + std::to_string(s % config_.launch.local_hosts)});
    }
    // A shard sums and steps on one core; its wait for messages is not busy.
    const pid_t pid =
        launcher_->start(binary_, args, {"DSGD_WORKER_OF=" + std::to_string(::getpid()), "OMP_NUM_THREADS=1"});
    servers_[pid] = s;
    if (const std::string where = launcher_->host_of(pid); !where.empty()) {
      control::log().info("trainer: starting ps shard {} on {} ({})", s, where, launcher_->name());
    }
  }
}

bool WorkerPool::exited(int id) {
  const pid_t pid = pid_of(id);
  return pid > 0 && children_.gone(pid);
}

void WorkerPool::check_children() {
  while (auto gone = children_.check_exited()) {
    if (launcher_) launcher_->released(gone->pid, /*failed=*/true, registered_host(gone->pid));
    if (auto it = servers_.find(gone->pid); it != servers_.end()) {
      const int shard = it->second;
      servers_.erase(it);
      throw CommError("ps shard " + std::to_string(shard) + ": " + gone->what, "ps shard");
    }
    if (auto p = std::find(pending_.begin(), pending_.end(), gone->pid); p != pending_.end()) {
      pending_.erase(p);
      defer_replacements("new worker " + gone->what);
      continue;
    }
    bool outsider = false;  // registered, not a member: a standby, or one being set up
    for (const auto& w : server_.workers()) {
      if (pid_of(static_cast<int>(w.index)) == gone->pid && w.alive && !is_member(static_cast<int>(w.index))) {
        discard(static_cast<int>(w.index), gone->what);
        outsider = true;
      }
    }
    if (outsider) continue;
    for (const auto& w : server_.workers()) {
      if (pid_of(static_cast<int>(w.index)) == gone->pid) {
        throw CommError("worker " + std::to_string(w.index) + " (host " + w.host + "): " + gone->what, "worker",
                        static_cast<int>(w.index), w.host);
      }
    }
    // Killed: a failure like any other. Exited by itself: the binary or its set-up is wrong
    // ("worker start": the start-up does not try again).
    if (gone->signaled) throw CommError(gone->what + " before registering", "worker");
    throw CommError(gone->what + " before registering; see its output above (does main() call dsgd::init(argc, argv) "
                                 "first?)",
                    "worker start");
  }
}

void WorkerPool::defer_replacements(const std::string& why) {
  next_spawn_ = Clock::now() + backoff_;
  control::log().warn(
      "trainer: {}; next attempt to get back to {} workers{} in {:.0f} s", why, config_.num_workers,
      config_.recovery.standby_workers > 0 ? fmt::format(" and {} standby(s)", config_.recovery.standby_workers) : "",
      std::chrono::duration<double>(backoff_).count());
  backoff_ = std::min(backoff_ * 2, milliseconds(60000));
}

void WorkerPool::spawn_replacements() {
  if (!spawns() || spawns_held_ || !config_.recovery.replace_lost_workers || !pending_.empty() ||
      Clock::now() < next_spawn_) {
    return;
  }
  int registered = 0;
  for (const auto& w : server_.workers()) registered += w.alive ? 1 : 0;
  if (launcher_->starts_all_at_once()) {
    if (registered < worker_processes(config_) && registered != said_short_of_) {
      said_short_of_ = registered;
      control::log().warn("trainer: launcher {} cannot start a replacement: the job goes on with {} worker(s)",
                          launcher_->name(), std::min(registered, config_.num_workers));
    }
    return;
  }
  for (int i = registered; i < worker_processes(config_); ++i) {
    try {
      pending_.push_back(spawn_worker());  // pending counts
    } catch (const Error& e) {  // no free slot (ssh), fork failed: try again later
      defer_replacements(e.what());
      break;
    }
  }
  pending_since_ = Clock::now();
}

void WorkerPool::stop(int grace_ms) {
  if (!children_.wait_all(grace_ms)) children_.kill_all();
}

std::vector<WorkerPool::Kept> WorkerPool::kept() const {
  const auto workers = server_.workers();
  std::vector<Kept> out;
  const auto add = [&](int id, bool member) {
    const pid_t pid = pid_of(id);
    const auto h = pseudo_host_.find(pid);
    out.push_back({id, workers.at(static_cast<size_t>(id)).spawn_index, pid,
                   h == pseudo_host_.end() ? -1 : h->second, member});
  };
  for (int id : members_) add(id, true);
  for (int id : ready_) add(id, false);
  return out;
}

void WorkerPool::adopt(const std::vector<Kept>& workers, int64_t next_spawn_index) {
  next_spawn_index_ = std::max(next_spawn_index_, next_spawn_index);
  for (const auto& w : workers) {
    (w.member ? members_ : ready_).push_back(w.id);
    if (w.pid <= 0) continue;  // one the driver did not start (remote)
    children_.adopt(w.pid);
    launched_[w.spawn_index] = w.pid;
    if (w.pseudo_host >= 0) pseudo_host_[w.pid] = w.pseudo_host;
  }
}

void WorkerPool::restart() {
  for (pid_t pid : std::vector<pid_t>(children_.pids())) end_process(pid, /*failed=*/false);
  launched_.clear();
  members_.clear();
  ready_.clear();
  preparing_.clear();
  pending_.clear();
  servers_.clear();
  pseudo_host_.clear();
  spawn_initial();
}

// The pseudo-host (local_hosts) short of its share of num_workers: where a replacement goes, so
// the job's layout (and its summation order) is what it was before the loss.
int WorkerPool::pseudo_host_for_next() const {
  const int n = config_.launch.local_hosts;
  std::vector<int> deficit(static_cast<size_t>(n), 0);
  for (int i = 0; i < config_.num_workers; ++i) ++deficit[static_cast<size_t>(i % n)];
  auto count = [&](pid_t pid) {
    if (auto it = pseudo_host_.find(pid); it != pseudo_host_.end()) --deficit[static_cast<size_t>(it->second)];
  };
  const auto workers = server_.workers();
  for (int id : members_) count(pid_of(id));
  for (pid_t pid : pending_) count(pid);
  for (int h = 0; h < n; ++h) {
    if (deficit[static_cast<size_t>(h)] > 0) return h;
  }
  return 0;
}

std::vector<std::string> WorkerPool::worker_env() const {
  std::vector<std::string> env = {"DSGD_WORKER_OF=" + std::to_string(::getpid())};
  // One OpenMP team per worker, sized by the driver on its own host (see threads_per_worker).
  const int threads = std::max(1, config_.threads_per_worker > 0
                                      ? config_.threads_per_worker
                                      : static_cast<int>(std::thread::hardware_concurrency()) / config_.num_workers);
  if (launcher_of(config_) == Launcher::kLocal || config_.threads_per_worker > 0) {
    env.push_back("OMP_NUM_THREADS=" + std::to_string(threads));
  }
  return env;
}

pid_t WorkerPool::spawn_worker(int host) {
  const int64_t index = next_spawn_index_++;
  std::vector<std::string> args = {"--dsgd-worker", "--driver", driver_address(config_, server_.port()),
                                   "--spawn-index", std::to_string(index)};
  if (config_.launch.local_hosts > 1) {
    if (host < 0) host = pseudo_host_for_next();
    args.insert(args.end(), {"--host-id", "local-host-" + std::to_string(host)});
  }
  for (const auto& w : server_.workers()) {  // where the running ones are (slurm avoids busy nodes)
    const auto it = launched_.find(w.spawn_index);
    if (w.alive && it != launched_.end()) launcher_->placed(it->second, w.host);
  }
  const pid_t pid = launcher_->start(binary_, args, worker_env());
  launched_[index] = pid;
  if (const std::string where = launcher_->host_of(pid); !where.empty()) {
    control::log().info("trainer: starting a worker on {} ({})", where, launcher_->name());
  }
  if (config_.launch.local_hosts > 1) pseudo_host_[pid] = host;
  return pid;
}

}  // namespace dsgd::runtime
