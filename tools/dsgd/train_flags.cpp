#include "train_flags.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "dsgd/runtime/settings.h"

namespace dsgd::cli {
namespace {

// The JSON a flag's text stands for, by the setting's type: numbers as numbers where they read
// as one (else the text, for the setting to accept, "auto", or to name as wrong), lists split at
// commas, the rest as text.
nlohmann::json flag_value(const SettingDescription& d, const std::string& text) {
  if (d.type == "integer" || d.type == "milliseconds" || d.type == "number") {
    char* end = nullptr;
    if (d.type == "number") {
      const double x = std::strtod(text.c_str(), &end);
      if (!text.empty() && *end == '\0') return x;
    } else {
      const long long n = std::strtoll(text.c_str(), &end, 10);
      if (!text.empty() && *end == '\0') return n;
    }
    return text;
  }
  if (d.type == "strings") {
    nlohmann::json out = nlohmann::json::array();
    for (size_t from = 0; from <= text.size();) {
      const size_t comma = std::min(text.find(',', from), text.size());
      out.push_back(text.substr(from, comma - from));
      from = comma + 1;
    }
    return out;
  }
  return text;
}

std::string default_text(const SettingDescription& d) {
  const nlohmann::json v = d.get(TrainerConfig{});
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// --help's heading of a setting: its group ("Comm settings"), or the job's for the top level.
std::string heading(const std::string& path) {
  const auto dot = path.find('.');
  if (dot == std::string::npos) return "Job settings";
  std::string g = path.substr(0, dot);
  g[0] = static_cast<char>(std::toupper(g[0]));
  return g + " settings";
}

// Binds the flag of setting `d` (dsgd/runtime/settings.h) to f.trainer: its text set through the
// setting's own setter, so the flag takes what apply_settings and Python take.
void bind_setting(CLI::App* cmd, TrainFlags& f, const SettingDescription& d) {
  const bool negated = d.flag[0] == '!';
  const std::string flag = negated ? d.flag.substr(1) : d.flag;
  f.flag_of[d.path] = flag;
  CLI::Option* o = nullptr;
  if (d.type == "bool") {
    o = cmd->add_flag_callback(
        flag, [&f, &d, negated] { d.set(f.trainer, !negated); }, d.help);
  } else {
    o = cmd->add_option_function<std::string>(
        flag,
        [&f, &d, flag](const std::string& text) {
          try {
            d.set(f.trainer, flag_value(d, text));
          } catch (const ConfigError& e) {
            throw CLI::ValidationError(flag, e.what());
          }
        },
        d.help);
    o->type_name(d.type == "integer"        ? "INT"
                 : d.type == "number"       ? "FLOAT"
                 : d.type == "milliseconds" ? "MS"
                                            : "TEXT")
        ->default_str(default_text(d));
  }
  o->group(heading(d.path));
}

// The settings the job flags below bind themselves, since --in-process's job takes them too.
bool bound_by_job(const std::string& path) {
  return path == "batch_size" || path == "seed" || path == "threads_per_worker";
}

std::string help_of(const std::string& path) { return find_setting(path)->help; }

// The model, data and optimizer (the image classifier's config, and --in-process's job).
void add_job_flags(CLI::App* cmd, TrainFlags& f) {
  auto& j = f.job;
  cmd->add_option("--model", j.model,
                  "Model: cnn, mlp, resnet18, resnet50, simulated (sleeps instead of computing: see --config); "
                  "gpt-tiny, gpt-small, gpt-base, gpt-medium, gpt-large, gpt-xl (language models, on --dataset "
                  "text:DIR); or a TorchScript file "
                  "(FILE.pt: torch.jit.save(torch.jit.script(net), FILE.pt) in Python; images to logits)")
      ->capture_default_str();
  cmd->add_option("--loss", j.loss,
                  "Image models' loss: cross_entropy, nll (log-probabilities), mse (against one-hot targets), or a "
                  "TorchScript file whose forward(output, target) returns it")
      ->capture_default_str();
  cmd->add_option("--dataset", j.dataset,
                  "Data: fashion-mnist, synthetic (random images, for benchmarks), text:DIR (token files from "
                  "`dsgd prepare-text --out DIR`) or FILE.pt (tensors: torch.save({'train_x': x, 'train_y': y, "
                  "'test_x': ..., 'test_y': ...}, FILE.pt))")
      ->capture_default_str();
  cmd->add_option("--data-dir", j.data_dir, "Directory with Fashion-MNIST's IDX files (.gz or plain)")
      ->capture_default_str();
  cmd->add_option("--epochs", j.epochs, "Passes over the training set")->capture_default_str();
  cmd->add_option("--batch-size", j.batch_size, help_of("batch_size"))->capture_default_str();
  f.flag_of["batch_size"] = "--batch-size";
  f.lr_option = cmd->add_option("--lr", j.lr, "Learning rate (SGD's; a language model's AdamW: default 6e-4)")
                    ->capture_default_str();
  cmd->add_option("--optimizer", j.optimizer, "Image models' optimizer: sgd (with --momentum), adam, adamw or rmsprop")
      ->check(CLI::IsMember({"sgd", "adam", "adamw", "rmsprop"}))
      ->capture_default_str();
  cmd->add_option("--momentum", j.momentum, "SGD momentum, in [0, 1)")->capture_default_str();
  cmd->add_option("--weight-decay", j.weight_decay, "Image models' weight decay (default: 0; adamw 0.01)");
  cmd->add_option("--lr-decay", j.lr_decay, "Multiply the learning rate by this after every epoch, in (0, 1]")
      ->capture_default_str();
  cmd->add_option("--seed", j.seed, help_of("seed"))->capture_default_str();
  f.flag_of["seed"] = "--seed";
  j.threads = 0;
  cmd->add_option("--threads", j.threads, help_of("threads_per_worker"))->capture_default_str();
  f.flag_of["threads_per_worker"] = "--threads";
  cmd->add_option("--max-steps", j.max_steps, "Stop after this many steps in all; 0 = run every epoch")
      ->capture_default_str();
  cmd->add_option("--synthetic-samples", j.synthetic_samples, "Training samples of --dataset synthetic")
      ->capture_default_str();
  cmd->add_option("--image-size", j.synthetic_image_size, "Image side in pixels of --dataset synthetic")
      ->capture_default_str();
  cmd->add_option("--channels", j.synthetic_channels, "Image channels of --dataset synthetic (3: ImageNet-shaped)")
      ->capture_default_str();
  cmd->add_flag("!--no-eval", j.evaluate, "Skip evaluating on the test split after each epoch");
  cmd->add_flag("!--no-dropout", j.dropout, "Turn dropout layers off");
  cmd->add_flag("--sync-batchnorm", j.sync_batchnorm,
                "ResNets: BatchNorm with the global batch's statistics (every replica's samples together), as one "
                "process with the whole batch; costs two small sums over the replicas a layer and step");
}

// Every setting with a flag, from its description; then the flags of the command line alone.
void add_setting_flags(CLI::App* cmd, TrainFlags& f) {
  for (const auto& d : setting_descriptions()) {
    if (!d.flag.empty() && !bound_by_job(d.path)) bind_setting(cmd, f, d);
  }
  f.flag_of["comm.powersgd_rank"] = "--compression";  // powersgd:R
  cmd->add_option("--save", f.save, "Write a checkpoint directory at the end");
  cmd->add_option("--load", f.load,
                  "Start from this checkpoint directory, or from the newest intact one in a --checkpoint-dir");
  cmd->add_flag_callback(
         "--no-tls", [&f] { f.trainer.launch.tls = Tls::kOff; }, "Same as --tls off: the control plane in plaintext")
      ->group(heading("launch.tls"));
  cmd->add_option_function<std::string>(
         "--tls-dir",
         [&f](const std::string& dir) {
           f.trainer.launch.tls_ca = dir + "/ca.pem";
           f.trainer.launch.tls_cert = dir + "/cert.pem";
           f.trainer.launch.tls_key = dir + "/key.pem";
         },
         "DIR/ca.pem, cert.pem and key.pem (`dsgd tls-keys DIR`): the job's keys, for workers that join by "
         "themselves with the same DIR")
      ->group(heading("launch.tls"));
  cmd->add_option("--cluster", f.cluster,
                  "A cluster spec (TF_CONFIG's shape; default: $DSGD_CLUSTER) whose task is the chief: listen on its "
                  "address for its workers and ps shards")
      ->group(heading("launch.hosts"));
  f.flag_of["launch.hosts"] = "--hosts";
  cmd->add_option("--hosts", f.hosts_file,
                  "--launcher ssh or mpirun: a file of hosts, one \"host\" or \"host:slots\" a line (# comments)")
      ->group(heading("launch.hosts"));
}

// The operator's config and this run's outputs.
void add_run_flags(CLI::App* cmd, TrainFlags& f) {
  cmd->add_option("--config", f.config,
                  "JSON object merged into the operator's config (keys: model, dataset, data_dir, lr, momentum, "
                  "lr_decay, dropout, channels_last, sync_batchnorm, cudnn_benchmark, synthetic_samples, "
                  "synthetic_image_size, synthetic_channels; for --model simulated: sim_parameters, "
                  "sim_layers, sim_step_ms; for --model gpt-*: context, dropout, lr, min_lr, weight_decay, beta1, "
                  "beta2, warmup_steps, decay_steps)");
  cmd->add_flag("--in-process", f.in_process, "Train in this process without workers (the single-process baseline)");
  cmd->add_option("--json-out", f.json_out, "Also write the JSON summary to this file");
  cmd->add_flag("-q,--quiet", f.quiet, "No progress output");
  cmd->add_option("--trace", f.trace,
                  "Write a timeline of the training to this file, a Chrome trace (open it in ui.perfetto.dev "
                  "or chrome://tracing): each worker's forward, backward, optimizer and waits for buckets, "
                  "and every allreduce on its communication thread. With several epochs, one file each: "
                  "trace.json becomes trace-epoch1.json, ...")
      ->type_name("FILE");
  cmd->add_flag("--profile", f.profile,
                "Time each step's phases (forward, backward, optimizer, waiting for communication, and the "
                "driver's snapshots; ms per step, mean over workers): on stderr after each epoch and at the "
                "end, and in the JSON summary");
}

}  // namespace

void add_train_flags(CLI::App* cmd, TrainFlags& f) {
  f.command = cmd;
  add_job_flags(cmd, f);
  add_setting_flags(cmd, f);
  add_run_flags(cmd, f);
}

}  // namespace dsgd::cli
