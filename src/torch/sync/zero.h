// ZeRO (StepConfig::zero_stage) on the optimizers' side. Each replica's optimizers step its
// pieces of the parameters (strategy::ShardLayout: flat slices of the buckets, balanced to the
// element) instead of the parameters: a piece is a 1-D view of its parameter's memory
// (memory_view), so the optimizer's step writes the parameter itself, and any elementwise
// LibTorch optimizer (SGD, Adam, AdamW, RMSprop, Adagrad: state a tensor shaped like its
// parameter, or a count) keeps state for 1/N of every parameter and steps it unchanged. What is
// here: each optimizer's parameters swapped for their pieces and back, the state sliced with
// them, and the state gathered whole for checkpoints, through LibTorch's own serialisation of
// each state (so no optimizer's fields are named here).
//
//   Pieces pieces;                                  // parameter -> its piece here
//   auto whole = optimizer_params(op);              // each optimizer's groups, as registered
//   to_pieces(op, pieces, whole);                   // whole states sliced; the pieces stepped
//   gather_whole(op, pieces, whole, sharing, true); // collective: every piece's state, whole here
#pragma once

#include <unordered_map>
#include <vector>

#include "dsgd/torch/operator.h"
#include "strategy/strategy.h"

namespace dsgd::torch_glue {

// A sharded parameter's piece on this replica: elements [begin, begin + count) in its memory
// order, `view` their 1-D view (undefined, count 0: none of it is here).
struct Piece {
  torch::Tensor view;
  size_t begin = 0, count = 0;
};
using Pieces = std::unordered_map<const void*, Piece>;  // by the parameter's TensorImpl
// Each optimizer's param groups' parameters.
using OptimizerParams = std::vector<std::vector<std::vector<torch::Tensor>>>;
OptimizerParams optimizer_params(TrainingOperator& op);

// Throws ConfigError for an optimizer that cannot step pieces (LBFGS: its step is over every
// parameter at once) or a sharded parameter that is not dense.
void check_shardable(TrainingOperator& op, const Pieces& pieces);

// The optimizers hold `whole` (their registered parameters): each sharded parameter's state, if
// any, becomes its piece's (sliced), the parameter itself leaves its group, and its piece, where
// this replica has one, takes its place.
void to_pieces(TrainingOperator& op, const Pieces& pieces, const OptimizerParams& whole);

// Collective over `sharing`, the optimizers holding the pieces: every replica's pieces' state
// goes to all, and where `keep` this replica's optimizers hold `whole` again, each parameter's
// state whole (save_state writes it; to_pieces slices it again). The others hold their pieces.
void gather_whole(TrainingOperator& op, const Pieces& pieces, const OptimizerParams& whole, strategy::Sharing& sharing,
                  bool keep);

// The optimizers holding the pieces hold `whole` again, with no state for the sharded
// parameters (before a load brings it whole).
void drop_pieces(TrainingOperator& op, const Pieces& pieces, const OptimizerParams& whole);

}  // namespace dsgd::torch_glue
