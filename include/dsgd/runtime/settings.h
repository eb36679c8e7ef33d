// dsgd/runtime/settings.h — every TrainerConfig setting, described once.
//
//   for (const auto& s : dsgd::setting_descriptions())   // path, type, default, flag, help, rule
//     std::cout << s.path << " " << s.flag << "\n";       // "step.max_grad_norm --max-grad-norm"
//   dsgd::apply_settings(c, {{"step", {{"max_grad_norm", 1.0}}}, {"num_workers", 2}});
//   nlohmann::json now = dsgd::settings_of(c);            // {"num_workers": 2, "step.max_grad_norm": 1.0, ...}
//
// One row per field (src/runtime/driver/trainer_settings.cpp) says everything a front end needs:
// the CLI's flags and --help are bound from it (tools/dsgd/train_flags.cpp), the Python module's
// keywords and setting_names() read it, the tuner sets the rows marked tunable, the summary and
// the dashboard print settings_of(), the job spec carries settings_of() to every worker, and
// validate_config applies each row's rule. A new setting is its field (dsgd/common/trainer_config.h),
// its row with its rule, and its use. Torch-free.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsgd/common/trainer_config.h"

namespace dsgd {

struct SettingDescription {
  std::string path;  // "step.max_grad_norm": the field in TrainerConfig, its group first
  // "bool", "integer", "number", "string", "strings", "milliseconds" or "choice" (one of `choices`)
  std::string type;
  std::vector<std::string> choices;
  // The `dsgd train` flag: "--max-grad-norm"; "!--no-overlap" for a bool the flag sets false;
  // "" for none (set it with --config-free front ends: apply_settings, Python, C++).
  std::string flag;
  std::string help;
  bool tunable = false;  // dsgd tune may vary it (a space file's key is its path)

  // The value in `config`, as JSON: what settings_of() prints and apply_settings takes back.
  std::function<nlohmann::json(const TrainerConfig&)> get;
  // Sets the field from JSON, checking its type (a ConfigError naming `path` otherwise).
  std::function<void(TrainerConfig&, const nlohmann::json&)> set;
  // The field's own range: "" where `config` keeps it, else what is wrong (validate_config
  // throws it as a ConfigError naming `path`). Rules between fields are validate_config's.
  std::function<std::string(const TrainerConfig&)> rule;
};

// Every setting, in TrainerConfig's order: the top-level fields, then each group's.
const std::vector<SettingDescription>& setting_descriptions();
// The row of `path` ("step.max_grad_norm"), or nullptr.
const SettingDescription* find_setting(const std::string& path);
// The groups, as their fields are prefixed: "step", "comm", "ps", "launch", ...
const std::vector<std::string>& setting_groups();
std::vector<std::string> setting_names();  // every row's path, "num_workers" to "monitor.metrics_dir"

// Every setting of `config` by its path (a flat object; durations in milliseconds, choices by
// name). launch.token is left out: it is a secret, not a setting to print.
nlohmann::json settings_of(const TrainerConfig& config);
// Only those that differ from a default TrainerConfig: what a summary shows.
nlohmann::json changed_settings(const TrainerConfig& config);

// Sets the fields `settings` names, by their paths as in C++, nested or dotted alike:
//   {"num_workers": 2, "step": {"max_grad_norm": 1.0}, "recovery.standby_workers": 1}
// Durations (comm.timeout, recovery.heartbeat_timeout, ...) in milliseconds; choices by the
// names the command line uses ("ps", "bf16"); "config" merges into config key by key. A name
// that is no field, or a value of the wrong type, is a ConfigError naming it (ranges are
// validate_config's). For front ends that take settings as data (the Python module).
void apply_settings(TrainerConfig& config, const nlohmann::json& settings);

// Every row's rule on `config`: the first broken one as a ConfigError naming its path
// (validate_config calls this before its rules between fields).
void check_setting_rules(const TrainerConfig& config);

}  // namespace dsgd
