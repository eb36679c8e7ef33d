// The job's ports under attack: garbage bytes, half-open connections and a port scan against the
// driver's and the workers' listening ports while training. The job must be undisturbed: its
// result equals an undisturbed run's. And local mode listens on loopback only, its control plane
// over mutual TLS with keys made for the job: the token alone does not let a process in.
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <iostream>

#include "dsgd/runtime/trainer.h"
#include "dsgd/common/error.h"
#include "dsgd/apps/image_classifier.h"
#include "control/driver_service.h"
#include "testing/port_attacker.h"

namespace dsgd {
namespace {

TrainerConfig config() {
  TrainerConfig c;
  c.num_workers = 2;
  c.batch_size = 64;
  c.seed = 7;
  c.comm.allreduce_algo = "ring";  // Gloo on every worker: listening ports of its own
  c.threads_per_worker = 1;
  c.config = {
      {"model", "cnn"}, {"dataset", "synthetic"}, {"synthetic_samples", 2048}, {"lr", 0.01}, {"dropout", false}};
  return c;
}

std::vector<torch::Tensor> parameters_after(Trainer& t, int64_t steps) {
  t.train({.num_steps = steps});
  std::vector<torch::Tensor> out;
  for (const auto& p : t.get_model()->parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(TrainerSecurity, GarbageHalfOpenConnectionsAndAPortScanLeaveTheResultUnchanged) {
  dsgd::register_builtin_operators();
  std::vector<torch::Tensor> reference;
  {
    Trainer quiet(dsgd::kImageClassifier, config());
    reference = parameters_after(quiet, 20);
  }
  // From before the workers start until training ends: setup, rendezvous and training.
  testing::PortAttacker attacker;
  std::vector<torch::Tensor> attacked;
  std::exception_ptr error;
  try {
    Trainer t(dsgd::kImageClassifier, config());
    attacked = parameters_after(t, 20);
  } catch (...) {
    error = std::current_exception();
  }
  attacker.stop();
  if (error) std::rethrow_exception(error);
  std::cout << attacker.attacks() << " attacks on " << attacker.ports() << " ports, " << attacker.half_open()
            << " half-open connections held\n";
  EXPECT_GT(attacker.attacks(), 10);
  EXPECT_GE(attacker.ports(), 1u);  // the driver's, at least
  EXPECT_EQ(attacker.exposed(), 0) << "local mode listened beyond loopback";
  ASSERT_EQ(attacked.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_TRUE(torch::equal(attacked[i], reference[i])) << "parameter " << i << " differs";
  }
}

TEST(TrainerSecurity, ALocalJobsControlPlaneIsTlsAndTheTokenAloneLetsNoProcessIn) {
  dsgd::register_builtin_operators();
  TrainerConfig plain_config = config();
  plain_config.launch.tls = "off";
  std::vector<torch::Tensor> plain;
  {
    Trainer t(dsgd::kImageClassifier, plain_config);
    EXPECT_FALSE(t.tls());
    plain = parameters_after(t, 8);
  }
  Trainer t(dsgd::kImageClassifier, config());
  ASSERT_TRUE(t.tls()) << "a local job should make its own keys";
  // With the token, but without the job's keys or with another job's: refused at the handshake.
  for (const auto& keys : {control::TlsKeys{}, control::make_job_keys()}) {
    control::DriverClient stranger(t.address(), t.token(), keys);
    try {
      stranger.register_worker("stranger", "127.0.0.1", 1, -1, std::chrono::milliseconds(1500));
      ADD_FAILURE() << "a process with the token but " << (keys.enabled() ? "another CA's keys" : "no keys")
                    << " registered";
    } catch (const CommError& e) {
      std::cout << "refused: " << e.what() << "\n";
    }
  }
  const auto with_tls = parameters_after(t, 8);
  ASSERT_EQ(with_tls.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(with_tls[i], plain[i])) << "parameter " << i;
}

}  // namespace
}  // namespace dsgd
