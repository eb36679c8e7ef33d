// Parameter-server shard processes (strategy ps, ps_placement "processes"): the process side,
// and how the workers' host leaders meet them. Torch-free.
//
//   driver (local mode): spawns `<binary> --dsgd-ps-server --driver HOST:PORT --shard s` (token
//                        in $DSGD_TOKEN), and before each generation g sets the store key
//                        "ps/generation" to g ("pending" while re-forming, "stop" at the end);
//   other hosts:         `dsgd ps-server --driver HOST:PORT --token T --shard s`, any launcher;
//   host leaders:        join_ps_servers() in `connect`; leader 0 first writes the generation's
//                        spec (how many leaders and shards, the timeouts);
//   shard process:       run_ps_server(): for every new generation, reads the spec, joins the
//                        servers' group as rank leaders + s and serves (strategy::PsServer)
//                        until the group fails or the driver announces the next generation.
//
// A shard process exits when told ("stop"), when the driver is unreachable for
// `driver_timeout`, and (spawned locally) with the driver.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "dsgd/comm/group.h"
#include "dsgd/comm/hierarchical.h"
#include "dsgd/comm/store.h"
#include "dsgd/runtime/remote.h"

namespace dsgd::runtime {

// Shard mode is `--dsgd-ps-server` anywhere in argv. nullopt otherwise; ConfigError for bad
// flags (no --driver, no token, no --shard).
std::optional<PsServerArgs> parse_ps_server_args(int argc, char** argv);

// The store key the driver sets to the current generation (or "pending" / "stop").
inline constexpr const char* kPsGenerationKey = "ps/generation";

// A host leader's side: `generation_store` is the generation's namespace ("gen<g>/"). Leader 0
// writes the spec, then every leader joins the servers' group at its leader index.
std::shared_ptr<comm::Group> join_ps_servers(const std::shared_ptr<comm::Store>& generation_store,
                                             comm::HierarchicalGroup& group, int num_shards,
                                             const comm::GroupOptions& options);

}  // namespace dsgd::runtime
