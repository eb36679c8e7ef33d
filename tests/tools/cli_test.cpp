// The `dsgd` command line, run as a user would: help, flag errors (exit 2 with a clear message),
// data errors (exit 1), and a short real run whose JSON summary is checked.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "dsgd/runtime/trainer.h"
#include "run_dsgd.h"
#include "testing/temp_dir.h"

namespace {

using dsgd::testing::children_of;
using dsgd::testing::CliRun;
using dsgd::testing::free_port;
using dsgd::testing::process_gone;
using dsgd::testing::run_command;
using dsgd::testing::run_dsgd;
using dsgd::testing::start_dsgd;
using dsgd::testing::start_train;

void expect_usage_error(const std::string& args, const std::string& needle) {
  CliRun r = run_dsgd(args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
}

TEST(Cli, HelpDescribesSubcommandsAndFlags) {
  CliRun top = run_dsgd("--help");
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_NE(top.output.find("train"), std::string::npos) << top.output;
  CliRun train = run_dsgd("train --help");
  EXPECT_EQ(train.exit_code, 0);
  for (const char* flag : {"--model", "--epochs", "--batch-size", "--lr", "--momentum", "--seed", "--threads",
                           "--data-dir", "--workers", "--strategy", "--json-out", "Examples"}) {
    EXPECT_NE(train.output.find(flag), std::string::npos) << flag << "\n" << train.output;
  }
  CliRun version = run_dsgd("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.output.find("dsgd 0."), std::string::npos) << version.output;
}

// The value `train --help` shows as the default of `flag` ("--workers INT=1" -> "1").
std::string help_default(const std::string& help, const std::string& flag) {
  const auto at = help.find("  " + flag + " ");
  if (at == std::string::npos) return "<no " + flag + ">";
  const auto start = at + flag.size() + 3;
  const auto end = std::min(help.find("  ", start), help.find('\n', start));  // the type ends there
  const std::string spec = help.substr(start, end - start);                     // "INT=1"
  const auto eq = spec.rfind('=');
  return eq == std::string::npos ? "<no default: " + spec + ">" : spec.substr(eq + 1);
}

// The command line has no defaults of its own: each Trainer flag shows TrainerConfig's.
TEST(Cli, TrainHelpShowsTheDefaultsOfADefaultTrainerConfig) {
  const CliRun train = run_dsgd("train --help");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const dsgd::TrainerConfig c;
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"--workers", std::to_string(c.num_workers)},
      {"--devices-per-worker", std::to_string(c.devices_per_worker)},
      {"--strategy", c.strategy.name()},
      {"--ps-shards", std::to_string(c.ps.shards)},
      {"--ps-placement", c.ps.placement.name()},
      {"--max-staleness", std::to_string(c.ps.max_staleness)},
      {"--local-hosts", std::to_string(c.launch.local_hosts)},
      {"--allreduce-algo", c.comm.allreduce_algo.name()},
      {"--grad-shard-bytes", std::to_string(c.comm.grad_shard_bytes)},
      {"--forward-overlap-buckets", std::to_string(c.comm.forward_overlap_buckets)},
      {"--checkpoint-every", std::to_string(c.checkpoints.every_steps)},
      {"--keep-checkpoints", std::to_string(c.checkpoints.keep)},
      {"--max-failures", std::to_string(c.recovery.max_failures)},
      {"--heartbeat-timeout-ms", std::to_string(c.recovery.heartbeat_timeout.count())},
      {"--nonfinite", c.step.nonfinite_policy.name()},
      {"--batch-size", std::to_string(c.batch_size)},
      {"--seed", std::to_string(c.seed)},
  };
  for (const auto& [flag, value] : expected) {
    EXPECT_EQ(help_default(train.output, flag), value) << flag << "\n" << train.output;
  }
  std::ostringstream overhead;
  overhead << c.checkpoints.max_overhead;
  EXPECT_EQ(help_default(train.output, "--checkpoint-overhead"), overhead.str());
}

// docs/SETTINGS.md's reference table is the settings' one description, printed: not a copy kept by hand.
TEST(Cli, TheSettingsPageHoldsTheTableDsgdSettingsPrints) {
  const CliRun r = dsgd::testing::run_command(std::string(DSGD_BINARY) + " settings --markdown");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string page = dsgd::testing::read_file(DSGD_SOURCE_DIR "/docs/SETTINGS.md");
  const std::string begin = "<!-- settings table: begin -->\n", end = "<!-- settings table: end -->";
  const auto from = page.find(begin), to = page.find(end);
  ASSERT_NE(from, std::string::npos) << "docs/SETTINGS.md has no settings table";
  ASSERT_NE(to, std::string::npos);
  EXPECT_EQ(page.substr(from + begin.size(), to - from - begin.size()), r.output)
      << "docs/SETTINGS.md's table is not what `dsgd settings --markdown` prints: paste its output in";
  EXPECT_NE(r.output.find("| `step.max_grad_norm` | number | `0.0` | `--max-grad-norm` | yes |"), std::string::npos);
}

// A setting's flag takes what its description's setter takes: a duration with its unit, "auto".
TEST(Cli, AFlagTakesWhatItsSettingTakes) {
  expect_usage_error("train --comm-timeout-ms soon", "--comm-timeout-ms: comm.timeout must be milliseconds or a "
                                                     "duration (250ms, 30s, 5m, 2h), got 'soon'");
  expect_usage_error("train --compression powersgd:x", "--compression: comm.compression 'powersgd:x': only powersgd "
                                                       "takes a rank");
  expect_usage_error("train --workers many",
                     "--workers: num_workers must be a count or MIN:MAX (an elastic size, e.g. 2:4), got 'many'");
  expect_usage_error("train --workers 4:2", "--workers: num_workers 4:2: MIN must be at least 1 and at most MAX");
  expect_usage_error("train --workers 2 --min-workers 3",
                     "--min-workers: recovery.min_workers (3) must be at most num_workers (2)");
}

TEST(Cli, FlagErrorsExitWithUsageStatusAndSayWhatIsWrong) {
  expect_usage_error("", "subcommand");
  expect_usage_error("fly", "fly");
  expect_usage_error("train --epochs 0", "epochs must be >= 1, got 0");
  expect_usage_error("train --epochs many", "--epochs");
  expect_usage_error("train --batch-size -1", "batch size must be >= 1, got -1");
  expect_usage_error("train --lr -0.1", "learning rate must be a positive number");
  expect_usage_error("train --momentum 1", "momentum must be in [0, 1)");
  expect_usage_error("train --model vgg16",
                     "unknown model 'vgg16'; known models: cnn, mlp, resnet18, resnet50, simulated, or a TorchScript "
                     "file (ending in .pt or .pth)");
  expect_usage_error("train --strategy gossip", "--strategy: unknown strategy 'gossip'; use simple, allreduce, ps");
  expect_usage_error("train --workers 0", "--workers: num_workers must be in 1..4096, got 0");
  expect_usage_error("train --workers 2 --in-process", "--in-process trains in this one process");
  expect_usage_error("train --in-process --profile", "--in-process trains in this one process");
  expect_usage_error("train --in-process --trace t.json", "--in-process trains in this one process");
  expect_usage_error("train --trace /nonexistent-dir/t.json",
                     "--trace /nonexistent-dir/t.json: directory /nonexistent-dir does not exist");
  expect_usage_error("train --workers 2 --devices-per-worker 0",
                     "--devices-per-worker: devices_per_worker must be in 1..256, got 0");
  expect_usage_error("train --workers 2 --grad-shard-bytes -1",
                     "--grad-shard-bytes: comm.grad_shard_bytes must be > 0, got -1");
  expect_usage_error("train --workers 2 --keep-checkpoints 0",
                     "--keep-checkpoints: checkpoints.keep must be >= 1, got 0");
  expect_usage_error("train --workers 2 --checkpoint-every -5",
                     "--checkpoint-every: checkpoints.every_steps must be >= 0");
  expect_usage_error("train --workers 2 --checkpoint-overhead 1.5",
                     "--checkpoint-overhead: checkpoints.max_overhead must be in [0, 1)");
  expect_usage_error("train --workers 2 --nonfinite ignore",
                     "--nonfinite: unknown step.nonfinite_policy 'ignore'; use skip or error");
  expect_usage_error("train --workers 2 --config '{\"lr\": 0.1'", "--config is not valid JSON");
  expect_usage_error("train --workers 2 --config '{\"lr\": \"fast\"}'", "wrong type");
  expect_usage_error("train --workers 2 --config '{\"lr\": 1e400}'", "--config is not valid JSON");  // found by fuzzing
  expect_usage_error("train --workers 2 --config '{\"lrr\": 0.1}'", "unknown image classifier config key 'lrr'");
  expect_usage_error("train --workers 2 --model mlp --config '{\"channels_last\": true}'", "model 'mlp' has none");
  expect_usage_error("train --workers 2 --config '{\"channels_last\": \"yes\"}'", "wrong type");
  expect_usage_error("train --workers 2 --config '{\"synthetic_samples\": 10000E020}'",  // found by fuzzing
                     "'synthetic_samples' must be a whole number");
  expect_usage_error("train --workers 2 --config '{\"sim_layers\": 3.5}'", "'sim_layers' must be a whole number");
  expect_usage_error("train --workers 2 --batch-size 1", "at least the number of replicas (2)");
  expect_usage_error("train --dataset imagenet", "unknown dataset 'imagenet'");
  expect_usage_error("train --json-out /nonexistent-dir/x.json", "/nonexistent-dir does not exist");
  expect_usage_error("train --forward-overlap-buckets 3000000000", "--forward-overlap-buckets");  // past an int
  expect_usage_error("train --forward-overlap-buckets sometimes", "--forward-overlap-buckets");
  expect_usage_error("train --no-such-flag", "--no-such-flag");
  expect_usage_error("train --strategy ps --ps-placement nowhere", "--ps-placement");
  expect_usage_error("ps-server --driver 127.0.0.1:1 --token t", "--shard is required");
  expect_usage_error("ps-server --driver 127.0.0.1:1 --token t --shard 64", "--shard");
  expect_usage_error("ps-server --driver 127.0.0.1:1 --shard 0", "ps-server: error: the job token is needed");
  expect_usage_error("worker --driver 127.0.0.1:1", "worker: error: the job token is needed");
}

TEST(Cli, MissingDataFailsWithTheDirectoryNamed) {
  CliRun r = run_dsgd("train --data-dir /nonexistent/fmnist");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/fmnist: data directory not found"), std::string::npos) << r.output;
}

TEST(Cli, ShortRunWritesJsonSummary) {
  dsgd::testing::TempDir dir;
  const std::string out = dir.file("run.json");
  CliRun r = run_dsgd("train --model mlp --dataset synthetic --synthetic-samples 512 --image-size 8 --epochs 2 "
                   "--batch-size 32 --threads 1 --json-out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("epoch 2 done"), std::string::npos) << r.output;  // plain progress lines
  std::ifstream f(out);
  ASSERT_TRUE(f.good());
  auto j = nlohmann::json::parse(f);
  for (const char* key : {"test_accuracy", "test_loss", "train_loss", "epochs", "workers", "strategy",
                          "samples_per_s", "wall_s"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["epochs"], 2);
  EXPECT_EQ(j["workers"], 1);
  EXPECT_EQ(j["steps"], 32);
  EXPECT_EQ(j["model"], "mlp");
  EXPECT_GT(j["samples_per_s"].get<double>(), 0);
  EXPECT_GE(j["test_accuracy"].get<double>(), 0);
  EXPECT_LE(j["test_accuracy"].get<double>(), 1);
  EXPECT_LT(j["history"][1]["train_loss"].get<double>(), j["history"][0]["train_loss"].get<double>());
}

TEST(Cli, TraceWritesOneChromeTracePerEpoch) {
  dsgd::testing::TempDir dir;
  CliRun r = run_dsgd("train --model mlp --dataset synthetic --synthetic-samples 256 --image-size 8 --epochs 2 "
                      "--batch-size 32 --threads 1 --workers 2 --quiet --trace " + dir.file("run.trace.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("run.trace.json")));
  for (const char* name : {"run.trace-epoch1.json", "run.trace-epoch2.json"}) {
    std::ifstream f(dir.file(name));
    ASSERT_TRUE(f.good()) << name;
    const auto t = nlohmann::json::parse(f);
    int forwards = 0;
    std::set<int> workers;
    for (const auto& e : t.at("traceEvents")) {
      if (e.at("name") == "forward") ++forwards;
      workers.insert(e.at("pid").get<int>());
    }
    EXPECT_EQ(forwards, 2 * 8) << name;  // 256 samples in batches of 32, on both workers
    EXPECT_EQ(workers, (std::set<int>{0, 1})) << name;
  }
}

TEST(Cli, ProfileSaysWhereEachStepWentPerEpochAndOverTheRun) {
  // The simulated model sleeps 30 ms per step, a third of it in forward and the rest in backward.
  dsgd::testing::TempDir dir;
  const std::string out = dir.file("run.json");
  CliRun r = run_dsgd("train --model simulated --dataset synthetic --synthetic-samples 256 --image-size 8 "
                      "--epochs 2 --batch-size 64 --threads 1 --no-eval --workers 2 --checkpoint-every 0 --profile "
                      "--config '{\"sim_parameters\": 4096, \"sim_step_ms\": 30, \"sim_layers\": 4}' "
                      "--json-out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("epoch 2 done"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n  per step, mean over workers: forward "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dsgd train: per step, mean over workers: forward "), std::string::npos) << r.output;
  std::ifstream f(out);
  const auto j = nlohmann::json::parse(f);
  ASSERT_EQ(j["history"].size(), 2u);
  for (const auto& p : {j["profile_ms"], j["history"][0]["profile_ms"], j["history"][1]["profile_ms"]}) {
    for (const char* k : {"forward", "backward", "optimizer", "comm_wait", "snapshot", "other", "step"}) {
      ASSERT_TRUE(p.contains(k)) << k << " in " << p.dump();
      EXPECT_GE(p[k].get<double>(), 0) << k;
    }
    // 10 ms slept in forward, 20 in backward; the paced sleeps take what backward overslept off the
    // next forward (paced_sleep.h), so the split moves by a few ms on a busy machine, the sum less.
    EXPECT_GE(p["forward"].get<double>(), 5) << p.dump();
    EXPECT_GE(p["backward"].get<double>(), 16) << p.dump();
    EXPECT_GE(p["forward"].get<double>() + p["backward"].get<double>(), 26) << p.dump();
    EXPECT_LT(p["forward"].get<double>(), p["backward"].get<double>()) << p.dump();
    EXPECT_GT(p["snapshot"].get<double>(), 0) << p.dump();  // --checkpoint-every 0: one per call (epoch)
    // "other" is what the named phases leave of the step (the driver's wall time per step): the
    // workers' own timings must explain most of it. A phase that went unmeasured (10 or 20 ms
    // of the ~35 ms step) would land in "other" and fail this.
    EXPECT_GE(p["step"].get<double>(), 28) << p.dump();  // 30 ms slept per step
    EXPECT_LT(p["other"].get<double>(), 0.25 * p["step"].get<double>()) << p.dump();
  }
}

// The language model from the command line: prepare-text writes the token files, train runs
// gpt-tiny on them with 2 workers and reports tokens/s and the validation perplexity.
TEST(Cli, PrepareTextThenTrainALanguageModel) {
  dsgd::testing::TempDir dir;
  {
    std::ofstream text(dir.file("corpus.txt"));
    for (int i = 0; i < 600; ++i) text << "line " << (i * 37 % 100) << " of a small corpus\n";
  }
  CliRun prep = run_dsgd("prepare-text --input " + dir.file("corpus.txt") + " --out " + dir.file("tok") +
                         " --val-fraction 0.1");
  ASSERT_EQ(prep.exit_code, 0) << prep.output;
  const auto p = nlohmann::json::parse(prep.output);
  EXPECT_GT(p["train_tokens"].get<int64_t>(), 8 * p["val_tokens"].get<int64_t>());
  const std::string out = dir.file("run.json");
  CliRun r = run_dsgd("train --model gpt-tiny --dataset text:" + dir.file("tok") +
                      " --workers 2 --threads 1 --batch-size 8 --accumulate-steps 2 --max-steps 12 --config "
                      "'{\"context\": 32, \"warmup_steps\": 4}' --checkpoint-dir " + dir.file("ckpts") +
                      " --save " + dir.file("lm") + " --json-out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(out);
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["model"], "gpt-tiny");
  EXPECT_EQ(j["steps"], 12);
  EXPECT_DOUBLE_EQ(j["tokens"].get<double>(), 12 * 8 * 32);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["worker_peak_rss_mib"].get<double>(), 50) << "a worker process holds LibTorch at least";
  EXPECT_LT(j["worker_peak_rss_mib"].get<double>(), 4096);
  // The summary's estimate, 6 FLOPs a parameter a token (kTrainingFlopsPerParameterToken), is
  // checked against what a training step computes, counted by LibTorch's profiler, in
  // Gpt.SixFlopsAParameterATokenIsWhatATrainingStepComputes; here, that the summary applies it to
  // this run's parameters and speed.
  EXPECT_NEAR(j["model_flops_per_s"].get<double>(),
              6 * j["parameters"].get<double>() * j["tokens_per_s"].get<double>(), 1.0);
  ASSERT_TRUE(j.contains("perplexity")) << j.dump();
  EXPECT_LT(j["perplexity"].get<double>(), 256) << "worse than guessing among the 256 bytes";
  EXPECT_FALSE(j.contains("test_accuracy"));
  // The epoch's line speaks in tokens and perplexity; so does the evaluator of its checkpoints.
  EXPECT_NE(r.output.find(" tokens/s, val loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(", perplexity "), std::string::npos) << r.output;
  CliRun ev = run_dsgd("evaluate --checkpoint-dir " + dir.file("ckpts") + " --metrics-out " + dir.file("eval.jsonl") +
                       " --idle-timeout-s 60");
  ASSERT_EQ(ev.exit_code, 0) << ev.output;
  std::ifstream eval_lines(dir.file("eval.jsonl"));
  std::string last_line;
  for (std::string line; std::getline(eval_lines, line);) last_line = line;
  const auto e = nlohmann::json::parse(last_line);
  EXPECT_EQ(e["step"], 12);
  EXPECT_NEAR(e["metrics"]["perplexity"].get<double>(), j["perplexity"].get<double>(),
              1e-4 * j["perplexity"].get<double>())
      << last_line;
  // generate: the checkpoint's model continues the prompt by --tokens bytes; the same seed, the same text.
  CliRun g = run_dsgd("generate --checkpoint " + dir.file("lm") + " --prompt 'line 3' --tokens 40 --seed 5");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  const size_t at = g.output.find("line 3");
  ASSERT_NE(at, std::string::npos) << g.output;
  ASSERT_GE(g.output.size(), at + 6 + 40) << g.output;
  const std::string text = g.output.substr(at, 6 + 40);
  const CliRun again = run_dsgd("generate --checkpoint " + dir.file("lm") + " --prompt 'line 3' --tokens 40 --seed 5");
  EXPECT_NE(again.output.find(text), std::string::npos) << again.output;
  expect_usage_error("generate --checkpoint " + dir.file("lm") + " --prompt ''", "--prompt is empty");
  CliRun missing = run_dsgd("generate --checkpoint " + dir.file("none"));
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find(dir.file("none")), std::string::npos) << missing.output;
  expect_usage_error("train --model gpt-tiny --dataset fashion-mnist --workers 2", "--dataset text:DIR");
  expect_usage_error("train --model gpt-tiny --dataset text:" + dir.file("tok") + " --in-process",
                     "a language model's one-process run is --workers 1");
  expect_usage_error("train --model gpt-huge --dataset text:" + dir.file("tok") + " --workers 2",
                     "unknown GPT size 'gpt-huge'");
}

TEST(Cli, TwoWorkersSaveThenOneWorkerLoadsAndContinues) {
  dsgd::testing::TempDir dir;
  const std::string common = "train --model mlp --dataset synthetic --synthetic-samples 512 --image-size 8 "
                             "--batch-size 32 --threads 1 --epochs 1 ";
  CliRun a = run_dsgd(common + "--workers 2 --strategy simple --save " + dir.file("ckpt") + " --json-out " +
                      dir.file("a.json") + " --checkpoint-dir " + dir.file("ckpts") +
                      " --checkpoint-every 5 --checkpoint-overhead 0");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  // Snapshots after steps 5, 10, 15 and 16 (the epoch's end); the newest 3 are kept, and the
  // driver marks the job's end for an evaluator.
  std::vector<std::string> kept;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("ckpts"))) kept.push_back(e.path().filename());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept,
            (std::vector<std::string>{"job-ended", "step-000000000010", "step-000000000015", "step-000000000016"}));
  EXPECT_NE(a.output.find("2 worker(s), simple"), std::string::npos) << a.output;
  std::ifstream fa(dir.file("a.json"));
  auto ja = nlohmann::json::parse(fa);
  EXPECT_EQ(ja["workers"], 2);
  EXPECT_EQ(ja["strategy"], "simple");
  EXPECT_EQ(ja["steps"], 16);
  EXPECT_GT(ja["test_accuracy"].get<double>(), 0.15);  // 10 classes
  CliRun b = run_dsgd(common + "--workers 1 --load " + dir.file("ckpt") + " --json-out " + dir.file("b.json"));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  std::ifstream fb(dir.file("b.json"));
  auto jb = nlohmann::json::parse(fb);
  // The loaded job starts where the saved one ended: its first epoch's loss is lower.
  EXPECT_LT(jb["history"][0]["train_loss"].get<double>(), ja["history"][0]["train_loss"].get<double>());
}

// `script` under sh, killed after `timeout_s`: its exit status (-1 if it did not exit) and
// output, stderr included.
CliRun run_shell(const std::string& script, int timeout_s) {
  return dsgd::testing::run_command("timeout " + std::to_string(timeout_s) + " sh -c '" + script + "' 2>&1");
}

// The summary of 2 workers training 16 steps of strategy ps (512 samples, batch 32).
void expect_two_worker_ps_epoch(const std::string& run_json, const CliRun& r) {
  std::ifstream f(run_json);
  ASSERT_TRUE(f.good()) << r.output;
  auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["workers"], 2);
  EXPECT_EQ(j["strategy"], "ps");
  EXPECT_EQ(j["steps"], 16);
  EXPECT_GT(j["test_accuracy"].get<double>(), 0.15);  // 10 classes: it learnt
}

TEST(Cli, RemoteWorkersAndPsShardProcessesJoinTheDriver) {
  // As a launcher would start them: the driver, 2 `dsgd worker` and 2 `dsgd ps-server`, each
  // told only the driver's address and the token. Every process must exit when the job ends.
  dsgd::testing::TempDir dir;
  const std::string bin = DSGD_BINARY, address = "127.0.0.1:" + std::to_string(free_port());
  const std::string join = " --driver " + address + " --token t0ken";
  const std::string script =
      bin + " train --listen " + address + " --token t0ken --workers 2 --strategy ps --ps-placement processes "
      "--ps-shards 2 --ps-update-on-shards --model mlp --dataset synthetic --synthetic-samples 512 --image-size 8 "
      "--batch-size 32 --threads 1 --epochs 1 --json-out " + dir.file("run.json") + " & sleep 1; " +
      bin + " ps-server" + join + " --shard 1 & " + bin + " ps-server" + join + " --shard 0 & " +
      bin + " worker" + join + " & " + bin + " worker" + join + " & wait";
  const CliRun r = run_shell(script, 120);
  ASSERT_EQ(r.exit_code, 0) << "a process did not exit\n" << r.output;
  for (const char* s : {"ps shard 0: serving generation 1", "ps shard 1: serving generation 1"}) {
    EXPECT_NE(r.output.find(s), std::string::npos) << r.output;
  }
  expect_two_worker_ps_epoch(dir.file("run.json"), r);
}

// A cluster spec as a cluster manager hands it out (TF_CONFIG's shape): every process gets the
// same cluster and its own task, from --cluster or $DSGD_CLUSTER; none is told the driver's
// address, the worker count, its shard or its host otherwise. Tasks for the wrong command, a
// --workers that contradicts the spec, and a bad spec are usage errors.
TEST(Cli, EveryTaskOfAClusterSpecFindsItsPlace) {
  dsgd::testing::TempDir dir;
  const std::string bin = DSGD_BINARY, chief = "127.0.0.1:" + std::to_string(free_port());
  auto spec = [&](const std::string& task) {
    return R"({"cluster": {"chief": [")" + chief +
           R"("], "worker": ["host-a", "host-b"], "ps": ["host-c"]}, "task": )" + task + "}";
  };
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.file(name)) << text;
    return dir.file(name);
  };
  const std::string chief_spec = write("chief.json", spec(R"({"type": "chief"})"));
  const std::string worker1 = write("worker1.json", spec(R"({"type": "worker", "index": 1})"));
  const std::string ps0 = write("ps0.json", spec(R"({"type": "ps", "index": 0})"));
  expect_usage_error("train --cluster " + worker1,
                     "this process's task in the cluster spec is worker 1: run `dsgd worker");
  expect_usage_error("train --cluster " + chief_spec + " --workers 3",
                     "--workers 3 but the cluster spec names 2 worker(s)");
  expect_usage_error("train --cluster " + chief_spec, "the cluster spec names ps tasks: train with --strategy ps");
  expect_usage_error("worker --cluster " + ps0 + " --token t", "task in the cluster spec is ps 0, not a worker");
  expect_usage_error("ps-server --cluster " + worker1 + " --token t", "task in the cluster spec is worker 1, not a ps");
  expect_usage_error("worker --cluster " + dir.file("missing.json"),
                     "cluster spec '" + dir.file("missing.json") + "' cannot be read");
  expect_usage_error("worker --token t", "--driver HOST:PORT is needed (or a cluster spec");
  // The job: worker 0 from $DSGD_CLUSTER, the others from files; the token from the environment.
  const std::string script =
      "export DSGD_TOKEN=t0ken; " + bin + " train --cluster " + chief_spec + " --strategy ps --model mlp "
      "--dataset synthetic --synthetic-samples 512 --image-size 8 --batch-size 32 --threads 1 --epochs 1 --json-out " +
      dir.file("run.json") + " & sleep 1; " + bin + " ps-server --cluster " + ps0 + " & DSGD_CLUSTER=\"$(cat " +
      write("worker0.json", spec(R"({"type": "worker", "index": 0})")) + ")\" " + bin + " worker & " + bin +
      " worker --cluster " + worker1 + " & wait";
  const CliRun r = run_shell(script, 120);
  ASSERT_EQ(r.exit_code, 0) << "a process failed or did not exit\n" << r.output;
  EXPECT_NE(r.output.find("ps shard 0: serving generation 1"), std::string::npos) << r.output;
  expect_two_worker_ps_epoch(dir.file("run.json"), r);
}

