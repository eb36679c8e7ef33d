// Two models and two optimizers in one operator (GAN-style), with a custom train_batch.
//
//   ./gan            # 2 workers learn to generate samples of N(3, 0.5) from noise
//
// Each backward averages the gradients of the models it reaches, across the workers, so the
// alternating discriminator and generator steps stay in lockstep on every replica.
#include <dsgd/torch/operator.h>
#include <dsgd/runtime/trainer.h>
#include <torch/torch.h>

#include <iostream>

torch::nn::Sequential mlp(int64_t in, int64_t out) {
  return torch::nn::Sequential(torch::nn::Linear(in, 32), torch::nn::ReLU(), torch::nn::Linear(32, 32),
                               torch::nn::ReLU(), torch::nn::Linear(32, out));
}

class GanOperator : public dsgd::TrainingOperator {
 public:
  void setup(const nlohmann::json& config) override {
    generator_ = register_model(mlp(4, 1));
    discriminator_ = register_model(mlp(1, 1));
    const double lr = config.value("lr", 0.002);
    g_opt_ = &register_optimizer(std::make_unique<torch::optim::Adam>(generator_->parameters(), lr));
    d_opt_ = &register_optimizer(std::make_unique<torch::optim::Adam>(discriminator_->parameters(), lr));
    auto gen = at::detail::createCPUGenerator(replica().seed);
    register_data(3.0 + 0.5 * torch::randn({16384, 1}, gen));  // real samples; no targets
    // Different noise on every replica (the models stay identical: their gradients are averaged).
    noise_ = at::detail::createCPUGenerator(replica().seed * 1000 + static_cast<uint64_t>(replica().rank) + 1);
  }

  dsgd::Metrics train_batch(const dsgd::Batch& batch) override {
    const int64_t n = batch.size();
    auto bce = [](const torch::Tensor& logits, double label) {
      return torch::binary_cross_entropy_with_logits(logits, torch::full_like(logits, label));
    };
    auto fake = generator_->forward(torch::randn({n, 4}, noise_));
    // Discriminator: real -> 1, fake -> 0 (fake detached: no generator gradient here).
    d_opt_->zero_grad();
    auto d_loss = bce(discriminator_->forward(batch.data), 1.0) + bce(discriminator_->forward(fake.detach()), 0.0);
    d_loss.backward();
    d_opt_->step();
    // Generator: make the discriminator say 1.
    g_opt_->zero_grad();
    auto g_loss = bce(discriminator_->forward(fake), 1.0);
    g_loss.backward();
    g_opt_->step();
    return {{"d_loss", d_loss.item<double>()}, {"g_loss", g_loss.item<double>()}, {"num_samples", double(n)}};
  }

  dsgd::Metrics validate() override {
    torch::NoGradGuard no_grad;
    auto samples = generator_->forward(torch::randn({4096, 4}, noise_));
    return {{"mean", samples.mean().item<double>()}, {"std", samples.std().item<double>()}, {"num_samples", 4096}};
  }

 private:
  torch::nn::Sequential generator_{nullptr}, discriminator_{nullptr};
  torch::optim::Optimizer* g_opt_ = nullptr;
  torch::optim::Optimizer* d_opt_ = nullptr;
  at::Generator noise_;
};
DSGD_REGISTER_OPERATOR(GanOperator);

int main(int argc, char** argv) {
  dsgd::init(argc, argv);
  dsgd::Trainer trainer(dsgd::operator_of<GanOperator>(), {.num_workers = 2, .batch_size = 128});
  dsgd::Metrics v;
  for (int epoch = 1; epoch <= 4; ++epoch) {
    auto t = trainer.train();
    v = trainer.validate().metrics;
    std::cout << "epoch " << epoch << ": d_loss " << t.metrics["d_loss"] << ", g_loss " << t.metrics["g_loss"]
              << ", generated mean " << v["mean"] << " std " << v["std"] << " (target 3.0, 0.5)\n";
  }
  const bool ok = std::abs(v["mean"] - 3.0) < 0.5;
  std::cout << (ok ? "generator learned the mean" : "generator did NOT learn the mean") << "\n";
  return ok ? 0 : 1;
}
