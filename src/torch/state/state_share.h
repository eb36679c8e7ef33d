// A replica's share of a sharded checkpoint, as the runtime writes and reads it: named tensors
// cut into element ranges, and named blobs. Torch-free, so the checkpoint's files
// (runtime/checkpoint/sharded_checkpoint.h) know nothing of LibTorch, and the replica
// (ReplicaRuntime::write_share, read_share) nothing of files.
//
//   StateShare share = replica.write_share(spread);       // regions pointing into its tensors
//   for (const auto& r : share.regions) file.write(r.data, r.bytes);  // share.keep holds them
//   replica.read_share(reader);                           // reader: a StateSource
//
// The names (docs/CHECKPOINTS.md):
//   model/<name>                      a model's parameter or buffer (model m > 0: "model<m>.<name>")
//   optimizer<k>/<name>/<field>       a per-element field of optimizer k's state of that parameter
//   optimizer<k>/<name>               blob: the state's other fields (counts: Adam's step)
//   extras                            blob: position, schedule, loss scale, operator state, CPU generator
//   feedback/<rank>                   blob: replica <rank>'s error feedback (compression)
// Element ranges count in the tensor's row-major order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dsgd::torch_glue {

struct StateRegion {
  std::string name;
  std::string dtype;             // LibTorch's scalar type name ("Float", "Long", ...); "" for a blob
  std::vector<int64_t> shape;    // the whole tensor's (a blob: none)
  int64_t begin = 0, count = 0;  // elements [begin, begin + count) (a blob: 0 and its bytes)
  const void* data = nullptr;    // count elements, or the blob's bytes
  size_t bytes = 0;
  // The data stays as it is until the replica's next update begins (a parameter, the optimizer's
  // state; not a buffer, which forward changes): a copy of it may be taken while forward runs.
  bool until_update = false;
};

struct StateShare {
  std::vector<StateRegion> regions;
  std::shared_ptr<const void> keep;  // owns whatever the regions point into
};

// Where a load reads what some share wrote.
class StateSource {
 public:
  struct Tensor {
    std::string dtype;
    std::vector<int64_t> shape;
  };
  virtual ~StateSource() = default;
  // The tensor as saved; null if the checkpoint holds none of that name.
  virtual const Tensor* find(const std::string& name) const = 0;
  // The tensors whose names begin with `prefix`, in name order.
  virtual std::vector<std::string> tensors_under(const std::string& prefix) const = 0;
  // Elements [begin, begin + count) of tensor `name` into `dest` (count elements of its dtype).
  // Throws dsgd::DataError naming the file for what cannot be read or fails its checksum.
  virtual void read(const std::string& name, int64_t begin, int64_t count, void* dest) = 0;
  virtual bool has_blob(const std::string& name) const = 0;
  virtual std::string blob(const std::string& name) = 0;  // throws as read does
  // The number of replicas that wrote it (error feedback is used only by a world of that size).
  virtual int world() const = 0;
};

}  // namespace dsgd::torch_glue
