#include "strategy/ps_server.h"

#include <algorithm>
#include <string>
#include <vector>

#include "dsgd/common/error.h"
#include "strategy/ps_wire.h"

namespace dsgd::strategy {

using ps_wire::Leg;
using ps_wire::Op;
using ps_wire::tag;

// One request as it goes through the server: its headers, the leaders' sums (and start state),
// and the answer being sent.
struct PsServer::Request {
  uint64_t seq = 0;
  std::vector<ps_wire::Request> headers;
  std::vector<std::shared_ptr<comm::Work>> header_works;
  std::vector<float> sum;                  // leader 0's slice, then the sum, then the answer
  std::vector<std::vector<float>> pushed;  // leaders 1.. slices
  std::vector<float> init_params, init_momentum;
  std::vector<std::shared_ptr<comm::Work>> data_works;
  bool data_posted = false;
  float flag = 1;
  std::vector<std::shared_ptr<comm::Work>> reply_works;
};

PsServer::PsServer(std::shared_ptr<comm::Group> group, int clients, std::chrono::milliseconds idle_timeout)
    : group_(std::move(group)), clients_(clients), shard_(group_->rank() - clients), idle_timeout_(idle_timeout) {
  if (clients_ < 1 || shard_ < 0) {
    throw ConfigError("a ps shard's group needs the host leaders first (" + std::to_string(clients_) +
                      ") and the shard after them; this is rank " + std::to_string(group_->rank()));
  }
}

PsServer::~PsServer() = default;

// Two requests in flight: while request i's sums arrive and are summed, request i+1's headers
// (then its sums) are already posted, and request i's answer goes out while i+1 comes in. The
// leaders' sends wait for a posted receive, so without this every link would carry one
// direction at a time.
void PsServer::serve() {
  std::shared_ptr<Request> cur, next, previous;
  try {
    cur = post_headers(0);
    while (true) {
      comm::wait_all(cur->header_works);  // the first of a step may be a long time coming
      if (!cur->data_posted) {
        check_headers(*cur);
        post_data(*cur);
      }
      next = post_headers(cur->seq + 1);
      comm::wait_all(cur->data_works);
      // Where the next request is announced already, its receives are posted before this
      // answer is sent: a leader's send waits for the receive's notice, which would otherwise
      // queue behind the answer's bytes on the same connection (and pushes would not overlap
      // pulls).
      if (std::all_of(next->header_works.begin(), next->header_works.end(), [](const auto& w) { return w->test(); }) &&
          std::none_of(next->header_works.begin(), next->header_works.end(),
                       [](const auto& w) { return w->error(); })) {
        check_headers(*next);
        post_data(*next);
      }
      if (previous) comm::wait_all(previous->reply_works);  // its buffers go now
      answer(*cur);
      previous = std::move(cur);
      cur = std::move(next);
    }
  } catch (...) {
    // Nothing may land in the requests' buffers once they are gone.
    group_->abort("ps shard " + std::to_string(shard_) + " stopped serving");
    throw;
  }
}

std::shared_ptr<PsServer::Request> PsServer::post_headers(uint64_t seq) {
  auto r = std::make_shared<Request>();
  r->seq = seq;
  r->headers.resize(static_cast<size_t>(clients_));
  for (int c = 0; c < clients_; ++c) {
    r->header_works.push_back(group_->recv_async(&r->headers[static_cast<size_t>(c)], sizeof(ps_wire::Request), c,
                                                 tag(seq, Leg::kRequest), idle_timeout_));
  }
  return r;
}

void PsServer::check_headers(const Request& q) const {
  const auto& r = q.headers[0];
  for (size_t c = 0; c < q.headers.size(); ++c) {
    const auto& h = q.headers[c];
    if (h.magic != ps_wire::kMagic || !h.same_as(r) || r.replicas == 0 ||
        (r.op != Op::kAverage && r.op != Op::kUpdate && r.op != Op::kGather)) {
      throw Error("ps shard " + std::to_string(shard_) + ": request #" + std::to_string(q.seq) + " from leader " +
                  std::to_string(c) + " is malformed or differs from leader 0's (op " +
                  std::to_string(static_cast<uint32_t>(h.op)) + ", " + std::to_string(h.count) +
                  " floats); are all processes the same dsgd build?");
    }
  }
}

// The leaders' sums of this shard's slice (and, to start the shard, leader 0's state).
void PsServer::post_data(Request& q) {
  q.data_posted = true;
  const auto& r = q.headers[0];
  const size_t n = r.count;
  if (n == 0 || r.op == Op::kGather) return;
  q.sum.resize(n);
  q.pushed.resize(q.headers.size());
  for (size_t c = 0; c < q.headers.size(); ++c) {
    float* into = q.sum.data();
    if (c > 0) {
      q.pushed[c].resize(n);
      into = q.pushed[c].data();
    }
    q.data_works.push_back(group_->recv_async(into, n * sizeof(float), static_cast<int>(c), tag(q.seq, Leg::kData)));
  }
  if (r.op == Op::kUpdate && (r.flags & ps_wire::kInit) != 0) {
    q.init_params.resize(n);
    q.data_works.push_back(group_->recv_async(q.init_params.data(), n * sizeof(float), 0, tag(q.seq, Leg::kParams)));
    if ((r.flags & ps_wire::kHasMomentum) != 0) {
      q.init_momentum.resize(n);
      q.data_works.push_back(
          group_->recv_async(q.init_momentum.data(), n * sizeof(float), 0, tag(q.seq, Leg::kMomentum)));
    }
  }
}

// Sums in leader order (as the owners of the in-worker placement do), computes and posts the
// answer to every leader.
void PsServer::answer(Request& q) {
  const auto& r = q.headers[0];
  const size_t n = r.count;
  for (size_t c = 1; c < q.pushed.size(); ++c) {
    const float* part = q.pushed[c].data();
    for (size_t i = 0; i < n; ++i) q.sum[i] += part[i];
  }
  q.pushed.clear();
  const float scale = 1.0f / static_cast<float>(r.replicas);
  if (r.op == Op::kAverage) {
    for (float& v : q.sum) v *= scale;
  } else if (r.op == Op::kUpdate) {
    auto& st = state_[r.key];
    if ((r.flags & ps_wire::kInit) != 0) {
      st.start(q.init_params.data(), q.init_momentum.empty() ? nullptr : q.init_momentum.data(), n);
    } else if (st.params.size() != n) {
      throw Error("ps shard " + std::to_string(shard_) + " was asked to update bucket " + std::to_string(r.key) +
                  " whose parameters it never received (the replicas must start it with init)");
    }
    q.flag = n == 0 || st.step(r.sgd(), q.sum.data(), n, scale) ? 1.0f : 0.0f;
  } else {  // kGather
    auto it = state_.find(r.key);
    const bool has = n == 0 || (it != state_.end() && it->second.momentum.size() == n);
    q.flag = has ? 1.0f : 0.0f;
    q.sum.assign(n, 0.0f);
    if (has && n > 0) q.sum = it->second.momentum;  // a copy: the next request may step it
  }
  for (int c = 0; c < clients_; ++c) {
    if (n > 0) q.reply_works.push_back(group_->send_async(q.sum.data(), n * sizeof(float), c, tag(q.seq, Leg::kReply)));
    q.reply_works.push_back(group_->send_async(&q.flag, sizeof(q.flag), c, tag(q.seq, Leg::kFlag)));
  }
}

}  // namespace dsgd::strategy
