#include "dsgd/comm/shm_group.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <immintrin.h>
#include <random>
#include <thread>
#include <vector>

#include "comm/op_queue.h"
#include "comm/process.h"
#include "comm/reduce_kernels.h"
#include "dsgd/common/error.h"

namespace dsgd::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kMaxRanks = 64;
constexpr uint32_t kMagic = 0x64736764;  // "dsgd"
constexpr size_t kAlign = 64;
// A sleeping waiter wakes this often to check the deadline, the abort flag and peers' liveness.
constexpr milliseconds kSleepSlice{50};
// Header::offset of a rank whose allreduce copies through its slot (not in its shared region).
constexpr uint64_t kStaged = ~uint64_t{0};

// The segment's header. Counters sit on their own cache lines so waiting ranks do not slow the
// ones still writing.
struct Header {
  uint32_t magic;
  uint32_t ranks;
  uint64_t slot_bytes;
  uint64_t shared_bytes;
  alignas(kAlign) std::atomic<uint32_t> arrived;     // ranks in the current barrier episode
  alignas(kAlign) std::atomic<uint32_t> episode;     // futex word: bumped when a barrier opens
  alignas(kAlign) std::atomic<uint32_t> aborted;     // nonzero: every operation fails (kAbort*)
  std::atomic<uint32_t> attached;                    // ranks that have mapped the segment
  std::atomic<int32_t> pids[kMaxRanks];
  std::atomic<uint32_t> rank_episode[kMaxRanks];     // last barrier episode each rank entered
  std::atomic<uint64_t> offset[kMaxRanks];           // each rank's current allreduce: where its data is
  char abort_reason[256];
};

// Header::aborted: the first rank to abort raises it to kAborting, writes abort_reason, then
// sets kAbortReasonWritten; a reader that sees kAborting waits for the reason (briefly: a rank
// killed in between never writes it).
constexpr uint32_t kAborting = 1;
constexpr uint32_t kAbortReasonWritten = 2;
constexpr auto kAbortReasonWithin = std::chrono::milliseconds(100);

// This process's PID namespace (the inode of /proc/self/ns/pid), 0 when it cannot be read. A
// segment's name carries its creator's, so a sweep judges only pids it can see.
uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// "/dsgd-<creator pid>-<random>-<creator's pid namespace>".
std::string segment_name() {
  std::random_device rd;
  return "/dsgd-" + std::to_string(::getpid()) + "-" + std::to_string(rd()) + "-" + std::to_string(pid_namespace());
}

// The creator pid and PID namespace of a segment's file name; false for a name that is not one.
// Names without the namespace (from versions before it) count as this namespace's.
bool parse_segment_name(const std::string& name, pid_t* pid, uint64_t* ns) {
  if (name.rfind("dsgd-", 0) != 0) return false;
  std::vector<uint64_t> parts;
  size_t at = 5;
  while (at <= name.size()) {
    const size_t end = std::min(name.find('-', at), name.size());
    if (end == at || name.find_first_not_of("0123456789", at) < end) return false;
    try {
      parts.push_back(std::stoull(name.substr(at, end - at)));
    } catch (const std::exception&) {
      return false;
    }
    at = end + 1;
  }
  if (parts.size() != 2 && parts.size() != 3) return false;
  if (parts[0] == 0 || parts[0] > static_cast<uint64_t>(std::numeric_limits<pid_t>::max())) return false;
  *pid = static_cast<pid_t>(parts[0]);
  *ns = parts.size() == 3 ? parts[2] : pid_namespace();
  return true;
}

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Where `bytes` at p lie in a shared region of `region_bytes` at `region`: their offset, else kStaged.
uint64_t offset_within(const void* p, size_t bytes, const char* region, size_t region_bytes) {
  const char* b = static_cast<const char*>(p);
  if (region_bytes == 0 || b < region || bytes > region_bytes) return kStaged;
  if (static_cast<size_t>(b - region) > region_bytes - bytes) return kStaged;
  return static_cast<uint64_t>(b - region);
}

