// A worker's side of sharded checkpoints (runtime/checkpoint/sharded_checkpoint.h): each of its
// replicas writes its share into the driver's temporary directory, or loads one, reading the
// ranges it needs. Where the worker does not see the directory (no storage shared with the
// driver's host) it says so (ShareReply::visible) and writes nothing: the driver falls back to
// the whole format, which travels over the control plane.
#pragma once

#include <atomic>
#include <exception>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dsgd/common/trainer_config.h"
#include "dsgd/control.pb.h"
#include "torch/state/state_share.h"

namespace dsgd {
namespace torch_glue {
class ReplicaRuntime;
}  // namespace torch_glue

namespace runtime {

using Replicas = std::vector<std::unique_ptr<torch_glue::ReplicaRuntime>>;

// The models as model.pt holds them: a TorchScript model's module (torch.jit.load reads it), else
// the first replica's parameters and buffers as a name -> tensor dict (torch.load). Under ZeRO
// stage 3 only while the first replica's parameters are gathered.
std::string model_pickle(const Replicas& replicas);

// Each replica's share into in.dir(); with in.model_pt(), the worker of the first replica writes
// model.pt there too (fsynced).
proto::ShareReply write_shares(const Replicas& replicas, const proto::WriteShareRequest& in);
// Throws dsgd::DataError naming the file for a damaged or missing share, ConfigError for a
// checkpoint of another model.
proto::ShareReply read_shares(const Replicas& replicas, const proto::ReadShareRequest& in);

// A worker's periodic checkpoints (WriteShareRequest::background): start() copies each replica's
// share into a buffer kept from one checkpoint to the next, and
// writes the files on a thread of its own while training goes on; finish() waits for that
// thread and gives the files' records. With `overlap`, start() copies only what forward changes
// (buffers, the blobs) and the thread the rest (the parameters and optimizer state, alike until
// the next update), while the next step's forward and backward run: each replica's update waits
// for that copy (StepBoundary::gate_update), as does any command that may change the state.
//
//   BackgroundShares shares;
//   reply = shares.start(replicas, request, true);  // returns once the buffers are copied
//   shares.wait_for_copy(command);                  // before each command the worker runs
//   reply = shares.finish();                        // DataError (the file named) if the write failed
class BackgroundShares {
 public:
  BackgroundShares() = default;
  ~BackgroundShares();  // waits for the write in flight: a file is never left half-written by us
  BackgroundShares(const BackgroundShares&) = delete;
  BackgroundShares& operator=(const BackgroundShares&) = delete;

  // write_shares(), or with in.background() start(), overlapping where `job`'s settings allow.
  proto::ShareReply write(const Replicas& replicas, const proto::WriteShareRequest& in, const TrainerConfig& job);
  // A write still in flight (a checkpoint abandoned by the driver) is waited for first.
  // `overlap`: where nothing but an update changes the parameters and the optimizer state
  // between steps (not with forward overlap's deferred steps, nor ZeRO stage 3's gathers).
  proto::ShareReply start(const Replicas& replicas, const proto::WriteShareRequest& in, bool overlap);
  // Before `cmd` runs: the copy start() left to the thread, waited for unless `cmd` cannot change
  // the state (train: its updates wait instead).
  void wait_for_copy(const proto::Command& cmd) const;
  // started() false where none was in flight (a replacement's, or after a finish).
  proto::ShareReply finish();

 private:
  struct Staged {
    std::string path;
    torch_glue::StateShare share;  // its regions point into the buffer
  };
  void wait();
  void write_files(std::vector<Staged> staged);  // the thread's

  struct Buffer {  // a staging buffer, its pages touched first by the thread's copy (no zero-fill)
    std::unique_ptr<char[]> data;
    size_t size = 0;
  };
  std::vector<std::shared_ptr<Buffer>> buffers_;  // one per replica, reused
  std::thread thread_;
  bool in_flight_ = false;
  std::atomic<bool> written_{false};  // the thread's write has ended
  std::shared_future<void> copied_;   // the thread's copy has ended
  proto::ShareReply result_;    // the thread's, read after wait()
  std::exception_ptr error_;    // likewise
};

}  // namespace runtime
}  // namespace dsgd
