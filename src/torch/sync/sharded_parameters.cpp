// ZeRO stage 3's parameters (torch/sync/sharded_parameters.h).
#include "torch/sync/sharded_parameters.h"

#include <torch/utils.h>

#include <sys/mman.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <string>

#include "dsgd/common/error.h"

namespace dsgd::torch_glue {
namespace {

// A bucket's whole buffer is a mapping of its own, not LibTorch's allocator's (whose cache would
// keep a released bucket's pages). Released, its pages go back to the system and it turns
// read-only: it holds no page (a read maps the kernel's zero page), reads give zeros, a write
// faults, and a view of a released parameter stays in bounds, so a forward that reads a layer it
// did not name reads zeros, not freed memory (the checked step then names it: UnitGathers).
// Gathered, it is writable again and fills page by page.
std::mutex released_mutex;
std::map<uintptr_t, size_t> released_ranges;  // start -> bytes, guarded by released_mutex

torch::Tensor map_buffer(size_t floats) {
  const size_t bytes = floats * sizeof(float);
  if (bytes == 0) return torch::empty({0}, torch::kFloat32);
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (data == MAP_FAILED) {
    throw Error("ZeRO stage 3: no memory for a bucket of " + std::to_string(bytes) + " bytes");
  }
  // Huge pages where the kernel has them: a gather faults 2 MiB at a time, not 4 KiB (a step of
  // the ZeRO recipe gathers 640 MB).
  ::madvise(data, bytes, MADV_HUGEPAGE);
  return torch::from_blob(data, {static_cast<int64_t>(floats)}, [bytes](void* p) { ::munmap(p, bytes); },
                          torch::kFloat32);
}

void release_pages(const torch::Tensor& t) {
  const size_t bytes = t.nbytes();
  if (bytes == 0) return;
  void* data = t.data_ptr();
  if (::madvise(data, bytes, MADV_DONTNEED) != 0 || ::mprotect(data, bytes, PROT_READ) != 0) {
    throw Error("ZeRO stage 3: could not release a bucket of " + std::to_string(bytes) + " bytes");
  }
  std::lock_guard<std::mutex> lock(released_mutex);
  released_ranges[reinterpret_cast<uintptr_t>(data)] = bytes;
}

void take_pages(const torch::Tensor& t) {
  const size_t bytes = t.nbytes();
  if (bytes == 0) return;
  void* data = t.data_ptr();
  {
    std::lock_guard<std::mutex> lock(released_mutex);
    released_ranges.erase(reinterpret_cast<uintptr_t>(data));
  }
  if (::mprotect(data, bytes, PROT_READ | PROT_WRITE) != 0) {
    throw Error("ZeRO stage 3: could not take back a bucket of " + std::to_string(bytes) + " bytes");
  }
}

int64_t i64(size_t n) { return static_cast<int64_t>(n); }

}  // namespace

bool released_memory(const torch::Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.storage().data() == nullptr) return false;
  const auto at = reinterpret_cast<uintptr_t>(t.storage().data());
  std::lock_guard<std::mutex> lock(released_mutex);
  auto it = released_ranges.upper_bound(at);
  if (it == released_ranges.begin()) return false;
  --it;
  return at < it->first + it->second;
}

ShardedParameters::ShardedParameters(std::vector<torch::Tensor> params, const strategy::BucketPlan& plan,
                                     const strategy::ShardLayout& layout)
    : params_(std::move(params)), plan_(plan), layout_(layout) {
  torch::NoGradGuard no_grad;
  for (const auto& p : params_) {
    require_checked(p.device().is_cpu() && p.scalar_type() == torch::kFloat32 && p.is_non_overlapping_and_dense(),
                    "stage 3's parameters are dense float32 on the CPU (validate_zero, check_shardable)");
    strides_.emplace_back(p.strides().begin(), p.strides().end());
  }
  // A bucket at a time: each parameter's own memory goes as its bucket's buffer takes its values,
  // so the move holds one bucket more than the model, not a second model.
  const auto& buckets = plan_.buckets();
  buckets_.resize(buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    buckets_[b].whole = map_buffer(layout_.padded(b));  // zeros, as a fresh mapping is
    for (size_t i : buckets[b].params) {
      auto view = view_of(i);
      view.copy_(params_[i]);
      params_[i].set_data(view);
    }
  }
  shard_ = torch::zeros({i64(layout_.shard_elements())}, torch::kFloat32);
  store();
}

