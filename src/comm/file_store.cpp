// The file Store: one file per key in a directory, for processes on one host. Writers write a
// temporary file and rename it into place, so a reader sees a whole value or none; waiters poll
// with back-off (rendezvous is rare, so polling costs nothing that matters).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "comm/store_util.h"
#include "dsgd/comm/store.h"
#include "dsgd/common/error.h"

namespace dsgd::comm {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Keys may hold any bytes; file names keep [A-Za-z0-9_-] and escape the rest as %XX (so no key
// maps to ".lock" or a temporary file, which start with '.').
std::string encode_key(const std::string& key) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '_' || c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      out += {'%', hex[c >> 4], hex[c & 15]};
    }
  }
  return out.empty() ? "%" : out;
}

class FileLock {
 public:
  explicit FileLock(const fs::path& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    if (fd_ < 0) throw CommError("file store: cannot open " + path.string() + ": " + std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        ::close(fd_);
        throw CommError("file store: cannot lock " + path.string() + ": " + std::strerror(errno));
      }
    }
  }
  ~FileLock() { ::close(fd_); }  // closing releases the lock
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

class FileStore : public Store {
 public:
  explicit FileStore(const std::string& dir) : dir_(dir) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (!fs::is_directory(dir_)) {
      throw CommError("file store: cannot create directory " + dir + (ec ? ": " + ec.message() : ""));
    }
  }

  void set(const std::string& key, const std::string& value) override { write(key, value); }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    std::string value;
    if (!read(key, &value)) throw CommError("file store: key '" + key + "' vanished while being read", "store get");
    return value;
  }

  bool check(const std::vector<std::string>& keys) override { return missing(keys).empty(); }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    auto sleep = std::chrono::microseconds(200);
    while (true) {
      auto left = missing(keys);
      if (left.empty()) return;
      if (Clock::now() >= deadline) throw_wait_timeout("file store " + dir_.string(), left, timeout);
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(20000));
    }
  }

  int64_t add(const std::string& key, int64_t delta) override {
    FileLock lock(dir_ / ".lock");
    std::string value;
    const int64_t result = (read(key, &value) ? parse_counter(key, value) : 0) + delta;
    write(key, std::to_string(result));
    return result;
  }

  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override {
    FileLock lock(dir_ / ".lock");
    std::string current;
    read(key, &current);
    if (current != expected) return current;
    write(key, desired);
    return desired;
  }

  bool erase(const std::string& key) override {
    std::error_code ec;
    return fs::remove(path(key), ec);
  }

 private:
  fs::path path(const std::string& key) const { return dir_ / encode_key(key); }

  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& k : keys) {
      if (!fs::exists(path(k), ec)) out.push_back(k);
    }
    return out;
  }

  bool read(const std::string& key, std::string* value) const {
    std::ifstream in(path(key), std::ios::binary);
    if (!in) return false;
    std::ostringstream ss;
    ss << in.rdbuf();
    *value = ss.str();
    return true;
  }

  void write(const std::string& key, const std::string& value) {
    static std::atomic<uint64_t> counter{0};
    const fs::path tmp = dir_ / (".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++));
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      if (!out) throw CommError("file store: cannot write " + tmp.string() + ": " + std::strerror(errno), "store set");
    }
    std::error_code ec;
    fs::rename(tmp, path(key), ec);
    if (ec) {
      fs::remove(tmp, ec);
      throw CommError("file store: cannot rename into " + path(key).string() + ": " + ec.message(), "store set");
    }
  }

  fs::path dir_;
};

}  // namespace

std::shared_ptr<Store> make_file_store(const std::string& dir) { return std::make_shared<FileStore>(dir); }

}  // namespace dsgd::comm
