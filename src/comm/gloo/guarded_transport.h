// Gloo's TCP transport with a handshake of our own in front of every data connection, so a
// connection that does not belong to the group never takes a real peer's place.
//
// Why: in Debian's Gloo each pair of ranks meets over a listening socket of its own (an ephemeral
// port, backlog 1) that accepts the *first* connection to arrive as the peer and then closes. A
// port scanner's probe, a half-open client or any stray connection that arrives first becomes
// "the peer", and the real peer's connect is refused: the group cannot form. Here the listening
// side keeps accepting, holds each newcomer as a candidate until it has sent the 32-byte hello
// the real peer sends first, and drops every candidate that sends anything else, closes, or
// stays silent while others come. The hello proves that the connecting rank knows its secret,
// 16 bytes drawn at random by each rank for each formation and exchanged through the job's store
// (readable only with the job token, under the generation's prefix), without sending it: it
// carries an HMAC-SHA256 of the pair's two ranks under that secret (pair_hello). A stranger
// cannot produce it, a recording of it reveals no secret and opens no other pair, and an old
// formation's does not open a new one's. It authenticates who connects; it does not encrypt
// what follows.
//
//   auto device = make_guarded_device("127.0.0.1", rank, secrets);   // secrets[r]: rank r's
//   context->connectFullMesh(store, device);                          // as with tcp::CreateDevice
//
// Thread-safety: as Gloo's device. Errors: creating the device throws gloo::Exception like
// gloo::transport::tcp::CreateDevice; a failed handshake never throws, it drops the connection.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gloo::transport {
class Device;
}

namespace dsgd::comm {

// A rank's per-formation secret, sent by it in the hello of every connection it opens.
using PairSecret = std::array<uint8_t, 16>;

// A fresh secret from the operating system's random source.
PairSecret random_pair_secret();

// The 32 bytes the connecting rank sends first: "dsgdpair", the listener's rank and the
// connector's (big-endian u32), then the first 16 bytes of HMAC-SHA256(connector_secret, those
// 16 bytes). The listener expects exactly this from the one rank that connects to it.
using PairHello = std::array<uint8_t, 32>;
PairHello pair_hello(int listener_rank, int connector_rank, const PairSecret& connector_secret);

// The device for one group formation: `rank` is this process's rank, `secrets[r]` rank r's
// secret (all ranks, this one included). `bind_address` as gloo::transport::tcp::attr's hostname.
std::shared_ptr<gloo::transport::Device> make_guarded_device(const std::string& bind_address, int rank,
                                                             std::vector<PairSecret> secrets);

}  // namespace dsgd::comm
