// Checkpoint directories on disk. Torch-free: the state arrives as bytes.
//
//   <dir>/checkpoint.dsgd   one JSON header line (format, version, size, crc32, epoch, ...) then
//                           the state bytes (models, optimizers, schedules, operator state),
//                           then each replica's error feedback (compression), if any
//   <dir>/model.pt          model 0 as a name -> tensor dict, for Python's torch.load (a
//                           TorchScript model: the module, for torch.jit.load)
//
// Each file is written to a temporary name, fsynced and renamed over the old one (then the
// directory is fsynced), so a crash mid-save leaves the previous checkpoint whole.
//
// Rotation (TrainerConfig::checkpoints.dir): a root holds the last K checkpoints,
//   <root>/step-000000000150/   <root>/step-000000000200/   ...
// each written whole into a temporary directory and renamed into place; loading the root takes
// the newest one that reads back intact and names the damaged ones it passed over.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "dsgd/common/error.h"

namespace dsgd::runtime {

// Durable files, for the checkpoints of either format (also sharded_checkpoint.h's). Each throws
// dsgd::DataError naming the path (a full volume: "No space left on device").
uint32_t crc_of(const std::string& bytes);
void write_all(int fd, std::string_view bytes, const std::string& path);
void fsync_dir(const std::filesystem::path& dir);  // best effort
// Written to a temporary name beside it, fsynced, renamed over `path`, the directory fsynced.
void write_atomically(const std::filesystem::path& path, const std::string& bytes);

struct Checkpoint {
  nlohmann::json header;   // without the integrity fields
  std::string state;
  // Error feedback (compression) by replica rank, opaque bytes: after the state in the file,
  // their ranks and sizes in the header ("feedback"), under the same checksum.
  std::map<int64_t, std::string> feedback;
};

void write_checkpoint(const std::string& dir, const Checkpoint& checkpoint, const std::string& model_pickle);
// Throws dsgd::DataError naming the file for a missing, truncated or corrupted checkpoint.
Checkpoint read_checkpoint(const std::string& dir);

// Writes <root>/step-<step> and then removes all but the newest `keep` (>= 1). Returns its path.
// A write that fails (DataError: the volume full, say) leaves the checkpoints there were and no
// half-written directory.
std::string write_rotating_checkpoint(const std::string& root, int64_t step, int keep, const Checkpoint& checkpoint,
                                      const std::string& model_pickle);
// <root>/step-<step>, its step in 12 digits.
std::string checkpoint_path(const std::string& root, int64_t step);
// Removes all but the newest `keep` (>= 1) step-* directories of root (either format).
void rotate_checkpoints(const std::string& root, int keep);
// Removes the temporary directories of root's checkpoints that were never committed (".step-*":
// a driver killed mid-write); a job's start does, as its root is its own.
void remove_unfinished_checkpoints(const std::string& root);
// The step-* checkpoint directories under root, oldest first (empty if none or no such root).
std::vector<std::string> list_checkpoints(const std::string& root);
// The step a checkpoint directory of a root is named for (".../step-000000000150": 150); -1 for
// another name.
int64_t checkpoint_step(const std::string& dir);
// The job's end, marked in its checkpoint root for an evaluator (dsgd/runtime/evaluator.h): the driver
// clears the mark when it starts and sets it when it shuts down.
void mark_job_ended(const std::string& root, bool ended);
bool job_ended(const std::string& root);

// The checkpoints `path` names, the one to try first first: itself where it holds one (of either
// format: checkpoint.dsgd, or a sharded one's manifest.json), else its step-* directories, newest
// first. DataError where it names none.
std::vector<std::string> checkpoint_candidates(const std::string& path);
// load(dir) on checkpoint_candidates(path) in turn until one throws no DataError; its result.
// Each one passed over is given to on_skip ("path: problem"). A lone candidate's DataError is
// thrown as it is; else, where every one fails, a DataError listing them all.
template <typename Load>
auto load_first_intact(const std::string& path, Load load,
                       const std::function<void(const std::string&)>& on_skip = {}) {
  const std::vector<std::string> candidates = checkpoint_candidates(path);
  std::string problems;
  for (const auto& dir : candidates) {
    try {
      return load(dir);
    } catch (const DataError& e) {
      if (candidates.size() == 1) throw;
      if (on_skip) on_skip(e.what());
      problems += std::string("\n  ") + e.what();
    }
  }
  throw DataError(path, "every checkpoint here is damaged:" + problems);
}

// The newest intact checkpoint under root. Each damaged one passed over is appended to *skipped
// as "path: problem". DataError, listing every problem, if none is intact.
Checkpoint read_latest_checkpoint(const std::string& root, std::vector<std::string>* skipped);

}  // namespace dsgd::runtime
