// ZeRO stage 3's schedule (StepConfig::zero_stage 3): when each bucket of a replica's
// ShardedParameters (torch/sync/sharded_parameters.h) is whole. A part of ZeroShare.
//
// A unit is what one dsgd::wait_for_parameters call names (a layer; the reference models name a
// top-level child at a time, a transformer block for the GPT): forward calls it just before the
// unit runs, and the unit's buckets are gathered then, while the next unit's, as the last forward
// called them, are gathered in the background; the buckets of neither are released. A call that
// names only parameters an earlier unit of this forward named (a tied weight: the GPT's head) joins
// the current unit. In backward, the first gradient of a unit's own parameters (the ones it named
// first) says its backward runs: the unit before it is gathered (waited for) and the one before
// that started, since autograd runs a unit's nodes, all created after the earlier unit's, before
// any of the earlier unit's. A bucket whose every parameter has its gradient is released at once
// (no node of this backward reads it again), the rest at backward's end; after the step,
// everything is released, and the next forward gathers the new values.
//
// Every replica makes the same calls in the same order (the gathers are collective): forward must
// run the same units in the same order on every replica. The first backward after a partition
// checks that forward named every parameter that got a gradient: one it did not name was read
// released (as zeros: sharded_parameters.h), so the step throws ConfigError, naming it. A unit
// whose parameters all get no gradient although it ran leaves the unit before it released in
// backward (read as zeros): forward must use what it names.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "torch/sync/sharded_parameters.h"

namespace dsgd::torch_glue {

class UnitGathers {
 public:
  // One ShardedParameters per GradSync, in the GradSyncs' order (null: that one is not sharded),
  // and each one's parameters. Buckets may be whole or released (a partition then releases all);
  // the next forward and backward check what forward names.
  void reset(std::vector<ShardedParameters*> shards, const std::vector<std::vector<torch::Tensor>>& params);
  bool active() const { return !shards_.empty(); }

  // The gate (wait_for_parameters): forward is about to use `params`.
  void enter(const std::vector<torch::Tensor>& params);
  // GradSync's listener, on backward's thread before the gradient is taken: `sync`'s parameter
  // `param` got its gradient.
  void on_grad(size_t sync, size_t param);
  // GradSync `sync`'s backward ended: its buckets released. Throws ConfigError at the checked
  // step's end for a parameter forward never named.
  void on_backward_end(size_t sync);

  void gather_all();   // collective: every bucket whole (for a save, a broadcast, validate)
  void release_all();  // every bucket released (after a step; the next forward gathers)
  // Collective, as gather_all, for a replica that only sends its blocks: each bucket released
  // again as soon as it is whole, so it holds one at a time.
  void pass_all();
  // Parameter bytes held now: the shards and the buckets whole.
  size_t bytes() const;

 private:
  using Key = uint64_t;  // (sync << 32) | bucket
  struct Unit {
    std::vector<Key> keys;
    bool started = false;  // its backward began: the units before it were gathered
  };
  std::vector<Key> keys_of(const std::vector<torch::Tensor>& params) const;
  ShardedParameters& shard(Key k) const { return *shards_[k >> 32]; }
  static size_t bucket(Key k) { return static_cast<size_t>(k & 0xffffffffu); }
  void gather(const std::vector<Key>& keys, bool wait);
  void begin_forward();
  void add_unit(const std::vector<torch::Tensor>& params, const std::vector<Key>& keys);
  void release_except(const std::vector<Key>& keep);

  std::vector<ShardedParameters*> shards_;
  std::unordered_map<const void*, std::pair<size_t, size_t>> index_;  // TensorImpl -> (sync, param)
  std::vector<std::vector<size_t>> bucket_of_;                        // per sync, per parameter
  std::vector<std::vector<const void*>> impls_;                       // per sync, per parameter
  // Until the first backward's end: what forward names, and what got a gradient unnamed.
  struct Check {
    bool done = false;
    std::unordered_set<const void*> named;
    std::vector<std::string> unnamed;
    std::vector<bool> ended;  // per sync: its checked backward ended
  } check_;
  // This forward and its backward.
  bool fresh_ = true;                          // the next enter begins a forward
  std::vector<Unit> units_;                    // in forward's order
  std::vector<std::vector<int64_t>> unit_of_;  // per sync, per parameter: the unit that named it first (-1)
  std::vector<std::vector<size_t>> missing_;   // per sync, per bucket: gradients still to come
  const void* last_call_ = nullptr;            // the last call's first parameter
  std::unordered_map<const void*, std::vector<Key>> next_;  // a call's first parameter -> what followed it
};

}  // namespace dsgd::torch_glue
