// dsgd_zero_bench: what step.zero_stage 1, 2 and 3 save and cost, on PyTorch's
// ZeroRedundancyOptimizer recipe (20 x Linear(2000, 2000), Adam (lr 1e-4: the recipe's 0.01
// diverges within steps), MSE against random targets, global batch 20).
// Runs the same job at each stage of --stages (interleaved, --rounds times each), fresh workers
// each run, and prints per run: seconds per step (median of the timed chunks), the workers'
// largest peak resident memory (VmHWM) and peak proportional set size (PSS, sampled every 100 ms:
// a shared page counts 1/n in each of the n processes mapping it, so the shared-memory gradient
// regions, which every rank reads and VmHWM counts whole in each, count once over the ranks),
// each replica's optimizer-state and gradient bytes; then each
// stage's saving against the formula (per replica, (N-1)/N of Adam's 8 bytes a parameter at
// stage 1, and of the gradient's 4 more at stage 2). bench/zero.sh runs it beside PyTorch's own
// (bench/peers/zero_peer.py).
//
//   dsgd_zero_bench --workers 2 --rounds 2 --stages 0,1,2,3 --json out.json
//   DSGD_ZERO_BENCH_PROFILE=1 dsgd_zero_bench ...   (also each call's forward/backward/optimizer/wait s)
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "dsgd/torch/operator.h"
#include "dsgd/torch/parameter_gate.h"
#include "dsgd/runtime/trainer.h"

namespace {

// `layers` Linear(width, width) in a row, each named before it runs (stage 3 gathers it then).
struct Stack : torch::nn::Module {
  Stack(int64_t layers, int64_t width) {
    for (int64_t i = 0; i < layers; ++i) {
      linears.push_back(register_module("l" + std::to_string(i), torch::nn::Linear(width, width)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : linears) {
      dsgd::wait_for_parameters(*l);
      x = l(x);
    }
    return x;
  }
  std::vector<torch::nn::Linear> linears;
};

// The recipe's model: the stack, Adam, MSE on random data.
class ZeroRecipe : public dsgd::TrainingOperator {
 public:
  void setup(const nlohmann::json& config) override {
    const int64_t layers = config.value("layers", 20), width = config.value("width", 2000);
    const int64_t samples = config.value("samples", 400);
    auto model = register_model(std::make_shared<Stack>(layers, width));
    const double lr = config.value("lr", 1e-4);
    register_optimizer(std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(lr)));
    register_loss([](const torch::Tensor& out, const torch::Tensor& target) { return torch::mse_loss(out, target); });
    register_data(torch::randn({samples, width}), torch::randn({samples, width}));
  }
};
DSGD_REGISTER_OPERATOR(ZeroRecipe);

struct Run {
  int zero = 0;
  double step_s = 0, peak_rss_mib = 0, peak_pss_mib = 0, state_bytes = 0, gradient_bytes = 0, loss = 0;
};

// The largest PSS any process descended from this one (workers, their fork server) reached,
// sampled every 100 ms while it lives.
class PssSampler {
 public:
  PssSampler() : thread_([this] { loop(); }) {}
  ~PssSampler() {
    stop_ = true;
    thread_.join();
  }
  double peak_mib() const { return static_cast<double>(peak_kb_.load()) / 1024; }

