#include "comm/gloo/gloo_calls.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>

#include <cstring>
#include <utility>

#include "comm/reduce_kernels.h"

namespace dsgd::comm {
namespace {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
void set_allreduce_buffer(gloo::AllreduceOptions& o, void* data, size_t count, ReduceOp op) {
  o.setOutput<T>(static_cast<T*>(data), count);
  o.setReduceFunction(op == ReduceOp::kMax ? static_cast<ReduceFn>(&gloo::max<T>)
                                           : static_cast<ReduceFn>(&gloo::sum<T>));
}

}  // namespace

void configure_allreduce(gloo::AllreduceOptions& o, void* data, size_t count, DataType type, ReduceOp op) {
  switch (type) {
    case DataType::kFloat32: set_allreduce_buffer<float>(o, data, count, op); break;
    case DataType::kFloat64: set_allreduce_buffer<double>(o, data, count, op); break;
    case DataType::kInt64: set_allreduce_buffer<int64_t>(o, data, count, op); break;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      o.setOutput<uint16_t>(static_cast<uint16_t*>(data), count);
      o.setReduceFunction([type, op](void* c, const void* a, const void* b, size_t n) {
        if (c == b) std::swap(a, b);  // c op= the other operand (both ops commute)
        if (c != a) std::memcpy(c, a, n * 2);
        reduce_into(c, b, n, type, op);
      });
      break;
  }
}

bool from_gloo(const std::exception& e) {
  return dynamic_cast<const gloo::Exception*>(&e) != nullptr || dynamic_cast<const gloo::EnforceNotMet*>(&e) != nullptr;
}

}  // namespace dsgd::comm
