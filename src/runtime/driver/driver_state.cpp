#include "runtime/driver/driver_state.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dsgd/control.pb.h"
#include "dsgd/common/error.h"

namespace dsgd::runtime {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int kFormat = 1;
constexpr const char* kFile = "driver.json";

// Whether `pid` runs this very executable: a driver of the same binary still holds the directory
// (a reused pid of another program does not).
bool runs_this_binary(int64_t pid) {
  if (pid <= 0 || pid == ::getpid()) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  std::error_code a, b;
  const auto theirs = fs::read_symlink("/proc/" + std::to_string(pid) + "/exe", a);
  const auto ours = fs::read_symlink("/proc/self/exe", b);
  if (a || b || theirs != ours) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';  // a zombie is gone
}

json to_json(const DriverState& s) {
  json workers = json::array();
  for (const auto& w : s.workers) {
    workers.push_back({{"id", w.id},
                       {"spawn_index", w.spawn_index},
                       {"pid", w.pid},
                       {"started", w.started},
                       {"host", w.host},
                       {"address", w.address},
                       {"pseudo_host", w.pseudo_host},
                       {"member", w.member}});
  }
  return {{"format", kFormat},
          {"job", s.job},
          {"driver_pid", s.driver_pid},
          {"address", s.address},
          {"token", s.token},
          {"tls_keys", s.tls_keys},
          {"generation", s.generation},
          {"restarts", s.restarts},
          {"next_spawn_index", s.next_spawn_index},
          {"signature", s.signature},
          {"parameters", s.parameters},
          {"workers", workers},
          {"checkpoint", s.checkpoint},
          {"checkpoint_steps", s.checkpoint_steps},
          {"first_epoch", s.first_epoch},
          {"batches_per_epoch", s.batches_per_epoch},
          {"ended", s.ended}};
}

DriverState from_json(const json& j) {
  DriverState s;
  s.job = j.at("job").get<std::string>();
  s.driver_pid = j.at("driver_pid").get<int64_t>();
  s.address = j.at("address").get<std::string>();
  s.token = j.at("token").get<std::string>();
  s.tls_keys = j.at("tls_keys").get<std::string>();
  s.generation = j.at("generation").get<int64_t>();
  s.restarts = j.at("restarts").get<int64_t>();
  s.next_spawn_index = j.at("next_spawn_index").get<int64_t>();
  s.signature = j.at("signature").get<std::string>();
  s.parameters = j.at("parameters").get<int64_t>();
  for (const auto& w : j.at("workers")) {
    s.workers.push_back({w.at("id").get<int64_t>(), w.at("spawn_index").get<int64_t>(), w.at("pid").get<int64_t>(),
                         w.at("started").get<bool>(), w.at("host").get<std::string>(),
                         w.at("address").get<std::string>(), w.at("pseudo_host").get<int>(),
                         w.at("member").get<bool>()});
  }
  s.checkpoint = j.at("checkpoint").get<std::string>();
  s.checkpoint_steps = j.at("checkpoint_steps").get<int64_t>();
  s.first_epoch = j.at("first_epoch").get<int64_t>();
  s.batches_per_epoch = j.at("batches_per_epoch").get<int64_t>();
  s.ended = j.at("ended").get<bool>();
  return s;
}

}  // namespace

std::string job_fingerprint(const proto::JobSpec& spec) {
  // What the job computes: the operator, its config and every setting but the recovery group's
  // (how many losses it survives, how fast it notices them: a restart may change those). FNV-1a
  // over that JSON (its keys sorted: the same bytes for the same job).
  nlohmann::json settings = nlohmann::json::parse(spec.settings(), nullptr, false);
  if (settings.is_object()) {
    for (auto it = settings.begin(); it != settings.end();) {
      it = it.key().rfind("recovery.", 0) == 0 ? settings.erase(it) : std::next(it);
    }
  }
  const std::string job =
      nlohmann::json{{"operator", spec.operator_name()}, {"config", spec.operator_config()}, {"settings", settings}}
          .dump();
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : job) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

DriverStateFile::DriverStateFile(std::string dir) : dir_(std::move(dir)) {}

std::string DriverStateFile::path() const { return (fs::path(dir_) / kFile).string(); }

std::optional<DriverState> DriverStateFile::resumable(const std::string& job) const {
  std::error_code ec;
  if (!fs::exists(path(), ec)) return std::nullopt;
  DriverState s;
  try {
    std::ifstream in(path());
    const json j = json::parse(in);
    if (j.at("format").get<int>() != kFormat) {
      throw ConfigError(path() + " is of format " + j.at("format").dump() + ", this dsgd reads " +
                            std::to_string(kFormat) + ": start the same dsgd build, or use another directory",
                        "recovery.driver_state_dir");
    }
    s = from_json(j);
  } catch (const json::exception& e) {
    throw ConfigError(path() + " is not a driver's state (" + std::string(e.what()) +
                          "): remove it to start a new job there, or name another directory",
                      "recovery.driver_state_dir");
  }
  if (s.ended) return std::nullopt;
  if (s.job != job) {
    throw ConfigError(dir_ + " holds the state of another job (settings fingerprint " + s.job + ", this job's " + job +
                          "), whose driver did not end it: start that job's command again to go on with it, or "
                          "name another directory (or remove " + path() + ") to start this one",
                      "recovery.driver_state_dir");
  }
  if (runs_this_binary(s.driver_pid)) {
    throw ConfigError(dir_ + " belongs to the job's driver that still runs (pid " + std::to_string(s.driver_pid) +
                          "): one driver a job; stop it first, or name another directory",
                      "recovery.driver_state_dir");
  }
  const auto mtime = fs::last_write_time(path(), ec);
  if (!ec) {
    s.last_alive = std::chrono::time_point_cast<std::chrono::system_clock::duration>(
        mtime - fs::file_time_type::clock::now() + std::chrono::system_clock::now());
  }
  return s;
}

void DriverStateFile::write(const DriverState& state) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  const std::string tmp = path() + ".tmp." + std::to_string(::getpid());
  const std::string text = to_json(state).dump(1);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);  // the token is in it
  bool ok = fd >= 0;
  for (size_t at = 0; ok && at < text.size();) {
    const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    ok = n > 0;
    at += ok ? static_cast<size_t>(n) : 0;
  }
  ok = ok && ::fsync(fd) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path().c_str()) != 0) {
    const int e = ok ? errno : err;
    ::unlink(tmp.c_str());
    throw DataError(path(), "cannot write the driver's state: " + std::string(std::strerror(e)));
  }
  last_ = state;
  touched_ = std::chrono::steady_clock::now();
}

void DriverStateFile::write_ended() {
  if (!last_) return;
  DriverState s = *last_;
  s.ended = true;
  write(s);
}

void DriverStateFile::touch() {
  const auto now = std::chrono::steady_clock::now();
  if (!last_ || now - touched_ < std::chrono::seconds(1)) return;
  touched_ = now;
  ::utimensat(AT_FDCWD, path().c_str(), nullptr, 0);
}

}  // namespace dsgd::runtime
