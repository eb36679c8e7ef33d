// How the ranks of a Gloo group meet: through the Store, then Gloo's full mesh.
#include "comm/gloo/rendezvous.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include "comm/gloo/store_adapter.h"
#include "dsgd/error.h"

namespace dsgd::comm {

Rendezvous meet(Store& store, int rank, int size, const GroupOptions& options) {
  Rendezvous out;
  const std::string me = "rank/" + std::to_string(rank);
  store.set(me + "/size", std::to_string(size));
  store.set(me + "/pid", std::to_string(::getpid()));
  store.set(me + "/host", options.host);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("rank/" + std::to_string(r) + "/host");
  try {
    store.wait(keys, options.timeout);
  } catch (const TimeoutError&) {
    std::string missing;
    for (int r = 0; r < size; ++r) {
      if (!store.check({keys[r]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    throw TimeoutError("group rendezvous: rank(s) " + missing + " of " + std::to_string(size) +
                           " did not arrive within " + std::to_string(options.timeout.count()) +
                           " ms (not started, crashed, or using another store or job prefix)",
                       "rendezvous");
  }
  for (int r = 0; r < size; ++r) {
    const std::string key = "rank/" + std::to_string(r);
    const std::string their_size = store.get(key + "/size", options.timeout);
    if (their_size != std::to_string(size)) {
      throw ConfigError("group rendezvous: rank " + std::to_string(r) + " expects a group of " + their_size +
                        ", this rank (" + std::to_string(rank) + ") expects " + std::to_string(size));
    }
    out.hosts.push_back(store.get(key + "/host", options.timeout));
    out.pids.push_back(std::stoi(store.get(key + "/pid", options.timeout)));
  }
  if (size == 1) {
    out.context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    return out;
  }
  try {
    gloo::transport::tcp::attr attr(options.bind_address.c_str());
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options.timeout);
    GlooStoreAdapter gloo_store(std::make_shared<PrefixStore>(std::shared_ptr<Store>(&store, [](Store*) {}), "gloo/"),
                                options.timeout);
    context->connectFullMesh(gloo_store, device);
    out.context = std::move(context);
    // connectFullMesh can return on one rank while a peer is still connecting; a rank that
    // then left at once would break the peer's rendezvous. Leave only when all are connected.
    store.set(me + "/connected", "1");
    std::vector<std::string> connected;
    for (int r = 0; r < size; ++r) connected.push_back("rank/" + std::to_string(r) + "/connected");
    store.wait(connected, options.timeout);
  } catch (const gloo::Exception& e) {
    throw CommError("group rendezvous: connecting rank " + std::to_string(rank) + " (" + options.bind_address +
                        ") to its peers failed: " + e.what(),
                    "rendezvous");
  }
  return out;
}

}  // namespace dsgd::comm
