#include "runtime/results.h"

#include <nlohmann/json.hpp>

#include "runtime/metrics_wire.h"

namespace dsgd::runtime {

Results results_of_command(const std::vector<control::CommandOutcome>& outs, bool per_worker) {
  Results r;
  std::vector<Metrics> parts;
  for (const auto& o : outs) {
    const auto j = nlohmann::json::parse(o.json);
    parts.push_back(metrics_from_json(j.at("metrics")));
    r.epoch = j.value("epoch", int64_t{0});
    r.batch = j.value("batch", int64_t{0});
    r.batches_per_epoch = j.value("batches_per_epoch", int64_t{0});
  }
  r.metrics = weighted_mean(parts);
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
