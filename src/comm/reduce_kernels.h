// Element-wise reductions on raw buffers: dst[i] = dst[i] op src[i]. Vectorised (AVX2 where the
// CPU has it, chosen at load time), type-erased so callers need no templates.
#pragma once

#include <cstddef>

#include "dsgd/comm/types.h"

namespace dsgd::comm {

// kAverage reduces as kSum; the caller divides.
void reduce_into(void* dst, const void* src, size_t count, DataType type, ReduceOp op);

// dst[i] /= divisor (integer division for kInt64).
void divide_by(void* dst, size_t count, DataType type, int divisor);

}  // namespace dsgd::comm
