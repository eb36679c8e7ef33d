// libFuzzer target: any bytes as an IDX file (plain or gzipped), the format of Fashion-MNIST.
// The only acceptable outcomes are an IdxArray whose data matches its dimensions, or a
// dsgd::DataError; anything else is a bug. Run with tests/fuzz/run.sh.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

#include "data/idx.h"
#include "dsgd/common/error.h"

namespace {

// Gzipped inputs go through the file reader (zlib's gz* API reads files).
dsgd::data::IdxArray read(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (size < 2 || data[0] != 0x1f || data[1] != 0x8b) return dsgd::data::parse_idx(bytes, "fuzz-input");
  static const std::string path = "/tmp/dsgd-idx-fuzz-" + std::to_string(::getpid()) + ".gz";
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(size));
  return dsgd::data::read_idx(path);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto a = read(data, size);
    uint64_t n = 1;
    for (int64_t d : a.dims) n *= static_cast<uint64_t>(d);
    if (a.dims.empty() || n != a.data.size()) __builtin_trap();
  } catch (const dsgd::DataError&) {
  }
  return 0;
}
