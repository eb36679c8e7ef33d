// dsgd/comm/cuda.h — what the CUDA runtime says of this machine's GPUs, torch-free. In a build
// without CUDA (DSGD_CUDA) there are none.
#pragma once

#include <cstddef>

namespace dsgd::comm {

// The number of CUDA devices the runtime sees (0 without CUDA, or on error).
int cuda_device_count();
// Free and total memory of `device`, in bytes; false without CUDA or on error.
bool cuda_memory_info(int device, size_t* free_bytes, size_t* total_bytes);

}  // namespace dsgd::comm
