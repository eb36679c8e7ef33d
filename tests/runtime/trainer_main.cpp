// The trainer tests' main: like every program that uses dsgd::Trainer, it calls dsgd::init
// first, so the driver can spawn this same binary as its workers; the built-in operators are
// registered before it, so a spawned worker can construct them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>

#include "dsgd/apps/image_classifier.h"
#include "dsgd/runtime/trainer.h"

int main(int argc, char** argv) {
  // A test's way to make replacement workers fail to start: while the file named by
  // DSGD_TEST_REFUSE_WORKERS_WHILE exists, a worker exits at once.
  const char* refuse = std::getenv("DSGD_TEST_REFUSE_WORKERS_WHILE");
  for (int i = 1; refuse != nullptr && i < argc; ++i) {
    if (std::strcmp(argv[i], "--dsgd-worker") == 0 && ::access(refuse, F_OK) == 0) {
      std::cerr << "test worker: refusing to start while " << refuse << " exists\n";
      return 3;
    }
  }
  dsgd::register_builtin_operators();
  dsgd::init(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
