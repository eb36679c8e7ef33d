#include "data/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "dsgd/common/error.h"

namespace dsgd::data {
namespace {

constexpr uint8_t kTypeUnsignedByte = 0x08;
constexpr int kMaxDims = 8;

uint32_t read_be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Decompresses (or just reads, for plain files: zlib passes them through) the whole file.
std::string read_maybe_gzipped(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw DataError(path, "file not found");
  if (std::filesystem::is_directory(path, ec)) throw DataError(path, "is a directory, not a file");
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw DataError(path, std::string("cannot open: ") + std::strerror(errno));
  gzbuffer(f, 1 << 20);
  std::string out;
  char buf[1 << 16];
  while (true) {
    int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      throw DataError(path, "corrupt gzip stream (" + msg + ")");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > kMaxIdxBytes + 4096) {
      gzclose(f);
      throw DataError(path, "larger than the 4 GiB limit for IDX files");
    }
  }
  // A gzip stream cut short reads as a clean EOF on some zlib versions; gzclose reports it.
  int rc = gzclose(f);
  if (rc == Z_BUF_ERROR) throw DataError(path, "truncated gzip stream (the file ends mid-stream)");
  if (rc != Z_OK) throw DataError(path, "corrupt gzip stream (gzclose returned " + std::to_string(rc) + ")");
  return out;
}

}  // namespace

std::string IdxArray::shape_string() const {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? " x " : "") + std::to_string(dims[i]);
  return s.empty() ? "(scalar)" : s;
}

IdxArray parse_idx(std::string_view bytes, const std::string& name) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < 4) {
    throw DataError(name, "too short for an IDX header: " + std::to_string(bytes.size()) +
                              " bytes (is it an IDX file?)");
  }
  if (p[0] != 0 || p[1] != 0) {
    char magic[16];
    std::snprintf(magic, sizeof(magic), "%02x%02x%02x%02x", p[0], p[1], p[2], p[3]);
    throw DataError(name, std::string("bad magic 0x") + magic +
                              ": an IDX file starts with two zero bytes (is it an IDX file?)");
  }
  if (p[2] != kTypeUnsignedByte) {
    char type[8];
    std::snprintf(type, sizeof(type), "0x%02x", p[2]);
    throw DataError(name, std::string("unsupported IDX element type ") + type +
                              "; only unsigned bytes (0x08) are supported");
  }
  const int ndims = p[3];
  if (ndims < 1 || ndims > kMaxDims) {
    throw DataError(name, "bad IDX header: " + std::to_string(ndims) +
                              " dimensions (expected 1 to " + std::to_string(kMaxDims) + ")");
  }
  const size_t header = 4 + 4 * static_cast<size_t>(ndims);
  if (bytes.size() < header) {
    throw DataError(name, "truncated IDX header: " + std::to_string(ndims) + " dimensions need " +
                              std::to_string(header) + " header bytes, the file has " +
                              std::to_string(bytes.size()));
  }
  IdxArray out;
  uint64_t elements = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint32_t dim = read_be32(p + 4 + 4 * d);
    out.dims.push_back(dim);
    elements = dim == 0 ? 0 : (elements > kMaxIdxBytes / dim ? kMaxIdxBytes + 1 : elements * dim);
  }
  if (elements > kMaxIdxBytes) {
    throw DataError(name, "IDX header promises " + out.shape_string() +
                              " elements, over the 4 GiB limit (corrupt header?)");
  }
  const uint64_t have = bytes.size() - header;
  if (have < elements) {
    throw DataError(name, "truncated data: the header promises " + out.shape_string() + " = " +
                              std::to_string(elements) + " bytes, the file holds " +
                              std::to_string(have));
  }
  if (have > elements) {
    throw DataError(name, std::to_string(have - elements) + " unexpected bytes after the " +
                              out.shape_string() + " data (wrong or damaged file?)");
  }
  out.data.assign(p + header, p + header + elements);
  return out;
}

IdxArray read_idx(const std::string& path) { return parse_idx(read_maybe_gzipped(path), path); }

}  // namespace dsgd::data
