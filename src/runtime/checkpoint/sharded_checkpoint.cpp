// Sharded checkpoints: the shares' files, the manifest, the commit, the reader
// (runtime/checkpoint/sharded_checkpoint.h).
#include "runtime/checkpoint/sharded_checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dsgd/common/error.h"
#include "runtime/driver/checkpoint.h"

namespace dsgd::runtime {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "dsgd-sharded-checkpoint";
constexpr int kVersion = 1;
constexpr uint64_t kAlign = 4096;

uint32_t crc_of(const char* data, size_t n) {
  return static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(data), static_cast<uInt>(n)));
}

size_t element_bytes(const std::string& dtype, const std::string& name) {
  static const std::map<std::string, size_t> sizes = {{"Float", 4}, {"Double", 8}, {"Half", 2},  {"BFloat16", 2},
                                                      {"Long", 8},  {"Int", 4},    {"Short", 2}, {"Char", 1},
                                                      {"Byte", 1},  {"Bool", 1}};
  const auto it = sizes.find(dtype);
  if (it == sizes.end())
    throw Error("sharded checkpoint: tensor " + name + " has the unknown data type '" + dtype + "'");
  return it->second;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

std::string manifest_text(nlohmann::json manifest) {
  manifest.erase("crc32");
  return manifest.dump();
}

}  // namespace

std::string share_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "share-%05d.bin", rank);
  return name;
}

StagedFile::StagedFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
  if (fd_ < 0 && errno == EINVAL) {
    direct_ = false;
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  if (fd_ < 0) throw DataError(path_, std::string("cannot create: ") + std::strerror(errno));
  buf_.reset(static_cast<char*>(std::aligned_alloc(kAlign, kStage)));
  if (!buf_) throw Error("sharded checkpoint: no memory for a " + std::to_string(kStage) + "-byte write buffer");
}

StagedFile::~StagedFile() {
  if (fd_ >= 0) ::close(fd_);
}

void StagedFile::put(const char* data, size_t n) {
  while (n > 0) {
    const size_t k = std::min(n, kStage - fill_);
    std::memcpy(buf_.get() + fill_, data, k);
    fill_ += k, data += k, n -= k;
    if (fill_ == kStage) drain(kStage);
  }
}

void StagedFile::pad_to(uint64_t align) {
  static const std::string zeros(kAlign, '\0');
  put(zeros.data(), (align - at() % align) % align);
}

void StagedFile::finish() {
  const uint64_t total = at();
  if (fill_ > 0) {
    const size_t n = direct_ ? (fill_ + kAlign - 1) / kAlign * kAlign : fill_;
    std::memset(buf_.get() + fill_, 0, n - fill_);
    drain(n);
  }
  if (::ftruncate(fd_, static_cast<off_t>(total)) != 0) {  // a direct write's padding cut off
    throw DataError(path_, std::string("cannot set its length: ") + std::strerror(errno));
  }
  if (::fsync(fd_) != 0) throw DataError(path_, std::string("fsync failed: ") + std::strerror(errno));
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) throw DataError(path_, std::string("cannot close: ") + std::strerror(errno));
}

void StagedFile::drain(size_t n) {
  const char* p = buf_.get();
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EINVAL && direct_) {  // opened direct, but its writes are refused: buffered
      direct_ = false;
      ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT);
      continue;
    }
    if (w < 0) throw DataError(path_, std::string("cannot write: ") + std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
  written_ += fill_;
  fill_ = 0;
}

