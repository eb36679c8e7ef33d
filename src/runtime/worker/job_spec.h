// The job contract: what every worker and parameter-server shard process of a job runs,
// as one typed message (proto::JobSpec, proto/dsgd/control.proto). The driver builds it once
// from a validated TrainerConfig and hands it, as it is, to each process at registration; a
// worker turns it into its replicas' options with one function.
//
//   proto::JobSpec spec = runtime::make_job_spec("image_classifier", config);  // driver
//   torch_glue::ReplicaOptions o = runtime::replica_options(spec, info, threads);  // worker
//
// The path of one setting, grad_shard_bytes: TrainerConfig (default, CLI flag or --config) ->
// make_job_spec -> JobSpec.grad_shard_bytes -> replica_options -> GradSync -> BucketPlan.
#pragma once

#include <string>

#include "dsgd/choice.h"
#include "dsgd/control.pb.h"
#include "dsgd/trainer_config.h"

namespace dsgd {
struct ReplicaInfo;
namespace torch_glue {
struct ReplicaOptions;
}  // namespace torch_glue
namespace strategy {
struct StrategyOptions;
}  // namespace strategy

namespace runtime {

// The job of operator `op` under `config` (its fixed-set fields known: dsgd::validate_config
// checks them before it calls this). Resolves what
// the driver knows best: threads_per_worker 0 becomes cores / workers in local mode, and the
// number of shard processes of ps_placement "processes".
proto::JobSpec make_job_spec(const std::string& op, const TrainerConfig& config);

// A replica's options under `spec`: `info` places it, `threads` are its intra-op threads.
torch_glue::ReplicaOptions replica_options(const proto::JobSpec& spec, const ReplicaInfo& info, int threads);

// The strategy's options under `spec` (the driver checks them with strategy::validate before
// any process starts; a worker adds the central average or the shard processes' group).
strategy::StrategyOptions strategy_options(const proto::JobSpec& spec);

// The enums of include/dsgd/choice.h as the job contract spells them, and back. Choices must be
// known (validated); from_proto of 0 or a number this build does not know throws ConfigError
// (a driver and a worker from different dsgd versions).
proto::Strategy to_proto(Strategy s);
proto::PsPlacement to_proto(PsPlacement p);
proto::AllreduceAlgo to_proto(AllreduceAlgo a);
Strategy from_proto(proto::Strategy s);
PsPlacement from_proto(proto::PsPlacement p);
AllreduceAlgo from_proto(proto::AllreduceAlgo a);
proto::Device to_proto(Device d);
Device from_proto(proto::Device d);
proto::Compression to_proto(Compression c);
Compression from_proto(proto::Compression c);

}  // namespace runtime
}  // namespace dsgd
