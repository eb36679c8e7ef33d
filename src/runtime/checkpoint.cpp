#include "runtime/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dsgd/error.h"

namespace dsgd::runtime {
namespace {

constexpr const char* kFormat = "dsgd-checkpoint";
constexpr int kVersion = 1;

uint32_t crc_of(const std::string& bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  size_t off = 0;
  while (off < bytes.size()) {
    const size_t n = std::min<size_t>(bytes.size() - off, 1u << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + off), static_cast<uInt>(n));
    off += n;
  }
  return static_cast<uint32_t>(crc);
}

void write_all(int fd, const std::string& bytes, const std::string& path) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw DataError(path, std::string("cannot write: ") + std::strerror(errno));
    }
    off += static_cast<size_t>(n);
  }
}

void write_atomically(const std::filesystem::path& path, const std::string& bytes) {
  const std::string tmp = path.string() + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw DataError(tmp, std::string("cannot create: ") + std::strerror(errno));
  try {
    write_all(fd, bytes, tmp);
    if (::fsync(fd) != 0) throw DataError(tmp, std::string("fsync failed: ") + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw DataError(path.string(), std::string("cannot rename into place: ") + std::strerror(errno));
  }
  const int dfd = ::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace

void write_checkpoint(const std::string& dir, const Checkpoint& checkpoint, const std::string& model_pickle) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw DataError(dir, "cannot create the checkpoint directory: " + ec.message());
  nlohmann::json header = checkpoint.header;
  header["format"] = kFormat;
  header["version"] = kVersion;
  header["state_bytes"] = checkpoint.state.size();
  header["state_crc32"] = crc_of(checkpoint.state);
  write_atomically(std::filesystem::path(dir) / "checkpoint.dsgd", header.dump() + "\n" + checkpoint.state);
  if (!model_pickle.empty()) write_atomically(std::filesystem::path(dir) / "model.pt", model_pickle);
}

Checkpoint read_checkpoint(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "checkpoint.dsgd").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw DataError(path, std::filesystem::exists(dir) ? "no checkpoint here (checkpoint.dsgd missing)"
                                                       : "no such checkpoint directory");
  }
  std::string line;
  if (!std::getline(in, line)) throw DataError(path, "empty file: not a dsgd checkpoint");
  Checkpoint c;
  try {
    c.header = nlohmann::json::parse(line);
  } catch (const std::exception&) {
    throw DataError(path, "the header is not valid JSON: not a dsgd checkpoint, or damaged");
  }
  if (!c.header.is_object() || c.header.value("format", "") != kFormat) {
    throw DataError(path, "not a dsgd checkpoint (format field missing)");
  }
  if (c.header.value("version", 0) != kVersion) {
    throw DataError(path, "checkpoint version " + std::to_string(c.header.value("version", 0)) +
                              " is not supported by this build (version " + std::to_string(kVersion) + ")");
  }
  std::ostringstream rest;
  rest << in.rdbuf();
  c.state = rest.str();
  const size_t expected = c.header.value("state_bytes", size_t{0});
  if (c.state.size() != expected) {
    throw DataError(path, "truncated or damaged: " + std::to_string(c.state.size()) + " state bytes, header says " +
                              std::to_string(expected));
  }
  if (crc_of(c.state) != c.header.value("state_crc32", uint32_t{0})) {
    throw DataError(path, "checksum mismatch: the file is damaged");
  }
  return c;
}

}  // namespace dsgd::runtime
