// What dsgd's Gloo group needs from Gloo beyond its own calls: allreduce options for our data
// types and reduce ops, and which exceptions are Gloo's.
//
//   gloo::AllreduceOptions o(context);
//   configure_allreduce(o, data, count, DataType::kBFloat16, ReduceOp::kSum);
//   try { gloo::allreduce(o); } catch (const std::exception& e) { if (from_gloo(e)) ...; }
#pragma once

#include <gloo/allreduce.h>

#include <cstddef>
#include <exception>

#include "dsgd/comm/types.h"

namespace dsgd::comm {

// Sets `o` to reduce `count` elements of `type` in place on `data` with `op`; kAverage reduces
// as a sum (the caller divides). Float16 and bfloat16 travel as 2-byte elements and are
// combined in float32.
void configure_allreduce(gloo::AllreduceOptions& o, void* data, size_t count, DataType type, ReduceOp op);

// Whether Gloo raised `e`: its errors (gloo::Exception), and its failed checks (EnforceNotMet),
// which is how its TCP transport reports some broken connections: a killed peer's socket closed
// while an operation registers it with epoll gives "epoll_ctl: Bad file descriptor".
bool from_gloo(const std::exception& e);

}  // namespace dsgd::comm
