// How host leaders talk to parameter-server shard processes (ps with placement "processes"):
// the messages of one request, shared by the client (ps.cpp) and the server (ps_server.cpp).
//
// The servers' group: host leaders are ranks 0..clients-1 (in leader order), shard s is rank
// clients + s. Every request (the seq-th of the job, the same seq on every leader) goes to every
// shard, also one whose slice is empty, so servers count requests as clients do:
//   leader -> shard   kRequest  a PsRequest (the same from every leader)
//                     kData     its sum of the shard's slice        (average, update; n > 0)
//                     kParams   leader 0 only, with kInit           (update; n > 0)
//                     kMomentum leader 0 only, with kHasMomentum    (update; n > 0)
//   shard -> leader   kReply    the average / the parameters / the momentum (n > 0)
//                     kFlag     one float: 1 = stepped (update) or has momentum (gather); else 0
// Torch-free; internal to dsgd_strategy.
#pragma once

#include <cstdint>

#include "strategy/strategy.h"

namespace dsgd::strategy::ps_wire {

enum class Op : uint32_t { kAverage = 1, kUpdate = 2, kGather = 3 };
enum Flags : uint32_t { kInit = 1, kHasMomentum = 2, kNesterov = 4 };
constexpr uint32_t kMagic = 0x64737073;  // "dsps": a peer of another protocol fails loudly

struct Request {
  uint32_t magic = kMagic;
  Op op = Op::kAverage;
  uint64_t key = 0;       // the bucket (update, gather)
  uint64_t count = 0;     // floats in this shard's slice
  uint32_t replicas = 0;  // the sum is divided by this
  uint32_t flags = 0;
  float lr = 0, momentum = 0, dampening = 0, weight_decay = 0;

  SgdOptions sgd() const {
    return {.lr = lr, .momentum = momentum, .dampening = dampening, .weight_decay = weight_decay,
            .nesterov = (flags & kNesterov) != 0};
  }
  void set_sgd(const SgdOptions& o) {
    lr = o.lr, momentum = o.momentum, dampening = o.dampening, weight_decay = o.weight_decay;
    if (o.nesterov) flags |= kNesterov;
  }
  bool same_as(const Request& o) const {
    return op == o.op && key == o.key && count == o.count && replicas == o.replicas;
  }
};

enum class Leg : uint32_t { kRequest = 0, kData = 1, kParams = 2, kMomentum = 3, kReply = 4, kFlag = 5 };

inline uint32_t tag(uint64_t seq, Leg leg) {
  return static_cast<uint32_t>(seq % (1u << 24)) * 8 + static_cast<uint32_t>(leg);
}

}  // namespace dsgd::strategy::ps_wire
