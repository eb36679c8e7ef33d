#include "dsgd/runtime/cluster.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "dsgd/common/error.h"

namespace dsgd {

namespace {

const char* const kRoles[] = {"chief", "worker", "ps", "evaluator"};

void require(bool ok, const std::string& what, const std::string& message) {
  if (!ok) throw ConfigError(what + ": " + message);
}

std::vector<std::string> entries_of(const nlohmann::json& list, const std::string& role, const std::string& what) {
  require(list.is_array(), what, "cluster." + role + " must be a list of \"HOST\" or \"HOST:PORT\" strings");
  std::vector<std::string> out;
  for (const auto& e : list) {
    require(e.is_string() && !e.get<std::string>().empty(), what,
            "cluster." + role + " must be a list of \"HOST\" or \"HOST:PORT\" strings, got " + e.dump());
    const auto s = e.get<std::string>();
    for (const char ch : s) {
      require(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' || ch == '_' || ch == ':', what,
              "cluster." + role + " entry '" + s + "': a host holds letters, digits and . - _ (and a :PORT)");
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace

ClusterSpec ClusterSpec::parse(const std::string& json_text, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(what + " is not valid JSON: " + e.what());
  }
  require(j.is_object() && j.contains("cluster") && j["cluster"].is_object(), what,
          "needs {\"cluster\": {\"chief\": [\"HOST:PORT\"], \"worker\": [...], ...}, \"task\": {\"type\": ..., "
          "\"index\": ...}}");
  ClusterSpec s;
  std::map<std::string, std::string> seen;  // entry -> "worker 1"
  for (const auto& [role, list] : j["cluster"].items()) {
    const bool known = std::find(std::begin(kRoles), std::end(kRoles), role) != std::end(kRoles);
    require(known, what, "unknown role '" + role + "' in cluster; roles are chief, worker, ps and evaluator");
    const auto entries = entries_of(list, role, what);
    for (size_t i = 0; i < entries.size(); ++i) {
      const std::string name = role + " " + std::to_string(i);
      const auto [it, fresh] = seen.emplace(entries[i], name);
      require(fresh, what, "'" + entries[i] + "' is named twice (" + it->second + " and " + name +
                               "): two processes cannot be one task; give each its own HOST:N");
    }
    if (role == "chief") {
      require(entries.size() == 1, what, "cluster.chief must name exactly one HOST:PORT (the driver), got " +
                                             std::to_string(entries.size()));
      s.chief = entries[0];
    } else if (role == "worker") {
      s.workers = entries;
    } else if (role == "ps") {
      s.ps = entries;
    } else {
      require(entries.size() <= 1, what, "cluster.evaluator names at most one evaluator");
      s.evaluators = entries;
    }
  }
  require(!s.chief.empty(), what, "cluster.chief is missing: the driver's HOST:PORT, which every task joins");
  const auto colon = s.chief.rfind(':');
  const std::string port = colon == std::string::npos ? "" : s.chief.substr(colon + 1);
  require(!port.empty() && port.find_first_not_of("0123456789") == std::string::npos && colon > 0, what,
          "cluster.chief must be HOST:PORT (the address the driver binds), got '" + s.chief + "'");
  require(!s.workers.empty(), what, "cluster.worker is missing or empty: at least one worker");
  require(j.contains("task") && j["task"].is_object() && j["task"].contains("type") && j["task"]["type"].is_string(),
          what, "needs \"task\": {\"type\": \"chief\"|\"worker\"|\"ps\"|\"evaluator\", \"index\": N}");
  s.task_type = j["task"]["type"].get<std::string>();
  const auto& index = j["task"].value("index", nlohmann::json(0));
  require(index.is_number_integer(), what, "task.index must be a whole number, got " + index.dump());
  const auto n = index.get<int64_t>();
  const size_t count = s.task_type == "chief"    ? 1
                       : s.task_type == "worker" ? s.workers.size()
                       : s.task_type == "ps"     ? s.ps.size()
                       : s.task_type == "evaluator" ? s.evaluators.size()
                                                    : 0;
  const bool known = std::find(std::begin(kRoles), std::end(kRoles), s.task_type) != std::end(kRoles);
  require(known, what, "unknown task.type '" + s.task_type + "'; use chief, worker, ps or evaluator");
  require(n >= 0 && static_cast<size_t>(n) < count, what,
          "task " + s.task_type + " " + std::to_string(n) + " is not in the cluster (it has " + std::to_string(count) +
              " " + s.task_type + " entr" + (count == 1 ? "y" : "ies") + ")");
  s.task_index = static_cast<int>(n);
  return s;
}

std::optional<ClusterSpec> ClusterSpec::load(const std::string& file) {
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) throw ConfigError("cluster spec '" + file + "' cannot be read");
    std::stringstream text;
    text << in.rdbuf();
    ClusterSpec s = parse(text.str(), "cluster spec " + file);
    s.source = "cluster spec " + file;
    return s;
  }
  for (const char* name : {"DSGD_CLUSTER", "TF_CONFIG"}) {
    if (const char* env = std::getenv(name); env != nullptr && *env != '\0') {
      ClusterSpec s = parse(env, std::string("$") + name);
      s.source = std::string("$") + name;
      return s;
    }
  }
  return from_environment();
}

namespace {

// The first of `names` set in the environment (and which), or nullopt.
std::optional<std::pair<std::string, std::string>> first_env(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v != nullptr && *v != '\0') return std::make_pair(std::string(n), std::string(v));
  }
  return std::nullopt;
}

int64_t env_number(const std::pair<std::string, std::string>& var, int64_t low, const std::string& what) {
  size_t used = 0;
  int64_t n = -1;
  try {
    n = std::stoll(var.second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != var.second.size() || n < low) {
    throw ConfigError("$" + var.first + " is '" + var.second + "': " + what + " (a whole number >= " +
                      std::to_string(low) + ")");
  }
  return n;
}

std::string this_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  std::string h(name);
  for (char& ch : h) {  // a host identity holds letters, digits and . - _
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-' && ch != '_') ch = '_';
  }
  return h;
}

}  // namespace

