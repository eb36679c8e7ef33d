// Sharded checkpoints' files (runtime/checkpoint/sharded_checkpoint.h), without a job: shares
// written by three "replicas" read back in any range, a share missing named, a damaged chunk
// named by its file, and a commit that is whole or not there.
#include "runtime/checkpoint/sharded_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include "dsgd/common/error.h"
#include "testing/temp_dir.h"

namespace dsgd::runtime {
namespace {

namespace fs = std::filesystem;
using torch_glue::StateRegion;
using torch_glue::StateShare;

// A float tensor of n elements, 0, 1, 2, ...: rank r of 3 holds [n r / 3, n (r + 1) / 3).
struct Parts {
  std::vector<float> values;
  explicit Parts(int64_t n) : values(static_cast<size_t>(n)) { std::iota(values.begin(), values.end(), 0.0f); }
  StateRegion of(int rank, int world, const std::string& name) const {
    const auto n = static_cast<int64_t>(values.size());
    const int64_t b = n * rank / world, e = n * (rank + 1) / world;
    return {name, "Float", {n}, b, e - b, values.data() + b, static_cast<size_t>(e - b) * sizeof(float)};
  }
};

// Three shares of "big" (2.5 chunks of 4 MiB, so ranges cross chunks and shares) and "small",
// and a blob from rank 0, written into `dir`, then committed; returns the manifest.
nlohmann::json write_three(const std::string& dir, const Parts& big, const Parts& small, const std::string& blob,
                           int skip_rank = -1) {
  const std::string tmp = sharded_temp_dir(dir);
  std::vector<nlohmann::json> files;
  for (int r = 0; r < 3; ++r) {
    StateShare share;
    share.regions.push_back(big.of(r, 3, "model/big"));
    if (r != skip_rank) share.regions.push_back(small.of(r, 3, "model/small"));
    if (r == 0)
      share.regions.push_back({"extras", "", {}, 0, static_cast<int64_t>(blob.size()), blob.data(), blob.size()});
    files.push_back(write_share_file(tmp + "/" + share_file_name(r), share));
  }
  auto m = make_manifest({{"operator", "test"}}, files, 3);
  commit_sharded_checkpoint(tmp, dir, m, "");
  return m;
}

TEST(ShardedCheckpoint, SharesOfThreeReadBackInAnyRangeAcrossSharesAndChunks) {
  testing::TempDir dir;
  const Parts big(2'621'440), small(7);  // 10 MiB of floats
  const std::string blob(5 << 20, 'x');  // a blob over one chunk
  write_three(dir.file("c"), big, small, blob);
  ASSERT_TRUE(is_sharded_checkpoint(dir.file("c")));
  check_share_files(dir.file("c"), read_manifest(dir.file("c")));
  ShardReader reader(dir.file("c"));
  EXPECT_EQ(reader.world(), 3);
  ASSERT_NE(reader.find("model/big"), nullptr);
  EXPECT_EQ(reader.find("model/big")->shape, std::vector<int64_t>{2'621'440});
  EXPECT_EQ(reader.tensors_under("model/"), (std::vector<std::string>{"model/big", "model/small"}));
  for (const auto& [begin, count] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 2'621'440}, {873'810, 10}, {1'000'000, 1'000'000}, {2'621'439, 1}, {5, 0}}) {
    std::vector<float> out(static_cast<size_t>(count), -1.0f);
    reader.read("model/big", begin, count, out.data());
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out[static_cast<size_t>(i)], static_cast<float>(begin + i)) << begin;
  }
  std::vector<float> s(7);
  reader.read("model/small", 0, 7, s.data());
  EXPECT_EQ(s, small.values);
  EXPECT_EQ(reader.blob("extras"), blob);
  EXPECT_FALSE(reader.has_blob("feedback/0"));
}

TEST(ShardedCheckpoint, AShareMissingFromATensorIsNamedAtTheManifest) {
  testing::TempDir dir;
  const Parts big(1000), small(9);
  try {
    write_three(dir.file("c"), big, small, "b", /*skip_rank=*/1);
    FAIL() << "a tensor with a gap made a manifest";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model/small: elements from 3 are in no share"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.file("c")));
}

TEST(ShardedCheckpoint, AFlippedByteIsNamedByItsShareFileWhenItsChunkIsRead) {
  testing::TempDir dir;
  const Parts big(2'621'440), small(7);
  write_three(dir.file("c"), big, small, "blob");
  const std::string file = dir.file("c") + "/" + share_file_name(2);
  {  // inside rank 2's part of "big", in its last chunk
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3'000'000);
    f.put('\x7f');
  }
  ShardReader reader(dir.file("c"));
  std::vector<float> out(10);
  reader.read("model/big", 0, 10, out.data());  // rank 0's file: untouched
  EXPECT_EQ(out[9], 9.0f);
  std::vector<float> all(2'621'440);
  try {
    reader.read("model/big", 0, 2'621'440, all.data());
    FAIL() << "a damaged share read";
  } catch (const DataError& e) {
    EXPECT_EQ(e.path(), file);
    EXPECT_NE(std::string(e.what()).find("checksum mismatch in model/big"), std::string::npos) << e.what();
  }
}

TEST(ShardedCheckpoint, ACommitReplacesTheOldCheckpointWholeAndAnUncommittedOneIsNotThere) {
  testing::TempDir dir;
  const Parts big(100), small(3), other(100);
  write_three(dir.file("c"), big, small, "first");
  // A save cut off before its commit (its workers killed mid-write): the temporary directory
  // holds shares, no manifest, and the checkpoint is the first one still.
  const std::string cut = sharded_temp_dir(dir.file("c"));
  std::ofstream(cut + "/" + share_file_name(0)) << "half";
  EXPECT_EQ(ShardReader(dir.file("c")).blob("extras"), "first");
  write_three(dir.file("c"), other, small, "second");
  EXPECT_EQ(ShardReader(dir.file("c")).blob("extras"), "second");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) entries += e.path() != cut;
  EXPECT_EQ(entries, 1) << "the old checkpoint swapped out is removed";
}

}  // namespace
}  // namespace dsgd::runtime
