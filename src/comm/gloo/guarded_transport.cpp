// Gloo's TCP pair, context and device, each subclassed to put our hello in front of Gloo's
// protocol (see guarded_transport.h for why). What the subclass changes, against Debian's Gloo
// (0.0~git20220518): the listening side no longer accepts once and closes, it accepts every
// connection as a candidate and promotes the one that sends the expected hello; the connecting
// side sends its hello before the pair counts as connected. Everything after that (buffers, the
// event loop, errors) is Gloo's own code on the promoted socket.
#include "comm/gloo/guarded_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gloo/common/error.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

namespace dsgd::comm {
namespace {

namespace tcp = gloo::transport::tcp;
using std::chrono::milliseconds;

// The classes below derive from Gloo's and touch their protected members, so the headers must
// describe the library as it was built: the sizes its own `new` and make_shared use (Debian 12's
// libgloo0 0.0~git20220518). Another Gloo build fails here, not at run time.
static_assert(sizeof(tcp::Pair) == 0x380, "gloo/transport/tcp/pair.h does not match Debian 12's libgloo0");
static_assert(sizeof(tcp::Context) == 0xe0, "gloo/transport/tcp/context.h does not match Debian 12's libgloo0");

constexpr size_t kHelloBytes = std::tuple_size_v<PairHello>;

// Candidates one listening pair holds at once; a newcomer past it drops the oldest. The real
// peer sends its hello in the same moment it connects, so it is never the oldest for long.
constexpr size_t kMaxCandidates = 32;
// Gloo listens with a backlog of 1: one stranger waiting to be accepted would make the kernel
// drop the real peer's SYN (retried after 1 s, then 3 s). Candidates are accepted at once anyway.
constexpr int kListenBacklog = 128;

// "127.0.0.1:41997" (Gloo's Address::str() prints the port in network byte order).
std::string endpoint(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

// Writes all of `hello` to a socket that has just connected (its send buffer is empty, so a
// non-blocking send takes 32 bytes at once; EAGAIN is an error here). Returns errno, or 0.
int send_hello(int fd, const PairHello& hello) {
  size_t sent = 0;
  while (sent < hello.size()) {
    const ssize_t n = ::send(fd, hello.data() + sent, hello.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EPIPE;
    sent += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

PairHello pair_hello(int listener_rank, int connector_rank, const PairSecret& connector_secret) {
  static constexpr char kMagic[8] = {'d', 's', 'g', 'd', 'p', 'a', 'i', 'r'};
  PairHello h{};
  std::memcpy(h.data(), kMagic, sizeof(kMagic));
  const uint32_t to = htonl(static_cast<uint32_t>(listener_rank));
  const uint32_t from = htonl(static_cast<uint32_t>(connector_rank));
  std::memcpy(h.data() + 8, &to, 4);
  std::memcpy(h.data() + 12, &from, 4);
  std::array<unsigned char, EVP_MAX_MD_SIZE> mac{};
  unsigned int mac_bytes = 0;
  if (HMAC(EVP_sha256(), connector_secret.data(), static_cast<int>(connector_secret.size()), h.data(), 16,
           mac.data(), &mac_bytes) == nullptr ||
      mac_bytes < h.size() - 16) {
    throw gloo::Exception("pair hello: HMAC-SHA256 failed (OpenSSL)");
  }
  std::memcpy(h.data() + 16, mac.data(), h.size() - 16);
  return h;
}

namespace {

class GuardedPair;

// An accepted connection that has not sent its hello yet. Owned by its pair and reused once
// closed: within one tick the loop may still deliver an event of one just closed, which then
// finds fd -1 (or the newer connection the slot now holds, whose readiness it handles alike).
struct Candidate final : tcp::Handler {
  GuardedPair* pair = nullptr;
  int fd = -1;         // guarded by the pair's m_
  size_t got = 0;      // bytes of the hello received
  uint64_t order = 0;  // acceptance order: the oldest is dropped first
  void handleEvents(int events) override;
};

// Does nothing: registered for one tick to learn that the loop has finished the tick.
struct NullHandler final : tcp::Handler {
  void handleEvents(int) override {}
};

class GuardedPair final : public tcp::Pair {
 public:
  GuardedPair(tcp::Context* context, tcp::Device* device, int peer_rank, milliseconds timeout, const PairHello& send,
              const PairHello& expect)
      : tcp::Pair(context, device, peer_rank, timeout), send_(send), expect_(expect) {
    std::lock_guard<std::mutex> lock(m_);
    if (state_ != LISTENING) {
      // Gloo's loop accepted a connection in the moment between its listen() and this line:
      // whoever it was, it has not said the hello. The pair fails; the group forms again.
      signalException(
          GLOO_ERROR_MSG("a connection reached rank ", peer_rank, "'s pair before its handshake was armed"));
      return;
    }
    ::listen(fd_, kListenBacklog);
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags == -1 || ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK) == -1) {
      signalException(GLOO_ERROR_MSG("fcntl on the listening socket: ", std::strerror(errno)));
    }
  }

  ~GuardedPair() override {
    std::lock_guard<std::mutex> lock(m_);
    close_candidates();
    // The loop may be in a tick that still holds an event of a candidate closed during it; the
    // candidates are freed with this object, so wait for that tick to end.
    if (!candidates_.empty()) wait_for_loop_tick();
  }

  void handleEvents(int events) override {
    {
      // Like Gloo's: another thread holding m_ may be waiting for this loop; skip this tick.
      std::unique_lock<std::mutex> lock(m_, std::try_to_lock);
      if (!lock) return;
      if (state_ == LISTENING) {
        accept_candidates();
        return;
      }
      if (state_ == CONNECTING) {
        finish_connecting();
        return;
      }
      // Closed: an event of the socket it just closed, delivered within the same tick.
      if (state_ != CONNECTED) return;
    }
    tcp::Pair::handleEvents(events);  // connected: Gloo's own reads and writes
  }

  // From a candidate's handler, on the loop thread.
  void candidate_readable(Candidate& c) {
    std::unique_lock<std::mutex> lock(m_, std::try_to_lock);
    if (!lock || c.fd < 0) return;  // level-triggered: a skipped event comes again
    take_hello(c);
  }

 protected:
  // Gloo waits 5x the timeout for a pair's first connection, for ranks that start late; every
  // rank has published its address in the store before any pair connects (rendezvous.h), so
  // the group's own deadline is enough.
  void waitUntilConnected(std::unique_lock<std::mutex>& lock, bool use_timeout) override {
    auto connected = [&] {
      throwIfException();
      return state_ >= CONNECTED;
    };
    if (!use_timeout || timeout_.count() <= 0) {
      cv_.wait(lock, connected);
    } else if (!cv_.wait_for(lock, timeout_, connected)) {
      signalAndThrowException(GLOO_ERROR_MSG("rank ", rank_, " did not connect within ", timeout_.count(), " ms"));
    }
  }

  void changeState(state next) noexcept override {
    // Leaving LISTENING (the peer promoted, connecting instead, or closing): no more candidates.
    if (state_ == LISTENING && next != LISTENING) close_candidates();
    tcp::Pair::changeState(next);
  }

 private:
  // The listening socket is readable: take every waiting connection as a candidate.
  void accept_candidates() {
    while (true) {
      const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        // accept(2): Linux passes pending network errors of the new connection to accept.
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO || errno == ENETDOWN ||
            errno == ENOPROTOOPT || errno == EHOSTDOWN || errno == ENONET || errno == EHOSTUNREACH ||
            errno == EOPNOTSUPP || errno == ENETUNREACH) {
          continue;
        }
        signalException(GLOO_ERROR_MSG("accept on ", endpoint(self_.getSockaddr()), ": ", std::strerror(errno)));
        return;
      }
      Candidate& c = free_candidate();
      c.fd = fd;
      c.got = 0;
      c.order = ++accepted_;
      device_->registerDescriptor(fd, EPOLLIN, &c);
      // The peer writes its hello as soon as it is connected, so it is usually here already:
      // read it now, before a flood of strangers accepted in this same loop could push this
      // candidate out as the oldest.
      if (take_hello(c)) return;
    }
  }

  // m_ held. Reads what `c` has sent of its hello: a wrong byte, a close or an error drops it;
  // the whole hello promotes it (true). Otherwise it waits for more.
  bool take_hello(Candidate& c) {
    while (c.got < kHelloBytes) {
      uint8_t* into = received_.data();
      const ssize_t n = ::recv(c.fd, into, kHelloBytes - c.got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
      if (n <= 0 || std::memcmp(into, expect_.data() + c.got, static_cast<size_t>(n)) != 0) {
        close_candidate(c);  // closed, reset, or not our hello: a stranger
        return false;
      }
      c.got += static_cast<size_t>(n);
    }
    promote(c);
    return true;
  }

  // A closed slot, a new one below the limit, or the oldest candidate dropped.
  Candidate& free_candidate() {
    Candidate* oldest = nullptr;
    for (auto& c : candidates_) {
      if (c->fd < 0) return *c;
      if (oldest == nullptr || c->order < oldest->order) oldest = c.get();
    }
    if (candidates_.size() < kMaxCandidates) {
      candidates_.push_back(std::make_unique<Candidate>());
      candidates_.back()->pair = this;
      return *candidates_.back();
    }
    close_candidate(*oldest);
    return *oldest;
  }

  // `c` said the hello: its socket becomes the pair's, the listener and the others close.
  void promote(Candidate& c) {
    const int fd = c.fd;
    device_->unregisterDescriptor(fd, &c);
    c.fd = -1;
    device_->unregisterDescriptor(fd_, this);
    ::close(fd_);
    fd_ = fd;
    handleConnected();  // Gloo's: socket options, registration, CONNECTED (closes the others)
  }

  // The connecting side's socket is writable (connected) or failed: say the hello, then Gloo's.
  void finish_connecting() {
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == 0) err = send_hello(fd_, send_);
    if (err != 0) {
      signalException(GLOO_ERROR_MSG("connect ", endpoint(peer_.getSockaddr()), ": ", std::strerror(err)));
      return;
    }
    handleConnected();
  }

  // m_ held. Closing a socket also takes it out of the loop's epoll set.
  void close_candidate(Candidate& c) {
    if (c.fd < 0) return;
    ::close(c.fd);
    c.fd = -1;
  }
  void close_candidates() {
    for (auto& c : candidates_) close_candidate(*c);
  }

  // Returns after the device's loop has finished a tick (Gloo's unregisterDescriptor waits for
  // one when called off the loop thread).
  void wait_for_loop_tick() {
    const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) return;
    NullHandler h;
    device_->registerDescriptor(fd, EPOLLIN, &h);
    device_->unregisterDescriptor(fd, &h);
    ::close(fd);
  }

  const PairHello send_;    // what this side says when it connects
  const PairHello expect_;  // what the peer must say when it connects here
  PairHello received_{};    // scratch for one recv
  std::vector<std::unique_ptr<Candidate>> candidates_;  // guarded by m_
  uint64_t accepted_ = 0;                               // guarded by m_
};

void Candidate::handleEvents(int) { pair->candidate_readable(*this); }

class GuardedContext final : public tcp::Context {
 public:
  GuardedContext(std::shared_ptr<tcp::Device> device, int rank, int size, std::vector<PairSecret> secrets)
      : tcp::Context(std::move(device), rank, size), secrets_(std::move(secrets)) {}

