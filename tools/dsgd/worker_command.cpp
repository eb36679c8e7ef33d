// `dsgd worker` and `dsgd ps-server`: join a driver started with `dsgd train --listen HOST:PORT`
// (or any program whose Trainer has `listen` set) from another host, as a worker (running the
// built-in operators) or as a parameter-server shard process (--ps-placement processes).
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "commands.h"
#include "dsgd/runtime/cluster.h"
#include "dsgd/common/error.h"
#include "dsgd/apps/image_classifier.h"
#include "dsgd/runtime/remote.h"

namespace dsgd::cli {
namespace {

// --token, else $DSGD_TOKEN or $DSGD_TOKEN_FILE; without any, says so and sets the usage exit code.
bool resolve_token(std::string& token, const char* command, int* exit_code) {
  try {
    if (token.empty()) token = token_from_environment();
  } catch (const ConfigError& e) {
    std::cerr << "dsgd " << command << ": error: " << e.what() << "\n";
    *exit_code = kExitUsage;
    return false;
  }
  if (!token.empty()) return true;
  std::cerr << "dsgd " << command << ": error: the job token is needed: --token T, $DSGD_TOKEN or $DSGD_TOKEN_FILE\n";
  *exit_code = kExitUsage;
  return false;
}

// The cluster spec's task for `command` (worker or ps), when there is a spec: the driver's
// address and this task's host. False (with the usage exit code) for a spec of another task.
bool apply_cluster(const std::string& file, const char* command, const char* type, std::string& driver,
                   std::string& host_id, int* index, int* exit_code) {
  std::optional<ClusterSpec> spec;
  try {
    spec = ClusterSpec::load(file);
  } catch (const ConfigError& e) {
    std::cerr << "dsgd " << command << ": error: " << e.what() << "\n";
    *exit_code = kExitUsage;
    return false;
  }
  // An engine's variables where --driver names the driver (`torchrun ... dsgd worker --driver`):
  // every process the engine starts is a worker of that driver, rank 0 too.
  if (spec && spec->from_engine && !driver.empty()) spec.reset();
  if (!spec) {
    if (!driver.empty()) return true;
    std::cerr << "dsgd " << command << ": error: --driver HOST:PORT is needed (or a cluster spec: --cluster FILE or "
                                        "$DSGD_CLUSTER)\n";
    *exit_code = kExitUsage;
    return false;
  }
  if (spec->task_type != type || (!driver.empty() && driver != spec->chief)) {
    std::cerr << "dsgd " << command << ": error: "
              << (spec->task_type != type ? "this process's task in the cluster spec is " + spec->task_name() +
                                                ", not a " + type
                                          : "--driver " + driver + " is not the spec's chief, " + spec->chief)
              << "\n";
    *exit_code = kExitUsage;
    return false;
  }
  driver = spec->chief;
  if (host_id.empty()) host_id = spec->task_host();
  if (index != nullptr) *index = spec->task_index;
  return true;
}

// --tls-dir DIR, or --tls-ca, --tls-cert and --tls-key: the job's keys when the driver has TLS.
void add_tls_options(CLI::App* cmd, std::string& ca, std::string& cert, std::string& key) {
  cmd->add_option_function<std::string>(
      "--tls-dir",
      [&ca, &cert, &key](const std::string& dir) {
        ca = dir + "/ca.pem";
        cert = dir + "/cert.pem";
        key = dir + "/key.pem";
      },
      "The job's TLS keys, where the driver has them: DIR/ca.pem, cert.pem, key.pem (dsgd tls-keys DIR)");
  cmd->add_option("--tls-ca", ca, "The job's CA certificate (PEM), instead of --tls-dir");
  cmd->add_option("--tls-cert", cert, "A certificate of that CA (PEM), instead of --tls-dir");
  cmd->add_option("--tls-key", key, "The certificate's private key (PEM), instead of --tls-dir");
}

}  // namespace

std::string token_from_environment() {
  if (const char* t = std::getenv("DSGD_TOKEN"); t != nullptr && *t != '\0') return t;
  const char* file = std::getenv("DSGD_TOKEN_FILE");
  if (file == nullptr || *file == '\0') return "";
  std::ifstream in(file);
  std::string token;
  if (!in || !std::getline(in, token) || token.empty()) {
    throw ConfigError(std::string("$DSGD_TOKEN_FILE names ") + file + ", which cannot be read or holds no token");
  }
  return token;
}

int join_as_task(const ClusterSpec& spec, const std::string& token) {
  if (spec.task_type == "worker") {
    dsgd::WorkerArgs args;
    args.driver = spec.chief;
    args.token = token;
    args.host_id = spec.task_host();
    dsgd::register_builtin_operators();
    return dsgd::run_worker(args);
  }
  dsgd::PsServerArgs args;
  args.driver = spec.chief;
  args.token = token;
  args.host_id = spec.task_host();
  args.shard = spec.task_index;
  return dsgd::run_ps_server(args);
}

void add_tls_keys_command(CLI::App& app, int* exit_code) {
  auto dir = std::make_shared<std::string>();
  auto days = std::make_shared<int>(365);
  CLI::App* cmd = app.add_subcommand("tls-keys", "Make a job's TLS keys for a driver and workers started apart");
  cmd->footer(
      "\nWrites DIR/ca.pem (a new certificate authority), DIR/cert.pem (a certificate of it) and DIR/key.pem\n"
      "(its private key, readable by you only). Copy DIR to every host of the job, then:\n"
      "  A$ dsgd train --workers 2 --listen 0.0.0.0:29500 --token s3cret --tls-dir DIR\n"
      "  B$ dsgd worker --driver A:29500 --token s3cret --tls-dir DIR\n"
      "The control plane then runs over mutual TLS: a process without a certificate of this CA is refused\n"
      "at the handshake. The CA's own key is not kept: run this again for a new job's keys.");
  cmd->add_option("DIR", *dir, "Where to write the keys")->required();
  cmd->add_option("--days", *days, "How long the certificates are valid")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([dir, days, exit_code] {
    try {
      dsgd::write_tls_keys(*dir, *days);
      std::cout << "wrote " << *dir << "/ca.pem, cert.pem, key.pem (valid " << *days << " days)\n";
    } catch (const std::exception& e) {
      std::cerr << "dsgd tls-keys: error: " << e.what() << "\n";
      *exit_code = kExitFailure;
    }
  });
}

void add_worker_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<dsgd::WorkerArgs>();
  CLI::App* cmd = app.add_subcommand("worker", "Join a training job's driver as a worker (remote mode)");
  cmd->footer(
      "\nExample (driver on host A, worker on host B):\n"
      "  A$ dsgd train --workers 2 --listen 0.0.0.0:29500 --token s3cret\n"
      "  B$ dsgd worker --driver A:29500 --token s3cret\n"
      "The token may come from $DSGD_TOKEN instead of --token. The worker exits when the job ends,\n"
      "or when the driver has been unreachable for the job's heartbeat timeout.");
  auto cluster = std::make_shared<std::string>();
  cmd->add_option("--driver", args->driver, "The driver's HOST:PORT (or the cluster spec's chief)");
  cmd->add_option("--cluster", *cluster, "A cluster spec whose task is a worker (default: $DSGD_CLUSTER)");
  cmd->add_option("--token", args->token, "The job token (default: $DSGD_TOKEN)");
  cmd->add_option("--address", args->address,
                  "Address peers reach this worker at (default: the one routing to the driver)");
  cmd->add_option("--host-id", args->host_id, "Host identity for shared memory (default: the host name)");
  add_tls_options(cmd, args->tls_ca, args->tls_cert, args->tls_key);
  cmd->callback([args, cluster, exit_code] {
    if (!apply_cluster(*cluster, "worker", "worker", args->driver, args->host_id, nullptr, exit_code)) return;
    if (!resolve_token(args->token, "worker", exit_code)) return;
    dsgd::register_builtin_operators();
    *exit_code = dsgd::run_worker(*args);
  });
}

