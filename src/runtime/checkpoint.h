// Checkpoint directories on disk. Torch-free: the state arrives as bytes.
//
//   <dir>/checkpoint.dsgd   one JSON header line (format, version, size, crc32, epoch, ...) then
//                           the state bytes (models, optimizers, schedules, operator state)
//   <dir>/model.pt          model 0 as a name -> tensor dict, for Python's torch.load
//
// Each file is written to a temporary name, fsynced and renamed over the old one (then the
// directory is fsynced), so a crash mid-save leaves the previous checkpoint whole.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace dsgd::runtime {

struct Checkpoint {
  nlohmann::json header;   // without the integrity fields
  std::string state;
};

void write_checkpoint(const std::string& dir, const Checkpoint& checkpoint, const std::string& model_pickle);
// Throws dsgd::DataError naming the file for a missing, truncated or corrupted checkpoint.
Checkpoint read_checkpoint(const std::string& dir);

}  // namespace dsgd::runtime