// The same `dsgd train` command in every process, told nothing but what an engine's environment
// says: torchrun's (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; its agent holds MASTER_PORT, so
// the driver takes the next), a Kubernetes Indexed Job's (JOB_COMPLETION_INDEX) and TFJob's
// TF_CONFIG. Rank 0 (the chief) drives, the others join it; the token comes from the environment
// or a file. What is missing or contradictory is a usage error; flags that shape the job set the
// environment aside.
// A launcher like torchrun started for workers only (`torchrun ... dsgd worker --driver D`): its
// variables say rank 0, which would be the chief of a job formed from them; --driver sets them
// aside, so rank 0 joins as a worker too (before, it refused: "task ... is chief 0, not a worker").
TEST(Cli, AWorkerGivenADriverSetsAnEnginesRanksAside) {
  dsgd::testing::TempDir dir;
  const std::string bin = DSGD_BINARY, address = "127.0.0.1:" + std::to_string(free_port());
  const std::string engine = "RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                             std::to_string(free_port()) + " ";
  const std::string script = bin + " train --listen " + address +
                             " --token t0ken --workers 1 --model mlp --dataset synthetic --synthetic-samples 256 "
                             "--batch-size 32 --threads 1 --epochs 1 --no-eval --quiet --json-out " +
                             dir.file("run.json") + " & sleep 1; " + engine + bin + " worker --driver " + address +
                             " --token t0ken; wait";
  const CliRun r = run_shell(script, 120);
  EXPECT_EQ(r.output.find("not a worker"), std::string::npos) << r.output;
  std::ifstream f(dir.file("run.json"));
  ASSERT_TRUE(f.good()) << "the job did not end\n" << r.output;
  EXPECT_EQ(nlohmann::json::parse(f)["steps"], 8);
}

