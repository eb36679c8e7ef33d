// How the ranks of a Gloo group meet: through the Store, then Gloo's full mesh.
#include "comm/gloo/rendezvous.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <unistd.h>

#include "comm/gloo/gloo_calls.h"
#include "comm/gloo/guarded_transport.h"
#include "comm/gloo/store_adapter.h"
#include "dsgd/common/error.h"

namespace dsgd::comm {
namespace {

std::string to_hex(const PairSecret& s) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : s) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

PairSecret from_hex(const std::string& hex, int rank) {
  PairSecret s{};
  auto digit = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw CommError("group rendezvous: rank " + std::to_string(rank) + " published a malformed secret", "rendezvous");
  };
  if (hex.size() != 2 * s.size()) {
    throw CommError("group rendezvous: rank " + std::to_string(rank) + " published a secret of " +
                        std::to_string(hex.size()) + " characters, not " + std::to_string(2 * s.size()),
                    "rendezvous");
  }
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint8_t>(digit(hex[2 * i]) * 16 + digit(hex[2 * i + 1]));
  return s;
}

// What a rank publishes: "size\npid\nsecret\nhost".
struct Published {
  std::string size;
  int pid = 0;
  PairSecret secret{};
  std::string host;
};

Published parse(const std::string& value, int rank) {
  std::vector<std::string> parts;
  size_t at = 0;
  for (int i = 0; i < 3; ++i) {
    const size_t nl = value.find('\n', at);
    if (nl == std::string::npos) {
      throw CommError("group rendezvous: rank " + std::to_string(rank) + " published '" + value.substr(0, 64) +
                          "', not size, pid, secret and host",
                      "rendezvous");
    }
    parts.push_back(value.substr(at, nl - at));
    at = nl + 1;
  }
  Published p;
  p.size = parts[0];
  p.pid = std::atoi(parts[1].c_str());
  p.secret = from_hex(parts[2], rank);
  p.host = value.substr(at);
  return p;
}

}  // namespace

Rendezvous meet(Store& store, int rank, int size, const GroupOptions& options) {
  Rendezvous out;
  const std::string me = "rank/" + std::to_string(rank);
  // One key a rank, read by all in one call each: N ranks meet in 2N calls to the store.
  // Its secret is what this rank's Gloo connections say first.
  store.set(me, std::to_string(size) + "\n" + std::to_string(::getpid()) + "\n" + to_hex(random_pair_secret()) +
                    "\n" + options.host);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("rank/" + std::to_string(r));
  std::vector<std::string> values;
  try {
    values = store.get_many(keys, options.timeout);
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
  std::vector<PairSecret> secrets;
  for (int r = 0; r < size; ++r) {
    const Published p = parse(values[static_cast<size_t>(r)], r);
    if (p.size != std::to_string(size)) {
      throw ConfigError("group rendezvous: rank " + std::to_string(r) + " expects a group of " + p.size +
                        ", this rank (" + std::to_string(rank) + ") expects " + std::to_string(size));
    }
    out.hosts.push_back(p.host);
    out.pids.push_back(p.pid);
    secrets.push_back(p.secret);
  }
  if (size == 1) {
    out.context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    return out;
  }
  try {
    // Gloo's TCP transport behind our handshake: a stranger's connection never becomes a peer.
    auto device = make_guarded_device(options.bind_address, rank, std::move(secrets));
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options.timeout);
    // What Debian's Gloo reads one call at a time (store_adapter.h): first the host of each lower
    // rank ("rank_<r>", each rank's first key), then every peer's addresses ("<r>", each rank's
    // second key, set before it reads any of them).
    std::vector<std::vector<std::string>> peers(2);
    for (int r = 0; r < size; ++r) {
      if (r < rank) peers[0].push_back("rank_" + std::to_string(r));
      if (r != rank) peers[1].push_back(std::to_string(r));
    }
    if (peers[0].empty()) peers.erase(peers.begin());
    GlooStoreAdapter gloo_store(std::make_shared<PrefixStore>(std::shared_ptr<Store>(&store, [](Store*) {}), "gloo/"),
                                options.timeout, std::move(peers));
    context->connectFullMesh(gloo_store, device);
    out.context = std::move(context);
    // connectFullMesh can return on one rank while a peer is still connecting; a rank that
    // then left at once would break the peer's rendezvous. Leave only when all are connected.
    store.set(me + "/connected", "1");
    std::vector<std::string> connected;
    for (int r = 0; r < size; ++r) connected.push_back("rank/" + std::to_string(r) + "/connected");
    store.wait(connected, options.timeout);
  } catch (const std::exception& e) {
    if (!from_gloo(e)) throw;
    throw CommError("group rendezvous: connecting rank " + std::to_string(rank) + " (" + options.bind_address +
                        ") to its peers failed: " + e.what(),
                    "rendezvous");
  }
  return out;
}

}  // namespace dsgd::comm
