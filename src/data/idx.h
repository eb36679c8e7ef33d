// IDX reader: the file format of MNIST and Fashion-MNIST, optionally gzipped. Torch-free.
//
//   dsgd::data::IdxArray a = dsgd::data::read_idx("/usr/share/datasets/fashion-mnist/"
//                                                 "t10k-labels-idx1-ubyte.gz");
//   // a.dims == {10000}, a.data.size() == 10000
//
// Format (big-endian): two zero bytes, a type byte (0x08 = unsigned byte, the only type
// supported), a byte with the number of dimensions, then one uint32 per dimension, then the
// elements, row-major. Anything else — a short header, a wrong magic, too little or too much
// data — throws dsgd::DataError naming the file and the problem. Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsgd::data {

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> data;  // product(dims) bytes, row-major

  int64_t count() const { return dims.empty() ? 0 : dims[0]; }
  std::string shape_string() const;  // "60000 x 28 x 28"
};

// Largest payload accepted (4 GiB): guards against headers that promise absurd sizes.
inline constexpr uint64_t kMaxIdxBytes = uint64_t{1} << 32;

// Reads and parses `path`; gzip is detected by content, so plain files work too.
IdxArray read_idx(const std::string& path);

// Parses IDX bytes already in memory. `name` is used in error messages (usually the path).
IdxArray parse_idx(std::string_view bytes, const std::string& name);

}  // namespace dsgd::data
