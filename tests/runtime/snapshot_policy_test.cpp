// When the driver snapshots during train(): the interval from the checkpoint budget, scaled to
// the state's size, and the steps a recovery replays.
#include "runtime/driver/snapshot_policy.h"

#include <gtest/gtest.h>

namespace dsgd::runtime {
namespace {

TrainerConfig budget(int64_t every, double overhead) {
  TrainerConfig c;
  c.checkpoints.every_steps = every;
  c.checkpoints.max_overhead = overhead;
  return c;
}

// 0.1 s per snapshot against a 2% budget: one per 5 s of training, 500 steps of 10 ms.
TEST(SnapshotPolicy, SpacesSnapshotsToTheBudgetAndNeverCloserThanEvery) {
  const TrainerConfig c = budget(50, 0.02);
  SnapshotPolicy p(c);
  EXPECT_EQ(p.chunk_steps(0.01), 50);  // no snapshot timed yet
  p.taken(0.1, 1000);
  EXPECT_EQ(p.chunk_steps(0.01), 500);
  EXPECT_EQ(p.chunk_steps(1.0), 50);   // slow steps: every_steps is the floor
  EXPECT_EQ(p.chunk_steps(0), 50);     // no step timed yet
  const TrainerConfig off = budget(50, 0);
  SnapshotPolicy q(off);
  q.taken(0.1, 1000);
  EXPECT_EQ(q.chunk_steps(0.01), 50);
}

// The constructor's snapshot holds no optimizer state (momentum appears at the first step), so
// its cost, for its size, predicts the next one's once the driver tells the state's size now:
// here twice as big, so twice the interval. A snapshot taken after steps needs no such answer.
TEST(SnapshotPolicy, ScalesTheLastSnapshotsCostToTheStatesSizeNow) {
  const TrainerConfig c = budget(50, 0.02);
  SnapshotPolicy p(c);
  p.taken(0.1, 1000, /*before_steps=*/true);
  EXPECT_TRUE(p.wants_size());
  EXPECT_EQ(p.chunk_steps(0.01), 500);
  p.resized(2000);
  EXPECT_FALSE(p.wants_size());
  EXPECT_DOUBLE_EQ(p.predicted_cost_s(), 0.2);
  EXPECT_EQ(p.chunk_steps(0.01), 1000);
  // Deferred up to the scaled interval, then due.
  EXPECT_TRUE(p.defer(600, 0.01, {0, 600}));
  EXPECT_EQ(p.next_chunk(0.01), 400);
  EXPECT_FALSE(p.defer(400, 0.01, {0, 1000}));
  // The snapshot then taken is measured as it is: 0.5 s for 2000 bytes.
  p.taken(0.5, 2000);
  EXPECT_FALSE(p.wants_size());
  EXPECT_DOUBLE_EQ(p.predicted_cost_s(), 0.5);
  EXPECT_EQ(p.chunk_steps(0.01), 2500);
}

TEST(SnapshotPolicy, DeferredStepsArePendingUntilTheNextSnapshotAndReplayToTheLastChunksEnd) {
  const TrainerConfig c = budget(10, 0);
  SnapshotPolicy p(c);
  EXPECT_TRUE(p.defer(4, 0.01, {0, 4}));
  EXPECT_TRUE(p.defer(5, 0.01, {0, 9}));
  EXPECT_EQ(p.pending(), 9);
  EXPECT_EQ(p.replay_to(), (SnapshotPolicy::Position{0, 9}));
  EXPECT_EQ(p.next_chunk(0.01), 1);
  EXPECT_FALSE(p.defer(1, 0.01, {0, 10}));
  p.taken(0.01, 100);
  EXPECT_EQ(p.pending(), 0);
  // With a checkpoint_dir every snapshot goes to disk: none waits.
  TrainerConfig disk = budget(10, 0);
  disk.checkpoints.dir = "/tmp/x";
  SnapshotPolicy d(disk);
  EXPECT_FALSE(d.defer(1, 0.01, {0, 1}));
}

// Checkpoints the workers write need no snapshot: chunks end at every checkpoint_every_steps for
// the checkpoint, while the snapshot waits for its own, budgeted interval (here 500 steps).
TEST(SnapshotPolicy, WithCheckpointsByTheWorkersChunksEndAtEachCheckpointAndSnapshotsWait) {
  TrainerConfig c = budget(50, 0.02);
  c.checkpoints.dir = "/tmp/x";
  SnapshotPolicy p(c);
  p.checkpoints_by_workers(true);
  p.taken(0.1, 1000);
  EXPECT_EQ(p.chunk_steps(0.01), 500);
  EXPECT_EQ(p.next_chunk(0.01), 50);
  for (int i = 1; i < 10; ++i) {
    EXPECT_TRUE(p.defer(50, 0.01, {0, 50 * i})) << i;
    EXPECT_EQ(p.next_chunk(0.01), 50) << i;
  }
  EXPECT_FALSE(p.defer(50, 0.01, {0, 500}));  // the budget's interval: the snapshot is due
  // An interval of 520 steps (0.104 s a snapshot) ends at the checkpoint after it, step 550.
  p.taken(0.104, 1000);
  EXPECT_EQ(p.chunk_steps(0.01), 550);
  p.taken(0.1, 1000);
  // Back to the driver's writes (a worker that does not see the directory): every snapshot goes
  // to disk, the chunk is the budget's interval, and none waits.
  p.checkpoints_by_workers(false);
  EXPECT_EQ(p.next_chunk(0.01), 500);
  EXPECT_FALSE(p.defer(1, 0.01, {0, 501}));
  // Once per call (checkpoint_every_steps 0): the chunk is the call.
  TrainerConfig per_call = budget(0, 0.02);
  per_call.checkpoints.dir = "/tmp/x";
  SnapshotPolicy q(per_call);
  q.checkpoints_by_workers(true);
  EXPECT_EQ(q.next_chunk(0.01), 0);
}

}  // namespace
}  // namespace dsgd::runtime
