// Presents a dsgd Store to Gloo's rendezvous. Debian's Gloo base Store::wait(keys, timeout)
// ignores its timeout and get() waits without one; here both honour a deadline and throw
// dsgd::TimeoutError naming the missing keys.
//
// Gloo's full mesh has each rank wait for and read its peers' keys one call at a time: N^2 calls
// to the driver for a group of N. Given those keys in batches (each batch's keys set by their
// ranks before they read any of that batch), the adapter reads a whole batch with the first wait
// or get of any of its keys, in one Store::get_many, and answers the rest from what it read.
#pragma once

#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsgd/comm/store.h"

namespace dsgd::comm {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<comm::Store> store, std::chrono::milliseconds timeout,
                   std::vector<std::vector<std::string>> batches = {})
      : store_(std::move(store)), timeout_(timeout), batches_(std::move(batches)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    if (const auto* batch = batch_of(key)) {
      const std::string& v = read(*batch, timeout_).at(key);
      return {v.begin(), v.end()};
    }
    const std::string v = store_->get(key, timeout_);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto* batch = keys.empty() ? nullptr : batch_of(keys.front());
    if (batch != nullptr && std::all_of(keys.begin(), keys.end(), [&](const std::string& k) {
          return std::find(batch->begin(), batch->end(), k) != batch->end();
        })) {
      read(*batch, timeout);
      return;
    }
    store_->wait(keys, timeout);
  }

 private:
  const std::vector<std::string>* batch_of(const std::string& key) const {
    for (const auto& b : batches_) {
      if (std::find(b.begin(), b.end(), key) != b.end()) return &b;
    }
    return nullptr;
  }
  const std::map<std::string, std::string>& read(const std::vector<std::string>& batch,
                                                 std::chrono::milliseconds timeout) {
    if (!read_.count(batch.front())) {
      const std::vector<std::string> values = store_->get_many(batch, timeout);
      for (size_t i = 0; i < batch.size(); ++i) read_[batch[i]] = values[i];
    }
    return read_;
  }

  std::shared_ptr<comm::Store> store_;
  std::chrono::milliseconds timeout_;
  const std::vector<std::vector<std::string>> batches_;  // none empty
  std::map<std::string, std::string> read_;              // the batches' values, once read
};

}  // namespace dsgd::comm
