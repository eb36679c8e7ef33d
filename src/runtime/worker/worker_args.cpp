// The worker's command line (worker mode, the driver, the token, the spawn index) and how it names
// itself to the driver and its peers (worker.h).
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include "dsgd/common/error.h"
#include "runtime/worker/worker.h"

namespace dsgd::runtime {

namespace {

// "--spawn-index N", or "mpi:B" from a launcher that starts every worker at once: B plus this
// process's rank, from the variables MPI launchers set.
int64_t spawn_index_of(const std::string& value) {
  if (value.rfind("mpi:", 0) != 0) return std::stoll(value);
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (const char* rank = std::getenv(name)) return std::stoll(value.substr(4)) + std::stoll(rank);
  }
  throw ConfigError("--spawn-index " + value + ": no MPI rank in the environment (OMPI_COMM_WORLD_RANK, PMIX_RANK or "
                    "PMI_RANK): start this under mpirun");
}

}  // namespace

std::optional<WorkerArgs> parse_worker_args(int argc, char** argv) {
  bool worker = false;
  WorkerArgs a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) throw ConfigError(std::string(flag) + " needs a value");
      return argv[++i];
    };
    if (arg == "--dsgd-worker") worker = true;
    else if (arg == "--driver") a.driver = value("--driver");
    else if (arg == "--token") a.token = value("--token");
    else if (arg == "--address") a.address = value("--address");
    else if (arg == "--host-id") a.host_id = value("--host-id");
    else if (arg == "--spawn-index") a.spawn_index = spawn_index_of(value("--spawn-index"));
  }
  if (!worker) return std::nullopt;
  if (a.driver.empty()) throw ConfigError("worker mode needs --driver HOST:PORT (the driver prints it)");
  if (a.token.empty()) {
    if (const char* t = std::getenv("DSGD_TOKEN")) a.token = t;
  }
  if (a.token.empty()) throw ConfigError("worker mode needs the job token: --token T or $DSGD_TOKEN");
  return a;
}

control::TlsKeys worker_tls_keys(const std::string& ca_file, const std::string& cert_file,
                                 const std::string& key_file) {
  if (ca_file.empty() && cert_file.empty() && key_file.empty()) return control::keys_from_environment();
  return control::load_keys(ca_file, cert_file, key_file);
}

std::string route_address(const std::string& driver) {
  const auto colon = driver.rfind(':');
  const std::string host = driver.substr(0, colon);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      if (inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf))) out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  return out;
}

std::string host_name() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace dsgd::runtime

namespace dsgd {

void write_tls_keys(const std::string& dir, int days) {
  if (days < 1) throw ConfigError("TLS keys must be valid for at least a day, got " + std::to_string(days));
  control::write_keys(control::make_job_keys(days), dir);
}

}  // namespace dsgd