ShardedParameters::~ShardedParameters() {
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].state == State::kGathering) {
      try {
        wait(b);
        continue;
      } catch (...) {  // an aborted group: this replica's block, as for a released bucket
        buckets_[b].state = State::kReleased;
      }
    }
    if (buckets_[b].state != State::kReleased) continue;
    allocate(b, /*fill_nan=*/true);
    const auto block = i64(layout_.block(b));
    buckets_[b]
        .whole.narrow(0, layout_.rank() * block, block)
        .copy_(shard_.narrow(0, i64(layout_.shard_offset(b)), block));
  }
}

bool ShardedParameters::same_layout(const std::vector<torch::Tensor>& params,
                                    const strategy::ShardLayout& layout) const {
  if (params.size() != params_.size() || layout.shards() != layout_.shards() || layout.rank() != layout_.rank() ||
      layout.shard_elements() != layout_.shard_elements()) {
    return false;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].unsafeGetTensorImpl() != params_[i].unsafeGetTensorImpl()) return false;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (layout.padded(b) != layout_.padded(b)) return false;
  }
  return true;
}

torch::Tensor ShardedParameters::view_of(size_t param) const {
  const auto& slot = plan_.slot(param);
  const auto& bucket = plan_.buckets()[slot.bucket];
  return buckets_[slot.bucket].whole.as_strided(params_[param].sizes(), strides_[param],
                                                i64(slot.offset - bucket.offset));
}

void ShardedParameters::allocate(size_t bucket, bool fill_nan) {
  const auto& t = buckets_[bucket].whole;
  take_pages(t);
  if (fill_nan) t.fill_(std::numeric_limits<float>::quiet_NaN());
  buckets_[bucket].state = State::kResident;
}

void ShardedParameters::gather(size_t bucket) {
  if (buckets_[bucket].state != State::kReleased) return;
  require_checked(sharing_ != nullptr, "a stage-3 gather has its group (ZeroShare::partition sets it)");
  allocate(bucket, /*fill_nan=*/false);
  const size_t block = layout_.block(bucket);
  if (block == 0) return;
  buckets_[bucket].state = State::kGathering;
  buckets_[bucket].work = sharing_->allgather_async(shard_.data_ptr<float>() + layout_.shard_offset(bucket),
                                                    buckets_[bucket].whole.data_ptr<float>(), block);
}

void ShardedParameters::wait(size_t bucket) {
  if (buckets_[bucket].state != State::kGathering) return;
  auto work = std::move(buckets_[bucket].work);
  try {
    work->wait();
  } catch (...) {
    release_pages(buckets_[bucket].whole);
    buckets_[bucket].state = State::kReleased;
    throw;
  }
  buckets_[bucket].state = State::kResident;
}

void ShardedParameters::release(size_t bucket) {
  if (buckets_[bucket].state == State::kGathering) {
    try {
      wait(bucket);
    } catch (...) {  // released all the same; the gather's error reaches whoever waits for the step
    }
  }
  if (buckets_[bucket].state == State::kReleased) return;
  release_pages(buckets_[bucket].whole);
  buckets_[bucket].state = State::kReleased;
}

bool ShardedParameters::all_resident() const {
  return std::all_of(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.state == State::kResident; });
}

void ShardedParameters::gather_all() {
  for (size_t b = 0; b < buckets_.size(); ++b) gather(b);
  for (size_t b = 0; b < buckets_.size(); ++b) wait(b);
}

void ShardedParameters::release_all() {
  for (size_t b = 0; b < buckets_.size(); ++b) release(b);
}

void ShardedParameters::allocate_all() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].state == State::kReleased) allocate(b, /*fill_nan=*/true);
  }
}

void ShardedParameters::store() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const size_t b = plan_.slot(i).bucket;
    require_checked(buckets_[b].state == State::kResident,
                    "a stage-3 store finds every bucket whole (allocate_all first)");
    auto& p = params_[i];
    auto view = view_of(i);
    const bool in_place = p.storage().unsafeGetStorageImpl() == buckets_[b].whole.storage().unsafeGetStorageImpl() &&
                          p.storage_offset() == view.storage_offset() && p.strides() == view.strides();
    if (in_place) continue;
    view.copy_(p);
    p.set_data(view);
  }
  const auto rank = layout_.rank();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto block = i64(layout_.block(b));
    shard_.narrow(0, i64(layout_.shard_offset(b)), block).copy_(buckets_[b].whole.narrow(0, rank * block, block));
  }
}

torch::Tensor ShardedParameters::piece(size_t param) const {
  const auto& p = layout_.piece(param);
  return p.count == 0 ? torch::Tensor() : shard_.narrow(0, i64(p.shard), i64(p.count));
}

size_t ShardedParameters::bytes() const {
  size_t n = static_cast<size_t>(shard_.nbytes());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].state != State::kReleased) n += layout_.padded(b) * sizeof(float);
  }
  return n;
}

}  // namespace dsgd::torch_glue
