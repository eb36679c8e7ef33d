// glibc malloc settings for training processes, and the peak memory they reach.
//
//   runtime::tune_malloc();   // dsgd::init() calls it, first thing
//   double mib = runtime::peak_resident_mib();
//
// By default glibc hands big freed blocks back to the kernel (munmap above a moving mmap
// threshold, heap trimming past 128 KB free at the top), so every training step faults its
// activations and gradients back in as fresh zeroed pages: 20% of a CNN step on this project's
// machine (perf: exc_page_fault, clear_page_erms), the whole gap between our single-process loop
// and PyTorch's. tune_malloc() keeps them: blocks up to 32 MB (glibc's limit for this setting)
// come from the heap, and the heap is trimmed only once 1 GB is free at its top, so memory stays
// near the process's peak, as with the caching allocators PyTorch recommends (jemalloc,
// tcmalloc). It does nothing where GLIBC_TUNABLES names a malloc setting (the user's choice wins)
// or DSGD_MALLOC_TUNING=0. LibTorch tensors of 1 MiB and more do not come here: dsgd::init gives
// them a cache of their own (torch/memory/cpu_allocator.h), since freed tensor blocks in this heap
// could not serve the next tensor of their size. Torch-free.
#pragma once

namespace dsgd::runtime {

// Returns whether the settings were applied.
bool tune_malloc();

// This process's peak resident memory (VmHWM) in MiB; 0 where /proc does not say.
double peak_resident_mib();

}  // namespace dsgd::runtime