TEST(Cli, TheSameTrainCommandInEveryProcessFormsAJobFromAnEnginesEnvironment) {
  dsgd::testing::TempDir dir;
  const std::string bin = DSGD_BINARY;
  const std::string train = bin + " train --model mlp --dataset synthetic --synthetic-samples 512 --image-size 8 "
                                  "--batch-size 32 --threads 1 --epochs 1 --quiet";
  std::ofstream(dir.file("token")) << "t0ken\n";
  // Three processes of one job: `env_of(r)` the environment of process r; process 0's summary.
  const auto job = [&](const std::string& name, const std::function<std::string(int)>& env_of) {
    std::string script;
    for (int r = 0; r < 3; ++r) {
      script += "env " + env_of(r) + " " + train + (r == 0 ? " --json-out " + dir.file(name + ".json") : "") +
                " > /dev/null 2>" + dir.file(name + std::to_string(r) + ".log") + " & ";
    }
    const CliRun run = run_shell(script + "wait", 120);
    EXPECT_EQ(run.exit_code, 0) << name << "\n" << run.output;
    std::ifstream f(dir.file(name + ".json"));
    std::stringstream logs;
    for (int r = 0; r < 3; ++r) logs << std::ifstream(dir.file(name + std::to_string(r) + ".log")).rdbuf();
    EXPECT_TRUE(f.good()) << name << ": the chief wrote no summary\n" << logs.str();
    if (!f.good()) return logs.str();
    const auto j = nlohmann::json::parse(f);
    EXPECT_EQ(j["workers"], 2) << name;
    EXPECT_EQ(j["steps"], 16) << name;
    EXPECT_GT(j["test_accuracy"].get<double>(), 0.15) << name;  // 10 classes: it learnt
    return logs.str();
  };
  // torchrun, its agent holding MASTER_PORT (a listening socket here); the token from a file.
  const int held = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(held, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(held, 4), 0);
  ASSERT_EQ(::getsockname(held, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int master_port = ntohs(a.sin_port);
  const std::string logs = job("torchrun", [&](int r) {
    return "RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) + " GROUP_RANK=0 WORLD_SIZE=3 "
           "LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(master_port) +
           " TORCHELASTIC_RUN_ID=test DSGD_TOKEN_FILE=" + dir.file("token");
  });
  ::close(held);
  EXPECT_NE(logs.find("--driver 127.0.0.1:" + std::to_string(master_port + 1)), std::string::npos) << logs;
  // A Kubernetes Indexed Job: each pod's index, the count and the first pod's address set in its manifest.
  const int port = free_port();
  job("indexed", [&](int r) {
    return "JOB_COMPLETION_INDEX=" + std::to_string(r) + " WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
           std::to_string(port) + " DSGD_TOKEN=t0ken";
  });
  // TFJob: TF_CONFIG alone.
  const std::string chief = "127.0.0.1:" + std::to_string(free_port());
  job("tfjob", [&](int r) {
    const std::string task = r == 0 ? R"({"type": "chief"})"
                                    : R"({"type": "worker", "index": )" + std::to_string(r - 1) + "}";
    const std::string file = dir.file("tf_config" + std::to_string(r));
    std::ofstream(file) << R"({"cluster": {"chief": [")" + chief + R"("], "worker": ["host-a", "host-b"]}, "task": )"
                        << task << "}";
    return "DSGD_TOKEN=t0ken TF_CONFIG=\"$(cat " + file + ")\"";
  });
  const std::string engine = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) + " ";
  const auto usage = [&](const std::string& env, const std::string& needle) {
    const CliRun r = run_command("env " + env + " " + train + " 2>&1");
    EXPECT_EQ(r.exit_code, 2) << env << "\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << env << "\n" << r.output;
  };
  usage(engine + "WORLD_SIZE=3", "but not this process's rank ($RANK, $JOB_COMPLETION_INDEX or $SLURM_PROCID)");
  usage(engine + "RANK=0 WORLD_SIZE=1 DSGD_TOKEN=t", "$WORLD_SIZE is '1': the job's process count");
  usage(engine + "RANK=3 WORLD_SIZE=3 DSGD_TOKEN=t", "$RANK 3 is not below $WORLD_SIZE 3");
  usage(engine + "RANK=0 WORLD_SIZE=3", "give every process the same token, $DSGD_TOKEN or $DSGD_TOKEN_FILE");
  usage(engine + "RANK=1 WORLD_SIZE=3", "it needs the job token the driver has");
  usage(engine + "RANK=1 WORLD_SIZE=3 DSGD_TOKEN_FILE=" + dir.file("missing"), "cannot be read or holds no token");
  // --workers shapes the job: the environment is set aside, and the job trains on its own.
  const CliRun own = run_command("env " + engine + "RANK=1 WORLD_SIZE=3 " + train + " --workers 1 2>&1");
  EXPECT_EQ(own.exit_code, 0) << own.output;
  EXPECT_NE(own.output.find("\"workers\": 1"), std::string::npos) << own.output;
}

// `dsgd export` writes model.pt from a checkpoint without a job (here one whose model.pt is gone):
// Python builds the same CNN (tests/python/scripted_models.py), loads it, and on Fashion-MNIST's
// test images gets the accuracy the job reported.
TEST(Cli, PythonReadsAnExportedModelAndGetsTheAccuracyTheJobReported) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no /usr/bin/python3 with torch (Debian's python3-torch)";
  }
  dsgd::testing::TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  const CliRun train = run_dsgd("train --workers 2 --model cnn --max-steps 60 --batch-size 64 --lr 0.05 --threads 1 "
                                "--quiet --save " + ckpt + " --json-out " + dir.file("run.json"));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  std::filesystem::remove(ckpt + "/model.pt");
  const CliRun exported = run_dsgd("export --checkpoint " + ckpt + " --out " + dir.file("m.pt"));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const std::string script = "import gzip, sys, numpy, torch\n"
                             "sys.path.insert(0, '" DSGD_SOURCE_DIR "/tests/python')\n"
                             "from scripted_models import Cnn\n"
                             "net = Cnn(); net.load_state_dict(torch.load(sys.argv[1])); net.eval()\n"
                             "d = '/usr/share/datasets/fashion-mnist/t10k-'\n"
                             "x = numpy.frombuffer(gzip.open(d + 'images-idx3-ubyte.gz').read()[16:], numpy.uint8)\n"
                             "y = numpy.frombuffer(gzip.open(d + 'labels-idx1-ubyte.gz').read()[8:], numpy.uint8)\n"
                             "x = torch.tensor(x.copy()).float().div(255).sub(0.2860).div(0.3530)\n"
                             "x = x.view(-1, 1, 28, 28)\n"
                             "with torch.no_grad():\n"
                             "    print(float((net(x).argmax(1) == torch.tensor(y.copy()).long()).float().mean()))\n";
  std::ofstream(dir.file("eval.py")) << script;
  const CliRun py = run_shell("/usr/bin/python3 " + dir.file("eval.py") + " " + dir.file("m.pt"), 120);
  ASSERT_EQ(py.exit_code, 0) << py.output;
  const auto j = nlohmann::json::parse(std::ifstream(dir.file("run.json")));
  EXPECT_GT(j["test_accuracy"].get<double>(), 0.5) << j.dump();
  EXPECT_NEAR(std::stod(py.output), j["test_accuracy"].get<double>(), 1e-3) << py.output;
  const CliRun missing = run_dsgd("export --checkpoint " + dir.file("none") + " --out " + dir.file("x.pt"));
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.pt")));
}

