// The job contract: what every worker and parameter-server shard process of a job runs,
// as one typed message (proto::JobSpec, proto/dsgd/control.proto). The driver builds it once
// from a validated TrainerConfig and hands it, as it is, to each process at registration; a
// worker reads the settings back into a TrainerConfig and turns that into its replicas' and its
// strategy's options, one function each.
//
//   proto::JobSpec spec = runtime::make_job_spec("image_classifier", config);  // driver
//   TrainerConfig job = runtime::job_settings(spec);                            // worker
//   torch_glue::ReplicaOptions o = runtime::replica_options(job, info, threads);
//
// The path of one setting, comm.grad_shard_bytes: its row in dsgd/runtime/settings.h (default, flag,
// rule) -> TrainerConfig -> settings_of in JobSpec.settings -> job_settings -> replica_options
// -> GradSync -> BucketPlan. The settings travel by the rows' paths, so nothing here names one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dsgd/control.pb.h"
#include "dsgd/common/trainer_config.h"

namespace at {
class Tensor;  // torch::Tensor, declared only: this header stays LibTorch-free
}  // namespace at

namespace dsgd {
struct ReplicaInfo;
namespace torch_glue {
struct ReplicaOptions;
class ReplicaRuntime;
}  // namespace torch_glue
namespace strategy {
struct StrategyOptions;
}  // namespace strategy

namespace runtime {

// `config` as its job runs it, with what the driver knows best resolved: threads_per_worker 0
// becomes cores / workers in local mode, and ps.shards the number of shard processes of
// ps.placement "processes".
TrainerConfig resolved(const TrainerConfig& config);

// The job of operator `op` under `config` (validated: dsgd::validate_config), resolved. The
// launch, checkpoints and monitor groups stay with the driver.
proto::JobSpec make_job_spec(const std::string& op, const TrainerConfig& config);

// The settings `spec` carries, as a TrainerConfig (config: the operator's). ConfigError where
// they do not read (a driver and a worker from different dsgd versions).
TrainerConfig job_settings(const proto::JobSpec& spec);

// A replica's options under `job`: `info` places it, `threads` are its intra-op threads.
torch_glue::ReplicaOptions replica_options(const TrainerConfig& job, const ReplicaInfo& info, int threads);

// The strategy's options under `job` (the driver checks them with strategy::validate before
// any process starts; a worker adds the central average or the shard processes' group).
strategy::StrategyOptions strategy_options(const TrainerConfig& job);

// zlib's CRC-32 of the tensors' bytes in order (copied to the CPU where they are not there), with
// the byte count: "crc32-bytes". Equal on replicas that hold the same values (dsgd.replica's
// checksum, the start-up's digest).
std::string tensors_checksum(const std::vector<at::Tensor>& tensors);

// What a worker tells the driver of its replicas (just set up, all built like the first): the
// models' signature, the trainable elements, what the worker will hold at each ZeRO stage over
// `world` replicas (torch_glue::memory_need; the driver's memory check), and the hash of their
// parameters and buffers where all replicas hold the same ("" where not).
proto::SetupReply setup_reply(const std::vector<std::unique_ptr<torch_glue::ReplicaRuntime>>& replicas,
                              const TrainerConfig& job, int world);

}  // namespace runtime
}  // namespace dsgd
