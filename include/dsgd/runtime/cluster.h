// dsgd/runtime/cluster.h — a cluster spec in the shape of TensorFlow's TF_CONFIG, so that every process
// a cluster manager starts (Kubernetes, Slurm, a script) reads one spec and its own task:
//
//   {"cluster": {"chief": ["hostA:29500"],                       the driver: exactly one
//                "worker": ["hostB", "hostC:1", "hostC:2"],      one entry per worker
//                "ps": ["hostD"],                                one per parameter-server shard
//                "evaluator": ["hostE"]},                        at most one
//    "task": {"type": "worker", "index": 1}}
//
// The chief's entry is the address the driver binds and everyone reaches (HOST:PORT); the
// others name their process's host, the host identity shared memory groups by (a ":N" suffix
// tells several on one host apart; Gloo picks its own ports). `dsgd train --cluster FILE` (task
// chief) runs the driver with num_workers and the ps shards from the spec; `dsgd worker` and
// `dsgd ps-server --cluster FILE` (tasks worker and ps) join it, and `dsgd evaluate --cluster
// FILE` (task evaluator) evaluates the job's checkpoints (dsgd/runtime/evaluator.h); without --cluster
// each reads $DSGD_CLUSTER (the JSON itself, as TF_CONFIG). The job token still comes from --token or
// $DSGD_TOKEN. Torch-free.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dsgd {

struct ClusterSpec {
  std::string chief;                    // HOST:PORT
  std::vector<std::string> workers;     // HOST or HOST:N
  std::vector<std::string> ps;
  std::vector<std::string> evaluators;
  std::string task_type;                // chief | worker | ps | evaluator
  int task_index = 0;

  // The spec in `json_text` (`what` names it in messages), checked: ConfigError for anything
  // else than the shape above (an unknown role, no chief or two, an entry named twice, a task
  // whose type or index the cluster lacks).
  static ClusterSpec parse(const std::string& json_text, const std::string& what);
  // `file`'s spec when it is not empty, else $DSGD_CLUSTER's, else nullopt.
  static std::optional<ClusterSpec> load(const std::string& file);

  // This task's entry, and its host (the entry without a ":N" or ":PORT" suffix).
  const std::string& task_entry() const;
  std::string task_host() const;
  // "worker 1" (for messages).
  std::string task_name() const;
};

}  // namespace dsgd
