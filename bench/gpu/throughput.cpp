// Training throughput of dsgd's Trainer, measured as bench/gpu/eager.py measures PyTorch eager:
// the same model, synthetic data already on the device, warm-up steps, then the wall time of a
// number of steps (each step ends with the loss read back, as the default train_batch does).
//   dsgd_gpu_bench --model resnet50 --batch 128 --image-size 224 --channels 3 --precision bf16 --steps 40
//   dsgd_gpu_bench --model gpt-small --tokens FILE --batch 32 --precision bf16 --steps 40
// Prints one JSON line: {"impl": "dsgd", "img_per_s": ...} (images) or {"tokens_per_s": ...} (a
// GPT, the built-in language model on a token file; --batch counts sequences of its context).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <iostream>

#include "dsgd/apps/image_classifier.h"
#include "dsgd/apps/language_model.h"
#include "dsgd/runtime/trainer.h"

int main(int argc, char** argv) {
  dsgd::register_builtin_operators();  // before init: a spawned worker constructs the operator
  dsgd::init(argc, argv);
  std::string model = "resnet50", precision = "fp32", device = "auto";
  int64_t batch = 128, image_size = 224, channels = 3, samples = 1024, warmup = 10, steps = 40;
  int workers = 1;
  bool cudnn_benchmark = true;
  std::string channels_last = "auto", tokens;
  CLI::App app("dsgd's training throughput on synthetic data (bench/gpu/run.sh)");
  app.add_option("--model", model)->capture_default_str();
  app.add_option("--precision", precision)->capture_default_str();
  app.add_option("--device", device)->capture_default_str();
  app.add_option("--batch", batch, "Global batch")->capture_default_str();
  app.add_option("--image-size", image_size)->capture_default_str();
  app.add_option("--channels", channels)->capture_default_str();
  app.add_option("--samples", samples, "Synthetic training samples")->capture_default_str();
  app.add_option("--warmup", warmup, "Steps before timing")->capture_default_str();
  app.add_option("--steps", steps, "Timed steps")->capture_default_str();
  app.add_option("--workers", workers)->capture_default_str();
  app.add_option("--channels-last", channels_last, "The image classifier's channels_last: auto (on a GPU), 1 or 0")
      ->check(CLI::IsMember({"auto", "1", "0"}))
      ->capture_default_str();
  app.add_option("--cudnn-benchmark", cudnn_benchmark, "The image classifier's cudnn_benchmark")->capture_default_str();
  app.add_option("--tokens", tokens, "A token file: --model is a GPT size (gpt-small, gpt-base)");
  CLI11_PARSE(app, argc, argv);
  const bool lm = !tokens.empty();
  try {
    dsgd::TrainerConfig c;
    c.num_workers = workers;
    c.batch_size = batch;
    c.device = device;
    c.step.precision = precision;
    c.checkpoints.every_steps = 1000000;  // no snapshot inside the timed steps
    c.config = {{"model", model},          {"dataset", "synthetic"},         {"synthetic_samples", samples},
                {"synthetic_channels", channels}, {"synthetic_image_size", image_size}, {"lr", 0.01},
                {"momentum", 0.9},         {"dropout", false},
                {"cudnn_benchmark", cudnn_benchmark}};
    if (channels_last != "auto") c.config["channels_last"] = channels_last == "1";
    if (lm) c.config = {{"model", model}, {"train_tokens", tokens}};
    dsgd::Trainer trainer(lm ? dsgd::kLanguageModel : dsgd::kImageClassifier, c);
    // A train() call stops at the epoch's end: as many calls as the steps take.
    auto run = [&trainer](int64_t n, double* loss) {
      int64_t done = 0;
      while (done < n) {
        const auto r = trainer.train({.num_steps = n - done});
        const auto b = static_cast<int64_t>(r.metrics.at("batches"));
        if (b == 0) break;
        done += b;
        *loss = r.metrics.at("loss");
      }
      return done;
    };
    double loss = 0;
    run(warmup, &loss);
    const auto t0 = std::chrono::steady_clock::now();
    const auto done = static_cast<double>(run(steps, &loss));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (lm) {
      const double context = static_cast<double>(dsgd::language_model_context(dsgd::language_model_options(c.config)));
      std::cout << nlohmann::json{{"impl", "dsgd"},          {"model", model},     {"precision", precision},
                                  {"workers", workers},      {"batch", batch},     {"context", context},
                                  {"steps", done},           {"seconds", s},       {"loss", loss},
                                  {"tokens_per_s", done * static_cast<double>(batch) * context / s}}
                       .dump()
                << std::endl;
      return 0;
    }
    std::cout << nlohmann::json{{"impl", "dsgd"},
                                {"model", model},
                                {"precision", precision},
                                {"workers", workers},
                                {"batch", batch},
                                {"steps", done},
                                {"seconds", s},
                                {"img_per_s", done * static_cast<double>(batch) / s},
                                {"loss", loss},
                                {"sync", "step"},
                                {"cudnn_benchmark", cudnn_benchmark ? 1 : 0},
                                {"channels_last",
                                 channels_last == "1" || (channels_last == "auto" && device != "cpu") ? 1 : 0}}
                     .dump()
              << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "dsgd_gpu_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
