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
// each reads $DSGD_CLUSTER (the JSON itself), else $TF_CONFIG (as TensorFlow's TFJob sets it), else
// the environment other engines set (from_environment: torchrun, Kubeflow's PyTorchJob, a
// Kubernetes Indexed Job, Slurm), where the same `dsgd train` command runs in every process: the
// chief drives, the others join as their task. The job token comes from --token, $DSGD_TOKEN or
// the file $DSGD_TOKEN_FILE names (a mounted secret). Torch-free.
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
  std::string source;                   // where it came from, for messages ("$TF_CONFIG", ...)
  bool from_engine = false;             // made from_environment: flags that shape the job set it aside

  // The spec in `json_text` (`what` names it in messages), checked: ConfigError for anything
  // else than the shape above (an unknown role, no chief or two, an entry named twice, a task
  // whose type or index the cluster lacks).
  static ClusterSpec parse(const std::string& json_text, const std::string& what);
  // `file`'s spec when it is not empty, else $DSGD_CLUSTER's, else $TF_CONFIG's, else
  // from_environment(), else nullopt.
  static std::optional<ClusterSpec> load(const std::string& file);
  // The spec of a job an engine started, from the variables it sets: the rank ($RANK; a Kubernetes
  // Indexed Job's $JOB_COMPLETION_INDEX; Slurm's $SLURM_PROCID), the process count ($WORLD_SIZE;
  // $SLURM_NTASKS) and the rank-0 process's address ($MASTER_ADDR, $MASTER_PORT). Rank 0 is the
  // chief, at MASTER_ADDR:MASTER_PORT ($DSGD_DRIVER_PORT instead where set; MASTER_PORT + 1 under
  // torchrun, whose agent may hold MASTER_PORT), and rank r > 0 worker r - 1: WORLD_SIZE - 1
  // workers. A worker's host is "node<N>" from torchrun's $GROUP_RANK or Slurm's $SLURM_NODEID,
  // else the host name. nullopt without MASTER_ADDR; ConfigError naming what is missing or wrong.
  static std::optional<ClusterSpec> from_environment();

  // This task's entry, and its host (the entry without a ":N" or ":PORT" suffix).
  const std::string& task_entry() const;
  std::string task_host() const;
  // "worker 1" (for messages).
  std::string task_name() const;
};

}  // namespace dsgd
