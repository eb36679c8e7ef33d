#include "train_flags.h"

#include <chrono>
#include <functional>
#include <limits>

#include "dsgd/choice.h"

namespace dsgd::cli {
namespace {

// Binds `flag` to the TrainerConfig field `field` (named for the Trainer's errors).
template <typename T>
CLI::Option* bind_option(CLI::App* cmd, TrainFlags& f, const std::string& flag, const char* field, T& value,
                         const std::string& help) {
  f.flag_of[field] = flag;
  return cmd->add_option(flag, value, help);
}

CLI::Option* bind_flag(CLI::App* cmd, TrainFlags& f, const std::string& flag, const char* field, bool& value,
                       const std::string& help) {
  f.flag_of[field] = flag[0] == '!' ? flag.substr(1) : flag;
  return cmd->add_flag(flag, value, help);
}

// A flag whose text `set` turns into the field's value.
CLI::Option* bind_with(CLI::App* cmd, TrainFlags& f, const std::string& flag, const char* field,
                       std::function<void(const std::string&)> set, const std::string& help) {
  f.flag_of[field] = flag;
  return cmd->add_option_function<std::string>(flag, std::move(set), help);
}

// A fixed-set field: the spelling as given (an unknown one is kept for the Trainer's validation
// to name, with the spellings it takes).
template <typename E>
CLI::Option* bind_choice(CLI::App* cmd, TrainFlags& f, const std::string& flag, Choice<E>& value,
                         const std::string& help) {
  return bind_with(
             cmd, f, flag, ChoiceTraits<E>::field.data(), [&value](const std::string& v) { value = v; }, help)
      ->type_name("TEXT")
      ->default_str(value.name());
}

// --compression: a Compression, or "powersgd:R" (powersgd at rank R, powersgd_rank).
void set_compression(TrainerConfig& t, const std::string& v) {
  const auto colon = v.find(':');
  if (colon == std::string::npos) {
    t.comm.compression = v;
    return;
  }
  const std::string name = v.substr(0, colon), rank = v.substr(colon + 1);
  size_t used = 0;
  int r = 0;
  try {
    r = std::stoi(rank, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (name != "powersgd" || rank.empty() || used != rank.size()) {
    throw CLI::ValidationError("--compression",
                               "'" + v + "': only powersgd takes a rank, a whole number (e.g. powersgd:4)");
  }
  t.comm.compression = Compression::kPowerSgd;
  t.comm.powersgd_rank = r;
}

// The model, data and optimizer (the image classifier's config, and --in-process's job).
void add_job_flags(CLI::App* cmd, TrainFlags& f) {
  auto& j = f.job;
  cmd->add_option("--model", j.model,
                  "Model: cnn, mlp, resnet18, resnet50, simulated (sleeps instead of computing: see --config); "
                  "gpt-tiny, gpt-small, gpt-base (language models, on --dataset text:DIR); or a TorchScript file "
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
  cmd->add_option("--batch-size", j.batch_size, "Global batch size (samples per step)")->capture_default_str();
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
  cmd->add_option("--seed", j.seed, "Seed for initial weights and shuffling")->capture_default_str();
  j.threads = 0;
  cmd->add_option("--threads", j.threads, "LibTorch threads per worker; 0 = cores / workers")->capture_default_str();
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

// Workers, replicas and how they synchronise.
void add_strategy_flags(CLI::App* cmd, TrainFlags& f) {
  bind_option(cmd, f, "--workers", "num_workers", f.trainer.num_workers, "Worker processes")->capture_default_str();
  bind_option(cmd, f, "--devices-per-worker", "devices_per_worker", f.trainer.devices_per_worker,
              "Model replicas per worker process")
      ->capture_default_str();
  bind_choice(cmd, f, "--strategy", f.trainer.strategy, "Gradient synchronisation: simple, allreduce, ps or ps_async");
  bind_option(cmd, f, "--ps-shards", "ps.shards", f.trainer.ps.shards,
              "ps: parameter-server shards (0 = one per host)")
      ->capture_default_str();
  bind_flag(cmd, f, "--ps-update-on-shards", "ps.update_on_shards", f.trainer.ps.update_on_shards,
            "ps: the shards apply SGD and hold its momentum (optimizer state sharded); needs SGD");
  bind_choice(cmd, f, "--ps-placement", f.trainer.ps.placement,
              "ps: the shards live in the workers, or in processes of their own (--ps-shards of them; "
              "remote mode: start each with dsgd ps-server --shard S)");
  bind_option(cmd, f, "--max-staleness", "ps.max_staleness", f.trainer.ps.max_staleness,
              "ps_async: a worker this many updates ahead of the slowest waits (-1 = never)")
      ->capture_default_str();
  bind_option(cmd, f, "--local-hosts", "launch.local_hosts", f.trainer.launch.local_hosts,
              "Spread local workers over this many pseudo-hosts (shared memory only within each)")
      ->capture_default_str();
  bind_choice(cmd, f, "--allreduce-algo", f.trainer.comm.allreduce_algo, "auto (shared memory + Gloo), ring or hd");
  bind_option(cmd, f, "--grad-shard-bytes", "comm.grad_shard_bytes", f.trainer.comm.grad_shard_bytes,
              "Gradient bucket size in bytes")
      ->capture_default_str();
  bind_flag(cmd, f, "!--no-overlap", "comm.overlap", f.trainer.comm.overlap,
            "Communicate gradients after backward instead of during it");
  bind_with(
      cmd, f, "--forward-overlap-buckets", "comm.forward_overlap_buckets",
      [&t = f.trainer](const std::string& v) { t.comm.forward_overlap_buckets = v == "auto" ? -1 : std::stoi(v); },
      "Also overlap the next forward: this many buckets (spread over the layers) go after "
      "backward, first layer first, and each is applied as forward reaches it (0 = off; auto: tried on the "
      "first steps)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()) | CLI::IsMember({"auto"}))
      ->default_str(std::to_string(f.trainer.comm.forward_overlap_buckets));
}

// Checkpoints, snapshots and what happens when a worker is lost.
void add_recovery_flags(CLI::App* cmd, TrainFlags& f) {
  cmd->add_option("--save", f.save, "Write a checkpoint directory at the end");
  cmd->add_option("--load", f.load,
                  "Start from this checkpoint directory, or from the newest intact one in a --checkpoint-dir");
  bind_option(cmd, f, "--checkpoint-dir", "checkpoints.dir", f.trainer.checkpoints.dir,
              "Also write every --checkpoint-every snapshot here (step-N), keeping --keep-checkpoints");
  bind_option(cmd, f, "--checkpoint-every", "checkpoints.every_steps", f.trainer.checkpoints.every_steps,
              "Steps between snapshots, at least; a lost worker costs at most one interval (0 = once per epoch)")
      ->capture_default_str();
  bind_option(cmd, f, "--checkpoint-overhead", "checkpoints.max_overhead", f.trainer.checkpoints.max_overhead,
              "Longer intervals where snapshots would take more than this share of training time "
              "(0 = exactly every --checkpoint-every steps)")
      ->capture_default_str();
  bind_option(cmd, f, "--keep-checkpoints", "checkpoints.keep", f.trainer.checkpoints.keep,
              "Checkpoints kept in --checkpoint-dir")
      ->capture_default_str();
  bind_flag(cmd, f, "--fail-on-checkpoint-error", "checkpoints.fail_on_write_error",
            f.trainer.checkpoints.fail_on_write_error,
            "A --checkpoint-dir checkpoint that cannot be written (volume full) ends the job; without it: a "
            "warning, counted in the summary, and the next snapshot tries again");
  bind_option(cmd, f, "--standby", "recovery.standby_workers", f.trainer.recovery.standby_workers,
              "Standby workers: set up outside the group, each takes a lost worker's place in well under a second")
      ->capture_default_str();
  bind_choice(cmd, f, "--on-straggler", f.trainer.recovery.on_straggler,
              "A straggler named (computing >= 1.1x the others' step): warn, or evict it, a ready --standby taking "
              "its place");
  bind_flag(cmd, f, "--wait-for-replacements", "recovery.wait_for_replacements",
            f.trainer.recovery.wait_for_replacements,
            "After a loss without a standby, wait for new workers instead of going on with the survivors");
  bind_flag(cmd, f, "!--no-from-peer", "recovery.from_peer", f.trainer.recovery.from_peer,
            "After a loss mid-training, restore the last snapshot and train the steps since again, instead of "
            "giving the new workers a survivor's state");
  bind_option(cmd, f, "--driver-state", "recovery.driver_state_dir", f.trainer.recovery.driver_state_dir,
              "Keep what a driver needs to go on in this directory: this command started again with it (after "
              "the driver was killed or its host rebooted) takes the job up with the same workers, from the last "
              "snapshot; the workers wait --driver-grace-ms for it");
  bind_with(
      cmd, f, "--driver-grace-ms", "recovery.driver_grace",
      [&t = f.trainer](const std::string& v) { t.recovery.driver_grace = std::chrono::milliseconds(std::stoll(v)); },
      "With --driver-state: how long workers wait for a driver that stopped answering")
      ->check(CLI::Number)
      ->default_str(std::to_string(f.trainer.recovery.driver_grace.count()));
  bind_option(cmd, f, "--max-failures", "recovery.max_failures", f.trainer.recovery.max_failures,
              "Lost workers survived before the job fails")
      ->capture_default_str();
  bind_with(
      cmd, f, "--heartbeat-timeout-ms", "recovery.heartbeat_timeout",
      [&t = f.trainer](const std::string& v) {
        t.recovery.heartbeat_timeout = std::chrono::milliseconds(std::stoll(v));
      },
      "A worker silent this long (hung, or its network cut) is evicted")
      ->check(CLI::Number)
      ->default_str(std::to_string(f.trainer.recovery.heartbeat_timeout.count()));
}

// Where and in what arithmetic replicas compute, and what crosses hosts.
void add_precision_flags(CLI::App* cmd, TrainFlags& f) {
  bind_choice(cmd, f, "--device", f.trainer.device,
              "Where replicas compute: auto (CUDA when the workers' LibTorch sees a GPU), cpu or cuda");
  bind_choice(cmd, f, "--precision", f.trainer.step.precision,
              "fp32; bf16: forward and loss under bfloat16 autocast (float32 weights and optimizer); fp16: "
              "the same in float16 with dynamic loss scaling (CUDA only)");
  bind_option(cmd, f, "--loss-scale", "step.loss_scale", f.trainer.step.loss_scale,
              "Dynamic loss scaling from this scale (a power of two); 0: 65536 under fp16, else off; -1: off")
      ->capture_default_str();
  bind_option(cmd, f, "--loss-scale-growth-interval", "step.loss_scale_growth_interval",
              f.trainer.step.loss_scale_growth_interval, "Finite steps in a row before the loss scale doubles")
      ->capture_default_str();
  bind_with(
      cmd, f, "--compression", "comm.compression", [&t = f.trainer](const std::string& v) { set_compression(t, v); },
      "What crosses hosts (allreduce): none; fp16 / bf16: 16 bits a value on the wire, summed in "
      "float32; powersgd:R: PowerSGD's rank-R factors of each matrix (R default 4); the lossy ones with "
      "error feedback")
      ->default_str(f.trainer.comm.compression.name());
  f.flag_of["comm.powersgd_rank"] = "--compression";
  bind_option(cmd, f, "--powersgd-start-steps", "comm.powersgd_start_steps", f.trainer.comm.powersgd_start_steps,
              "--compression powersgd: plain float32 steps first")
      ->capture_default_str();
  bind_choice(cmd, f, "--nonfinite", f.trainer.step.nonfinite_policy,
              "A NaN/infinite gradient: skip (the step, everywhere, and warn) or error (stop)");
  bind_option(cmd, f, "--max-grad-norm", "step.max_grad_norm", f.trainer.step.max_grad_norm,
              "Clip the averaged gradients to this global L2 norm before each step (0: off)")
      ->capture_default_str();
  bind_option(cmd, f, "--accumulate-steps", "step.accumulate_steps", f.trainer.step.accumulate_steps,
              "Micro-batches per step: gradients summed locally, averaged once per step (1: off)")
      ->capture_default_str();
  bind_option(cmd, f, "--zero", "step.zero_stage", f.trainer.step.zero_stage,
              "ZeRO stage: 1 = each replica keeps optimizer state for its share of the parameters only, 2 = and "
              "only their gradients (0: off)")
      ->capture_default_str();
}

// Who starts the workers, and how they find the driver.
void add_launch_flags(CLI::App* cmd, TrainFlags& f) {
  bind_option(cmd, f, "--listen", "launch.listen", f.trainer.launch.listen,
              "HOST:PORT: wait for --workers workers started elsewhere (`dsgd worker`) instead of spawning");
  bind_option(cmd, f, "--token", "launch.token", f.trainer.launch.token,
              "Job token for --listen (default: $DSGD_TOKEN, else random, printed)");
  bind_choice(cmd, f, "--tls", f.trainer.launch.tls,
              "Mutual TLS on the control plane: auto (on where the driver starts every worker, with a CA it makes "
              "for the job; with --tls-dir wherever the workers run), on (an error where it cannot be had), off");
  cmd->add_flag_callback(
      "--no-tls", [&f] { f.trainer.launch.tls = Tls::kOff; }, "Same as --tls off: the control plane in plaintext");
  bind_option(cmd, f, "--tls-ca", "launch.tls_ca", f.trainer.launch.tls_ca, "The job's CA certificate (PEM)");
  bind_option(cmd, f, "--tls-cert", "launch.tls_cert", f.trainer.launch.tls_cert, "A certificate of that CA (PEM)");
  bind_option(cmd, f, "--tls-key", "launch.tls_key", f.trainer.launch.tls_key, "The certificate's key (PEM)");
  cmd->add_option_function<std::string>(
      "--tls-dir",
      [&f](const std::string& dir) {
        f.trainer.launch.tls_ca = dir + "/ca.pem";
        f.trainer.launch.tls_cert = dir + "/cert.pem";
        f.trainer.launch.tls_key = dir + "/key.pem";
      },
      "DIR/ca.pem, cert.pem and key.pem (`dsgd tls-keys DIR`): the job's keys, for workers that join by themselves "
      "with the same DIR");
  cmd->add_option("--cluster", f.cluster,
                  "A cluster spec (TF_CONFIG's shape; default: $DSGD_CLUSTER) whose task is the chief: listen on its "
                  "address for its workers and ps shards");
  bind_choice(
      cmd, f, "--launcher", f.trainer.launch.launcher,
      "Who starts the workers: local (this host), ssh (--hosts, over the system's ssh client; needs "
      "--listen HOST:PORT the hosts reach), mpirun (all at once; --hosts optional; a lost worker is not "
      "replaced), slurm (a job step per worker inside sbatch/salloc; needs --listen HOST:PORT the nodes reach), "
      "none (you do: `dsgd worker --driver`); auto: local, or none with --listen");
  f.flag_of["launch.hosts"] = "--hosts";
  cmd->add_option("--hosts", f.hosts_file,
                  "--launcher ssh or mpirun: a file of hosts, one \"host\" or \"host:slots\" a line (# comments)");
  bind_option(cmd, f, "--ssh-command", "launch.ssh_command", f.trainer.launch.ssh_command,
              "--launcher ssh: the ssh client and its options (e.g. \"ssh -p 2222 -i KEY\")")
      ->capture_default_str();
  bind_option(cmd, f, "--mpirun-command", "launch.mpirun_command", f.trainer.launch.mpirun_command,
              "--launcher mpirun: mpirun and its options (e.g. \"mpirun --allow-run-as-root\")")
      ->capture_default_str();
  bind_option(cmd, f, "--srun-command", "launch.srun_command", f.trainer.launch.srun_command,
              "--launcher slurm: srun and its options for every worker's step (e.g. \"srun --cpus-per-task=4\")")
      ->capture_default_str();
}

// The operator's config and this run's outputs.
void add_run_flags(CLI::App* cmd, TrainFlags& f) {
  cmd->add_option("--config", f.config,
                  "JSON object merged into the operator's config (keys: model, dataset, data_dir, lr, momentum, "
                  "lr_decay, dropout, channels_last, sync_batchnorm, cudnn_benchmark, synthetic_samples, "
                  "synthetic_image_size, synthetic_channels; for --model simulated: sim_parameters, "
                  "sim_layers, sim_step_ms; for --model gpt-*: context, dropout, lr, min_lr, weight_decay, beta1, "
                  "beta2, warmup_steps, decay_steps)");
  bind_option(cmd, f, "--metrics-port", "monitor.metrics_port", f.trainer.monitor.metrics_port,
              "Serve the job's live figures for Prometheus at http://HOST:PORT/metrics (0: any free port, "
              "logged; -1: off)")
      ->capture_default_str();
  bind_option(cmd, f, "--metrics-host", "monitor.metrics_host", f.trainer.monitor.metrics_host,
              "The address --metrics-port listens on (0.0.0.0: every interface)")
      ->capture_default_str();
  bind_option(cmd, f, "--metrics-dir", "monitor.metrics_dir", f.trainer.monitor.metrics_dir,
              "Write the dashboard's history (history.json) here as the job goes: `dsgd dashboard --metrics-dir "
              "DIR` shows it, during the job or after");
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
  add_job_flags(cmd, f);
  add_strategy_flags(cmd, f);
  add_recovery_flags(cmd, f);
  add_precision_flags(cmd, f);
  add_launch_flags(cmd, f);
  add_run_flags(cmd, f);
}

}  // namespace dsgd::cli
