// Checks a TrainerConfig before a Trainer starts anything: every bad field is a ConfigError
// that names the field, the value and what is allowed. (runtime/job_spec.h then turns it into
// the job every worker receives.)
//
//   runtime::validate_trainer_config("image_classifier", config);   // throws ConfigError
#pragma once

#include <string>

#include "dsgd/trainer.h"

namespace dsgd::runtime {

// Also fails where `op` is not a registered operator (listing those that are), and where this
// process was spawned as a worker but main() skipped dsgd::init.
void validate_trainer_config(const std::string& op, const TrainerConfig& c);

// How many parameter-server shard processes the job has (strategy ps, ps_placement
// "processes": num_ps_shards, 0 resolved to local_hosts); 0 for every other configuration.
int ps_shard_processes(const TrainerConfig& c);

// The loss scaling the job runs with: 0 (off), or the initial scale (loss_scale 0 resolved to
// 65536 under precision fp16, off otherwise; -1 off).
double loss_scale_of(const TrainerConfig& c);

}  // namespace dsgd::runtime
