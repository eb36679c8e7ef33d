// The in-memory Store: ranks as threads of one process.
#include <condition_variable>
#include <map>
#include <mutex>

#include "comm/store_util.h"
#include "dsgd/comm/store.h"

namespace dsgd::comm {
namespace {

class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      values_[key] = value;
    }
    changed_.notify_all();
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_locked(lock, {key}, timeout);
    return values_.at(key);
  }

  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return missing_locked(keys).empty();
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_locked(lock, keys, timeout);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t result;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = values_.find(key);
      result = (it == values_.end() ? 0 : parse_counter(key, it->second)) + delta;
      values_[key] = std::to_string(result);
    }
    changed_.notify_all();
    return result;
  }

  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override {
    std::string result;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = values_.find(key);
      const std::string current = it == values_.end() ? "" : it->second;
      result = current == expected ? desired : current;
      values_[key] = result;
    }
    changed_.notify_all();
    return result;
  }

  bool erase(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return values_.erase(key) > 0;
  }

 private:
  std::vector<std::string> missing_locked(const std::vector<std::string>& keys) const {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (values_.find(k) == values_.end()) missing.push_back(k);
    }
    return missing;
  }

  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      auto missing = missing_locked(keys);
      if (missing.empty()) return;
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && !missing_locked(keys).empty()) {
        throw_wait_timeout("memory store", missing_locked(keys), timeout);
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;  // signalled on every write
  std::map<std::string, std::string> values_;  // guarded by mutex_
};

}  // namespace

std::shared_ptr<Store> make_memory_store() { return std::make_shared<MemoryStore>(); }

}  // namespace dsgd::comm
