// LibTorch's choice of CPU kernels in training processes.
//
//   runtime::choose_cpu_kernels();   // dsgd::init() calls it, before any tensor is made
//
// LibTorch 1.13 (Debian 12's) runs its own vectorised kernels (elementwise arithmetic, GELU,
// softmax, LayerNorm, the optimizers' updates) as AVX2 code even on CPUs with AVX-512: that
// release made AVX-512 opt-in (ATEN_CPU_CAPABILITY=avx512) after it ran slower on CPUs that lower
// their clock for it (pytorch/pytorch#80252). LibTorch 2 picks AVX-512 again where the CPU has
// AVX-512 VL, BW and DQ and FMA. This does what LibTorch 2 does, for a LibTorch that reads
// ATEN_CPU_CAPABILITY: it sets it to avx512 on such a CPU, unless ATEN_CPU_CAPABILITY is already
// set (the user's choice wins) or DSGD_CPU_KERNELS=default. On this project's machine (AMD EPYC,
// AVX-512 at full clock) a gpt-small step at 1 worker is 4-7% faster with it. Matrix products
// (OpenBLAS, oneDNN) choose their own code either way. Torch-free.
#pragma once

namespace dsgd::runtime {

// Whether this CPU has what LibTorch 2 asks of AVX-512 kernels: AVX-512 VL, BW, DQ and FMA.
bool cpu_has_avx512_kernels();

// Returns whether it set ATEN_CPU_CAPABILITY.
bool choose_cpu_kernels();

}  // namespace dsgd::runtime
