#include "torch/memory/cpu_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dsgd/common/log.h"

namespace dsgd::torch_glue {

namespace {

using Clock = std::chrono::steady_clock;

size_t page_bytes() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

// Page-rounded, then up to a multiple of 1/8 of the power of two below it.
size_t class_bytes(size_t bytes) {
  const size_t page = page_bytes();
  size_t pages = (bytes + page - 1) / page;
  if (pages >= 16) {
    size_t top = 1;
    while (top * 2 <= pages) top *= 2;
    const size_t step = top / 8;
    pages = (pages + step - 1) / step * step;
  }
  return pages * page;
}

struct Kept {
  void* data;
  Clock::time_point since;
};

// The process's one cache: the tensors' deleter is a plain function, so it finds its blocks here.
class Pool {
 public:
  void configure(const CpuCacheOptions& options) {
    std::vector<std::pair<void*, size_t>> out;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      options_ = options;
      min_bytes_ = options.min_bytes;
      trim_locked(Clock::now(), &out);
    }
    unmap(out);
  }

  size_t min_bytes() const { return min_bytes_.load(std::memory_order_relaxed); }

  void* take(size_t bytes) {
    if (bytes < min_bytes()) return c10::alloc_cpu(bytes);
    const size_t size = class_bytes(bytes);
    std::vector<std::pair<void*, size_t>> out;
    void* data = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& kept = free_[size];
      if (!kept.empty()) {
        data = kept.back().data;  // the most recently freed: its pages are likeliest in cache
        kept.pop_back();
        cached_ -= size;
        ++stats_.hits;
        live_[data] = size;
      } else {
        ++stats_.misses;
      }
      trim_locked(Clock::now(), &out);
    }
    unmap(out);
    if (data != nullptr) return data;
    data = map(size);
    std::lock_guard<std::mutex> lock(mutex_);
    live_[data] = size;
    mapped_ += size;
    return data;
  }

  void give(void* data) {
    if (data == nullptr) return;
    if (reinterpret_cast<uintptr_t>(data) % page_bytes() != 0 || !keep(data)) {  // ours are mapped: page-aligned
      c10::free_cpu(data);
    }
  }

  CpuCacheStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    CpuCacheStats s = stats_;
    s.mapped_bytes = mapped_;
    s.cached_bytes = cached_;
    return s;
  }

  void release_all() {
    std::vector<std::pair<void*, size_t>> out;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [size, kept] : free_) {
        for (const auto& k : kept) out.emplace_back(k.data, size);
        kept.clear();
      }
      account_released_locked(out);
    }
    unmap(out);
  }

  // fork(): the lock is held across it, so the child never inherits it held by a thread it lacks.
  void lock_for_fork() { mutex_.lock(); }
  void unlock_after_fork() { mutex_.unlock(); }

 private:
  // Into the cache, if one of ours; false for malloc's (page-aligned by chance).
  bool keep(void* data) {
    std::vector<std::pair<void*, size_t>> out;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = live_.find(data);
      if (it == live_.end()) return false;
      const size_t size = it->second;
      live_.erase(it);
      const auto now = Clock::now();
      free_[size].push_back({data, now});
      cached_ += size;
      trim_locked(now, &out);
    }
    unmap(out);
    return true;
  }

  static void* map(size_t size) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(p != MAP_FAILED, "dsgd's CPU tensor cache: not enough memory: mmap of ", size, " bytes failed (",
                std::strerror(errno), "); DSGD_CPU_ALLOCATOR=default turns the cache off");
    return p;
  }
  static void unmap(const std::vector<std::pair<void*, size_t>>& blocks) {
    for (const auto& [data, size] : blocks) ::munmap(data, size);
  }

  // Over the limit: the oldest kept blocks go; every block kept longer than `idle` goes too.
  void trim_locked(Clock::time_point now, std::vector<std::pair<void*, size_t>>* out) {
    const bool sweep = now - last_sweep_ >= std::min<Clock::duration>(std::chrono::seconds(1), options_.idle);
    if (cached_ <= options_.limit_bytes && !sweep) return;
    const size_t first = out->size();
    if (sweep) {
      last_sweep_ = now;
      for (auto& [size, kept] : free_) {
        const auto stale = std::stable_partition(kept.begin(), kept.end(),
                                          [&](const Kept& k) { return now - k.since < options_.idle; });
        for (auto it = stale; it != kept.end(); ++it) out->emplace_back(it->data, size);
        kept.erase(stale, kept.end());
      }
    }
    account_released_locked({out->begin() + static_cast<std::ptrdiff_t>(first), out->end()});
    while (cached_ > options_.limit_bytes) {  // the oldest block of all: lists are few, oldest at the front
      std::vector<Kept>* oldest = nullptr;
      size_t oldest_size = 0;
      for (auto& [size, kept] : free_) {
        if (!kept.empty() && (oldest == nullptr || kept.front().since < oldest->front().since)) {
          oldest = &kept;
          oldest_size = size;
        }
      }
      out->emplace_back(oldest->front().data, oldest_size);
      oldest->erase(oldest->begin());
      account_released_locked({out->back()});
    }
  }

  void account_released_locked(const std::vector<std::pair<void*, size_t>>& blocks) {
    for (const auto& b : blocks) {
      cached_ -= b.second;
      mapped_ -= b.second;
      ++stats_.released;
    }
  }

  mutable std::mutex mutex_;
  CpuCacheOptions options_;
  std::atomic<size_t> min_bytes_{CpuCacheOptions{}.min_bytes};  // read without the lock: every tensor asks
  std::unordered_map<void*, size_t> live_;           // blocks in tensors, by address: their class
  std::unordered_map<size_t, std::vector<Kept>> free_;  // kept blocks by class, oldest first
  size_t mapped_ = 0, cached_ = 0;
  CpuCacheStats stats_;
  Clock::time_point last_sweep_ = Clock::now();
};

