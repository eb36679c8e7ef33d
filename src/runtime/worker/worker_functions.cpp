#include "runtime/worker/worker_functions.h"

#include <map>
#include <mutex>

#include "dsgd/common/error.h"

namespace dsgd {
namespace {

struct FunctionRegistry {
  std::mutex mutex;
  std::map<std::string, WorkerFunction> functions;  // guarded by mutex
};

FunctionRegistry& functions() {
  static FunctionRegistry r;
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
