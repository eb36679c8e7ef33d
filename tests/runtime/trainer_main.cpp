// The trainer tests' main: like every program that uses dsgd::Trainer, it calls dsgd::init
// first, so the driver can spawn this same binary as its workers.
#include <gtest/gtest.h>

#include "dsgd/trainer.h"

int main(int argc, char** argv) {
  dsgd::init(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
