// Checkpoint rotation on disk: keep the newest K, never expose a half-written one, and fall back
// past damaged ones to the newest intact checkpoint.
#include "runtime/driver/checkpoint.h"
#include "runtime/driver/checkpoint_writer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "dsgd/common/error.h"
#include "testing/temp_dir.h"

namespace dsgd::runtime {
namespace {

namespace fs = std::filesystem;

Checkpoint state_of(int64_t step) { return {{{"step", step}}, "state of step " + std::to_string(step), {}}; }

void flip_a_byte(const std::string& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-3, std::ios::end);
  f.put('#');
}

TEST(CheckpointRotation, KeepsTheNewestKInStepOrder) {
  testing::TempDir dir;
  const std::string root = dir.file("ckpts");
  for (int64_t step : {5, 10, 100, 15}) write_rotating_checkpoint(root, step, 2, state_of(step), "");
  // 100 is newest by step, 15 the next: numeric order, not write order or string order.
  const auto all = list_checkpoints(root);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(fs::path(all[0]).filename(), "step-000000000015");
  EXPECT_EQ(fs::path(all[1]).filename(), "step-000000000100");
  EXPECT_EQ(read_latest_checkpoint(root, nullptr).state, "state of step 100");
  // No temporary directories are left behind.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(root)) ++entries;
  EXPECT_EQ(entries, 2);
}

TEST(CheckpointRotation, RewritingAStepReplacesIt) {
  testing::TempDir dir;
  const std::string root = dir.file("ckpts");
  write_rotating_checkpoint(root, 7, 3, state_of(7), "");
  write_rotating_checkpoint(root, 7, 3, {{{"step", 7}}, "again", {}}, "");
  EXPECT_EQ(list_checkpoints(root).size(), 1u);
  EXPECT_EQ(read_latest_checkpoint(root, nullptr).state, "again");
}

TEST(CheckpointRotation, DamagedOrTruncatedNewestFallsBackToThePreviousAndNamesIt) {
  testing::TempDir dir;
  const std::string root = dir.file("ckpts");
  for (int64_t step : {1, 2, 3}) write_rotating_checkpoint(root, step, 3, state_of(step), "model bytes");
  flip_a_byte(root + "/step-000000000003/checkpoint.dsgd");
  std::vector<std::string> skipped;
  EXPECT_EQ(read_latest_checkpoint(root, &skipped).state, "state of step 2");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("step-000000000003/checkpoint.dsgd: checksum mismatch"), std::string::npos) << skipped[0];

  const std::string two = root + "/step-000000000002/checkpoint.dsgd";
  fs::resize_file(two, fs::file_size(two) - 4);
  skipped.clear();
  EXPECT_EQ(read_latest_checkpoint(root, &skipped).state, "state of step 1");
  EXPECT_EQ(skipped.size(), 2u);
}

// Each replica's error feedback follows the state under the same checksum, by rank.
TEST(CheckpointFile, FeedbackComesBackByRankAndIsCoveredByTheChecksum) {
  testing::TempDir dir;
  Checkpoint c = state_of(4);
  c.feedback = {{0, std::string("leader \0 zero", 13)}, {2, "leader two"}, {3, ""}};
  write_checkpoint(dir.file("c"), c, "");
  const Checkpoint back = read_checkpoint(dir.file("c"));
  EXPECT_EQ(back.state, c.state);
  EXPECT_EQ(back.feedback, c.feedback);
  EXPECT_EQ(back.header.value("step", 0), 4);
  EXPECT_FALSE(back.header.contains("feedback"));
  flip_a_byte(dir.file("c") + "/checkpoint.dsgd");  // inside rank 2's bytes
  EXPECT_THROW(read_checkpoint(dir.file("c")), DataError);
  // Without feedback the file is what it always was: state only.
  write_checkpoint(dir.file("d"), state_of(5), "");
  EXPECT_TRUE(read_checkpoint(dir.file("d")).feedback.empty());
}

TEST(CheckpointRotation, AHalfWrittenCheckpointIsNeverPickedUp) {
  testing::TempDir dir;
  const std::string root = dir.file("ckpts");
  write_rotating_checkpoint(root, 1, 3, state_of(1), "");
  // What a crash during the write of step 2 leaves: its temporary directory, partly written.
  fs::create_directories(root + "/.step-000000000002.partial.999");
  std::ofstream(root + "/.step-000000000002.partial.999/checkpoint.dsgd") << "{\"format\":";
  EXPECT_EQ(list_checkpoints(root).size(), 1u);
  EXPECT_EQ(read_latest_checkpoint(root, nullptr).state, "state of step 1");
  // A sharded one's temporary directory, as a driver killed mid-write leaves it.
  fs::create_directories(root + "/.step-000000000003.tmp-999-0");
  std::ofstream(root + "/.step-000000000003.tmp-999-0/share-00000.bin") << "part of a share";
  EXPECT_EQ(checkpoint_candidates(root), std::vector<std::string>{list_checkpoints(root).at(0)});
  // The next job's start clears both away, and nothing else.
  remove_unfinished_checkpoints(root);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(root)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"step-000000000001"});
}