nlohmann::json write_share_file(const std::string& path, const torch_glue::StateShare& share) {
  StagedFile out(path);
  nlohmann::json regions = nlohmann::json::array();
  for (const auto& r : share.regions) {
    out.pad_to(kAlign);
    const uint64_t offset = out.at();
    const auto* data = static_cast<const char*>(r.data);
    nlohmann::json crcs = nlohmann::json::array();
    for (size_t off = 0; off < r.bytes; off += kShareChunkBytes) {
      const size_t n = std::min(kShareChunkBytes, r.bytes - off);
      crcs.push_back(crc_of(data + off, n));
      out.put(data + off, n);
    }
    regions.push_back({{"name", r.name},
                       {"dtype", r.dtype},
                       {"shape", r.shape},
                       {"begin", r.begin},
                       {"count", r.count},
                       {"offset", offset},
                       {"bytes", r.bytes},
                       {"crc32", std::move(crcs)}});
  }
  const uint64_t bytes = out.at();
  out.finish();
  return {{"file", fs::path(path).filename().string()}, {"bytes", bytes}, {"regions", std::move(regions)}};
}

nlohmann::json make_manifest(nlohmann::json header, const std::vector<nlohmann::json>& files, int world) {
  nlohmann::json tensors = nlohmann::json::object(), blobs = nlohmann::json::object(), list = nlohmann::json::array();
  for (size_t f = 0; f < files.size(); ++f) {
    list.push_back({{"name", files[f].at("file")}, {"bytes", files[f].at("bytes")}});
    for (const auto& r : files[f].at("regions")) {
      const std::string name = r.at("name");
      if (r.at("dtype").get<std::string>().empty()) {
        if (blobs.contains(name)) throw Error("sharded checkpoint: two shares wrote the blob " + name);
        blobs[name] = {{"file", f}, {"offset", r.at("offset")}, {"bytes", r.at("bytes")}, {"crc32", r.at("crc32")}};
        continue;
      }
      auto& t = tensors[name];
      if (t.is_null()) {
        t = {{"dtype", r.at("dtype")}, {"shape", r.at("shape")}, {"ranges", nlohmann::json::array()}};
      } else if (t.at("dtype") != r.at("dtype") || t.at("shape") != r.at("shape")) {
        throw Error("sharded checkpoint: the shares disagree on the type or shape of " + name);
      }
      if (r.at("count").get<int64_t>() == 0) continue;
      t["ranges"].push_back({{"file", f},
                             {"offset", r.at("offset")},
                             {"begin", r.at("begin")},
                             {"count", r.at("count")},
                             {"crc32", r.at("crc32")}});
    }
  }
  for (auto& [name, t] : tensors.items()) {
    auto& ranges = t["ranges"];
    std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) {
      return a.at("begin").template get<int64_t>() < b.at("begin").template get<int64_t>();
    });
    int64_t next = 0;
    for (const auto& r : ranges) {
      const int64_t begin = r.at("begin"), count = r.at("count");
      if (begin != next) {
        throw Error("sharded checkpoint: tensor " + name + ": elements from " + std::to_string(std::min(begin, next)) +
                    (begin > next ? " are in no share" : " are in two shares") +
                    " (a replica's share is missing or wrong)");
      }
      next = begin + count;
    }
    if (next != numel_of(t.at("shape").get<std::vector<int64_t>>())) {
      throw Error("sharded checkpoint: tensor " + name + ": elements from " + std::to_string(next) +
                  " are in no share");
    }
  }
  nlohmann::json manifest = {{"format", kFormat},
                             {"version", kVersion},
                             {"header", std::move(header)},
                             {"world", world},
                             {"chunk_bytes", kShareChunkBytes},
                             {"files", std::move(list)},
                             {"tensors", std::move(tensors)},
                             {"blobs", std::move(blobs)}};
  manifest["crc32"] = crc_of(manifest_text(manifest));
  return manifest;
}

std::string sharded_temp_dir(const std::string& dir) {
  static std::atomic<int> counter{0};
  const fs::path target = fs::absolute(fs::path(dir)).lexically_normal();
  const fs::path parent = target.has_filename() ? target.parent_path() : target.parent_path().parent_path();
  const std::string name =
      target.has_filename() ? target.filename().string() : target.parent_path().filename().string();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw DataError(parent.string(), "cannot create: " + ec.message());
  const fs::path tmp = parent / ("." + name + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec) || ec) throw DataError(tmp.string(), "cannot create: " + ec.message());
  return tmp.string();
}

