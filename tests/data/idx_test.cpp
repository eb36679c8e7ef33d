// The torch-free IDX reader: good files (gzipped and plain) and every kind of damage.
#include "data/idx.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "dsgd/common/error.h"
#include "testing/idx_writer.h"
#include "testing/temp_dir.h"

namespace dsgd::data {
namespace {

using testing::counting_bytes;
using testing::idx_bytes;

// Runs `fn`, expecting a DataError whose message contains `needle` and names `path`.
template <typename Fn>
void expect_data_error(Fn fn, const std::string& path, const std::string& needle) {
  try {
    fn();
    FAIL() << "expected a DataError containing '" << needle << "'";
  } catch (const DataError& e) {
    EXPECT_EQ(e.path(), path);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(IdxReader, ReadsGzippedAndPlainFiles) {
  testing::TempDir dir;
  const std::string payload = counting_bytes(3 * 4 * 5, 7);
  testing::write_gzip(dir.file("a.gz"), idx_bytes({3, 4, 5}, payload));
  testing::write_plain(dir.file("a"), idx_bytes({3, 4, 5}, payload));
  for (const auto& name : {"a.gz", "a"}) {
    IdxArray a = read_idx(dir.file(name));
    EXPECT_EQ(a.dims, (std::vector<int64_t>{3, 4, 5}));
    EXPECT_EQ(a.count(), 3);
    ASSERT_EQ(a.data.size(), payload.size());
    EXPECT_EQ(a.data[0], 7);
    EXPECT_EQ(a.data[59], (7 + 59) % 256);
    EXPECT_EQ(a.shape_string(), "3 x 4 x 5");
  }
}

TEST(IdxReader, ReadsEmptyArray) {
  IdxArray a = parse_idx(idx_bytes({0, 28, 28}, ""), "empty");
  EXPECT_EQ(a.count(), 0);
  EXPECT_TRUE(a.data.empty());
}

TEST(IdxReader, MissingFile) {
  testing::TempDir dir;
  const auto path = dir.file("nope.gz");
  expect_data_error([&] { read_idx(path); }, path, "file not found");
}

TEST(IdxReader, DirectoryInsteadOfFile) {
  testing::TempDir dir;
  const auto path = dir.path().string();
  expect_data_error([&] { read_idx(path); }, path, "is a directory");
}

TEST(IdxReader, BadMagic) {
  testing::TempDir dir;
  const auto path = dir.file("bad.gz");
  testing::write_gzip(path, std::string("\x1f\x8b\x08\x00 this is not an IDX file", 28));
  expect_data_error([&] { read_idx(path); }, path, "bad magic 0x1f8b0800");
}

TEST(IdxReader, UnsupportedElementType) {
  expect_data_error([] { parse_idx(idx_bytes({2}, "12345678", 0x0D), "floats"); }, "floats",
                    "unsupported IDX element type 0x0d");
}

TEST(IdxReader, TooShortForHeader) {
  testing::TempDir dir;
  const auto path = dir.file("short");
  testing::write_plain(path, std::string("\0\0", 2));
  expect_data_error([&] { read_idx(path); }, path, "too short for an IDX header: 2 bytes");
}

TEST(IdxReader, ZeroDimensions) {
  expect_data_error([] { parse_idx(std::string("\0\0\x08\0", 4), "x"); }, "x", "0 dimensions");
}

TEST(IdxReader, TruncatedHeader) {
  std::string bytes = idx_bytes({60000, 28, 28}, "").substr(0, 10);
  expect_data_error([&] { parse_idx(bytes, "x"); }, "x", "truncated IDX header");
}

TEST(IdxReader, TruncatedData) {
  testing::TempDir dir;
  const auto path = dir.file("truncated.gz");
  testing::write_gzip(path, idx_bytes({10, 28, 28}, counting_bytes(10 * 28 * 28 - 100)));
  expect_data_error([&] { read_idx(path); }, path,
                    "truncated data: the header promises 10 x 28 x 28 = 7840 bytes, the file holds 7740");
}

TEST(IdxReader, TrailingBytes) {
  expect_data_error([] { parse_idx(idx_bytes({4}, "123456"), "x"); }, "x", "2 unexpected bytes after the 4 data");
}

TEST(IdxReader, TruncatedGzipStream) {
  testing::TempDir dir;
  const auto whole = dir.file("whole.gz");
  testing::write_gzip(whole, idx_bytes({100, 28, 28}, counting_bytes(100 * 28 * 28)));
  std::string gz(std::filesystem::file_size(whole), '\0');
  std::ifstream(whole, std::ios::binary).read(gz.data(), static_cast<std::streamsize>(gz.size()));
  const auto path = dir.file("cut.gz");
  testing::write_plain(path, gz.substr(0, gz.size() / 2));
  // Either the stream is reported truncated or the data comes up short: both name the file.
  try {
    read_idx(path);
    FAIL() << "a gzip stream cut in half was accepted";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.path(), path);
    EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("corrupt") != std::string::npos) << msg;
  }
}

TEST(IdxReader, CorruptGzipStream) {
  testing::TempDir dir;
  const auto whole = dir.file("whole.gz");
  testing::write_gzip(whole, idx_bytes({100, 28, 28}, counting_bytes(100 * 28 * 28)));
  std::string gz(std::filesystem::file_size(whole), '\0');
  std::ifstream(whole, std::ios::binary).read(gz.data(), static_cast<std::streamsize>(gz.size()));
  for (size_t i = 20; i < gz.size() - 8; i += 7) gz[i] = static_cast<char>(gz[i] ^ 0x5a);
  const auto path = dir.file("corrupt.gz");
  testing::write_plain(path, gz);
  expect_data_error([&] { read_idx(path); }, path, "gzip");
}

TEST(IdxReader, AbsurdSizeInHeaderIsRejectedBeforeAllocating) {
  expect_data_error([] { parse_idx(idx_bytes({0xffffffff, 0xffffffff, 0xffff}, ""), "x"); }, "x",
                    "over the 4 GiB limit");
}

}  // namespace
}  // namespace dsgd::data
