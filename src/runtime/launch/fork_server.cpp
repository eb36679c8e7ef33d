#include "runtime/launch/fork_server.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "control/log.h"

namespace dsgd::runtime {
namespace {

constexpr const char* kFlag = "--dsgd-fork-server";  // then the connection's descriptor, then kTitleRoom
constexpr size_t kTitleRoom = 2048;  // spaces: room in the command line for a worker's
constexpr int32_t kReady = 0x64736764;  // "dsgd"
constexpr size_t kMaxRequest = 1 << 16;

struct Request {
  int32_t stop_signal;
  int32_t nice;
  uint32_t argc;  // then argc NUL-terminated arguments
};

// Where the server's command line lies (its strings are contiguous): a worker writes its own
// there, so that `ps` and /proc/PID/cmdline show its flags. The environment stays as it is: the
// workers' own (/proc/PID/environ).
struct Title {
  char* start = nullptr;
  size_t size = 0;
};

Title title_area(int argc, char** argv) {
  Title t;
  if (argc < 1 || argv[0] == nullptr) return t;
  t.start = argv[0];
  char* end = argv[0];
  for (int i = 0; i < argc && argv[i] == end; ++i) end = argv[i] + std::strlen(argv[i]) + 1;
  t.size = static_cast<size_t>(end - t.start);
  return t;
}

void set_title(const Title& t, const std::vector<std::string>& argv) {
  std::string line;  // NUL-separated, as exec lays them out
  for (const auto& a : argv) line.append(a.c_str(), a.size() + 1);
  if (t.start == nullptr || line.size() > t.size) return;
  std::memset(t.start, 0, t.size);
  std::memcpy(t.start, line.data(), line.size());
  // Without the padding's NULs where allowed (CAP_SYS_RESOURCE); else they read as spaces at the end.
  (void)::prctl(PR_SET_MM, PR_SET_MM_ARG_END, reinterpret_cast<unsigned long>(t.start + line.size()), 0, 0);
}

// What exec would have closed.
void close_cloexec_descriptors() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return;
  std::vector<int> close;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    if (fd > 2 && fd != ::dirfd(d) && (::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0) close.push_back(fd);
  }
  ::closedir(d);
  for (int fd : close) ::close(fd);
}

// In the worker (the server's grandchild): becomes what an exec'd worker would be, then runs.
[[noreturn]] void become_worker(pid_t driver, const Title& title, const Request& r, std::vector<std::string> argv,
                                const int* fds, int server_fd, ForkedMain main) {
  // Its own name and command line first: until then it reads as the server.
  std::string comm = argv[0].substr(argv[0].rfind('/') + 1);
  ::prctl(PR_SET_NAME, comm.substr(0, 15).c_str());
  set_title(title, argv);
  // Its parent, the server's child, exits at once: the driver (the subreaper) adopts it.
  for (int i = 0; ::getppid() != driver; ++i) {
    if (i > 20000) ::_exit(126);
    ::usleep(100);
  }
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, r.stop_signal);
  if (::getppid() != driver) ::_exit(126);
  for (int i = 0; i < 3; ++i) {
    if (fds[i] != i) ::dup2(fds[i], i);
  }
  for (int i = 0; i < 3; ++i) {
    if (fds[i] > 2) ::close(fds[i]);
  }
  ::close(server_fd);
  close_cloexec_descriptors();
  if (r.nice > 0) (void)!::nice(r.nice);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::exit(main(static_cast<int>(argv.size()), args.data()));
}

// A message of one buffer and a control part (the standard streams' descriptors).
msghdr message(iovec* io, char* control, size_t control_size) {
  msghdr m{};
  m.msg_iov = io;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = control_size;
  return m;
}

// One request: fork twice (the middle process exits at once), answer with the worker's pid.
void serve_one(pid_t driver, const Title& title, const char* binary, int fd, ForkedMain main) {
  std::vector<char> buf(kMaxRequest);
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))];
  iovec io{buf.data(), buf.size()};
  msghdr m = message(&io, control, sizeof(control));
  const ssize_t n = ::recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
  if (n <= 0) ::_exit(0);  // the driver is gone
  int fds[3] = {-1, -1, -1};
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(3 * sizeof(int))) {
      std::memcpy(fds, CMSG_DATA(c), sizeof(fds));
    }
  }
  int32_t answer = -EINVAL;
  Request r{};
  if (static_cast<size_t>(n) >= sizeof(r) && fds[0] >= 0) {
    std::memcpy(&r, buf.data(), sizeof(r));
    std::vector<std::string> argv{binary};
    for (size_t at = sizeof(r); argv.size() <= r.argc && at < static_cast<size_t>(n);) {
      argv.emplace_back(buf.data() + at);
      at += argv.back().size() + 1;
    }
    int pipe[2];
    if (argv.size() == r.argc + 1 && ::pipe2(pipe, O_CLOEXEC) == 0) {
      const pid_t middle = ::fork();
      if (middle == 0) {
        const pid_t worker = ::fork();
        if (worker == 0) become_worker(driver, title, r, std::move(argv), fds, fd, main);
        const int32_t pid = worker > 0 ? worker : -errno;
        (void)!::write(pipe[1], &pid, sizeof(pid));
        ::_exit(0);
      }
      ::close(pipe[1]);
      answer = -errno;
      if (middle > 0) {
        int32_t pid = -EIO;
        answer = ::read(pipe[0], &pid, sizeof(pid)) == sizeof(pid) ? pid : -EIO;
        ::waitpid(middle, nullptr, 0);
      }
      ::close(pipe[0]);
    }
  }
  for (int f : fds) {
    if (f >= 0) ::close(f);
  }
  if (::send(fd, &answer, sizeof(answer), MSG_NOSIGNAL) != sizeof(answer)) ::_exit(0);
}

