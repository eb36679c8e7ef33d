// LibTorch's CPU tensors of 1 MiB and more from a cache of mapped blocks, reused by size class.
//
//   torch_glue::install_cpu_cache();                // dsgd::init() does, unless DSGD_CPU_ALLOCATOR=default
//   auto s = torch_glue::cpu_cache_stats();         // s.mapped_bytes, s.cached_bytes, s.hits, ...
//   torch_glue::release_cpu_cache();                // every kept block back to the system
//
// Why: LibTorch 1.13 allocates a CPU tensor with posix_memalign(64); glibc serves that from a
// request 96 bytes larger than the tensor and gives the spare bytes back as small free chunks,
// which other allocations soon take. A freed tensor's chunk then cannot serve the next tensor of
// the same size (96 bytes short) and the heap grows instead. runtime::tune_malloc keeps big
// blocks in the heap (so steps do not fault their pages in again), which made that growth
// stay: a ZeRO rank of 20 x Linear(2000, 2000) held 1.17 GB of heap for 0.68 GB of live tensors.
// Here a block of a size class (page-rounded, 8 classes a doubling: at most 12.5% over the
// request) comes from mmap and, once freed, waits in the cache for the next request of its class,
// as PyTorch's CUDA caching allocator does for device memory. A block goes back to the system
// when the cache would hold more than `limit_bytes`, oldest first, or once it waited `idle`
// unused. Smaller tensors go to malloc as before.
//
// Thread-safe; fork-safe (the lock is held across fork and released on both sides). Memory comes
// back to the cache through the tensors' deleter, also after main() returns.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace dsgd::torch_glue {

struct CpuCacheOptions {
  // Tensors of fewer bytes go to malloc (c10's own allocation), not the cache.
  size_t min_bytes = size_t{1} << 20;
  // The most bytes of freed blocks kept for reuse; past it, the oldest go back first.
  // DSGD_CPU_CACHE_MIB sets it for dsgd::init's cache.
  size_t limit_bytes = size_t{1} << 30;
  // A kept block unused this long goes back to the system (checked as tensors come and go).
  std::chrono::milliseconds idle{10000};
};

struct CpuCacheStats {
  size_t mapped_bytes = 0;   // blocks held from the system: in tensors and in the cache
  size_t cached_bytes = 0;   // of which free, kept for reuse
  uint64_t hits = 0;         // requests served from the cache
  uint64_t misses = 0;       // requests that mapped a new block
  uint64_t released = 0;     // blocks given back to the system
};

// Makes the cache LibTorch's CPU allocator, with these options (a later call changes them and
// keeps the blocks). Tensors allocated before keep their own deleter.
void install_cpu_cache(const CpuCacheOptions& options = {});

// dsgd::init's call: installs the cache unless DSGD_CPU_ALLOCATOR=default; DSGD_CPU_CACHE_MIB
// sets limit_bytes (a value that is not a whole number of MiB is logged as a warning and the
// default kept). Returns whether it installed it.
bool install_cpu_cache_from_environment();

// Whether the cache is LibTorch's CPU allocator now.
bool cpu_cache_installed();

CpuCacheStats cpu_cache_stats();

// Gives every free block back to the system.
void release_cpu_cache();

// The bytes a request of `bytes` maps (its size class); the request itself under min_bytes.
size_t cpu_cache_class_bytes(size_t bytes);

}  // namespace dsgd::torch_glue
