#include "dsgd/apps/image_classifier.h"

#include <ATen/Context.h>

#include <cmath>

#include "apps/classifier_parts.h"
#include "dsgd/data/datasets.h"
#include "dsgd/common/error.h"
#include "dsgd/apps/language_model.h"
#include "dsgd/models/registry.h"
#include "dsgd/torch/operator.h"

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
    const apps::ClassifierData d = apps::classifier_data(o, replica_seed());
    models::ModelOptions mo = apps::classifier_model_options(o, d);
    mo.channels_last =
        o.channels_last.value_or(replica().device.is_cuda() && mo.input_shape.empty() && o.model != "mlp" &&
                                 o.model != "simulated");
    auto model = register_model(models::make_model(o.model, mo));
    register_optimizer(apps::classifier_optimizer(model->parameters(), o));
    register_loss(apps::classifier_loss(o.loss, mo.num_classes));
    const double decay = o.lr_decay;
    if (decay != 1.0)
      register_scheduler([decay](int64_t epoch) { return std::pow(decay, static_cast<double>(epoch)); });
    register_data(d.train_x, d.train_y, d.test_x, d.test_y);
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
