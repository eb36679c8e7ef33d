// The operator a checkpoint names, set up in this process from the config the checkpoint carries:
// one replica of one, on the CPU. The evaluator and load_operator (dsgd/runtime/loaded_operator.h) start
// from it.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "torch/replica/replica.h"

namespace dsgd::runtime {

// `header` is the checkpoint's (read_checkpoint), `path` where it was read, for messages.
// ConfigError when it carries no operator config or names an operator this binary lacks.
std::unique_ptr<torch_glue::ReplicaRuntime> operator_runtime(const nlohmann::json& header, const std::string& path,
                                                             int threads);

}  // namespace dsgd::runtime
