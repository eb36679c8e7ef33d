// A --checkpoint-dir on a volume that fills up mid-job (a tmpfs of a known size, mounted by the
// test: it needs root, as CI has): the periodic checkpoints that no longer fit are warned about
// and counted, training goes on to the end, the good ones stay and load, nothing half-written is
// left; with --fail-on-checkpoint-error the same job stops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "run_dsgd.h"
#include "testing/temp_dir.h"

namespace {

using dsgd::testing::CliRun;
using dsgd::testing::run_dsgd;
namespace fs = std::filesystem;

// A tmpfs of `bytes` at `dir` for the test's life (lazily unmounted, also when an assertion fails).
class SmallVolume {
 public:
  SmallVolume(const std::string& dir, uintmax_t bytes) : dir_(dir) {
    fs::create_directories(dir);
    const std::string cmd = "mount -t tmpfs -o size=" + std::to_string(bytes) + " dsgd-test-volume " + dir;
    mounted_ = std::system(cmd.c_str()) == 0;
  }
  ~SmallVolume() {
    if (mounted_) (void)std::system(("umount -l " + dir_).c_str());
  }
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

uintmax_t bytes_under(const fs::path& dir) {
  uintmax_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + " ";
  return s;
}

const std::string kJob =
    "train --model cnn --dataset synthetic --synthetic-samples 640 --batch-size 32 --workers 2 --threads 1 "
    "--epochs 1 --checkpoint-every 2 --checkpoint-overhead 0 --no-eval --quiet";

TEST(CliCheckpointVolume, AVolumeThatFillsUpWarnsCountsAndTrainingGoesOn) {
  dsgd::testing::TempDir dir;
  // One checkpoint's size, written where there is room.
  const CliRun probe = run_dsgd(kJob + " --max-steps 2 --keep-checkpoints 1 --checkpoint-dir " + dir.file("probe"));
  ASSERT_EQ(probe.exit_code, 0) << probe.output;
  const uintmax_t one = bytes_under(dir.file("probe"));
  ASSERT_GT(one, 100000u) << "the probe wrote no checkpoint";

  const std::string vol = dir.file("vol");
  SmallVolume volume(vol, one * 5 / 2);  // room for two
  ASSERT_TRUE(volume.mounted()) << "cannot mount a tmpfs at " << vol << " (the test needs root)";
  const std::string json = dir.file("run.json");
  const CliRun run = run_dsgd(kJob + " --keep-checkpoints 3 --checkpoint-dir " + vol + " --json-out " + json);
  ASSERT_EQ(run.exit_code, 0) << "a full checkpoint volume ended the job\n" << run.output;
  EXPECT_NE(run.output.find("NOT written"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("No space left on device"), std::string::npos) << run.output;
  std::ifstream in(json);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["steps"], 20) << "training did not go on to the end";
  // 20 steps, a snapshot every 2: 10 checkpoints tried, 2 fit.
  EXPECT_EQ(j["checkpoint_failures"], 8) << run.output;
  const auto left = entries(vol);
  EXPECT_EQ(left.size(), 3u) << joined(left);  // two steps and the job-ended mark
  for (const auto& name : left) {
    EXPECT_EQ(name.find(".partial"), std::string::npos) << joined(left);
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << joined(left);
  }
  // The good ones load (the newest intact one of the directory), and training goes on from it.
  const CliRun resumed = run_dsgd(kJob + " --load " + vol + " --max-steps 1");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;

  // Asked to: the same full volume ends the job, saying why.
  const CliRun strict =
      run_dsgd(kJob + " --keep-checkpoints 3 --checkpoint-dir " + vol + " --fail-on-checkpoint-error");
  EXPECT_EQ(strict.exit_code, 1) << strict.output;
  EXPECT_NE(strict.output.find("No space left on device"), std::string::npos) << strict.output;
  for (const auto& name : entries(vol)) EXPECT_EQ(name.find(".partial"), std::string::npos) << name;
}

}  // namespace