void commit_sharded_checkpoint(const std::string& tmp, const std::string& dir, const nlohmann::json& manifest,
                               const std::string& model_pickle) {
  if (!model_pickle.empty()) write_atomically(fs::path(tmp) / "model.pt", model_pickle);
  write_atomically(fs::path(tmp) / kManifestFile, manifest.dump(1) + "\n");
  fsync_dir(tmp);
  const fs::path target = fs::absolute(fs::path(dir)).lexically_normal();
  std::error_code ec;
  if (fs::exists(target, ec)) {
    // Swapped in one step (the old one then removed), so `dir` is never missing.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
      throw DataError(dir, std::string("cannot swap the new checkpoint into place: ") + std::strerror(errno));
    }
    fs::remove_all(tmp, ec);
  } else if (::rename(tmp.c_str(), target.c_str()) != 0) {
    throw DataError(dir, std::string("cannot rename the new checkpoint into place: ") + std::strerror(errno));
  }
  fsync_dir(target.parent_path());
}

bool is_sharded_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kManifestFile, ec);
}

nlohmann::json read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifestFile).string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, "cannot open: " + std::string(std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json m = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object()) throw DataError(path, "not JSON: damaged or cut short");
  if (m.value("format", "") != kFormat) throw DataError(path, "not a dsgd sharded checkpoint's manifest");
  if (m.value("version", 0) != kVersion) {
    throw DataError(path, "manifest version " + std::to_string(m.value("version", 0)) + ", this build reads " +
                              std::to_string(kVersion));
  }
  if (!m.contains("crc32") || !m["crc32"].is_number_unsigned() ||
      m["crc32"].get<uint32_t>() != crc_of(manifest_text(m))) {
    throw DataError(path, "checksum mismatch: the manifest is damaged");
  }
  return m;
}

void check_share_files(const std::string& dir, const nlohmann::json& manifest) {
  for (const auto& f : manifest.at("files")) {
    const fs::path path = fs::path(dir) / f.at("name").get<std::string>();
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) throw DataError(path.string(), "a share of this checkpoint is missing: " + ec.message());
    if (size != f.at("bytes").get<uint64_t>()) {
      throw DataError(path.string(), "a share of " + std::to_string(size) + " bytes where the manifest says " +
                                         std::to_string(f.at("bytes").get<uint64_t>()) + ": cut short or replaced");
    }
  }
}

ShardReader::ShardReader(std::string dir) : dir_(std::move(dir)), manifest_(read_manifest(dir_)) {
  world_ = manifest_.value("world", 0);
  for (const auto& f : manifest_.at("files")) files_.push_back(f.at("name"));
  fds_.assign(files_.size(), -1);
  for (const auto& [name, t] : manifest_.at("tensors").items()) {
    Entry e;
    e.tensor = {t.at("dtype"), t.at("shape").get<std::vector<int64_t>>()};
    e.element = element_bytes(e.tensor.dtype, name);
    for (const auto& r : t.at("ranges")) {
      e.ranges.push_back(
          {r.at("file"), r.at("offset"), r.at("begin"), r.at("count"), r.at("crc32").get<std::vector<uint32_t>>()});
    }
    tensors_.emplace(name, std::move(e));
  }
  for (const auto& [name, b] : manifest_.at("blobs").items()) {
    blobs_.emplace(name, Blob{b.at("file"), b.at("offset"), b.at("bytes"), b.at("crc32").get<std::vector<uint32_t>>()});
  }
}

ShardReader::~ShardReader() {
  for (const int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

const torch_glue::StateSource::Tensor* ShardReader::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second.tensor;
}

std::vector<std::string> ShardReader::tensors_under(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto it = tensors_.lower_bound(prefix); it != tensors_.end() && it->first.rfind(prefix, 0) == 0; ++it) {
    out.push_back(it->first);
  }
  return out;
}

