#include "comm/store_util.h"

#include <charconv>

#include "dsgd/comm/store.h"
#include "dsgd/common/error.h"

namespace dsgd::comm {

void throw_wait_timeout(const std::string& where, const std::vector<std::string>& missing,
                        std::chrono::milliseconds timeout) {
  std::string keys;
  for (size_t i = 0; i < missing.size() && i < 8; ++i) keys += (i ? ", " : "") + missing[i];
  if (missing.size() > 8) keys += ", ... (" + std::to_string(missing.size()) + " in all)";
  throw TimeoutError(where + ": waited " + std::to_string(timeout.count()) + " ms for key(s) " + keys +
                         "; the ranks that should set them have not arrived (not started, crashed, or "
                         "using another store or job prefix)",
                     "store wait");
}

int64_t parse_counter(const std::string& key, const std::string& value) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size()) {
    throw CommError("store key '" + key + "' holds '" + value.substr(0, 32) + "', not a counter", "store add");
  }
  return v;
}

std::vector<std::string> Store::get_many(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  wait(keys, timeout);
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& k : keys) values.push_back(get(k, timeout));
  return values;
}

PrefixStore::PrefixStore(std::shared_ptr<Store> base, std::string prefix)
    : base_(std::move(base)), prefix_(std::move(prefix)) {}

std::vector<std::string> PrefixStore::prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(prefix_ + k);
  return out;
}

void PrefixStore::set(const std::string& key, const std::string& value) { base_->set(prefix_ + key, value); }
std::string PrefixStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return base_->get(prefix_ + key, timeout);
}
bool PrefixStore::check(const std::vector<std::string>& keys) { return base_->check(prefixed(keys)); }
void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  base_->wait(prefixed(keys), timeout);
}
std::vector<std::string> PrefixStore::get_many(const std::vector<std::string>& keys,
                                               std::chrono::milliseconds timeout) {
  return base_->get_many(prefixed(keys), timeout);
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) { return base_->add(prefix_ + key, delta); }
std::string PrefixStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  return base_->compare_set(prefix_ + key, expected, desired);
}
bool PrefixStore::erase(const std::string& key) { return base_->erase(prefix_ + key); }

}  // namespace dsgd::comm
