// Rendezvous of a Gloo group: each rank publishes its size, pid, host and a fresh random secret
// under rank/<r>/ in the store, all check that they agree on the size, connect Gloo's full mesh
// behind our handshake (comm/gloo/guarded_transport.h: each connection opens with its
// connector's secret, so a stranger's never becomes a peer; the store adapter gives Gloo's waits
// our deadline), and wait until every rank has connected, so no rank leaves while a
// peer is still connecting. Throws dsgd::TimeoutError naming the ranks that did not arrive,
// dsgd::ConfigError when sizes disagree, dsgd::CommError when connecting fails.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dsgd/comm/group.h"

namespace gloo {
class Context;
}

namespace dsgd::comm {

struct Rendezvous {
  std::vector<std::string> hosts;  // by rank
  std::vector<int> pids;           // by rank
  std::shared_ptr<gloo::Context> context;
};

Rendezvous meet(Store& store, int rank, int size, const GroupOptions& options);

}  // namespace dsgd::comm
