// ZeRO stage 3's parameters (StepConfig::zero_stage 3): one GradSync's parameters kept as this
// replica's block of every bucket (its strategy::ShardLayout), the shard, and gathered whole one
// bucket at a time when a layer needs them (torch/replica/unit_gathers.h says when).
//
// Each parameter is a view of its bucket's whole buffer (padded as the layout pads it), a mapping
// of its own. A bucket released gives that buffer's pages back to the system, as FSDP frees its
// flat parameter: the mapping stays, read-only and holding no page (reads give zeros, writes
// fault), and the parameters, and autograd's saved references to them, keep viewing it. A bucket
// gathered turns writable and fills with every replica's block (Sharing::allgather_async), so
// those views see the values again. The optimizer steps pieces of
// the shard (piece(i)), so a step changes only the shard, and the next gather brings it to all.
//
//   ShardedParameters shards(params, plan, layout);     // views set; this replica's block kept
//   shards.set_sharing(sharing);
//   shards.release_all();                               // 1/N of the parameters held
//   shards.gather(b); shards.wait(b);                   // bucket b whole again, on every replica
//
// CPU only (ZeRO stage 3 on CUDA would gather through the staged host copies: not yet).
#pragma once

#include <torch/types.h>

#include <memory>
#include <vector>

#include "dsgd/comm/work.h"
#include "strategy/bucket_plan.h"
#include "strategy/strategy.h"

namespace dsgd::torch_glue {

// Whether `t`'s memory is a released bucket's (its values read as zeros, not the parameters').
bool released_memory(const torch::Tensor& t);

class ShardedParameters {
 public:
  // The parameters' values as they are now go into the shard (this replica's block); each
  // parameter becomes a view of its bucket's buffer, every bucket resident. Parameters dense, as
  // check_shardable requires. Keeps copies of the plan and layout: it may outlive their GradSync
  // (a re-formed group keeps its shard where the layout stays).
  ShardedParameters(std::vector<torch::Tensor> params, const strategy::BucketPlan& plan,
                    const strategy::ShardLayout& layout);
  // The parameters are left with memory of their own again: this replica's block from the shard,
  // NaN elsewhere (a load or a gather brings the rest; a use without one shows).
  ~ShardedParameters();
  ShardedParameters(const ShardedParameters&) = delete;
  ShardedParameters& operator=(const ShardedParameters&) = delete;

  // The group the gathers go over (the GradSyncs' strategy's; set again after a re-formation).
  void set_sharing(strategy::Sharing* sharing) { sharing_ = sharing; }
  // The same parameters cut the same way (after a re-formation: the shard stays valid).
  bool same_layout(const std::vector<torch::Tensor>& params, const strategy::ShardLayout& layout) const;

  size_t num_buckets() const { return buckets_.size(); }
  size_t bucket_of(size_t param) const { return plan_.slot(param).bucket; }
  size_t params_in(size_t bucket) const { return plan_.buckets()[bucket].params.size(); }
  // Collective (every replica gathers the same buckets in the same order): starts filling
  // `bucket` from every replica's block; nothing where it is resident or on its way.
  void gather(size_t bucket);
  // `bucket` whole: waits for its gather (throws its CommError).
  void wait(size_t bucket);
  bool resident(size_t bucket) const { return buckets_[bucket].state != State::kReleased; }
  bool all_resident() const;
  // Its memory given back (a gather in flight is waited for first).
  void release(size_t bucket);
  void gather_all();  // collective: every bucket whole
  void release_all();
  // Every bucket's memory back, uninitialised (NaN), for a load to write into: not collective.
  void allocate_all();
  // After the parameters were written whole (a load, a broadcast): their values, this replica's
  // block of them, into the shard. A parameter a load gave memory of its own (Module::load's set_)
  // is copied into its bucket's buffer and views it again. Every bucket must be resident.
  void store();

  // Parameter `param`'s piece of the shard (1-D; undefined where this replica has none of it):
  // what the optimizer steps.
  torch::Tensor piece(size_t param) const;
  // Bytes held: the shard and the resident buckets.
  size_t bytes() const;

 private:
  enum class State { kReleased, kGathering, kResident };
  void allocate(size_t bucket, bool fill_nan);
  torch::Tensor view_of(size_t param) const;  // its place in its bucket's buffer, shaped and strided like it

  std::vector<torch::Tensor> params_;
  const strategy::BucketPlan plan_;
  const strategy::ShardLayout layout_;
  strategy::Sharing* sharing_ = nullptr;
  torch::Tensor shard_;                        // this replica's block of every bucket
  std::vector<std::vector<int64_t>> strides_;  // per parameter, as it was laid out
  struct Bucket {
    torch::Tensor whole;  // its whole (padded) buffer, which the parameters view
    State state = State::kResident;
    std::shared_ptr<comm::Work> work;  // its gather in flight
  };
  std::vector<Bucket> buckets_;
};

}  // namespace dsgd::torch_glue
