#include "dsgd/image_classifier.h"

#include <ATen/Context.h>
#include <torch/optim/sgd.h>

#include <cmath>

#include "apps/classifier_loss.h"
#include "dsgd/data.h"
#include "dsgd/error.h"
#include "dsgd/language_model.h"
#include "dsgd/models.h"
#include "dsgd/operator.h"
#include "dsgd/sgd.h"

namespace dsgd {
namespace {

class ImageClassifier : public TrainingOperator {
 public:
  void setup(const nlohmann::json& config) override {
    const LocalJobOptions o = image_classifier_options(config);
    // Every batch of a replica has the same shape, so cuDNN's timing of its algorithms on the
    // first batches pays off on all later ones (PyTorch: torch.backends.cudnn.benchmark). A
    // process-wide switch, as in PyTorch; without a GPU it changes nothing.
    at::globalContext().setBenchmarkCuDNN(o.cudnn_benchmark);

    // Data exactly as the single-process job draws it.
    std::optional<data::ImageDataset> train, test;
    if (o.dataset == "synthetic") {
      const int64_t n_test = std::max<int64_t>(1, o.synthetic_samples / 4);
      auto all = data::make_synthetic({.num_samples = o.synthetic_samples + n_test,
                                       .channels = o.synthetic_channels,
                                       .image_size = o.synthetic_image_size,
                                       .seed = replica_seed()});
      train.emplace(all.images().slice(0, 0, o.synthetic_samples).contiguous(),
                    all.labels().slice(0, 0, o.synthetic_samples).contiguous(), all.num_classes());
      test.emplace(all.images().slice(0, o.synthetic_samples).contiguous(),
                   all.labels().slice(0, o.synthetic_samples).contiguous(), all.num_classes());
    } else {
      train.emplace(data::load_fashion_mnist(o.data_dir, data::Split::kTrain));
      test.emplace(data::load_fashion_mnist(o.data_dir, data::Split::kTest));
    }
    models::ModelOptions mo;
    mo.in_channels = train->images().size(1);
    mo.image_size = train->images().size(2);
    mo.num_classes = train->num_classes();
    mo.dropout = o.dropout;
    mo.channels_last =
        o.channels_last.value_or(replica().device.is_cuda() && o.model != "mlp" && o.model != "simulated");
    mo.sim_parameters = o.sim_parameters;
    mo.sim_layers = o.sim_layers;
    mo.sim_step_ms = o.sim_step_ms;
    auto model = register_model(models::make_model(o.model, mo));
    register_optimizer(std::make_unique<FusedSGD>(model->parameters(),
                                                           torch::optim::SGDOptions(o.lr).momentum(o.momentum)));
    register_loss(apps::classifier_loss(o.loss, mo.num_classes));
    const double decay = o.lr_decay;
    if (decay != 1.0)
      register_scheduler([decay](int64_t epoch) { return std::pow(decay, static_cast<double>(epoch)); });
    register_data(train->images(), train->labels(), test->images(), test->labels());
  }

 private:
  // The synthetic teacher depends on the job's seed only, like the single-process job's.
  uint64_t replica_seed() const { return replica().seed; }
};

}  // namespace

void register_builtin_operators() {
  register_language_model();
  static const bool once = [] {
    register_operator(kImageClassifier, [] { return std::unique_ptr<TrainingOperator>(new ImageClassifier()); });
    register_operator_config_check(kImageClassifier,
                                   [](const nlohmann::json& c) { (void)image_classifier_options(c); });
    return true;
  }();
  (void)once;
}

}  // namespace dsgd
