// A build without CUDA and NCCL (DSGD_CUDA=OFF, or neither found): the NCCL group's entry
// points say so instead of failing to link.
#include "dsgd/comm/nccl_group.h"
#include "dsgd/common/error.h"

namespace dsgd::comm {

int cuda_device_count() { return 0; }
bool cuda_memory_info(int, size_t*, size_t*) { return false; }
bool nccl_available() { return false; }

std::unique_ptr<Group> make_nccl_group(std::shared_ptr<Store>, int, int, const NcclOptions&) {
  throw ConfigError(
      "this dsgd was built without NCCL: configure with -DDSGD_CUDA=ON where the CUDA toolkit and "
      "NCCL are installed (CUDAToolkit_ROOT, NCCL_ROOT), or use the host-staged path (Gloo, shared memory)");
}

}  // namespace dsgd::comm