// A root names its step-* directories newest first, of either format; a checkpoint directory
// names itself; a directory of neither is a DataError saying so.
TEST(CheckpointRotation, CandidatesAreTheNewestFirstOrTheCheckpointItself) {
  testing::TempDir dir;
  const std::string root = dir.file("ckpts");
  for (int64_t step : {5, 10}) write_rotating_checkpoint(root, step, 3, state_of(step), "");
  fs::create_directories(root + "/step-000000000015");
  std::ofstream(root + "/step-000000000015/manifest.json") << "{}";
  const auto all = checkpoint_candidates(root);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(fs::path(all[0]).filename(), "step-000000000015");
  EXPECT_EQ(fs::path(all[2]).filename(), "step-000000000005");
  EXPECT_EQ(checkpoint_candidates(all[0]), std::vector<std::string>{all[0]});
  EXPECT_EQ(checkpoint_candidates(all[1]), std::vector<std::string>{all[1]});
  fs::create_directories(dir.file("empty"));
  try {
    checkpoint_candidates(dir.file("empty"));
    FAIL() << "an empty directory named a checkpoint";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("no checkpoints here"), std::string::npos) << e.what();
  }
}

TEST(CheckpointRotation, EveryOneDamagedIsADataErrorListingThemAll) {
  testing::TempDir dir;
  const std::string root = dir.file("ckpts");
  for (int64_t step : {1, 2}) write_rotating_checkpoint(root, step, 3, state_of(step), "");
  for (const auto& p : list_checkpoints(root)) flip_a_byte(p + "/checkpoint.dsgd");
  try {
    read_latest_checkpoint(root, nullptr);
    FAIL() << "a damaged checkpoint loaded";
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("every checkpoint here is damaged"), std::string::npos) << what;
    EXPECT_NE(what.find("step-000000000001"), std::string::npos) << what;
    EXPECT_NE(what.find("step-000000000002"), std::string::npos) << what;
  }
  EXPECT_THROW(read_latest_checkpoint(dir.file("absent"), nullptr), DataError);
  EXPECT_THROW(write_rotating_checkpoint(root, 3, 0, state_of(3), ""), DataError);
}

// A header whose fields have the wrong type or an impossible value is a damaged checkpoint (a
// DataError naming the field), never an escaped JSON exception or an unchecked float cast.
TEST(CheckpointRotation, AHeaderWithImpossibleFieldsIsADataError) {
  testing::TempDir dir;
  const std::string root = dir.file("ckpts");
  write_rotating_checkpoint(root, 1, 3, state_of(1), "");
  const std::string file = list_checkpoints(root).at(0) + "/checkpoint.dsgd";
  std::string header, state;
  {
    std::ifstream in(file, std::ios::binary);
    std::getline(in, header);
    state.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto good = nlohmann::json::parse(header);
  const std::vector<std::pair<std::string, nlohmann::json>> bad = {
      {"version", 1e300}, {"version", "1"}, {"state_bytes", 1e24}, {"state_bytes", 12.5}, {"state_crc32", -1},
      {"state_crc32", 1e10}, {"format", 7}};
  for (const auto& [field, value] : bad) {
    auto h = good;
    h[field] = value;
    std::ofstream(file, std::ios::binary | std::ios::trunc) << h.dump() << "\n" << state;
    try {
      read_checkpoint(fs::path(file).parent_path().string());
      ADD_FAILURE() << field << " = " << value.dump() << " loaded";
    } catch (const DataError& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find(field) != std::string::npos || what.find("not a dsgd checkpoint") != std::string::npos)
          << field << " = " << value.dump() << ": " << what;
    }
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc) << good.dump() << "\n" << state;
  EXPECT_EQ(read_checkpoint(fs::path(file).parent_path().string()).state, "state of step 1");
}

// The writer's thread writes what it is given, one at a time and in order, rotating as
// write_rotating_checkpoint does, and hands back each outcome; a write that fails (here the root
// is a file) comes back as an error, never thrown from its thread.
TEST(CheckpointWriter, WritesInOrderOnItsThreadAndHandsBackEachOutcome) {
  testing::TempDir dir;
  const std::string root = dir.file("ckpts");
  {
    CheckpointWriter w(root, 2);
    for (int64_t step : {4, 8, 12}) w.submit({.step = step, .steps_done = step * 10}, state_of(step), "pt");
    const auto done = w.take(/*wait=*/true);
    ASSERT_EQ(done.size(), 3u);
    for (size_t i = 0; i < done.size(); ++i) {
      EXPECT_EQ(done[i].job.step, 4 * static_cast<int64_t>(i + 1));
      EXPECT_EQ(done[i].job.steps_done, 40 * static_cast<int64_t>(i + 1));
      EXPECT_TRUE(done[i].error.empty()) << done[i].error;
      EXPECT_EQ(done[i].bytes, state_of(done[i].job.step).state.size() + 2);
    }
    EXPECT_EQ(fs::path(done[2].path).filename(), "step-000000000012");
    EXPECT_TRUE(w.take(true).empty()) << "each outcome is handed back once";
    w.submit({.step = 16}, state_of(16), "");
  }  // the destructor waits for the write in flight
  const auto all = list_checkpoints(root);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(read_latest_checkpoint(root, nullptr).state, "state of step 16");
  std::ofstream(dir.file("a-file")) << "not a directory";
  CheckpointWriter bad(dir.file("a-file"), 1);
  bad.submit({.step = 1}, state_of(1), "");
  const auto done = bad.take(true);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].path.empty());
  EXPECT_FALSE(done[0].error.empty());
}

}  // namespace
}  // namespace dsgd::runtime
