#include "dsgd/runtime/evaluator.h"

#include <spdlog/fmt/fmt.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "dsgd/common/error.h"
#include "dsgd/torch/operator.h"
#include "control/log.h"
#include "runtime/checkpoint/sharded_checkpoint.h"
#include "runtime/driver/checkpoint.h"
#include "runtime/driver/operator_runtime.h"
#include "torch/replica/replica.h"

namespace dsgd {

namespace {

using Clock = std::chrono::steady_clock;

// The operator a checkpoint names, set up from the config it carries, its state loaded.
class CheckpointModel {
 public:
  explicit CheckpointModel(int threads) : threads_(threads) {}

  // Checkpoint directory `dir` (either format) evaluated; *header gets its header.
  Metrics evaluate(const std::string& dir, nlohmann::json* header) {
    std::optional<runtime::ShardReader> shards;
    runtime::Checkpoint c;
    if (runtime::is_sharded_checkpoint(dir)) {
      shards.emplace(dir);
      c.header = shards->manifest().at("header");
    } else {
      c = runtime::read_checkpoint(dir);
    }
    const auto& h = c.header;
    *header = h;
    const std::string op = h.value("operator", std::string());
    if (!runtime_ || op != op_ || h.value("operator_config", nlohmann::json()) != config_) {
      runtime_ = runtime::operator_runtime(h, dir, threads_);
      op_ = op;
      config_ = h["operator_config"];
    }
    if (shards) {
      runtime_->read_share(*shards);
    } else {
      runtime_->load_state(c.state);
    }
    Metrics m = runtime_->validate();
    derive_operator_metrics(op, m);  // over the whole validation split: the language model's perplexity
    return m;
  }

 private:
  const int threads_;
  std::unique_ptr<torch_glue::ReplicaRuntime> runtime_;
  std::string op_;
  nlohmann::json config_;
};

// Appends one JSON line per evaluation, and a CSV row (header on the first).
class MetricsFiles {
 public:
  explicit MetricsFiles(const std::string& path) : path_(path) {}
  void write(int64_t step, const nlohmann::json& header, const std::string& dir, const Metrics& m) {
    if (path_.empty()) return;
    const nlohmann::json line = {{"step", step},
                                 {"epoch", header.value("epoch", int64_t{0})},
                                 {"checkpoint", dir},
                                 {"metrics", m},
                                 {"unix_s", std::chrono::duration<double>(
                                                std::chrono::system_clock::now().time_since_epoch())
                                                .count()}};
    std::ofstream(path_, std::ios::app) << line.dump() << "\n" << std::flush;
    const std::string csv = path_ + ".csv";
    const bool fresh = !std::filesystem::exists(csv);
    std::ofstream out(csv, std::ios::app);
    if (fresh) {
      out << "step";
      for (const auto& [k, v] : m) out << "," << k;
      out << "\n";
    }
    out << step;
    for (const auto& [k, v] : m) out << "," << v;
    out << "\n" << std::flush;
  }

 private:
  const std::string path_;
};

}  // namespace

int run_evaluator(const EvaluatorArgs& a) {
  auto& log = control::log();
  if (a.checkpoint_dir.empty()) {
    log.error("evaluator: no checkpoint directory (the job's checkpoint_dir, --checkpoint-dir)");
    return 2;
  }
  CheckpointModel model(a.threads);
  MetricsFiles files(a.metrics_out);
  int64_t done = -1;  // the newest step evaluated
  auto last_news = Clock::now();
  log.info("evaluator: watching {} for checkpoints", a.checkpoint_dir);
  while (true) {
    // Read the end mark first: every checkpoint listed after it was seen came before the end.
    const bool ended = runtime::job_ended(a.checkpoint_dir);
    const auto all = runtime::list_checkpoints(a.checkpoint_dir);
    std::vector<std::string> fresh;
    for (const auto& dir : all) {
      if (runtime::checkpoint_step(dir) > done) fresh.push_back(dir);
    }
    // Only the newest: an evaluator that falls behind skips to the present, as TensorFlow's does.
    if (!fresh.empty()) {
      const std::string& dir = fresh.back();
      const int64_t step = runtime::checkpoint_step(dir);
      try {
        const auto t0 = Clock::now();
        nlohmann::json header;
        const Metrics m = model.evaluate(dir, &header);
        files.write(step, header, dir, m);
        std::string shown;
        for (const auto& [k, v] : m) shown += fmt::format("{}{} {:.4g}", shown.empty() ? "" : ", ", k, v);
        log.info("evaluator: step {} (epoch {}): {} ({:.1f} s)", step, header.value("epoch", int64_t{0}), shown,
                 std::chrono::duration<double>(Clock::now() - t0).count());
      } catch (const ConfigError& e) {
        log.error("evaluator: {}", e.what());
        return 1;
      } catch (const std::exception& e) {  // removed by rotation meanwhile, or damaged: the next one
        log.warn("evaluator: passed over {}: {}", dir, e.what());
      }
      done = step;
      last_news = Clock::now();
      continue;
    }
    if (ended) {
      log.info("evaluator: the job has ended; evaluated up to step {}", done);
      return 0;
    }
    if (Clock::now() - last_news > a.idle_timeout) {
      log.error("evaluator: no new checkpoint in {} and the job has not ended for {} s; exiting", a.checkpoint_dir,
                std::chrono::duration_cast<std::chrono::seconds>(a.idle_timeout).count());
      return 3;
    }
    std::this_thread::sleep_for(a.poll);
  }
}

}  // namespace dsgd
