#include "runtime/driver/results.h"

#include <algorithm>
#include <string>

namespace dsgd::runtime {
namespace {

// A peak is the largest of the parts', not their mean.
void keep_largest(const std::vector<Metrics>& parts, const std::string& key, Metrics* out) {
  double largest = -1;
  for (const auto& m : parts) {
    if (const auto it = m.find(key); it != m.end()) largest = std::max(largest, it->second);
  }
  if (largest >= 0) (*out)[key] = largest;
}

}  // namespace

Results results_of_command(const std::vector<proto::CommandResult>& outs, bool per_worker) {
  Results r;
  std::vector<Metrics> parts;
  for (const auto& o : outs) {
    const proto::EpochReply& e = o.epoch();
    if (!e.untrained()) parts.emplace_back(e.metrics().begin(), e.metrics().end());
    r.epoch = e.position().epoch();
    r.batch = e.position().batch();
    r.batches_per_epoch = e.batches_per_epoch();
  }
  r.metrics = weighted_mean(parts);
  // Every worker trained the samples; the untrained answers are of newcomers in their place.
  const auto n = r.metrics.find("num_samples");
  if (n != r.metrics.end() && !parts.empty() && parts.size() < outs.size()) {
    n->second *= static_cast<double>(outs.size()) / static_cast<double>(parts.size());
  }
  keep_largest(parts, "peak_rss_mib", &r.metrics);
  if (per_worker) r.per_worker = parts;
  return r;
}

Results merge_chunks(const std::vector<Results>& chunks, bool profile, bool reduce_results) {
  Results total;
  if (chunks.empty()) return total;
  const Results& last = chunks.back();
  total.epoch = last.epoch;
  total.batch = last.batch;
  total.batches_per_epoch = last.batches_per_epoch;
  if (chunks.size() == 1) {
    total.metrics = last.metrics;
  } else {
    std::vector<Metrics> metrics;
    double batches = 0, epoch_s = 0, skipped = 0;
    for (const auto& c : chunks) {
      const auto& m = c.metrics;
      metrics.push_back(m);
      batches += m.count("batches") ? m.at("batches") : 0;
      epoch_s += m.count("epoch_s") ? m.at("epoch_s") : 0;
      skipped += m.count("skipped_steps") ? m.at("skipped_steps") : 0;
    }
    total.metrics = weighted_mean(metrics);
    keep_largest(metrics, "peak_rss_mib", &total.metrics);
    total.metrics["batches"] = batches;
    total.metrics["skipped_steps"] = skipped;
    if (profile) total.metrics["epoch_s"] = epoch_s;
  }
  if (!reduce_results) {
    bool same = true;
    for (const auto& c : chunks) same &= c.per_worker.size() == last.per_worker.size();
    if (same && chunks.size() > 1) {
      for (size_t w = 0; w < last.per_worker.size(); ++w) {
        std::vector<Metrics> parts;
        for (const auto& c : chunks) parts.push_back(c.per_worker[w]);
        total.per_worker.push_back(weighted_mean(parts));
      }
    } else {
      total.per_worker = last.per_worker;
    }
  }
  return total;
}

}  // namespace dsgd::runtime