  std::unique_ptr<gloo::transport::Pair>& createPair(int peer) override {
    auto& slot = pairs_.at(static_cast<size_t>(peer));
    slot = std::make_unique<GuardedPair>(this, device_.get(), peer, getTimeout(),
                                         pair_hello(peer, rank, secrets_.at(static_cast<size_t>(rank))),
                                         pair_hello(rank, peer, secrets_.at(static_cast<size_t>(peer))));
    return slot;
  }

 private:
  const std::vector<PairSecret> secrets_;
};

class GuardedDevice final : public tcp::Device {
 public:
  GuardedDevice(const tcp::attr& attr, int rank, std::vector<PairSecret> secrets)
      : tcp::Device(attr), rank_(rank), secrets_(std::move(secrets)) {}

  std::shared_ptr<gloo::transport::Context> createContext(int rank, int size) override {
    if (rank != rank_ || static_cast<size_t>(size) != secrets_.size()) {
      throw gloo::Exception("guarded device: made for rank " + std::to_string(rank_) + " of " +
                            std::to_string(secrets_.size()) + ", asked for rank " + std::to_string(rank) + " of " +
                            std::to_string(size));
    }
    return std::make_shared<GuardedContext>(shared_from_this(), rank, size, secrets_);
  }

 private:
  const int rank_;
  const std::vector<PairSecret> secrets_;
};

}  // namespace

PairSecret random_pair_secret() {
  std::random_device source;  // getrandom(2) on Linux
  PairSecret s{};
  for (size_t i = 0; i < s.size(); i += 4) {
    const uint32_t v = source();
    std::memcpy(s.data() + i, &v, 4);
  }
  return s;
}

std::shared_ptr<gloo::transport::Device> make_guarded_device(const std::string& bind_address, int rank,
                                                             std::vector<PairSecret> secrets) {
  const tcp::attr attr(bind_address.c_str());
  return std::make_shared<GuardedDevice>(tcp::CreateDeviceAttr(attr), rank, std::move(secrets));
}

}  // namespace dsgd::comm
