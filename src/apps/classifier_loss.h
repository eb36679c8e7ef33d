// The image classifier's loss by name (LocalJobOptions::loss), for the distributed operator and
// the single-process job alike.
#pragma once

#include <cstdint>
#include <string>

#include "dsgd/operator.h"

namespace dsgd::apps {

// "cross_entropy" (logits), "nll" (log-probabilities), "mse" (logits against one-hot targets of
// `classes`), or a TorchScript file's forward(output, target). The batch's mean.
LossFn classifier_loss(const std::string& name, int64_t classes);

}  // namespace dsgd::apps
