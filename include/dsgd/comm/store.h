// dsgd/comm/store.h — the rendezvous key-value store through which ranks find each other.
//
//   auto store = dsgd::comm::make_file_store("/tmp/job-42");            // one host, any processes
//   dsgd::comm::PrefixStore gen(store, "job42/gen3/");                   // a namespace per generation
//   gen.set("rank0/addr", bytes);
//   std::string peer = gen.get("rank1/addr", std::chrono::seconds(10)); // waits, then TimeoutError
//
// Keys are strings; values are byte strings. Every wait takes a timeout and throws
// dsgd::TimeoutError naming the keys still missing when it runs out. Implementations: in memory
// (ranks as threads, tests), a directory (processes on one host), and, with the runtime, the
// driver's gRPC service. Keys are namespaced with PrefixStore by job and generation, so a group
// re-formed after a failure never reads the previous generation's keys. All methods are
// thread-safe. Torch-free.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dsgd::comm {

class Store {
 public:
  virtual ~Store() = default;

  // Stores `value` under `key`, replacing any previous value. Readers see all of it or none.
  virtual void set(const std::string& key, const std::string& value) = 0;

  // The value of `key`, waiting up to `timeout` for it to be set.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;

  // True if every key is set now.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Waits up to `timeout` until every key is set.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;

  // The values of `keys`, in order, once every one is set (waiting up to `timeout`). One round
  // trip to a remote store, so N ranks that each read all N meet in N calls, not N^2. This
  // default waits, then gets each.
  virtual std::vector<std::string> get_many(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  // Atomically adds `delta` to the integer stored under `key` (absent = 0); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Atomically: if the value of `key` equals `expected` (absent counts as ""), sets it to
  // `desired`. Returns the value after the operation.
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;

  // Removes `key`; true if it was present.
  virtual bool erase(const std::string& key) = 0;
};

// All keys in process memory: ranks that are threads of one process (tests).
std::shared_ptr<Store> make_memory_store();

// One file per key in `dir` (created if missing): ranks that are processes on one host. Writes
// are atomic (temp file + rename); add and compare_set hold an flock on `dir`/.lock.
std::shared_ptr<Store> make_file_store(const std::string& dir);

// Prepends `prefix` to every key of `base`: the namespace of one job and generation.
class PrefixStore : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix);
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::vector<std::string> get_many(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override;
  bool erase(const std::string& key) override;
  const std::string& prefix() const { return prefix_; }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const;
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

}  // namespace dsgd::comm