// The lock around a request: the subreaper flag is the process's.
std::mutex& fork_mutex() {
  static std::mutex m;
  return m;
}

// Whether `binary` can be a fork server: it holds the flag (dsgd is linked into it). A script or
// another program run with the flag would do something else, or nothing, instead of answering.
bool holds_flag(const std::string& binary) {
  const int fd = ::open(binary.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  void* map = ::fstat(fd, &st) == 0 && st.st_size > 0
                  ? ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0)
                  : MAP_FAILED;
  ::close(fd);
  if (map == MAP_FAILED) return false;
  const bool found = ::memmem(map, static_cast<size_t>(st.st_size), kFlag, std::strlen(kFlag)) != nullptr;
  ::munmap(map, static_cast<size_t>(st.st_size));
  return found;
}

}  // namespace

bool is_fork_server(int argc, char** argv) { return argc == 4 && std::strcmp(argv[1], kFlag) == 0; }

bool fork_servers_enabled() {
  const char* v = std::getenv("DSGD_FORK_SERVER");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

void serve_forks(int argc, char** argv, ForkedMain main) {
  const int fd = std::atoi(argv[2]);
  if (fd <= 2 || ::fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) ::_exit(2);
  const pid_t driver = ::getppid();
  const Title title = title_area(argc, argv);
  const std::string binary = argv[0];
  ::prctl(PR_SET_NAME, "dsgd-forkserver");
  if (::send(fd, &kReady, sizeof(kReady), MSG_NOSIGNAL) != sizeof(kReady)) ::_exit(0);
  while (true) serve_one(driver, title, binary.c_str(), fd, main);
}

std::unique_ptr<ForkServer> ForkServer::start(const std::string& binary, const std::vector<std::string>& env,
                                              std::chrono::milliseconds timeout) {
  if (!holds_flag(binary)) return nullptr;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return nullptr;
  // Built before fork: the child of a threaded process may only make async-signal-safe calls.
  std::vector<std::string> env_s = env;
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string path = binary, flag = kFlag, fd = std::to_string(sv[1]), room(kTitleRoom, ' ');
  char* argv[] = {path.data(), flag.data(), fd.data(), room.data(), nullptr};
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);  // no terminal's Ctrl-C: it ends with its driver
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    ::fcntl(sv[1], F_SETFD, 0);
    ::execve(argv[0], argv, envp.data());
    ::_exit(127);
  }
  ::close(sv[1]);
  if (pid < 0) {
    ::close(sv[0]);
    return nullptr;
  }
  pollfd p{sv[0], POLLIN, 0};
  int32_t ready = 0;
  if (::poll(&p, 1, static_cast<int>(timeout.count())) == 1 && ::recv(sv[0], &ready, sizeof(ready), 0) == 4 &&
      ready == kReady) {
    return std::unique_ptr<ForkServer>(new ForkServer(pid, sv[0]));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  ::close(sv[0]);
  control::log().warn("fork server of {} did not start within {} ms (does its main() call dsgd::init(argc, argv) "
                      "first?); its workers start by exec instead, a second of CPU each (DSGD_FORK_SERVER=0 "
                      "says so without trying)",
                      binary, timeout.count());
  return nullptr;
}

ForkServer::~ForkServer() {
  ::close(fd_);  // the server reads the end of its connection and exits
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

std::optional<pid_t> ForkServer::fork(const std::vector<std::string>& args, int stop_signal, int nice) {
  std::string body(sizeof(Request), '\0');
  const Request r{stop_signal, nice, static_cast<uint32_t>(args.size())};
  std::memcpy(body.data(), &r, sizeof(r));
  for (const auto& a : args) body.append(a.c_str(), a.size() + 1);
  if (body.size() > kMaxRequest) return std::nullopt;
  int streams[3] = {0, 1, 2};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(streams))] = {};
  iovec io{body.data(), body.size()};
  msghdr m = message(&io, control, sizeof(control));
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(streams));
  std::memcpy(CMSG_DATA(c), streams, sizeof(streams));
  std::lock_guard<std::mutex> lock(fork_mutex());
  int was_subreaper = 0;
  ::prctl(PR_GET_CHILD_SUBREAPER, &was_subreaper);
  if (!was_subreaper) ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  int32_t answer = -EIO;
  pollfd p{fd_, POLLIN, 0};
  const bool ok = ::sendmsg(fd_, &m, MSG_NOSIGNAL) == static_cast<ssize_t>(body.size()) && ::poll(&p, 1, 10000) == 1 &&
                  ::recv(fd_, &answer, sizeof(answer), 0) == sizeof(answer);
  if (!was_subreaper) ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  if (!ok || answer <= 0) return std::nullopt;
  return static_cast<pid_t>(answer);
}

}  // namespace dsgd::runtime
