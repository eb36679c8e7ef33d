// Trainer results from the workers' answers: one command's (every worker's metrics, weighted by
// samples), and one train() call's (its chunks merged). Torch-free.
//
//   Results r = results_of_command(train_results, /*per_worker=*/true);   // EpochReply each
//   Results total = merge_chunks(chunk_results, options.profile, options.reduce_results);
#pragma once

#include <vector>

#include "dsgd/runtime/trainer.h"
#include "control/driver_service.h"

namespace dsgd::runtime {

// Metrics weighted by samples across workers, but peak_rss_mib, the largest worker's peak
// resident memory; epoch, batch and batches_per_epoch as the workers report them (the same on
// all). `per_worker` keeps each worker's metrics too. Untrained answers (TrainRequest.results_only)
// carry none: the others' stand for every worker's, num_samples scaled to all of them.
Results results_of_command(const std::vector<proto::CommandResult>& outs, bool per_worker);

// The chunks of one train() call as one result: metrics weighted by samples except the totals
// (batches, skipped_steps, and epoch_s when profiling), summed, and peak_rss_mib, the
// largest; per-worker metrics merged the same way when the worker count held (else the last
// chunk's); the position of the last.
Results merge_chunks(const std::vector<Results>& chunks, bool profile, bool reduce_results);

}  // namespace dsgd::runtime
