// The worker functions a binary registers by name (DSGD_REGISTER_WORKER_FUNCTION, dsgd/runtime/trainer.h):
// what Trainer::foreach_worker and TrainerConfig::initialization_hook run on the workers.
//
//   if (!runtime::has_worker_function(name)) ...        // the driver, validating a config
//   runtime::find_worker_function(name)(op, arg);      // a worker, running one
//
// Registration happens during static initialisation; lookups are thread-safe.
#pragma once

#include <string>

#include "dsgd/runtime/trainer.h"

namespace dsgd::runtime {

// The registered worker function `name`; ConfigError if none.
WorkerFunction find_worker_function(const std::string& name);
bool has_worker_function(const std::string& name);

}  // namespace dsgd::runtime
