#include "runtime/driver/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "dsgd/common/error.h"
#include "dsgd/common/json_fields.h"
#include "runtime/checkpoint/sharded_checkpoint.h"

namespace dsgd::runtime {
namespace {

constexpr const char* kFormat = "dsgd-checkpoint";
constexpr int kVersion = 1;

constexpr const char* kStepPrefix = "step-";

// "step-000000000150" -> 150; -1 for anything else.
int64_t step_of(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0 || name.size() == std::strlen(kStepPrefix)) return -1;
  int64_t step = 0;
  for (size_t i = std::strlen(kStepPrefix); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (std::numeric_limits<int64_t>::max() - 9) / 10) return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

}  // namespace

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

void write_all(int fd, std::string_view bytes, const std::string& path) {
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

void fsync_dir(const std::filesystem::path& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
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
  fsync_dir(path.parent_path());
}

void write_checkpoint(const std::string& dir, const Checkpoint& checkpoint, const std::string& model_pickle) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw DataError(dir, "cannot create the checkpoint directory: " + ec.message());
  nlohmann::json header = checkpoint.header;
  header["format"] = kFormat;
  header["version"] = kVersion;
  header["state_bytes"] = checkpoint.state.size();
  std::string body = checkpoint.state;
  if (!checkpoint.feedback.empty()) {
    auto& fb = header["feedback"] = nlohmann::json::array();
    for (const auto& [rank, bytes] : checkpoint.feedback) {
      fb.push_back({{"rank", rank}, {"bytes", bytes.size()}});
      body += bytes;
    }
  }
  header["state_crc32"] = crc_of(body);  // of all that follows the header
  write_atomically(std::filesystem::path(dir) / "checkpoint.dsgd", header.dump() + "\n" + body);
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
  if (!c.header.is_object() || !c.header.contains("format") || c.header["format"] != kFormat) {
    throw DataError(path, "not a dsgd checkpoint (format field missing)");
  }
  int64_t version = 0, expected = 0;
  uint32_t crc = 0;
  try {
    version = integer_field(c.header, "version", int64_t{0});
    expected = integer_field(c.header, "state_bytes", int64_t{0});
    crc = integer_field(c.header, "state_crc32", uint32_t{0});
  } catch (const std::invalid_argument& e) {
    throw DataError(path, std::string("damaged header: ") + e.what());
  }
  if (version != kVersion) {
    throw DataError(path, "checkpoint version " + std::to_string(version) +
                              " is not supported by this build (version " + std::to_string(kVersion) + ")");
  }
  std::vector<std::pair<int64_t, int64_t>> feedback;  // (rank, bytes)
  try {
    if (const auto it = c.header.find("feedback"); it != c.header.end()) {
      if (!it->is_array()) throw std::invalid_argument("\"feedback\" is not an array");
      for (const auto& f : *it) {
        const int64_t bytes = integer_field(f, "bytes", int64_t{0});
        if (bytes < 0) throw std::invalid_argument("a feedback entry of negative size");
        feedback.emplace_back(integer_field(f, "rank", int64_t{0}), bytes);
      }
    }
  } catch (const std::exception& e) {
    throw DataError(path, std::string("damaged header: ") + e.what());
  }
  std::ostringstream rest;
  rest << in.rdbuf();
  std::string body = rest.str();
  int64_t total = expected;
  for (const auto& [rank, bytes] : feedback) total += bytes;
  if (static_cast<int64_t>(body.size()) != total) {
    throw DataError(path, "truncated or damaged: " + std::to_string(body.size()) +
                              " bytes after the header, header says " + std::to_string(total));
  }
  if (crc_of(body) != crc) {
    throw DataError(path, "checksum mismatch: the file is damaged");
  }
  size_t at = static_cast<size_t>(expected);
  for (const auto& [rank, bytes] : feedback) {
    c.feedback[rank] = body.substr(at, static_cast<size_t>(bytes));
    at += static_cast<size_t>(bytes);
  }
  body.resize(static_cast<size_t>(expected));
  c.state = std::move(body);
  c.header.erase("feedback");
  return c;
}

std::string write_rotating_checkpoint(const std::string& root, int64_t step, int keep, const Checkpoint& checkpoint,
                                      const std::string& model_pickle) {
  namespace fs = std::filesystem;
  if (keep < 1) throw DataError(root, "checkpoint_keep must be >= 1, got " + std::to_string(keep));
  const fs::path final_dir = checkpoint_path(root, step);
  const std::string name = final_dir.filename().string();
  const std::string suffix = "." + std::to_string(::getpid());
  const fs::path tmp = fs::path(root) / ("." + std::string(name) + ".partial" + suffix);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  try {
    write_checkpoint(tmp.string(), checkpoint, model_pickle);  // creates root too
  } catch (...) {
    fs::remove_all(tmp, ec);  // a volume that filled up keeps no half-written step
    throw;
  }
  // rename(2) cannot replace a non-empty directory: move an old one of the same step aside first.
  const fs::path old = fs::path(root) / ("." + std::string(name) + ".old" + suffix);
  const bool replacing = fs::exists(final_dir);
  if (replacing && ::rename(final_dir.c_str(), old.c_str()) != 0) {
    throw DataError(final_dir.string(), std::string("cannot move the old checkpoint aside: ") + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    const int err = errno;
    fs::remove_all(tmp, ec);
    if (replacing) ::rename(old.c_str(), final_dir.c_str());  // the old one back in its place
    throw DataError(final_dir.string(), std::string("cannot rename into place: ") + std::strerror(err));
  }
  fsync_dir(root);
  if (replacing) fs::remove_all(old, ec);
  rotate_checkpoints(root, keep);
  return final_dir.string();
}

std::string checkpoint_path(const std::string& root, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "%s%012lld", kStepPrefix, static_cast<long long>(step));
  return (std::filesystem::path(root) / name).string();
}

void rotate_checkpoints(const std::string& root, int keep) {
  std::error_code ec;
  const auto all = list_checkpoints(root);
  const auto kept = static_cast<size_t>(std::max(keep, 1));
  for (size_t i = 0; i + kept < all.size(); ++i) std::filesystem::remove_all(all[i], ec);
}

std::vector<std::string> list_checkpoints(const std::string& root) {
  namespace fs = std::filesystem;
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = step_of(it->path().filename().string());
    if (step >= 0 && it->is_directory(ec)) found.emplace_back(step, it->path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

namespace {
constexpr const char* kJobEnded = "job-ended";
}

void mark_job_ended(const std::string& root, bool ended) {
  namespace fs = std::filesystem;
  const fs::path mark = fs::path(root) / kJobEnded;
  if (!ended) {
    std::error_code ec;
    fs::remove(mark, ec);
    return;
  }
  std::error_code ec;
  fs::create_directories(root, ec);
  write_atomically(mark, "{\"ended_unix_s\": " + std::to_string(::time(nullptr)) + "}\n");
}

bool job_ended(const std::string& root) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::path(root) / kJobEnded, ec);
}

int64_t checkpoint_step(const std::string& dir) {
  return step_of(std::filesystem::path(dir).filename().string());
}

Checkpoint read_latest_checkpoint(const std::string& root, std::vector<std::string>* skipped) {
  if (list_checkpoints(root).empty()) {
    throw DataError(root, std::filesystem::exists(root)
                              ? "no checkpoints here (neither checkpoint.dsgd nor step-* directories)"
                              : "no such checkpoint directory");
  }
  return load_first_intact(root, read_checkpoint, [&](const std::string& s) {
    if (skipped) skipped->push_back(s);
  });
}

void remove_unfinished_checkpoints(const std::string& root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string prefix = std::string(".") + kStepPrefix;
  std::vector<fs::path> gone;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().rfind(prefix, 0) == 0) gone.push_back(it->path());
  }
  for (const auto& p : gone) fs::remove_all(p, ec);
}

std::vector<std::string> checkpoint_candidates(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(fs::path(path) / "checkpoint.dsgd", ec) || fs::exists(fs::path(path) / kManifestFile, ec)) {
    return {path};
  }
  auto all = list_checkpoints(path);
  if (all.empty()) {
    throw DataError(path, fs::exists(path, ec) ? "no checkpoints here (neither checkpoint.dsgd, manifest.json nor "
                                                 "step-* directories)"
                                               : "no such checkpoint directory");
  }
  std::reverse(all.begin(), all.end());
  return all;
}

}  // namespace dsgd::runtime
