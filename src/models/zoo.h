// Factories for the reference models, one .cpp each; make_model (registry.cpp) picks by name.
// Options are validated by the caller.
#pragma once

#include <torch/types.h>

#include "dsgd/models/registry.h"

namespace dsgd::models {

std::shared_ptr<Classifier> make_cnn(const ModelOptions& options);
std::shared_ptr<Classifier> make_mlp(const ModelOptions& options);
std::shared_ptr<Classifier> make_resnet(int depth, const ModelOptions& options);  // 18 or 50
std::shared_ptr<Classifier> make_simulated(const ModelOptions& options);
// A TorchScript file, checked on two blank images of the options' shape: ConfigError unless its
// forward gives [2, num_classes] logits.
std::shared_ptr<Classifier> load_scripted(const std::string& path, const ModelOptions& options);

// For ModelOptions::channels_last: the images as the first convolution takes them.
inline torch::Tensor images_for(const torch::Tensor& images, bool channels_last) {
  return channels_last ? images.contiguous(torch::MemoryFormat::ChannelsLast) : images;
}

}  // namespace dsgd::models