 private:
  static std::vector<int> descendants() {
    std::map<int, int> parent;
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      const std::string name = e.path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream stat(e.path() / "stat");
      std::string line;
      if (!std::getline(stat, line) || line.rfind(')') == std::string::npos) continue;
      int ppid = 0;  // after "pid (comm) state "
      if (std::sscanf(line.c_str() + line.rfind(')') + 2, "%*c %d", &ppid) == 1) parent[std::stoi(name)] = ppid;
    }
    std::vector<int> out{static_cast<int>(::getpid())};
    for (size_t i = 0; i < out.size(); ++i) {
      for (const auto& [pid, ppid] : parent) {
        if (ppid == out[i]) out.push_back(pid);
      }
    }
    out.erase(out.begin());
    return out;
  }
  static long pss_kb(int pid) {
    std::ifstream rollup("/proc/" + std::to_string(pid) + "/smaps_rollup");
    for (std::string line; std::getline(rollup, line);) {
      if (line.rfind("Pss:", 0) == 0) return std::atol(line.c_str() + 4);
    }
    return 0;
  }
  void loop() {
    while (!stop_) {
      for (int pid : descendants()) peak_kb_ = std::max(peak_kb_.load(), pss_kb(pid));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  std::atomic<bool> stop_{false};
  std::atomic<long> peak_kb_{0};
  std::thread thread_;
};

int heartbeat_ms = 3000;

Run run(int zero, int workers, int64_t steps, int chunks, const nlohmann::json& config) {
  dsgd::TrainerConfig c{.num_workers = workers, .batch_size = 20, .device = "cpu", .seed = 1, .threads_per_worker = 1};
  c.config = config;
  c.step.zero_stage = zero;
  c.checkpoints.every_steps = 1 << 30;  // no snapshots between chunks: the step alone
  c.recovery.heartbeat_timeout = std::chrono::milliseconds(heartbeat_ms);
  PssSampler pss;
  dsgd::Trainer t(dsgd::operator_of<ZeroRecipe>(), c);
  t.train({.num_steps = 2});  // warm-up: the optimizer state exists from here on
  std::vector<double> per_step;
  Run r{.zero = zero};
  for (int i = 0; i < chunks; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto res = t.train({.num_steps = steps, .profile = std::getenv("DSGD_ZERO_BENCH_PROFILE") != nullptr});
    if (std::getenv("DSGD_ZERO_BENCH_PROFILE") != nullptr) {
      for (const char* k : {"forward_s", "backward_s", "optimizer_s", "comm_wait_s"}) {
        if (res.metrics.count(k)) std::printf("  %s %.4f", k, res.metrics.at(k));
      }
      std::printf("\n");
    }
    per_step.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                       static_cast<double>(steps));
    r.peak_rss_mib = res.metrics.count("peak_rss_mib") ? res.metrics.at("peak_rss_mib") : 0;
    r.state_bytes = res.metrics.at("optimizer_state_bytes");
    r.gradient_bytes = res.metrics.at("gradient_bytes");
    r.loss = res.metrics.at("loss");
  }
  std::sort(per_step.begin(), per_step.end());
  r.step_s = per_step[per_step.size() / 2];
  r.peak_pss_mib = pss.peak_mib();
  std::printf("zero %d: %.3f s/step, worker peak RSS %.0f MiB, peak PSS %.0f MiB, optimizer state %.1f MB and "
              "gradients %.1f MB a replica, loss %.4f\n",
              zero, r.step_s, r.peak_rss_mib, r.peak_pss_mib, r.state_bytes / 1e6, r.gradient_bytes / 1e6, r.loss);
  std::fflush(stdout);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  dsgd::init(argc, argv);
  int workers = 2, rounds = 2, chunks = 3, layers = 20, width = 2000;
  int64_t steps = 5;
  std::vector<int> stages{0, 1, 2, 3};
  std::string json_out;
  CLI::App app{"dsgd_zero_bench: memory and step time of step.zero_stage 1 to 3 against 0 on ZeRO's recipe"};
  app.add_option("--workers", workers, "Workers (one replica each, one thread each)")->capture_default_str();
  app.add_option("--rounds", rounds, "Runs of each stage, interleaved")->capture_default_str();
  app.add_option("--stages", stages, "The stages to run; the first is the baseline")->delimiter(',');
  app.add_option("--chunks", chunks, "Timed train() calls per run")->capture_default_str();
  app.add_option("--steps", steps, "Steps per timed call")->capture_default_str();
  app.add_option("--layers", layers, "Linear layers")->capture_default_str();
  app.add_option("--width", width, "Their width")->capture_default_str();
  app.add_option("--json", json_out, "Also write the runs here");
  app.add_option("--heartbeat-ms", heartbeat_ms, "recovery.heartbeat_timeout")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const nlohmann::json config{{"layers", layers}, {"width", width}};
  std::vector<Run> runs;
  for (int i = 0; i < rounds; ++i) {
    for (int zero : stages) runs.push_back(run(zero, workers, steps, chunks, config));
  }
  const auto best = [&](int zero, double Run::*field) {
    double v = 1e300;
    for (const auto& r : runs) v = r.zero == zero ? std::min(v, r.*field) : v;
    return v;
  };
  const auto median = [&](int zero, double Run::*field) {
    std::vector<double> v;
    for (const auto& r : runs) {
      if (r.zero == zero) v.push_back(r.*field);
    }
    std::sort(v.begin(), v.end());
    return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  const double params = static_cast<double>(layers) * (static_cast<double>(width) * width + width);
  const int base = stages.front();
  nlohmann::json j = {{"parameters", params}, {"workers", workers}, {"baseline", base},
                      {"stages", nlohmann::json::object()}, {"runs", nlohmann::json::array()}};
  for (int zero : stages) {
    if (zero == base) continue;
    const double bytes_a_parameter = zero == 1 ? 8 : zero == 2 ? 12 : 16;  // Adam's state; the gradient; the weight
    const double formula_mib = bytes_a_parameter * params * (workers - 1) / workers / (1 << 20);
    const double saved_mib = best(base, &Run::peak_rss_mib) - best(zero, &Run::peak_rss_mib);
    const double step_ratio = best(zero, &Run::step_s) / best(base, &Run::step_s);
    const double median_ratio = median(zero, &Run::step_s) / median(base, &Run::step_s);
    std::printf("%.1fM parameters, %d workers: zero %d saves %.0f MiB of peak RSS per worker against zero %d (formula "
                "%.0f MiB: %.2f of it); step time %.3f of zero %d's (best of %d runs each; medians: %.3f)\n",
                params / 1e6, workers, zero, saved_mib, base, formula_mib, saved_mib / formula_mib, step_ratio, base,
                rounds, median_ratio);
    j["stages"][std::to_string(zero)] = {{"formula_saved_mib", formula_mib},
                                         {"saved_mib", saved_mib},
                                         {"step_ratio", step_ratio},
                                         {"median_step_ratio", median_ratio}};
  }
  if (!json_out.empty()) {
    for (const auto& r : runs) {
      j["runs"].push_back({{"zero", r.zero}, {"step_s", r.step_s}, {"peak_rss_mib", r.peak_rss_mib},
                           {"peak_pss_mib", r.peak_pss_mib},
                           {"optimizer_state_bytes", r.state_bytes}, {"gradient_bytes", r.gradient_bytes},
                           {"loss", r.loss}});
    }
    std::ofstream(json_out) << j.dump(2) << "\n";
  }
  return 0;
}
