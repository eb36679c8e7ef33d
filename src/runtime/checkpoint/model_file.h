// model.pt, the file Python reads a dsgd model from: an operator's models as torch.save writes a
// name -> tensor dict (torch.load; model 0's parameters and buffers under their own names, model
// m's as "model<m>.<name>"), or a TorchScript model's module (torch.jit.load). Written straight
// into the file through a StagedFile (sharded_checkpoint.h), as torch::pickle_save lays it out
// without its copies: 344 MB of gpt-base took pickle_save 5 s.
//
//   write_model_file(op, dir + "/model.pt");       // fsynced; dsgd::DataError naming it otherwise
#pragma once

#include <string>

namespace dsgd {
class TrainingOperator;
}  // namespace dsgd

namespace dsgd::runtime {

// The operator's parameters must be whole here (under ZeRO stage 3: gathered).
void write_model_file(const TrainingOperator& op, const std::string& path);

}  // namespace dsgd::runtime