std::optional<ClusterSpec> ClusterSpec::from_environment() {
  const auto addr = first_env({"MASTER_ADDR"});
  if (!addr) return std::nullopt;
  const auto rank_var = first_env({"RANK", "JOB_COMPLETION_INDEX", "SLURM_PROCID"});
  const auto world_var = first_env({"WORLD_SIZE", "SLURM_NTASKS"});
  const auto port_var = first_env({"DSGD_DRIVER_PORT", "MASTER_PORT"});
  const std::string what = "$MASTER_ADDR is set (" + addr->second + ")";
  if (!rank_var || !world_var || !port_var) {
    throw ConfigError(what + " but not " +
                      std::string(!port_var    ? "$MASTER_PORT (the rank-0 process's port)"
                                  : !rank_var ? "this process's rank ($RANK, $JOB_COMPLETION_INDEX or $SLURM_PROCID)"
                                              : "the process count ($WORLD_SIZE or $SLURM_NTASKS)") +
                      ": set it in every process, as torchrun and Kubeflow's PyTorchJob do, or unset $MASTER_ADDR");
  }
  const int64_t world = env_number(*world_var, 2, "the job's process count: rank 0 drives, the others train, so at "
                                                  "least 2");
  const int64_t rank = env_number(*rank_var, 0, "this process's rank");
  if (rank >= world) {
    throw ConfigError("$" + rank_var->first + " " + std::to_string(rank) + " is not below $" + world_var->first +
                      " " + std::to_string(world));
  }
  int64_t port = env_number(*port_var, 1, "the driver's port");
  const bool torchrun = std::getenv("TORCHELASTIC_RUN_ID") != nullptr && port_var->first == "MASTER_PORT";
  if (torchrun) ++port;  // torchrun's agent may hold MASTER_PORT (its store): the driver takes the next
  if (port > 65535) throw ConfigError("$" + port_var->first + " " + port_var->second + ": not a port");
  ClusterSpec s;
  s.chief = addr->second + ":" + std::to_string(port);
  s.source = "$" + rank_var->first + ", $" + world_var->first + " and $MASTER_ADDR" + (torchrun ? " (torchrun)" : "");
  s.from_engine = true;
  std::string host = this_host_name();
  if (const auto node = first_env({"GROUP_RANK", "SLURM_NODEID"})) host = "node" + node->second;
  for (int64_t w = 1; w < world; ++w) s.workers.push_back(w == rank ? host : "worker" + std::to_string(w - 1));
  s.task_type = rank == 0 ? "chief" : "worker";
  s.task_index = rank == 0 ? 0 : static_cast<int>(rank - 1);
  return s;
}

const std::string& ClusterSpec::task_entry() const {
  if (task_type == "chief") return chief;
  const auto& list = task_type == "worker" ? workers : task_type == "ps" ? ps : evaluators;
  return list.at(static_cast<size_t>(task_index));
}

std::string ClusterSpec::task_host() const {
  const std::string& e = task_entry();
  return e.substr(0, e.find(':'));
}

std::string ClusterSpec::task_name() const { return task_type + " " + std::to_string(task_index); }

}  // namespace dsgd