void add_ps_server_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<dsgd::PsServerArgs>();
  CLI::App* cmd =
      app.add_subcommand("ps-server", "Join a training job's driver as a parameter-server shard (remote mode)");
  cmd->footer(
      "\nExample (driver on host A, two shard processes on host C):\n"
      "  A$ dsgd train --workers 2 --strategy ps --ps-placement processes --ps-shards 2 --listen 0.0.0.0:29500 --token "
      "s3cret\n"
      "  C$ dsgd ps-server --driver A:29500 --token s3cret --shard 0\n"
      "  C$ dsgd ps-server --driver A:29500 --token s3cret --shard 1\n"
      "The token may come from $DSGD_TOKEN instead of --token. A shard process exits when the job ends,\n"
      "or when the driver has been unreachable for --driver-timeout-ms.");
  auto cluster = std::make_shared<std::string>();
  cmd->add_option("--driver", args->driver, "The driver's HOST:PORT (or the cluster spec's chief)");
  cmd->add_option("--cluster", *cluster, "A cluster spec whose task is a ps shard (default: $DSGD_CLUSTER)");
  cmd->add_option("--token", args->token, "The job token (default: $DSGD_TOKEN)");
  cmd->add_option("--shard", args->shard, "Which shard this process serves: 0 .. --ps-shards - 1 (or the spec's index)")
      ->check(CLI::Range(0, 63));
  cmd->add_option("--address", args->address,
                  "Address the workers reach this shard at (default: the one routing to the driver)");
  cmd->add_option("--host-id", args->host_id, "Host identity (default: the host name)");
  add_tls_options(cmd, args->tls_ca, args->tls_cert, args->tls_key);
  auto timeout_ms = std::make_shared<int64_t>(args->driver_timeout.count());
  cmd->add_option("--driver-timeout-ms", *timeout_ms, "Exit when the driver has not answered for this long")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([args, cluster, timeout_ms, exit_code] {
    int index = -1;
    if (!apply_cluster(*cluster, "ps-server", "ps", args->driver, args->host_id, &index, exit_code)) return;
    if (index >= 0 && args->shard >= 0 && args->shard != index) {
      std::cerr << "dsgd ps-server: error: --shard " << args->shard << " but the cluster spec's task is ps " << index
                << "\n";
      *exit_code = kExitUsage;
      return;
    }
    if (index >= 0) args->shard = index;
    if (args->shard < 0) {
      std::cerr << "dsgd ps-server: error: --shard is required (or a cluster spec's ps task)\n";
      *exit_code = kExitUsage;
      return;
    }
    if (!resolve_token(args->token, "ps-server", exit_code)) return;
    args->driver_timeout = std::chrono::milliseconds(*timeout_ms);
    *exit_code = dsgd::run_ps_server(*args);
  });
}

}  // namespace dsgd::cli
