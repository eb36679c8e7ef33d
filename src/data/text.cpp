#include "dsgd/data/text.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "dsgd/common/error.h"

namespace dsgd::data {
namespace {

constexpr char kMagic[8] = {'D', 'S', 'G', 'D', 'T', 'O', 'K', '1'};
constexpr size_t kHeaderBytes = 32;

template <typename T>
T load_le(const unsigned char* p) {  // little-endian, as this machine and every x86/ARM host
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

int width_for(int64_t vocab_size) { return vocab_size <= 256 ? 1 : vocab_size <= 65536 ? 2 : 4; }

size_t page_size() {
  static const size_t p = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

}  // namespace

std::vector<int32_t> encode_bytes(std::string_view text) {
  std::vector<int32_t> out(text.size());
  std::transform(text.begin(), text.end(), out.begin(), [](char c) { return static_cast<unsigned char>(c); });
  return out;
}

std::string decode_bytes(const std::vector<int32_t>& tokens) {
  std::string out(tokens.size(), '\0');
  std::transform(tokens.begin(), tokens.end(), out.begin(), [](int32_t t) { return static_cast<char>(t & 0xff); });
  return out;
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size) {
  if (vocab_size < 1 || vocab_size > (int64_t{1} << 31)) {
    throw DataError(path, "vocabulary size " + std::to_string(vocab_size) + " is not in 1..2^31");
  }
  const int width = width_for(vocab_size);
  std::string bytes(kHeaderBytes + tokens.size() * static_cast<size_t>(width), '\0');
  std::memcpy(bytes.data(), kMagic, sizeof kMagic);
  const uint32_t w = static_cast<uint32_t>(width);
  const uint64_t vocab = static_cast<uint64_t>(vocab_size), count = tokens.size();
  std::memcpy(bytes.data() + 8, &w, 4);
  std::memcpy(bytes.data() + 16, &vocab, 8);
  std::memcpy(bytes.data() + 24, &count, 8);
  char* p = bytes.data() + kHeaderBytes;
  for (size_t i = 0; i < tokens.size(); ++i, p += width) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      throw DataError(path, "token " + std::to_string(i) + " is " + std::to_string(tokens[i]) +
                                ", outside the vocabulary of " + std::to_string(vocab_size));
    }
    const uint32_t t = static_cast<uint32_t>(tokens[i]);
    std::memcpy(p, &t, static_cast<size_t>(width));
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw DataError(path, std::string("cannot write: ") + std::strerror(errno));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f.flush()) throw DataError(path, std::string("cannot write: ") + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw DataError(path, std::string("cannot rename into place: ") + std::strerror(e));
  }
}

namespace {

std::string read_text(const std::string& path) {  // gzread reads plain files as they are
  gzFile f = ::gzopen(path.c_str(), "rb");
  if (f == nullptr) throw DataError(path, std::string("cannot open: ") + std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  int n = 0;
  while ((n = ::gzread(f, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  int err = Z_OK;
  const std::string why = n < 0 ? ::gzerror(f, &err) : "";
  ::gzclose(f);
  if (n < 0) throw DataError(path, "cannot read: " + why);
  if (text.empty()) throw DataError(path, "is empty: no text to train on");
  return text;
}

}  // namespace

PreparedText prepare_text(const std::string& input, const std::string& out_dir, double val_fraction) {
  if (!(val_fraction > 0 && val_fraction <= 0.5)) {
    throw ConfigError("prepare_text: val_fraction must be in (0, 0.5], got " + std::to_string(val_fraction));
  }
  const std::string text = read_text(input);
  size_t cut = text.size() - static_cast<size_t>(static_cast<double>(text.size()) * val_fraction);
  const size_t line = text.rfind('\n', cut);
  if (line != std::string::npos && line > 0) cut = line + 1;  // validation starts at a line
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw DataError(out_dir, "cannot create the directory: " + ec.message());
  PreparedText p{.train_path = (std::filesystem::path(out_dir) / "train.tok").string(),
                 .val_path = (std::filesystem::path(out_dir) / "val.tok").string()};
  const std::string_view all(text);
  const auto train = encode_bytes(all.substr(0, cut)), val = encode_bytes(all.substr(cut));
  write_token_file(p.train_path, train, 256);
  write_token_file(p.val_path, val, 256);
  p.train_tokens = static_cast<int64_t>(train.size());
  p.val_tokens = static_cast<int64_t>(val.size());
  return p;
}

TokenFile::TokenFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw DataError(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw DataError(path, "not a regular file");
  }
  map_bytes_ = static_cast<size_t>(st.st_size);
  auto fail = [&](const std::string& why) {
    if (map_ != nullptr) ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
    ::close(fd_);
    throw DataError(path, why);
  };
  if (map_bytes_ < kHeaderBytes) fail("not a token file (" + std::to_string(map_bytes_) + " bytes, no header)");
  void* m = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd_, 0);
  if (m == MAP_FAILED) fail(std::string("cannot map: ") + std::strerror(errno));
  map_ = static_cast<const unsigned char*>(m);
  ::madvise(m, map_bytes_, MADV_RANDOM);  // batches read scattered windows: no read-ahead
  if (std::memcmp(map_, kMagic, sizeof kMagic) != 0) fail("not a token file (no DSGDTOK1 header): prepare it first");
  width_ = static_cast<int>(load_le<uint32_t>(map_ + 8));
  vocab_ = static_cast<int64_t>(load_le<uint64_t>(map_ + 16));
  count_ = static_cast<int64_t>(load_le<uint64_t>(map_ + 24));
  if (width_ != 1 && width_ != 2 && width_ != 4) fail("bad token width " + std::to_string(width_));
  if (vocab_ < 1) fail("bad vocabulary size " + std::to_string(vocab_));
  const size_t want = kHeaderBytes + static_cast<size_t>(count_) * static_cast<size_t>(width_);
  if (count_ < 0 || map_bytes_ < want) {
    fail("truncated: " + std::to_string(count_) + " tokens need " + std::to_string(want) + " bytes, the file has " +
         std::to_string(map_bytes_));
  }
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

void TokenFile::read(int64_t begin, int64_t n, int64_t* out) const {
  if (begin < 0 || n < 0 || begin + n > count_) {
    throw DataError(path_, "tokens [" + std::to_string(begin) + ", " + std::to_string(begin + n) +
                               ") are past its " + std::to_string(count_));
  }
  const unsigned char* p = map_ + kHeaderBytes + static_cast<size_t>(begin) * static_cast<size_t>(width_);
  for (int64_t i = 0; i < n; ++i, p += width_) {
    const int64_t t = width_ == 1 ? *p : width_ == 2 ? load_le<uint16_t>(p) : load_le<uint32_t>(p);
    if (t >= vocab_) {
      throw DataError(path_, "token " + std::to_string(begin + i) + " is " + std::to_string(t) +
                                 ", past the vocabulary of " + std::to_string(vocab_) + ": a damaged file?");
    }
    out[i] = t;
  }
}

void TokenFile::release(int64_t begin, int64_t n) const {
  const size_t first = kHeaderBytes + static_cast<size_t>(begin) * static_cast<size_t>(width_);
  const size_t last = first + static_cast<size_t>(n) * static_cast<size_t>(width_);
  const size_t page = page_size();
  const size_t from = first / page * page, to = std::min(map_bytes_, (last + page - 1) / page * page);
  if (to > from) ::madvise(const_cast<unsigned char*>(map_) + from, to - from, MADV_DONTNEED);
}

TokenDataset::TokenDataset(const std::string& path, int64_t context) : file_(path), context_(context) {
  if (context < 1) throw DataError(path, "context must be >= 1, got " + std::to_string(context));
  samples_ = file_.size() > 0 ? (file_.size() - 1) / context : 0;
  if (samples_ < 1) {
    throw DataError(path, "has " + std::to_string(file_.size()) + " tokens: fewer than one sequence of " +
                              std::to_string(context + 1));
  }
}

Batch TokenDataset::get_batch(const torch::Tensor& indices) const {
  const auto idx = indices.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t b = idx.numel(), t = context_;
  auto window = torch::empty({b, t + 1}, torch::kInt64);
  const int64_t* i = idx.data_ptr<int64_t>();
  for (int64_t r = 0; r < b; ++r) {
    if (i[r] < 0 || i[r] >= samples_) {
      throw DataError(file_.path(),
                      "sample " + std::to_string(i[r]) + " asked for; it has " + std::to_string(samples_));
    }
    file_.read(i[r] * t, t + 1, window.data_ptr<int64_t>() + r * (t + 1));
    file_.release(i[r] * t, t + 1);
  }
  return {window.slice(1, 0, t).contiguous(), window.slice(1, 1, t + 1).contiguous()};
}

}  // namespace dsgd::data