void ShardReader::pread_file(int file, uint64_t offset, size_t n, char* dest) {
  const std::string path = (fs::path(dir_) / files_.at(static_cast<size_t>(file))).string();
  int& fd = fds_.at(static_cast<size_t>(file));
  if (fd < 0) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw DataError(path, std::string("cannot open a share of this checkpoint: ") + std::strerror(errno));
  }
  while (n > 0) {
    const ssize_t r = ::pread(fd, dest, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      throw DataError(path, "cannot read at byte " + std::to_string(offset) + ": " +
                                (r < 0 ? std::string(std::strerror(errno)) : std::string("cut short")));
    }
    dest += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
    bytes_read_ += static_cast<uint64_t>(r);
  }
}

void ShardReader::read(const std::string& name, int64_t begin, int64_t count, void* dest) {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw DataError(dir_, "the checkpoint holds no tensor " + name);
  const Entry& e = it->second;
  const int64_t end = begin + count;
  int64_t at = begin;
  std::string chunk;
  for (const auto& r : e.ranges) {
    if (at >= end) break;
    if (r.begin + r.count <= at) continue;
    if (r.begin > at) break;
    const int64_t stop = std::min(end, r.begin + r.count);
    const uint64_t lo = static_cast<uint64_t>(at - r.begin) * e.element,
                   hi = static_cast<uint64_t>(stop - r.begin) * e.element;
    const uint64_t bytes = static_cast<uint64_t>(r.count) * e.element;
    char* out = static_cast<char*>(dest) + static_cast<uint64_t>(at - begin) * e.element;
    for (uint64_t c = lo / kShareChunkBytes; c * kShareChunkBytes < hi; ++c) {
      const uint64_t c0 = c * kShareChunkBytes, n = std::min<uint64_t>(kShareChunkBytes, bytes - c0);
      const uint64_t from = std::max(lo, c0), to = std::min(hi, c0 + n);
      const bool inside = from == c0 && to == c0 + n;  // the whole chunk is wanted: straight into dest
      char* buf = inside ? out + (c0 - lo) : (chunk.resize(n), chunk.data());
      pread_file(r.file, r.offset + c0, n, buf);
      if (c >= r.crcs.size() || crc_of(buf, n) != r.crcs[c]) {
        throw DataError(
            (fs::path(dir_) / files_.at(static_cast<size_t>(r.file))).string(),
            "checksum mismatch in " + name + " at byte " + std::to_string(r.offset + c0) + ": this share is damaged");
      }
      if (!inside) std::memcpy(out + (from - lo), buf + (from - c0), to - from);
    }
    at = stop;
  }
  if (at < end) {
    throw DataError(dir_, "tensor " + name + ": elements from " + std::to_string(at) + " are in no share");
  }
}

std::string ShardReader::blob(const std::string& name) {
  const auto it = blobs_.find(name);
  if (it == blobs_.end()) throw DataError(dir_, "the checkpoint holds no " + name);
  const Blob& b = it->second;
  std::string out(b.bytes, '\0');
  pread_file(b.file, b.offset, out.size(), out.data());
  for (size_t c = 0; c * kShareChunkBytes < out.size(); ++c) {
    const size_t n = std::min<size_t>(kShareChunkBytes, out.size() - c * kShareChunkBytes);
    if (c >= b.crcs.size() || crc_of(out.data() + c * kShareChunkBytes, n) != b.crcs[c]) {
      throw DataError((fs::path(dir_) / files_.at(static_cast<size_t>(b.file))).string(),
                      "checksum mismatch in " + name + " at byte " + std::to_string(b.offset + c * kShareChunkBytes) +
                          ": this share is damaged");
    }
  }
  return out;
}

}  // namespace dsgd::runtime
