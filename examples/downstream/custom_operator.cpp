// Your own model and TrainingOperator, trained by 2 worker processes with allreduce.
//
//   ./custom_operator            # spawns 2 workers (this same binary), trains 5 epochs, saves
//
// The operator fits y = sin(3x) + noise with a small MLP. Everything dsgd needs is in setup():
// the model, optimizer, loss, a learning-rate schedule and the data. The defaults of train_batch
// and validate do the rest; gradients are averaged across the workers inside backward().
#include <dsgd/dsgd.h>  // everything (dsgd::dsgd); or dsgd/torch/operator.h and dsgd/runtime/trainer.h
#include <torch/torch.h>

#include <cmath>
#include <iostream>

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(1, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 64));
    fc3 = register_module("fc3", torch::nn::Linear(64, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3->forward(torch::tanh(fc2->forward(torch::tanh(fc1->forward(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

class SineOperator : public dsgd::TrainingOperator {
 public:
  void setup(const nlohmann::json& config) override {
    auto net = register_model(std::make_shared<Net>());
    register_optimizer(std::make_unique<torch::optim::SGD>(
        net->parameters(), torch::optim::SGDOptions(config.value("lr", 0.1)).momentum(0.9)));
    register_loss([](const torch::Tensor& out, const torch::Tensor& y) { return torch::mse_loss(out, y); });
    register_scheduler([](int64_t epoch) { return std::pow(0.8, static_cast<double>(epoch)); });
    // The same data on every replica: drawn from the job's seed, not from the replica's rank.
    auto gen = at::detail::createCPUGenerator(replica().seed);
    auto x = torch::rand({8192, 1}, gen) * 4 - 2;
    auto y = torch::sin(3 * x) + 0.05 * torch::randn({8192, 1}, gen);
    register_data(x.slice(0, 0, 6144), y.slice(0, 0, 6144), x.slice(0, 6144), y.slice(0, 6144));
  }
};
DSGD_REGISTER_OPERATOR(SineOperator);

int main(int argc, char** argv) {
  dsgd::init(argc, argv);  // first: in a spawned worker this serves the job and exits
  dsgd::Trainer trainer(dsgd::operator_of<SineOperator>(),
                        {.num_workers = 2, .strategy = "allreduce", .batch_size = 64, .config = {{"lr", 0.1}}});
  double first = 0, last = 0;
  for (int epoch = 1; epoch <= 5; ++epoch) {
    auto t = trainer.train();
    auto v = trainer.validate();
    if (epoch == 1) first = v.metrics["loss"];
    last = v.metrics["loss"];
    std::cout << "epoch " << epoch << ": train loss " << t.metrics["loss"] << ", validation loss " << last << "\n";
  }
  trainer.save("sine-ckpt");
  std::cout << (last < 0.5 * first ? "validation loss fell" : "validation loss did NOT fall") << "\n";
  return last < 0.5 * first ? 0 : 1;
}
