// `dsgd train`'s flags: what the command line sets, and the binders that tie each flag to it.
//
//   TrainFlags f;
//   add_train_flags(cmd, f);        // every flag of `dsgd train`, grouped as --help shows them
//   ... CLI11 parses ...
//   f.flag_of["step.max_grad_norm"]  // "--max-grad-norm": names a Trainer error's field as a flag
//
// What a run does with them is train_command.cpp's.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "dsgd/apps/local_job.h"
#include "dsgd/common/trainer_config.h"

namespace dsgd::cli {

// The flags. Those of the Trainer's settings are bound from each setting's description
// (dsgd/runtime/settings.h: flag, help, default, grouped in --help as TrainerConfig groups them) to
// `trainer`, through the setting's own setter; the Trainer's validation checks them
// (dsgd::validate_config) and its errors name the field, which `flag_of` turns back into the flag
// that set it.
struct TrainFlags {
  dsgd::LocalJobOptions job;                   // the model, data and optimizer; also --in-process's job
  TrainerConfig trainer;                       // the rest of the Trainer's settings
  std::map<std::string, std::string> flag_of;  // TrainerConfig field -> the flag bound to it
  std::string hosts_file;                      // launcher ssh: one "host[:slots]" a line
  std::string cluster;                         // a cluster spec (dsgd/runtime/cluster.h); "" = $DSGD_CLUSTER, if set
  std::string save;
  std::string load;
  std::string config;  // JSON merged into the operator's config
  nlohmann::json config_json = nlohmann::json::object();
  bool in_process = false;
  std::string json_out;
  bool quiet = false;
  bool profile = false;
  std::string trace;  // Chrome trace of the training, per epoch (trace_path_of)
  CLI::Option* lr_option = nullptr;  // --lr: given, or the image classifier's default
  const CLI::App* command = nullptr;  // `train` itself: which flags were given
};

// Binds every flag of `dsgd train` to `f`: the model and data, every setting with a flag, and
// this run's outputs.
void add_train_flags(CLI::App* cmd, TrainFlags& f);

}  // namespace dsgd::cli