// The evaluator role: `dsgd evaluate` beside a training job evaluates its checkpoints as they
// appear, the last one included, and exits when the job has ended; its metrics go to JSON lines
// and a CSV. Without checkpoints or the job's end it gives up after --idle-timeout-s.
TEST(Cli, AnEvaluatorEvaluatesTheCheckpointsUntilTheJobEnds) {
  dsgd::testing::TempDir dir;
  const std::string bin = DSGD_BINARY, ckpts = dir.file("ckpts"), out = dir.file("eval.jsonl");
  const std::string script =
      bin + " evaluate --checkpoint-dir " + ckpts + " --metrics-out " + out + " --idle-timeout-s 120 & " + bin +
      " train --workers 1 --model mlp --dataset synthetic --synthetic-samples 2048 --image-size 8 --batch-size 32 "
      "--threads 1 --epochs 3 --checkpoint-dir " + ckpts + " --checkpoint-every 16 --checkpoint-overhead 0 --quiet "
      "--json-out " + dir.file("run.json") + "; wait $!; echo evaluator-exit=$?";
  const CliRun r = run_shell(script, 240);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("evaluator-exit=0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("evaluator: the job has ended; evaluated up to step 192"), std::string::npos) << r.output;
  std::ifstream lines(out);
  std::vector<nlohmann::json> evals;
  for (std::string line; std::getline(lines, line);) evals.push_back(nlohmann::json::parse(line));
  ASSERT_GE(evals.size(), 2u) << r.output;
  for (size_t i = 1; i < evals.size(); ++i) EXPECT_GT(evals[i]["step"], evals[i - 1]["step"]);
  EXPECT_EQ(evals.back()["step"], 192);
  EXPECT_EQ(evals.back()["epoch"], 3);
  EXPECT_GT(evals.back()["metrics"]["accuracy"].get<double>(), 0.15) << evals.back().dump();
  // The job's own final evaluation of the same parameters.
  std::ifstream run(dir.file("run.json"));
  const auto j = nlohmann::json::parse(run);
  EXPECT_NEAR(evals.back()["metrics"]["accuracy"].get<double>(), j["test_accuracy"].get<double>(), 1e-6);
  std::ifstream csv(out + ".csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "step,accuracy,loss,num_samples");
  const CliRun idle = run_dsgd("evaluate --checkpoint-dir " + dir.file("none") + " --idle-timeout-s 1");
  EXPECT_EQ(idle.exit_code, 3) << idle.output;
  EXPECT_NE(idle.output.find("no new checkpoint in"), std::string::npos) << idle.output;
  expect_usage_error("evaluate", "--checkpoint-dir is required");
}

TEST(Cli, ARemoteWorkerBeyondNumWorkersIsAStandbyThatTakesALostWorkersPlace) {
  // A launcher starts 3 `dsgd worker` for a job of 2 with --standby 1: the last to register
  // waits set up; the first is killed once the standby says it is ready (while training, or on a
  // loaded machine while the first snapshot is given out: both are recoveries), and the standby
  // takes its place.
  dsgd::testing::TempDir dir;
  const std::string bin = DSGD_BINARY, address = "127.0.0.1:" + std::to_string(free_port());
  const std::string join = " --driver " + address + " --token t0ken", log = dir.file("driver.log");
  const std::string script =
      bin + " train --listen " + address + " --token t0ken --workers 2 --standby 1 --model mlp --dataset synthetic "
      "--synthetic-samples 4096 --batch-size 64 --threads 1 --epochs 4 --checkpoint-every 10 --quiet --json-out " +
      dir.file("run.json") + " 2> " + log + " & sleep 1; " + bin + " worker" + join + " & first=$!; " + bin +
      " worker" + join + " & sleep 1; " + bin + " worker" + join + " & for i in $(seq 600); do grep -q \"is set up "
      "and ready outside the group\" " + log + " && break; sleep 0.1; done; sleep 1; kill -9 $first; wait; cat " + log;
  const CliRun r = run_shell(script, 180);  // its status is the killed worker's; the summary tells the rest
  std::ifstream f(dir.file("run.json"));
  ASSERT_TRUE(f.good()) << "the driver wrote no summary\n" << r.output;
  auto j = nlohmann::json::parse(f);
  ASSERT_EQ(j["recoveries"].size(), 1u) << j.dump(2) << "\n" << r.output;
  EXPECT_EQ(j["recoveries"][0]["standbys_used"], 1) << r.output;
  EXPECT_EQ(j["recoveries"][0]["workers_after"], 2);
  EXPECT_EQ(j["steps"], 256);
  EXPECT_NE(r.output.find("is set up and ready outside the group"), std::string::npos) << r.output;
}

// The contract for scripts: a kill -9 of a worker is in --json-out's "recoveries", with when it
// happened, what it cost and how many workers went on; the epoch it happened in counts it.
// With --standby 1, recovery_s is the kill-to-resumed time.
TEST(Cli, AKilledWorkerIsInTheJsonSummary) {
  dsgd::testing::TempDir dir;
  const std::string out = dir.file("run.json");
  const std::string ckpts = dir.file("ckpts");
  const pid_t driver = start_train({"--workers", "2", "--standby", "1", "--model", "mlp", "--dataset", "synthetic",
                                     "--synthetic-samples", "4096", "--epochs", "4", "--threads", "1",
                                     "--checkpoint-every", "10", "--checkpoint-dir", ckpts, "--quiet", "--json-out",
                                     out});
  ASSERT_GE(driver, 0);
  const auto workers = children_of(driver, 3);  // spawned in order: 2 workers, then the standby
  ASSERT_EQ(workers.size(), 3u) << "the driver did not start its workers";
  // Training, not start-up (a worker lost while the others set up is started again, not
  // recovered from): a snapshot after some steps is on disk. 4 epochs of 64 steps take far longer.
  const auto trained = [&] {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(ckpts, ec)) {
      const std::string name = e.path().filename();
      if (name.rfind("step-", 0) == 0 && std::stoll(name.substr(5)) > 0) return true;
    }
    return false;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!trained() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(trained()) << "no snapshot after a step within a minute";
  const double killed_at =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  ASSERT_EQ(::kill(workers[1], SIGKILL), 0) << "the worker was gone before the kill";
  int status = 0;
  ::waitpid(driver, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the job did not survive the kill";
  std::ifstream f(out);
  ASSERT_TRUE(f.good());
  const auto j = nlohmann::json::parse(f);
  ASSERT_GE(j["recoveries"].size(), 1u) << j.dump(2);
  const auto& r = j["recoveries"][0];
  EXPECT_EQ(r["kind"], "recovery");
  EXPECT_NE(r["lost"].get<std::string>().find("pid " + std::to_string(workers[1])), std::string::npos) << r.dump();
  EXPECT_GT(r["at_step"].get<int64_t>(), 0);
  EXPECT_GT(r["recovery_s"].get<double>(), 0.0);
  EXPECT_LT(r["recovery_s"].get<double>(), 30.0);
  EXPECT_GE(r["detect_s"].get<double>(), 0.0);
  // recovery_s is the kill-to-resumed time: what this test measures from its own kill, to within
  // the driver's ~0.1 s bound on when the process died (and a loaded machine's slack).
  const double measured = r["resumed_at_unix_s"].get<double>() - killed_at;
  EXPECT_NEAR(r["recovery_s"].get<double>(), measured, 1.0) << r.dump();
  EXPECT_EQ(r["workers_after"], 2) << "the standby took the lost worker's place";
  EXPECT_EQ(r["standbys_used"], 1);
  int64_t counted = 0;
  for (const auto& e : j["history"]) counted += e["recoveries"].get<int64_t>();
  EXPECT_EQ(counted, static_cast<int64_t>(std::count_if(j["recoveries"].begin(), j["recoveries"].end(),
                                                        [](const auto& x) { return x["kind"] == "recovery"; })));
}

TEST(Cli, KillingTheDriverTakesItsWorkersAlongAndLeavesNoSharedMemory) {
  const pid_t driver = start_train({"--workers", "2", "--standby", "1", "--model", "mlp", "--dataset", "synthetic",
                                     "--epochs", "1000", "--threads", "1", "--quiet"});
  ASSERT_GE(driver, 0);
  // Its two workers and the standby, once they train (the shared-memory group exists then).
  const auto workers = children_of(driver, 3);
  ASSERT_EQ(workers.size(), 3u) << "the driver did not start its workers";
  std::this_thread::sleep_for(std::chrono::seconds(4));
  ::kill(driver, SIGKILL);
  ::waitpid(driver, nullptr, 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (pid_t w : workers) {
    while (!process_gone(w) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(process_gone(w)) << "worker " << w << " outlived its driver";
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    for (pid_t w : workers) {
      EXPECT_NE(e.path().filename().string().rfind("dsgd-" + std::to_string(w) + "-", 0), 0u) << e.path();
    }
  }
}

}  // namespace

namespace {

TEST(CliBench, AllreduceEmitsVerifiedJsonForEachAlgorithm) {
  for (const char* algo : {"shm", "ring", "hd", "auto"}) {
    CliRun r =
        run_dsgd(std::string("bench allreduce --procs 2 --bytes 4 64K --iters 3 --warmup 1 --json --algo ") + algo);
    ASSERT_EQ(r.exit_code, 0) << algo << "\n" << r.output;
    auto j = nlohmann::json::parse(r.output);
    EXPECT_EQ(j["procs"], 2);
    ASSERT_EQ(j["results"].size(), 2u);
    EXPECT_EQ(j["results"][1]["bytes"], 64000);
    EXPECT_GT(j["results"][1]["algbw_gbps"].get<double>(), 0);
  }
  // Each figure from the measured latency: algbw = bytes / latency, and busbw = algbw 2(n-1)/n
  // (NCCL's bus bandwidth), which 3 ranks tell apart from algbw (for 2 they are equal).
  CliRun h = run_dsgd("bench allreduce --procs 3 --hosts 2 --algo hier --bytes 1K 64K --iters 2 --json");
  ASSERT_EQ(h.exit_code, 0) << h.output;
  const auto j = nlohmann::json::parse(h.output);
  ASSERT_EQ(j["results"].size(), 2u) << h.output;
  for (const auto& r : j["results"]) {
    const double seconds = r["latency_us"].get<double>() * 1e-6;
    ASSERT_GT(seconds, 0) << r.dump();
    const double algbw = r["bytes"].get<double>() / seconds / 1e9;
    EXPECT_NEAR(r["algbw_gbps"].get<double>(), algbw, 1e-9 * algbw) << r.dump();
    EXPECT_NEAR(r["busbw_gbps"].get<double>(), algbw * 4 / 3, 1e-9 * algbw) << r.dump();
  }
}

TEST(CliBench, BadFlagsAreUsageErrors) {
  expect_usage_error("bench allreduce --algo bogus", "unknown allreduce algorithm 'bogus'; known: auto, ring, hd");
  expect_usage_error("bench allreduce --procs 0", "--procs must be in 1..256, got 0");
  expect_usage_error("bench allreduce --bytes 12Q", "unknown unit 'Q'");
  expect_usage_error("bench allreduce --algo hier --procs 2 --hosts 3", "--hosts must be in 1..--procs (2), got 3");
  expect_usage_error("bench", "subcommand");
}


// ---- dsgd tune ----

// A space file for small, fast trials: the MLP on synthetic images, a few steps an iteration.
std::string small_space_file(const dsgd::testing::TempDir& dir, int trials, int iterations) {
  const std::string path = dir.file("space.json");
  std::ofstream(path) << R"({"space": {"lr": {"loguniform": [0.001, 0.3]}, "momentum": {"uniform": [0.0, 0.9]}},
    "base": {"model": "mlp", "dataset": "synthetic", "synthetic_samples": 1024, "synthetic_image_size": 8,
             "batch_size": 32},
    "trials": )" << trials << R"(, "max_iterations": )" << iterations << R"(, "steps_per_iteration": 6})";
  return path;
}

TEST(Cli, TuneBadInputIsAUsageErrorBeforeAnythingRuns) {
  dsgd::testing::TempDir dir;
  const std::string d = " --dir " + dir.file("t");
  expect_usage_error("tune --space /nonexistent.json" + d, "cannot read it");
  std::ofstream(dir.file("empty.json")) << "{}";
  expect_usage_error("tune --space " + dir.file("empty.json") + d, "is empty");
  std::ofstream(dir.file("unknown.json")) << R"({"learning_rate": {"choice": [0.1]}})";
  expect_usage_error("tune --space " + dir.file("unknown.json") + d,
                     "unknown image classifier config key 'learning_rate'");
  std::ofstream(dir.file("dist.json")) << R"({"lr": {"gaussian": [0.1, 1]}})";
  expect_usage_error("tune --space " + dir.file("dist.json") + d, "unknown distribution 'gaussian'");
  const std::string ok = small_space_file(dir, 2, 2);
  expect_usage_error("tune --space " + ok + d + " --cores 100000", "cores must be in");
  expect_usage_error("tune --space " + ok + d + " --scheduler grid", "unknown scheduler 'grid'");
  EXPECT_FALSE(std::filesystem::exists(dir.file("t")));
}

// The contract for scripts: --json-out holds best.test_accuracy, trials and trials_stopped_early;
// the table and the plot come too.
TEST(Cli, TuneWritesBestTrialsAndTrialsStoppedEarly) {
  dsgd::testing::TempDir dir;
  const CliRun r = run_dsgd("tune --space " + small_space_file(dir, 4, 3) + " --scheduler asha --reduction-factor 2 " +
                            "--cores 2 --dir " + dir.file("t") + " --json-out " + dir.file("out.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(std::ifstream(dir.file("out.json")));
  ASSERT_TRUE(j.contains("best")) << j.dump(1);
  EXPECT_TRUE(j["best"]["test_accuracy"].is_number());
  EXPECT_TRUE(j["best"]["params"].contains("lr"));
  EXPECT_TRUE(std::filesystem::exists(j["best"]["checkpoint"].get<std::string>() + "/manifest.json"));
  EXPECT_EQ(j["trials"].size(), 4u);
  EXPECT_TRUE(j["trials_stopped_early"].is_number_integer());
  EXPECT_NE(r.output.find("| trial | config |"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir.file("t") + "/tune.png"));
  EXPECT_TRUE(std::filesystem::exists(dir.file("t") + "/results.json"));
}

// Every process under `pid`, any of its threads' children (the tuner's trials start their
// workers from its pool threads).
std::vector<pid_t> descendants_of(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream children(task.path() / "children");
    pid_t p;
    while (children >> p) {
      out.push_back(p);
      for (pid_t q : descendants_of(p)) out.push_back(q);
    }
  }
  return out;
}

// Killed mid-search (kill -9) and started again with the same --dir: the trials that had ended
// are not run again (their histories unchanged), the rest finish; the killed search's workers
// do not outlive it.
TEST(Cli, TuneKilledAndRestartedFinishesWithoutRerunningFinishedTrialsOrLeavingWorkers) {
  dsgd::testing::TempDir dir;
  const std::string space = small_space_file(dir, 6, 4), tdir = dir.file("t");
  const std::vector<std::string> args = {"--space", space, "--scheduler", "fifo", "--cores", "2", "--dir", tdir};
  const pid_t tune = start_dsgd("tune", args);
  ASSERT_GT(tune, 0);
  nlohmann::json before;
  std::vector<pid_t> workers;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {  // until a trial is done and another runs
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream f(tdir + "/tune.json");
    if (!f) continue;
    try {
      before = nlohmann::json::parse(f);
    } catch (const std::exception&) {
      continue;
    }
    int done = 0, running = 0;
    for (const auto& t : before["trials"]) done += t["state"] == "done", running += t["state"] == "running";
    workers = descendants_of(tune);
    if (done >= 1 && running >= 1 && !workers.empty()) break;
  }
  ASSERT_FALSE(workers.empty()) << "no trial was running";
  ::kill(tune, SIGKILL);
  ::waitpid(tune, nullptr, 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (pid_t w : workers) {
    while (!process_gone(w) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(process_gone(w)) << "process " << w << " outlived the killed search";
  }
  std::string args_text;
  for (const auto& a : args) args_text += " " + a;
  const CliRun r = run_dsgd("tune" + args_text + " --json-out " + dir.file("out.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming"), std::string::npos) << r.output;
  const auto after = nlohmann::json::parse(std::ifstream(tdir + "/tune.json"));
  int kept = 0;
  for (size_t i = 0; i < before["trials"].size(); ++i) {
    EXPECT_EQ(after["trials"][i]["state"], "done") << i;
    EXPECT_EQ(after["trials"][i]["history"].size(), 4u) << i;
    if (before["trials"][i]["state"] == "done") {
      EXPECT_EQ(after["trials"][i]["history"], before["trials"][i]["history"]) << "trial " << i << " ran again";
      ++kept;
    }
  }
  EXPECT_GE(kept, 1);
}

}  // namespace
