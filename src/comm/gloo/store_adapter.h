// Presents a dsgd Store to Gloo's rendezvous. Debian's Gloo base Store::wait(keys, timeout)
// ignores its timeout and get() waits without one; here both honour a deadline and throw
// dsgd::TimeoutError naming the missing keys.
#pragma once

#include <gloo/rendezvous/store.h>

#include <memory>

#include "dsgd/comm/store.h"

namespace dsgd::comm {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<comm::Store> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_->get(key, timeout_);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<comm::Store> store_;
  std::chrono::milliseconds timeout_;
};

}  // namespace dsgd::comm
