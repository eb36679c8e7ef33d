// A worker's side of sharded checkpoints (runtime/checkpoint/sharded_checkpoint.h): each of its
// replicas writes its share into the driver's temporary directory, or loads one, reading the
// ranges it needs. Where the worker does not see the directory (no storage shared with the
// driver's host) it says so (ShareReply::visible) and writes nothing: the driver falls back to
// the whole format, which travels over the control plane.
#pragma once

#include <memory>
#include <vector>

#include "dsgd/control.pb.h"

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

}  // namespace runtime
}  // namespace dsgd
