// TrainerConfig's fields by name, from JSON (dsgd/trainer_config.h: apply_settings): one table,
// a path and a setter per field. Values are checked for their type here and for their range by
// validate_config, as every other way into a TrainerConfig is.
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsgd/error.h"
#include "dsgd/json_fields.h"
#include "dsgd/trainer_config.h"

namespace dsgd {
namespace {

using json = nlohmann::json;

[[noreturn]] void wrong(const std::string& path, const std::string& want, const json& v) {
  throw ConfigError(path + " must be " + want + ", got " + v.dump(), path);
}

template <typename T>
void set(T& field, const json& v, const std::string& path) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) wrong(path, "true or false", v);
    field = v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    try {
      field = integer_field(json{{path, v}}, path, field);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(e.what(), path);
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) wrong(path, "a number", v);
    field = v.get<double>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) wrong(path, "a string", v);
    field = v.get<std::string>();
  } else if constexpr (std::is_same_v<T, std::chrono::milliseconds>) {
    int64_t ms = field.count();
    set(ms, v, path);
    field = std::chrono::milliseconds(ms);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    if (!v.is_array()) wrong(path, "a list of strings", v);
    std::vector<std::string> out;
    for (const auto& e : v) {
      if (!e.is_string()) wrong(path, "a list of strings", v);
      out.push_back(e.get<std::string>());
    }
    field = std::move(out);
  } else {  // Choice<E>: by the name the command line uses
    if (!v.is_string()) wrong(path, "a string", v);
    field = v.get<std::string>();
  }
}

using Setter = std::function<void(TrainerConfig&, const json&)>;

#define DSGD_SETTING(path, member) \
  { path, [](TrainerConfig& c, const json& v) { set(c.member, v, path); } }

