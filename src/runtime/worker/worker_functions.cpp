#include "runtime/worker/worker_functions.h"

#include <torch/nn/module.h>

#include <cstdio>
#include <map>
#include <mutex>

#include "dsgd/common/error.h"
#include "dsgd/torch/operator.h"
#include "runtime/worker/job_spec.h"
#include "torch/sync/sharded_parameters.h"

namespace dsgd {
namespace {

struct FunctionRegistry {
  std::mutex mutex;
  std::map<std::string, WorkerFunction> functions;  // guarded by mutex
};

// "dsgd.replica": where a replica stands and what its models hold. The checksum is
// tensors_checksum of every model's parameters in order: replicas of a synchronous job agree on it.
nlohmann::json replica_summary(TrainingOperator* op, const nlohmann::json&) {
  if (op == nullptr) throw ConfigError("dsgd.replica needs a replica: not as the initialization hook");
  const ReplicaInfo& info = op->replica();
  std::vector<torch::Tensor> all;
  int64_t parameters = 0;
  for (const auto& model : op->models()) {
    for (const auto& p : model->parameters()) {
      if (torch_glue::released_memory(p)) {
        throw Error("dsgd.replica reads the parameters, and under step.zero_stage 3 they are sharded between "
                    "steps: run it with zero_stage 2 or less, or read the model with get_model");
      }
      all.push_back(p);
      parameters += p.numel();
    }
  }
  const std::string checksum = runtime::tensors_checksum(all);
  return {{"rank", info.rank},          {"world_size", info.world_size}, {"worker", info.worker},
          {"local_replica", info.local_replica}, {"device", info.device.str()}, {"models", op->models().size()},
          {"parameters", parameters},   {"checksum", checksum}};
}

FunctionRegistry& functions() {
  static FunctionRegistry r;
  static const bool builtins = [] {  // in the registry itself: no static initialiser a linker could drop
    r.functions["dsgd.replica"] = replica_summary;
    return true;
  }();
  (void)builtins;
  return r;
}

}  // namespace

void register_worker_function(const std::string& name, WorkerFunction fn) {
  auto& r = functions();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.functions[name] = std::move(fn);
}

namespace runtime {

bool has_worker_function(const std::string& name) {
  auto& r = functions();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.functions.count(name) > 0;
}

WorkerFunction find_worker_function(const std::string& name) {
  auto& r = functions();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.functions.find(name);
  if (it == r.functions.end()) {
    throw ConfigError("no worker function '" + name + "' is registered in this binary (DSGD_REGISTER_WORKER_FUNCTION)");
  }
  return it->second;
}

}  // namespace runtime
}  // namespace dsgd
