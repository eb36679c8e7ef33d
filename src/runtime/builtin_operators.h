// Operators compiled into every dsgd binary, so `dsgd train` and `dsgd worker` need no user code.
//
// "dsgd.ImageClassifier": a reference model (cnn, mlp, resnet18, resnet50) on Fashion-MNIST or
// synthetic images, SGD with momentum, cross-entropy, lr x lr_decay per epoch. Config (JSON):
//   {"model": "cnn", "dataset": "fashion-mnist", "data_dir": "...", "lr": 0.01, "momentum": 0.9,
//    "lr_decay": 1.0, "dropout": true, "synthetic_samples": 8192, "synthetic_image_size": 28}
// Unknown keys are an error (a typo must not silently train something else).
#pragma once

namespace dsgd::runtime {

inline constexpr const char* kImageClassifier = "dsgd.ImageClassifier";

// Idempotent.
void register_builtin_operators();

}  // namespace dsgd::runtime