const std::map<std::string, Setter>& settings() {
  static const std::map<std::string, Setter> table = {
      DSGD_SETTING("num_workers", num_workers),
      DSGD_SETTING("strategy", strategy),
      DSGD_SETTING("batch_size", batch_size),
      DSGD_SETTING("devices_per_worker", devices_per_worker),
      DSGD_SETTING("device", device),
      DSGD_SETTING("seed", seed),
      DSGD_SETTING("initialization_hook", initialization_hook),
      DSGD_SETTING("threads_per_worker", threads_per_worker),
      DSGD_SETTING("step.precision", step.precision),
      DSGD_SETTING("step.loss_scale", step.loss_scale),
      DSGD_SETTING("step.loss_scale_growth_interval", step.loss_scale_growth_interval),
      DSGD_SETTING("step.nonfinite_policy", step.nonfinite_policy),
      DSGD_SETTING("step.scheduler_step_freq", step.scheduler_step_freq),
      DSGD_SETTING("step.max_grad_norm", step.max_grad_norm),
      DSGD_SETTING("step.accumulate_steps", step.accumulate_steps),
      DSGD_SETTING("step.zero_stage", step.zero_stage),
      DSGD_SETTING("comm.allreduce_algo", comm.allreduce_algo),
      DSGD_SETTING("comm.grad_shard_bytes", comm.grad_shard_bytes),
      DSGD_SETTING("comm.overlap", comm.overlap),
      DSGD_SETTING("comm.forward_overlap_buckets", comm.forward_overlap_buckets),
      DSGD_SETTING("comm.compression", comm.compression),
      DSGD_SETTING("comm.powersgd_rank", comm.powersgd_rank),
      DSGD_SETTING("comm.powersgd_start_steps", comm.powersgd_start_steps),
      DSGD_SETTING("comm.timeout", comm.timeout),
      DSGD_SETTING("ps.shards", ps.shards),
      DSGD_SETTING("ps.update_on_shards", ps.update_on_shards),
      DSGD_SETTING("ps.placement", ps.placement),
      DSGD_SETTING("ps.max_staleness", ps.max_staleness),
      DSGD_SETTING("launch.launcher", launch.launcher),
      DSGD_SETTING("launch.listen", launch.listen),
      DSGD_SETTING("launch.token", launch.token),
      DSGD_SETTING("launch.tls", launch.tls),
      DSGD_SETTING("launch.tls_ca", launch.tls_ca),
      DSGD_SETTING("launch.tls_cert", launch.tls_cert),
      DSGD_SETTING("launch.tls_key", launch.tls_key),
      DSGD_SETTING("launch.worker_binary", launch.worker_binary),
      DSGD_SETTING("launch.hosts", launch.hosts),
      DSGD_SETTING("launch.ssh_command", launch.ssh_command),
      DSGD_SETTING("launch.mpirun_command", launch.mpirun_command),
      DSGD_SETTING("launch.srun_command", launch.srun_command),
      DSGD_SETTING("launch.local_hosts", launch.local_hosts),
      DSGD_SETTING("launch.registration_timeout", launch.registration_timeout),
      DSGD_SETTING("recovery.heartbeat_timeout", recovery.heartbeat_timeout),
      DSGD_SETTING("recovery.max_failures", recovery.max_failures),
      DSGD_SETTING("recovery.standby_workers", recovery.standby_workers),
      DSGD_SETTING("recovery.wait_for_replacements", recovery.wait_for_replacements),
      DSGD_SETTING("recovery.from_peer", recovery.from_peer),
      DSGD_SETTING("recovery.replace_lost_workers", recovery.replace_lost_workers),
      DSGD_SETTING("recovery.replacement_timeout", recovery.replacement_timeout),
      DSGD_SETTING("recovery.on_straggler", recovery.on_straggler),
      DSGD_SETTING("recovery.driver_state_dir", recovery.driver_state_dir),
      DSGD_SETTING("recovery.driver_grace", recovery.driver_grace),
      DSGD_SETTING("checkpoints.every_steps", checkpoints.every_steps),
      DSGD_SETTING("checkpoints.max_overhead", checkpoints.max_overhead),
      DSGD_SETTING("checkpoints.dir", checkpoints.dir),
      DSGD_SETTING("checkpoints.keep", checkpoints.keep),
      DSGD_SETTING("checkpoints.fail_on_write_error", checkpoints.fail_on_write_error),
      DSGD_SETTING("monitor.metrics_port", monitor.metrics_port),
      DSGD_SETTING("monitor.metrics_host", monitor.metrics_host),
      DSGD_SETTING("monitor.metrics_dir", monitor.metrics_dir),
  };
  return table;
}

#undef DSGD_SETTING

const std::vector<std::string> kGroups = {"step", "comm", "ps", "launch", "recovery", "checkpoints", "monitor"};

}  // namespace

std::vector<std::string> setting_names() {
  std::vector<std::string> out;
  for (const auto& [path, setter] : settings()) out.push_back(path);
  return out;
}

void apply_settings(TrainerConfig& config, const json& values) {
  if (!values.is_object()) throw ConfigError("settings must be a JSON object, got " + values.dump());
  for (const auto& [key, v] : values.items()) {
    if (key == "config") {  // the operator's own: merged key by key
      if (!v.is_object()) wrong("config", "an object", v);
      for (const auto& [k, x] : v.items()) config.config[k] = x;
      continue;
    }
    if (std::find(kGroups.begin(), kGroups.end(), key) != kGroups.end()) {
      if (!v.is_object()) wrong(key, "an object of its fields", v);
      json flat = json::object();
      for (const auto& [k, x] : v.items()) flat[key + "." + k] = x;
      apply_settings(config, flat);
      continue;
    }
    const auto it = settings().find(key);
    if (it == settings().end()) {
      throw ConfigError("unknown setting '" + key + "': TrainerConfig's fields are num_workers, strategy, ... "
                        "and the groups' (step.max_grad_norm, recovery.standby_workers, ...; docs/SETTINGS.md)",
                        key);
    }
    it->second(config, v);
  }
}

}  // namespace dsgd
