// Strategies that apply SGD on their servers (ps with update on shards, ps_async): what GradSync
// needs of the operator's optimizer for one model (ServerSteps::Optimizer): the options each
// step reads, and the momentum buffers the servers hold and hand back for checkpoints.
//
//   sync.servers()->set_optimizer(m, server_optimizer(op, m, trainable_params_of_model_m));
#pragma once

#include <vector>

#include "dsgd/torch/operator.h"
#include "torch/sync/server_steps.h"

namespace dsgd::torch_glue {

// ConfigError unless `params` (model `model`'s trainable parameters) are all in one param group
// of a torch::optim::SGD registered by `op`, naming what is wrong and what to do.
ServerSteps::Optimizer server_optimizer(const TrainingOperator& op, size_t model,
                                           const std::vector<torch::Tensor>& params);

}  // namespace dsgd::torch_glue
