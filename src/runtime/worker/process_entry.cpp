// dsgd::init (dsgd/runtime/trainer.h): where every process of a job enters. A process the driver (or a
// launcher) started as a worker, a ps shard or the fork server runs as one and exits; any other
// returns and goes on to be a driver.
#include <cstdlib>
#include <optional>

#include "dsgd/runtime/remote.h"
#include "dsgd/runtime/trainer.h"
#include "control/log.h"
#include "runtime/launch/fork_server.h"
#include "runtime/worker/cpu_kernels.h"
#include "runtime/worker/malloc_tuning.h"
#include "runtime/worker/ps_server_process.h"
#include "runtime/worker/worker.h"
#include "torch/memory/cpu_allocator.h"

namespace dsgd {

namespace {

// A process the driver started (a worker, a ps shard): what it exits with; nullopt for another.
std::optional<int> run_as_started(int argc, char** argv) {
  std::optional<dsgd::WorkerArgs> args;
  std::optional<dsgd::PsServerArgs> server_args;
  try {
    args = runtime::parse_worker_args(argc, argv);
    server_args = runtime::parse_ps_server_args(argc, argv);
  } catch (const std::exception& e) {
    control::log().error("dsgd worker: {}", e.what());
    return 2;
  }
  if (server_args) return dsgd::run_ps_server(*server_args);  // a ps shard process
  if (!args) return std::nullopt;
  return dsgd::run_worker(*args);
}

// A worker forked by a fork server (runtime/launch/fork_server.h).
int run_forked(int argc, char** argv) { return run_as_started(argc, argv).value_or(2); }

}  // namespace

void init(int argc, char** argv) {
  runtime::tune_malloc();         // before the first big allocation, in drivers and workers alike
  runtime::choose_cpu_kernels();  // before LibTorch's first kernel fixes its choice
  torch_glue::install_cpu_cache_from_environment();  // before the first tensor: big ones reused by size class
  if (runtime::is_fork_server(argc, argv)) runtime::serve_forks(argc, argv, &run_forked);
  if (const auto status = run_as_started(argc, argv)) std::exit(*status);
}

}  // namespace dsgd
