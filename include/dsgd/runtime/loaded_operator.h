// dsgd/runtime/loaded_operator.h — a trained job's operator in this process, from a checkpoint: its
// models as training left them, for inference (`dsgd generate`), inspection or export.
//
//   auto loaded = dsgd::load_operator("ckpts");      // a checkpoint directory, or a checkpoints.dir root
//   torch::nn::Module& model = loaded->op().model(0);
//
// The checkpoint names its operator and carries the config its job ran with: the operator (one
// this binary registers) is set up from that config on the CPU, as one replica of one, and its
// state (models, optimizers, schedules, its own) loaded. Setting up may read what the config
// names (data files). Throws dsgd::DataError for a missing or damaged checkpoint and
// dsgd::ConfigError for an operator this binary does not know. Torch-free header.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace dsgd {

class TrainingOperator;

class LoadedOperator {
 public:
  virtual ~LoadedOperator() = default;
  virtual TrainingOperator& op() = 0;
  virtual const std::string& operator_name() const = 0;
  virtual const nlohmann::json& operator_config() const = 0;
};

std::unique_ptr<LoadedOperator> load_operator(const std::string& path, int threads = 1);

// `dsgd export`: the checkpoint's models as model.pt at `out`, as a save writes it (torch.load
// reads a name -> tensor dict; torch.jit.load a TorchScript model), without starting a job: for a
// checkpoint written without model.pt, or one whose job's model no single process gathered.
// Written beside `out` and renamed over it. Throws as load_operator does, and DataError naming
// `out` where it cannot be written.
void export_model(const std::string& checkpoint, const std::string& out, int threads = 1);

}  // namespace dsgd