Pool& pool() {
  static Pool* const p = [] {  // never destroyed: tensors may be freed after main() returns
    auto* created = new Pool;
    ::pthread_atfork([] { pool().lock_for_fork(); }, [] { pool().unlock_after_fork(); },
                     [] { pool().unlock_after_fork(); });
    return created;
  }();
  return *p;
}

void give_back(void* data) { pool().give(data); }

// LibTorch's allocator interface. LibTorch 1.x declares allocate() const, 2.3 and later not, and
// adds copy_data(): both forms are here, each overriding where its LibTorch declares it.
class CachingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) const { return make(bytes); }
  c10::DataPtr allocate(size_t bytes) { return make(bytes); }
  c10::DeleterFnPtr raw_deleter() const override { return &give_back; }
  void copy_data(void* dest, const void* src, size_t count) const { std::memcpy(dest, src, count); }

 private:
  static c10::DataPtr make(size_t bytes) {
    void* data = pool().take(bytes);
    return {data, data, &give_back, c10::Device(c10::DeviceType::CPU)};
  }
};

CachingCpuAllocator& allocator() {
  static auto* const a = new CachingCpuAllocator;
  return *a;
}

}  // namespace

void install_cpu_cache(const CpuCacheOptions& options) {
  pool().configure(options);
  c10::SetCPUAllocator(&allocator(), /*priority=*/1);
}

bool install_cpu_cache_from_environment() {
  const char* choice = std::getenv("DSGD_CPU_ALLOCATOR");
  if (choice != nullptr && std::string(choice) == "default") return false;
  CpuCacheOptions options;
  if (const char* mib = std::getenv("DSGD_CPU_CACHE_MIB"); mib != nullptr && *mib != '\0') {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(mib, &end, 10);
    if (*end != '\0' || mib[0] == '-') {  // a warning, not an error: dsgd::init runs before any caller could catch
      dsgd::log().warn("DSGD_CPU_CACHE_MIB={}: expected a whole number of MiB, the most memory kept for reuse by CPU "
                       "tensors (0 keeps none); using {}", mib, options.limit_bytes >> 20);
    } else {
      options.limit_bytes = static_cast<size_t>(v) << 20;
    }
  }
  install_cpu_cache(options);
  return cpu_cache_installed();
}

bool cpu_cache_installed() { return c10::GetCPUAllocator() == &allocator(); }

CpuCacheStats cpu_cache_stats() { return pool().stats(); }

void release_cpu_cache() { pool().release_all(); }

size_t cpu_cache_class_bytes(size_t bytes) { return bytes < pool().min_bytes() ? bytes : class_bytes(bytes); }

}  // namespace dsgd::torch_glue