long futex(std::atomic<uint32_t>* addr, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, value, timeout, nullptr, 0);
}

class ShmGroupImpl : public ShmGroup {
 public:
  ShmGroupImpl(std::shared_ptr<Store> store, int rank, int size, const ShmOptions& options)
      : rank_(rank), size_(size), options_(options) {
    if (size < 1 || size > kMaxRanks || rank < 0 || rank >= size) {
      throw ConfigError("shm group: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                        " is invalid (1.." + std::to_string(kMaxRanks) + " ranks per host)");
    }
    if (options_.slot_bytes < 4096) throw ConfigError("shm group: slot_bytes must be >= 4096");
    options_.slot_bytes = round_up(options_.slot_bytes, 4096);
    options_.shared_bytes = round_up(options_.shared_bytes, 4096);
    slot_offset_ = round_up(sizeof(Header), 4096);
    shared_offset_ = slot_offset_ + options_.slot_bytes * static_cast<size_t>(size_);
    oversubscribed_ = size_ > static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
    bytes_ = shared_offset_ + options_.shared_bytes * static_cast<size_t>(size_);
    try {
      attach(*store);
    } catch (...) {
      if (base_ != nullptr) ::munmap(base_, bytes_);  // the destructor will not run
      throw;
    }
  }

  ~ShmGroupImpl() override {
    queue_.reset();  // finish (or fail) queued operations before the segment goes away
    if (base_ != nullptr) ::munmap(base_, bytes_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void* buffer() override { return slot(rank_); }
  size_t buffer_bytes() const override { return options_.slot_bytes; }
  void* shared_buffer() override { return options_.shared_bytes > 0 ? shared(rank_) : nullptr; }
  size_t shared_buffer_bytes() const override { return options_.shared_bytes; }

  void abort(const std::string& reason) override {
    uint32_t expected = 0;
    if (header_->aborted.compare_exchange_strong(expected, kAborting)) {
      std::snprintf(header_->abort_reason, sizeof(header_->abort_reason), "rank %d: %s", rank_, reason.c_str());
      header_->aborted.store(kAbortReasonWritten, std::memory_order_release);
    }
    header_->episode.fetch_add(0);  // order the flag before the wake
    futex(&header_->episode, FUTEX_WAKE, INT32_MAX, nullptr);
  }

  std::shared_ptr<Work> barrier_async(milliseconds timeout) override {
    return queue_->submit("shm barrier", barrier_op(timeout));
  }
  void barrier(milliseconds timeout) override { queue_->run("shm barrier", barrier_op(timeout)); }

  std::shared_ptr<Work> allreduce_async(void* data, size_t count, DataType type, ReduceOp op,
                                        milliseconds timeout) override {
    return queue_->submit("shm allreduce", allreduce_op(data, count, type, op, timeout));
  }
  void allreduce(void* data, size_t count, DataType type, ReduceOp op, milliseconds timeout) override {
    queue_->run("shm allreduce", allreduce_op(data, count, type, op, timeout));
  }

  std::shared_ptr<Work> broadcast_async(void* data, size_t bytes, int root, milliseconds timeout) override {
    return queue_->submit("shm broadcast", broadcast_op(data, bytes, root, timeout));
  }
  void broadcast(void* data, size_t bytes, int root, milliseconds timeout) override {
    queue_->run("shm broadcast", broadcast_op(data, bytes, root, timeout));
  }

  // `in` in the shared regions (the same offset of every rank's): each rank reduces its block
  // where the blocks lie, nothing copied in (zero-copy, as the allreduce's). Else in pieces of
  // slot_bytes / size() elements of each block: every rank writes its pieces of all blocks into
  // its slot, then reduces its own block's piece from every slot into `out`. `out` may be in's
  // own block: the others read only theirs.
  std::shared_ptr<Work> reduce_scatter_async(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                                             milliseconds timeout) override {
    const std::string name = "shm reduce_scatter #" + std::to_string(++ops_) + " (" + std::to_string(count) +
                             " x " + to_string(type) + " a rank, " + to_string(op) + ")";
    return queue_->submit("shm reduce_scatter", [=, this] {
      const Clock::time_point until = deadline(timeout);
      const size_t es = element_size(type);
      const auto* src = static_cast<const char*>(in);
      char* dst = static_cast<char*>(out);
      if (size_ == 1) {
        if (count > 0 && dst != src) std::memmove(dst, src, count * es);
        return;
      }
      const size_t n = static_cast<size_t>(size_);
      const int divisor = op == ReduceOp::kAverage ? size_ : 1;
      const uint64_t offset = offset_within(src, n * count * es, shared(rank_), options_.shared_bytes);
      header_->offset[rank_].store(offset, std::memory_order_relaxed);
      if (offset != kStaged) {
        wait_all(name, until);  // every region holds its rank's data
        check_offsets(name, offset);
        const size_t at = offset + static_cast<size_t>(rank_) * count * es;
        if (dst != shared(rank_) + at) std::memcpy(dst, shared(rank_) + at, count * es);
        std::vector<const void*> others;
        for (int r = 0; r < size_; ++r) {
          if (r != rank_) others.push_back(shared(r) + at);
        }
        reduce_many(dst, others.data(), static_cast<int>(others.size()), count, type, op, divisor);
        wait_all(name, until);  // nobody reads the regions any more
        return;
      }
      const size_t piece = options_.slot_bytes / n / kAlign * kAlign / es;  // elements of each block a round
      for (size_t done = 0; done < count; done += piece) {
        const size_t m = std::min(piece, count - done);
        char* mine = slot(rank_);
        for (size_t b = 0; b < n; ++b) std::memcpy(mine + b * piece * es, src + (b * count + done) * es, m * es);
        wait_all(name, until);  // every slot holds its rank's pieces
        if (done == 0) check_offsets(name, kStaged);
        const size_t at = static_cast<size_t>(rank_) * piece * es;
        std::memcpy(dst + done * es, mine + at, m * es);
        std::vector<const void*> others;
        for (int r = 0; r < size_; ++r) {
          if (r != rank_) others.push_back(slot(r) + at);
        }
        reduce_many(dst + done * es, others.data(), static_cast<int>(others.size()), m, type, op, divisor);
        wait_all(name, until);  // nobody reads the slots any more
      }
    });
  }

  // `out` in the shared regions (the same offset of every rank's): each rank writes its block
  // into its place there and copies the others' from their regions (zero-copy). Else in pieces of
  // slot_bytes: every rank writes its piece into its slot, then copies the others'.
  std::shared_ptr<Work> allgather_async(const void* in, void* out, size_t bytes, milliseconds timeout) override {
    const std::string name =
        "shm allgather #" + std::to_string(++ops_) + " (" + std::to_string(bytes) + " bytes a rank)";
    return queue_->submit("shm allgather", [=, this] {
      const Clock::time_point until = deadline(timeout);
      const auto* src = static_cast<const char*>(in);
      char* dst = static_cast<char*>(out);
      char* own = dst + static_cast<size_t>(rank_) * bytes;
      const uint64_t offset =
          size_ > 1 ? offset_within(dst, static_cast<size_t>(size_) * bytes, shared(rank_), options_.shared_bytes)
                    : kStaged;
      header_->offset[rank_].store(offset, std::memory_order_relaxed);
      if (offset != kStaged) {
        if (bytes > 0 && own != src) std::memcpy(own, src, bytes);
        wait_all(name, until);  // every region holds its rank's block
        check_offsets(name, offset);
        for (int r = 0; r < size_; ++r) {
          const size_t at = offset + static_cast<size_t>(r) * bytes;
          if (r != rank_) std::memcpy(dst + static_cast<size_t>(r) * bytes, shared(r) + at, bytes);
        }
        wait_all(name, until);  // nobody reads the regions any more
        return;
      }
      const size_t piece = options_.slot_bytes;
      for (size_t done = 0; size_ > 1 && done < bytes; done += piece) {
        const size_t m = std::min(piece, bytes - done);
        std::memcpy(slot(rank_), src + done, m);
        wait_all(name, until);  // every slot holds its rank's piece
        if (done == 0) check_offsets(name, kStaged);
        for (int r = 0; r < size_; ++r) {
          if (r != rank_) std::memcpy(dst + static_cast<size_t>(r) * bytes + done, slot(r), m);
        }
        wait_all(name, until);  // nobody reads the slots any more
      }
      if (bytes > 0 && own != src) std::memcpy(own, src, bytes);
    });
  }

 private:
  // The operations as closures, numbered in submission order; each deadline counts from the
  // operation's start.
  std::function<void()> barrier_op(milliseconds timeout) {
    return [this, timeout, name = "shm barrier #" + std::to_string(++ops_)] { wait_all(name, deadline(timeout)); };
  }
  std::function<void()> allreduce_op(void* data, size_t count, DataType type, ReduceOp op, milliseconds timeout) {
    const std::string name = "shm allreduce #" + std::to_string(++ops_) + " (" + std::to_string(count) + " x " +
                             to_string(type) + ", " + to_string(op) + ")";
    return [=, this] { run_allreduce(name, data, count, type, op, deadline(timeout)); };
  }
  std::function<void()> broadcast_op(void* data, size_t bytes, int root, milliseconds timeout) {
    if (root < 0 || root >= size_) {
      throw ConfigError("shm broadcast: root " + std::to_string(root) + " is not a rank (0.." +
                        std::to_string(size_ - 1) + ")");
    }
    const std::string name = "shm broadcast #" + std::to_string(++ops_) + " (" + std::to_string(bytes) + " bytes)";
    return [=, this] { run_broadcast(name, data, bytes, root, deadline(timeout)); };
  }

  void run_allreduce(const std::string& name, void* data, size_t count, DataType type, ReduceOp op,
                     Clock::time_point until) {
    if (size_ == 1 || count == 0) return;  // data already holds the sum, max and average of one rank
    const size_t es = element_size(type);
    char* bytes = static_cast<char*>(data);
    const char* region = shared(rank_);
    if (options_.shared_bytes > 0 && bytes >= region && count * es <= options_.shared_bytes &&
        static_cast<size_t>(bytes - region) <= options_.shared_bytes - count * es) {
      run_shared_allreduce(name, static_cast<size_t>(bytes - region), count, type, op, until);
      return;
    }
    const size_t piece_elems = options_.slot_bytes / es;
    const bool zero_copy = data == buffer() && count * es <= options_.slot_bytes;
    header_->offset[rank_].store(kStaged, std::memory_order_relaxed);
    for (size_t done = 0; done < count; done += piece_elems) {
      const size_t m = std::min(piece_elems, count - done);
      char* mine = slot(rank_);
      if (!zero_copy) std::memcpy(mine, bytes + done * es, m * es);
      wait_all(name, until);  // every slot holds its rank's piece
      if (done == 0) check_offsets(name, kStaged);
      // Reduce this rank's block across all slots, into this rank's slot.
      const auto [lo, hi] = block(m, rank_, es);
      std::vector<const void*> others;
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) others.push_back(slot(r) + lo * es);
      }
      reduce_many(mine + lo * es, others.data(), static_cast<int>(others.size()), hi - lo, type, op,
                  op == ReduceOp::kAverage ? size_ : 1);
      wait_all(name, until);  // every block is reduced
      for (int r = 0; r < size_; ++r) {
        const auto [rlo, rhi] = block(m, r, es);
        if (zero_copy) {
          if (r != rank_) std::memcpy(mine + rlo * es, slot(r) + rlo * es, (rhi - rlo) * es);
        } else {
          std::memcpy(bytes + (done + rlo) * es, slot(r) + rlo * es, (rhi - rlo) * es);
        }
      }
      wait_all(name, until);  // nobody reads the slots any more: they may be refilled
    }
  }

  // Data in the shared regions, at `offset` in every rank's: reduced where it lies, and only the
  // other ranks' blocks copied (from their regions into this rank's).
  void run_shared_allreduce(const std::string& name, size_t offset, size_t count, DataType type, ReduceOp op,
                            Clock::time_point until) {
    const size_t es = element_size(type);
    header_->offset[rank_].store(offset, std::memory_order_relaxed);
    wait_all(name, until);  // every region holds its rank's data
    check_offsets(name, offset);
    char* mine = shared(rank_) + offset;
    const auto [lo, hi] = block(count, rank_, es);
    std::vector<const void*> others;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) others.push_back(shared(r) + offset + lo * es);
    }
    reduce_many(mine + lo * es, others.data(), static_cast<int>(others.size()), hi - lo, type, op,
                op == ReduceOp::kAverage ? size_ : 1);
    wait_all(name, until);  // every block is reduced
    for (int r = 0; r < size_; ++r) {
      const auto [rlo, rhi] = block(count, r, es);
      if (r != rank_) std::memcpy(mine + rlo * es, shared(r) + offset + rlo * es, (rhi - rlo) * es);
    }
    wait_all(name, until);  // nobody reads the regions any more
  }

  // After an allreduce's first barrier: every rank's data must be where this rank's is (the same
  // offset of the shared regions, or staged through the slots). Ranks that disagree would sum
  // unrelated memory: fail the group instead.
  void check_offsets(const std::string& op, uint64_t mine) {
    for (int r = 0; r < size_; ++r) {
      const uint64_t theirs = header_->offset[r].load(std::memory_order_relaxed);
      if (theirs == mine) continue;
      auto where = [](uint64_t o) {
        return o == kStaged ? std::string("memory of its own")
                            : "offset " + std::to_string(o) + " of its shared buffer";
      };
      const std::string msg = op + ": rank " + std::to_string(rank_) + " passed " + where(mine) + ", rank " +
                              std::to_string(r) + " " + where(theirs) +
                              " (every rank must allreduce the same region of its shared buffer, or none)";
      abort(msg);
      throw CommError("shm rank " + std::to_string(rank_) + ": " + msg, op);
    }
  }

  // Double-buffered through root's slot: while the others copy chunk k - 1 out of one half, root
  // copies chunk k into the other; one barrier a chunk (and one at the end). A half is rewritten
  // two barriers after it was filled, when every rank has copied it out.
  void run_broadcast(const std::string& name, void* data, size_t bytes, int root, Clock::time_point until) {
    if (bytes == 0) return;
    char* p = static_cast<char*>(data);
    const size_t half = options_.slot_bytes / 2 / kAlign * kAlign;
    const size_t chunks = (bytes + half - 1) / half;
    auto buffer = [&](size_t k) { return slot(root) + (k % 2) * half; };
    auto length = [&](size_t k) { return std::min(half, bytes - k * half); };
    for (size_t k = 0; k <= chunks; ++k) {
      if (rank_ == root && k < chunks && p + k * half != buffer(k)) std::memcpy(buffer(k), p + k * half, length(k));
      if (rank_ != root && k > 0) std::memcpy(p + (k - 1) * half, buffer(k - 1), length(k - 1));
      wait_all(name, until);  // the last: root's slot is free for what comes next
    }
  }

  char* slot(int r) const {
    return static_cast<char*>(base_) + slot_offset_ + options_.slot_bytes * static_cast<size_t>(r);
  }
  char* shared(int r) const {
    return static_cast<char*>(base_) + shared_offset_ + options_.shared_bytes * static_cast<size_t>(r);
  }

  // Rank r's block of m elements: cache-line-aligned boundaries, the last rank takes the rest.
  std::pair<size_t, size_t> block(size_t m, int r, size_t es) const {
    const size_t align = std::max<size_t>(1, kAlign / es);
    const size_t per = round_up((m + static_cast<size_t>(size_) - 1) / static_cast<size_t>(size_), align);
    const size_t lo = std::min(m, per * static_cast<size_t>(r));
    const size_t hi = std::min(m, lo + per);
    return {lo, hi};
  }

  Clock::time_point deadline(milliseconds timeout) const {
    return Clock::now() + (timeout.count() > 0 ? timeout : options_.timeout);
  }

  void attach(Store& store) {
    // The creator picks a unique name and publishes it; the others open it.
    if (rank_ == 0) {
      remove_orphaned_segments();  // what creators killed before their group formed left
      name_ = segment_name();
      const int fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) throw CommError("shm group: shm_open " + name_ + ": " + std::strerror(errno), "shm create");
      if (::ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
        const int err = errno;
        ::close(fd);
        ::shm_unlink(name_.c_str());
        throw CommError("shm group: cannot size " + name_ + " to " + std::to_string(bytes_) + " bytes: " +
                            std::strerror(err) + " (is /dev/shm large enough?)",
                        "shm create");
      }
      try {
        map(fd);
      } catch (...) {
        ::shm_unlink(name_.c_str());
        throw;
      }
      header_ = new (base_) Header{};
      header_->magic = kMagic;
      header_->ranks = static_cast<uint32_t>(size_);
      header_->slot_bytes = options_.slot_bytes;
      header_->shared_bytes = options_.shared_bytes;
      store.set("shm/name", name_);
    } else {
      name_ = store.get("shm/name", options_.timeout);
      const int fd = ::shm_open(name_.c_str(), O_RDWR, 0600);
      if (fd < 0) throw CommError("shm group: shm_open " + name_ + ": " + std::strerror(errno), "shm attach");
      map(fd);
      header_ = static_cast<Header*>(base_);
      if (header_->magic != kMagic || header_->ranks != static_cast<uint32_t>(size_) ||
          header_->slot_bytes != options_.slot_bytes || header_->shared_bytes != options_.shared_bytes) {
        ::shm_unlink(name_.c_str());  // the group cannot form: leave nothing behind
        throw ConfigError(
            "shm group: segment " + name_ + " was made for " + std::to_string(header_->ranks) + " ranks of " +
            std::to_string(header_->slot_bytes) + " + " + std::to_string(header_->shared_bytes) +
            " shared bytes; this rank expects " + std::to_string(size_) + " of " + std::to_string(options_.slot_bytes) +
            " + " + std::to_string(options_.shared_bytes) + " (every rank of a host must pass the same ShmOptions)");
      }
    }
    header_->pids[rank_] = ::getpid();
    // The last rank to map the segment removes its name: from then on nothing can leak into
    // /dev/shm, whoever dies; the memory goes away with the last mapping.
    if (header_->attached.fetch_add(1) + 1 == static_cast<uint32_t>(size_)) ::shm_unlink(name_.c_str());
    try {
      wait_all("shm rendezvous", deadline({}));
    } catch (...) {
      ::shm_unlink(name_.c_str());  // a rank never came: remove the name ourselves
      throw;
    }
  }

  void map(int fd) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) throw CommError("shm group: mmap " + name_ + ": " + std::strerror(errno), "shm attach");
    base_ = p;
  }

  // The barrier: spin briefly, then sleep on the episode futex in slices, checking the abort
  // flag, the deadline and peers' liveness between slices.
  void wait_all(const std::string& op, Clock::time_point until) {
    check_aborted(op);
    const uint32_t episode = header_->episode.load(std::memory_order_acquire);
    header_->rank_episode[rank_].store(episode + 1, std::memory_order_relaxed);
    if (header_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
      header_->arrived.store(0, std::memory_order_relaxed);
      header_->episode.store(episode + 1, std::memory_order_release);
      futex(&header_->episode, FUTEX_WAKE, INT32_MAX, nullptr);
      return;
    }
    // Spin briefly: most barriers open within microseconds. With more ranks than cores, the
    // rank being waited for may need this core, so yield it while spinning.
    const auto spin_until = Clock::now() + options_.spin_us;
    for (int i = 0; header_->episode.load(std::memory_order_acquire) == episode; ++i) {
      if ((i & 63) == 0) {
        if (Clock::now() >= spin_until) break;
        if (oversubscribed_) std::this_thread::yield();
      }
      _mm_pause();
    }
    while (header_->episode.load(std::memory_order_acquire) == episode) {
      check_aborted(op);
      const auto now = Clock::now();
      if (now >= until) fail_timeout(op, episode);
      const auto slice = std::min<Clock::duration>(kSleepSlice, until - now);
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      futex(&header_->episode, FUTEX_WAIT, episode, &ts);
      if (header_->episode.load(std::memory_order_acquire) != episode) break;
      for (int r = 0; r < size_; ++r) {
        if (r != rank_ && header_->rank_episode[r].load() != episode + 1 && process_gone(header_->pids[r])) {
          const std::string msg = "rank " + std::to_string(r) + " (pid " + std::to_string(header_->pids[r]) +
                                  ") has exited";
          abort(msg);
          throw CommError("shm rank " + std::to_string(rank_) + ": " + op + " failed: " + msg + "; re-form the group",
                          op, r);
        }
      }
    }
    check_aborted(op);
  }

  void check_aborted(const std::string& op) const {
    uint32_t state = header_->aborted.load(std::memory_order_acquire);
    if (state == 0) return;
    const auto give_up = std::chrono::steady_clock::now() + kAbortReasonWithin;
    while (state == kAborting && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      state = header_->aborted.load(std::memory_order_acquire);
    }
    const std::string reason =
        state == kAbortReasonWritten
            ? std::string(header_->abort_reason, strnlen(header_->abort_reason, sizeof(header_->abort_reason)))
            : "the rank that aborted it left no reason: it died while aborting";
    throw CommError("shm rank " + std::to_string(rank_) + ": " + op + " failed: group aborted (" + reason +
                        "); re-form the group",
                    op);
  }

  [[noreturn]] void fail_timeout(const std::string& op, uint32_t episode) {
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      if (header_->rank_episode[r].load() != episode + 1) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    const std::string msg = op + ": rank(s) " + missing + " did not arrive before the deadline (stopped or hung)";
    abort(msg);
    throw TimeoutError("shm rank " + std::to_string(rank_) + ": " + msg + "; re-form the group", op);
  }

  const int rank_;
  const int size_;
  ShmOptions options_;
  size_t slot_offset_ = 0;
  size_t shared_offset_ = 0;
  size_t bytes_ = 0;
  std::string name_;
  void* base_ = nullptr;
  Header* header_ = nullptr;
  std::atomic<uint64_t> ops_{0};
  bool oversubscribed_ = false;  // more local ranks than cores
  std::unique_ptr<OpQueue> queue_ = std::make_unique<OpQueue>("shm group");
};

}  // namespace

int remove_orphaned_segments(const std::string& dir) {
  const uint64_t ours = pid_namespace();
  if (ours == 0) return 0;  // no /proc: whose pids a name holds cannot be judged
  int removed = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    pid_t pid = 0;
    uint64_t ns = 0;
    struct stat st {};
    if (!parse_segment_name(name, &pid, &ns) || ns != ours) continue;
    if (::stat(it->path().c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to probe)
    if (std::filesystem::remove(it->path(), ec)) ++removed;
  }
  return removed;
}

std::unique_ptr<ShmGroup> ShmGroup::create(std::shared_ptr<Store> store, int rank, int size,
                                           const ShmOptions& options) {
  return std::make_unique<ShmGroupImpl>(std::move(store), rank, size, options);
}

}  // namespace dsgd::comm
