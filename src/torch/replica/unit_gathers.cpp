// ZeRO stage 3's schedule (torch/replica/unit_gathers.h).
#include "torch/replica/unit_gathers.h"

#include <algorithm>

#include "comm/timeline.h"
#include "dsgd/common/error.h"

namespace dsgd::torch_glue {

void UnitGathers::reset(std::vector<ShardedParameters*> shards, const std::vector<std::vector<torch::Tensor>>& params) {
  *this = UnitGathers();
  if (std::none_of(shards.begin(), shards.end(), [](auto* s) { return s != nullptr; })) return;
  shards_ = std::move(shards);
  bucket_of_.resize(shards_.size());
  impls_.resize(shards_.size());
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (shards_[s] == nullptr) continue;
    for (size_t i = 0; i < params[s].size(); ++i) {
      index_[params[s][i].unsafeGetTensorImpl()] = {s, i};
      impls_[s].push_back(params[s][i].unsafeGetTensorImpl());
      bucket_of_[s].push_back(shards_[s]->bucket_of(i));
    }
  }
  check_.ended.assign(shards_.size(), false);
  for (size_t s = 0; s < shards_.size(); ++s) check_.ended[s] = shards_[s] == nullptr;
}

std::vector<UnitGathers::Key> UnitGathers::keys_of(const std::vector<torch::Tensor>& params) const {
  std::vector<Key> keys;
  for (const auto& p : params) {
    const auto it = index_.find(p.unsafeGetTensorImpl());
    if (it == index_.end()) continue;  // not sharded (frozen, or another model's without a strategy)
    const auto [s, i] = it->second;
    keys.push_back((static_cast<Key>(s) << 32) | bucket_of_[s][i]);
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

void UnitGathers::gather(const std::vector<Key>& keys, bool wait) {
  for (Key k : keys) {
    const size_t s = k >> 32;
    if (!missing_.empty() && missing_[s][bucket(k)] == 0) continue;  // its gradients are in: not read again
    shard(k).gather(bucket(k));
  }
  if (!wait) return;
  for (Key k : keys) shard(k).wait(bucket(k));
}

void UnitGathers::begin_forward() {
  fresh_ = false;
  units_.clear();
  last_call_ = nullptr;
  unit_of_.assign(shards_.size(), {});
  missing_.assign(shards_.size(), {});
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (shards_[s] == nullptr) continue;
    unit_of_[s].assign(bucket_of_[s].size(), -1);
    for (size_t b = 0; b < shards_[s]->num_buckets(); ++b) missing_[s].push_back(shards_[s]->params_in(b));
  }
}

void UnitGathers::add_unit(const std::vector<torch::Tensor>& params, const std::vector<Key>& keys) {
  std::vector<std::pair<size_t, size_t>> own;
  for (const auto& p : params) {
    const auto it = index_.find(p.unsafeGetTensorImpl());
    if (it != index_.end() && unit_of_[it->second.first][it->second.second] < 0) own.push_back(it->second);
  }
  if (own.empty() && !units_.empty()) {  // named already (a tied weight): part of the current unit
    auto& current = units_.back().keys;
    current.insert(current.end(), keys.begin(), keys.end());
    return;
  }
  for (const auto& [s, i] : own) unit_of_[s][i] = static_cast<int64_t>(units_.size());
  units_.push_back({keys, false});
}

void UnitGathers::release_except(const std::vector<Key>& keep) {
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (shards_[s] == nullptr) continue;
    for (size_t b = 0; b < shards_[s]->num_buckets(); ++b) {
      const Key k = (static_cast<Key>(s) << 32) | b;
      if (shards_[s]->resident(b) && std::find(keep.begin(), keep.end(), k) == keep.end()) shards_[s]->release(b);
    }
  }
}

void UnitGathers::enter(const std::vector<torch::Tensor>& params) {
  if (shards_.empty()) return;
  const auto keys = keys_of(params);
  if (keys.empty()) return;
  if (!check_.done) {  // checked at backward's end
    for (const auto& p : params) check_.named.insert(p.unsafeGetTensorImpl());
  }
  comm::timeline::Span span("gather unit");
  const bool training = torch::GradMode::is_enabled();
  if (fresh_) begin_forward();
  gather(keys, /*wait=*/true);
  const void* call = params.front().unsafeGetTensorImpl();
  if (last_call_ != nullptr) next_[last_call_] = keys;
  last_call_ = call;
  std::vector<Key> keep = keys;
  if (const auto it = next_.find(call); it != next_.end()) {  // the next unit, as the last forward went
    gather(it->second, /*wait=*/false);
    keep.insert(keep.end(), it->second.begin(), it->second.end());
  }
  const size_t units = units_.size();
  if (training) add_unit(params, keys);
  if (training && units_.size() == units) return;  // joined the current unit: nothing of it goes
  release_except(keep);
}

void UnitGathers::on_grad(size_t sync, size_t param) {
  if (shards_.empty() || shards_[sync] == nullptr) return;
  if (!check_.done && check_.named.count(impls_[sync][param]) == 0 && check_.unnamed.size() < 8) {
    check_.unnamed.push_back("model " + std::to_string(sync) + "'s parameter " + std::to_string(param));
  }
  if (missing_.empty()) return;  // a backward with no forward named in it (nothing was released)
  const int64_t u = unit_of_[sync][param];
  if (u >= 0 && !units_[static_cast<size_t>(u)].started) {
    units_[static_cast<size_t>(u)].started = true;
    comm::timeline::Span span("gather unit for backward");
    if (u >= 1) gather(units_[static_cast<size_t>(u) - 1].keys, /*wait=*/true);
    if (u >= 2) gather(units_[static_cast<size_t>(u) - 2].keys, /*wait=*/false);
  }
  const size_t b = bucket_of_[sync][param];
  if (missing_[sync][b] > 0 && --missing_[sync][b] == 0) shards_[sync]->release(b);
}

void UnitGathers::on_backward_end(size_t sync) {
  if (shards_.empty() || shards_[sync] == nullptr) return;
  if (!check_.done) {
    check_.ended[sync] = true;
    if (!check_.unnamed.empty()) {
      shards_[sync]->release_all();
      std::string list;
      for (const auto& u : check_.unnamed) list += (list.empty() ? "" : ", ") + u;
      check_.unnamed.clear();
      throw ConfigError(
          "step.zero_stage 3 gathers a layer's parameters when forward names them with "
          "dsgd::wait_for_parameters just before using them (dsgd/torch/parameter_gate.h), and " +
              list +
              " got a gradient but forward never named it: call wait_for_parameters on "
              "every layer before it runs, or use zero_stage 2",
          "step.zero_stage");
    }
    if (std::all_of(check_.ended.begin(), check_.ended.end(), [](bool e) { return e; })) {
      check_.done = true;
      check_.named.clear();
    }
  }
  shards_[sync]->release_all();
  fresh_ = true;
}

void UnitGathers::gather_all() {
  for (auto* s : shards_) {
    if (s != nullptr) s->gather_all();
  }
}

void UnitGathers::pass_all() {
  for (auto* s : shards_) {
    if (s == nullptr) continue;
    for (size_t b = 0; b < s->num_buckets(); ++b) {
      s->gather(b);
      s->wait(b);
      s->release(b);
    }
  }
}

void UnitGathers::release_all() {
  fresh_ = true;
  for (auto* s : shards_) {
    if (s != nullptr) s->release_all();
  }
}

size_t UnitGathers::bytes() const {
  size_t n = 0;
  for (auto* s : shards_) n += s != nullptr ? s->bytes() : 0;
  return n;
}

}  // namespace dsgd::torch_glue
