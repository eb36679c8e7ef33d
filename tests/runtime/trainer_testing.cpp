// The registrations behind trainer_testing.h: its operators by name, and the worker functions
// the Trainer's tests call through foreach_worker.
#include "runtime/trainer_testing.h"

namespace dsgd::trainer_testing {
namespace {

DSGD_REGISTER_WORKER_FUNCTION(replica_info, [](TrainingOperator* op, const json& arg) -> json {
  return {{"rank", op->replica().rank}, {"world", op->replica().world_size}, {"pid", ::getpid()}, {"arg", arg}};
});

// The initialization hook counts its runs in the worker and notes whether an operator existed
// yet (it runs before setup: none); hook_runs_here reports both to the driver, where the test
// asserts them (an EXPECT in a worker process could not fail the test).
std::atomic<int> hook_runs{0};

std::atomic<int> hook_runs_with_operator{0};

DSGD_REGISTER_WORKER_FUNCTION(count_hook, [](TrainingOperator* op, const json&) -> json {
  ++hook_runs;
  if (op != nullptr) ++hook_runs_with_operator;
  return {};
});

DSGD_REGISTER_WORKER_FUNCTION(hook_runs_here, [](TrainingOperator*, const json&) -> json {
  return {{"runs", hook_runs.load()}, {"with_operator", hook_runs_with_operator.load()}};
});

// A worker that dies at start-up, before setup: with DSGD_TEST_DIE_ONCE=FILE the first worker to
// create FILE, with DSGD_TEST_DIE_ALWAYS set every worker.
DSGD_REGISTER_WORKER_FUNCTION(die_at_start, [](TrainingOperator*, const json&) -> json {
  if (std::getenv("DSGD_TEST_DIE_ALWAYS") != nullptr) ::raise(SIGKILL);
  if (const char* once = std::getenv("DSGD_TEST_DIE_ONCE")) {
    const int fd = ::open(once, O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (fd >= 0) ::raise(SIGKILL);
  }
  return {};
});

DSGD_REGISTER_WORKER_FUNCTION(optimizer_states, [](TrainingOperator* op, const json&) -> json {
  return op->optimizer(0).state().size();
});

DSGD_REGISTER_WORKER_FUNCTION(learning_rate, [](TrainingOperator* op, const json&) -> json {
  return op->optimizer(0).param_groups()[0].options().get_lr();
});

DSGD_REGISTER_OPERATOR(MismatchOperator);

DSGD_REGISTER_OPERATOR(NanOperator);

DSGD_REGISTER_OPERATOR(AdamOperator);

DSGD_REGISTER_OPERATOR(SlowSecondReplicaOperator);

DSGD_REGISTER_OPERATOR(DiesInSnapshotOperator);

DSGD_REGISTER_OPERATOR(DiesInValidationOperator);

DSGD_REGISTER_OPERATOR(DiesAtStepOperator);

DSGD_REGISTER_OPERATOR(CountingOperator);

DSGD_REGISTER_WORKER_FUNCTION(counted_batches, [](TrainingOperator* op, const json&) -> json {
  return dynamic_cast<CountingOperator&>(*op).batches_;
});

DSGD_REGISTER_OPERATOR(StreamedOperator);

DSGD_REGISTER_WORKER_FUNCTION(samples_read, [](TrainingOperator* op, const json&) -> json {
  const auto& c = dynamic_cast<StreamedOperator&>(*op).counting_;
  return c ? c->read_.load() : -1;
});

DSGD_REGISTER_OPERATOR(PickyOperator);

DSGD_REGISTER_OPERATOR(TwoModelOperator);

// Every parameter of every model of the worker's operator, flattened in order: replicas compared exactly.
DSGD_REGISTER_WORKER_FUNCTION(all_parameters, [](TrainingOperator* op, const json&) -> json {
  json models = json::array();
  for (const auto& m : op->models()) {
    std::vector<float> values;
    for (const auto& p : m->parameters()) {
      const auto flat = p.detach().to(torch::kFloat32).contiguous().view(-1);
      values.insert(values.end(), flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
    }
    models.push_back(values);
  }
  return models;
});

// The vectorised kernels LibTorch chose in the worker's process (runtime/worker/cpu_kernels.h).
DSGD_REGISTER_WORKER_FUNCTION(cpu_kernels, [](TrainingOperator*, const json&) -> json {
  const std::string config = at::show_config(), key = "CPU capability usage: ";
  const size_t at = config.find(key);
  if (at == std::string::npos) return std::string();
  return config.substr(at + key.size(), config.find('\n', at) - at - key.size());
});

DSGD_REGISTER_WORKER_FUNCTION(weight_sum, [](TrainingOperator* op, const json&) -> json {
  double s = 0;
  for (const auto& p : op->model(0).parameters()) s += p.sum().item<double>();
  return s;
});

DSGD_REGISTER_WORKER_FUNCTION(running_stats,
                              [](TrainingOperator* op, const json&) -> json { return running_stats(op->model(0)); });

// How the replica's convolution weights are laid out: "channels_last", "nchw" (or "mixed").
DSGD_REGISTER_WORKER_FUNCTION(conv_layout, [](TrainingOperator* op, const json&) -> json {
  int last = 0, plain = 0;
  for (const auto& p : op->model(0).parameters()) {
    if (p.dim() != 4 || p.is_contiguous() == p.is_contiguous(torch::MemoryFormat::ChannelsLast)) continue;
    (p.is_contiguous(torch::MemoryFormat::ChannelsLast) ? last : plain)++;
  }
  return last > 0 && plain == 0 ? "channels_last" : plain > 0 && last == 0 ? "nchw" : "mixed";
});

// In the worker whose pid is `arg`: no more file descriptors (the limit lowered to the lowest
// free one), so it stays alive and answers, but cannot open a socket or a store connection.
DSGD_REGISTER_WORKER_FUNCTION(exhaust_descriptors, [](TrainingOperator*, const json& arg) -> json {
  if (arg.get<int>() != ::getpid()) return false;
  const int lowest = ::dup(0);
  ::close(lowest);
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = static_cast<rlim_t>(lowest);
  return ::setrlimit(RLIMIT_NOFILE, &r) == 0;
});

}  // namespace
}  // namespace dsgd::trainer_testing
