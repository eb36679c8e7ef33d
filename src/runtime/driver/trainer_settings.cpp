// Every TrainerConfig setting described once (dsgd/runtime/settings.h): one row per field, with its
// flag, help, whether it can be tuned and its own range. The front ends (CLI, Python, tuner,
// summary, job spec) read this table; none keeps a list of its own.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "dsgd/common/error.h"
#include "dsgd/common/json_fields.h"
#include "dsgd/runtime/settings.h"

namespace dsgd {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

[[noreturn]] void wrong(const std::string& path, const std::string& want, const json& v) {
  throw ConfigError(path + " must be " + want + ", got " + v.dump(), path);
}

template <typename T>
struct IsChoice : std::false_type {};
template <typename E>
struct IsChoice<Choice<E>> : std::true_type {
  static std::vector<std::string> names() { return {ChoiceTraits<E>::names.begin(), ChoiceTraits<E>::names.end()}; }
};

template <typename T>
std::string type_of() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  if constexpr (std::is_integral_v<T>) return "integer";
  if constexpr (std::is_floating_point_v<T>) return "number";
  if constexpr (std::is_same_v<T, std::string>) return "string";
  if constexpr (std::is_same_v<T, std::vector<std::string>>) return "strings";
  if constexpr (std::is_same_v<T, milliseconds>) return "milliseconds";
  if constexpr (IsChoice<T>::value) return "choice";
}

template <typename T>
json get_value(const T& field) {
  if constexpr (std::is_same_v<T, milliseconds>) {
    return field.count();
  } else if constexpr (IsChoice<T>::value) {
    return field.name();
  } else {
    return field;
  }
}

// "250ms", "30s", "5m", "2h" (a whole number and its unit).
milliseconds duration(const std::string& text, const std::string& path) {
  size_t used = 0;
  long long n = -1;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const long long scale = unit == "ms" ? 1 : unit == "s" ? 1000 : unit == "m" ? 60000 : unit == "h" ? 3600000 : 0;
  if (used == 0 || n < 0 || scale == 0) {
    throw ConfigError(path + " must be milliseconds or a duration (250ms, 30s, 5m, 2h), got '" + text + "'", path);
  }
  return milliseconds(n * scale);
}

template <typename T>
void set_value(T& field, const json& v, const std::string& path) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) wrong(path, "true or false", v);
    field = v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    try {
      field = integer_field(json{{path, v}}, path, field);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(e.what(), path);
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) wrong(path, "a number", v);
    field = v.get<double>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) wrong(path, "a string", v);
    field = v.get<std::string>();
  } else if constexpr (std::is_same_v<T, milliseconds>) {
    if (v.is_string()) {
      field = duration(v.get<std::string>(), path);
      return;
    }
    int64_t ms = field.count();
    set_value(ms, v, path);
    field = milliseconds(ms);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    if (!v.is_array() || !std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_string(); })) {
      wrong(path, "a list of strings", v);
    }
    field = v.get<std::vector<std::string>>();
  } else {  // Choice<E>: by the name the command line uses; an unknown one is the rule's to name
    static_assert(IsChoice<T>::value);
    if (!v.is_string()) wrong(path, "a string", v);
    field = v.get<std::string>();
  }
}

// Rules on one field's value: "" where it holds, else the message.
template <typename T>
using Rule = std::function<std::string(const std::string& path, const T&)>;

std::string text(double v) {
  return v == std::trunc(v) && std::abs(v) < 1e15 ? std::to_string(static_cast<int64_t>(v)) : std::to_string(v);
}

template <typename T>
double number(const T& v) {
  if constexpr (std::is_same_v<T, milliseconds>) {
    return static_cast<double>(v.count());
  } else {
    return static_cast<double>(v);
  }
}

// lo <= v <= hi: "<path> must be in lo..hi<note>, got v".
auto in(double lo, double hi, std::string note = "") {
  return [=](const std::string& path, const auto& v) -> std::string {
    const double x = number(v);
    if (std::isfinite(x) && x >= lo && x <= hi) return "";
    return path + " must be in " + text(lo) + ".." + text(hi) + note + ", got " + text(x);
  };
}
// v >= lo: "<path> must be >= lo<note>, got v".
auto at_least(double lo, std::string note = "") {
  return [=](const std::string& path, const auto& v) -> std::string {
    const double x = number(v);
    if (std::isfinite(x) && x >= lo) return "";
    return path + " must be >= " + text(lo) + note + ", got " + text(x);
  };
}
auto positive() {
  return [](const std::string& path, const auto& v) -> std::string {
    return number(v) > 0 ? "" : path + " must be > 0, got " + text(number(v));
  };
}
// A Choice's spelling names one of its values (the "unknown strategy 'x'; use ..." of choice.h).
template <typename E>
std::string known(const std::string&, const Choice<E>& c) {
  try {
    (void)c.value();
    return "";
  } catch (const ConfigError& e) {
    return e.what();
  }
}
struct Free {  // any value of the type
  template <typename T>
  std::string operator()(const std::string&, const T&) const {
    return "";
  }
};

// A row: the path (the member's spelling), the field, the flag, whether it can be tuned, the help
// and the rule. `as` and `from` replace the plain JSON of the value where a setting has a
// spelling of its own (comm.compression's "powersgd:R").
template <typename Field, typename R>
SettingDescription row(const char* path, Field field, std::string flag, bool tunable, std::string help, R rule,
                       std::function<json(const TrainerConfig&)> as = nullptr,
                       std::function<void(TrainerConfig&, const json&)> from = nullptr) {
  using T = std::remove_cvref_t<decltype(field(std::declval<TrainerConfig&>()))>;
  SettingDescription d;
  d.path = path;
  d.type = type_of<T>();
  if constexpr (IsChoice<T>::value) d.choices = IsChoice<T>::names();
  d.flag = std::move(flag);
  d.help = std::move(help);
  d.tunable = tunable;
  const std::string p = path;
  d.get =
      as ? as
         : std::function<json(const TrainerConfig&)>([field](const TrainerConfig& c) { return get_value(field(c)); });
  d.set = from ? from : std::function<void(TrainerConfig&, const json&)>([field, p](TrainerConfig& c, const json& v) {
    set_value(field(c), v, p);
  });
  d.rule = [field, p, rule](const TrainerConfig& c) -> std::string {
    if constexpr (IsChoice<T>::value) {
      if (auto bad = known(p, field(c)); !bad.empty()) return bad;
    }
    return rule(p, field(c));
  };
  return d;
}

#define DSGD_FIELD(member) \
#member, [](auto& c) -> auto& { return c.member; }

constexpr bool kTunable = true, kFixed = false;

// comm.compression: a Compression, or "powersgd:R" (powersgd at rank R, comm.powersgd_rank).
json compression_of(const TrainerConfig& c) {
  const std::string name = c.comm.compression.name();
  return c.comm.compression == Compression::kPowerSgd ? name + ":" + std::to_string(c.comm.powersgd_rank) : name;
}
void set_compression(TrainerConfig& c, const json& v) {
  if (!v.is_string()) wrong("comm.compression", "a string", v);
  const std::string s = v.get<std::string>();
  const auto colon = s.find(':');
  if (colon == std::string::npos) {
    c.comm.compression = s;
    return;
  }
  const std::string name = s.substr(0, colon), rank = s.substr(colon + 1);
  size_t used = 0;
  int r = 0;
  try {
    r = std::stoi(rank, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (name != "powersgd" || rank.empty() || used != rank.size()) {
    throw ConfigError("comm.compression '" + s + "': only powersgd takes a rank, a whole number (e.g. powersgd:4)",
                      "comm.compression");
  }
  c.comm.compression = Compression::kPowerSgd;
  c.comm.powersgd_rank = r;
}

// comm.forward_overlap_buckets: a count, or "auto" (-1: the driver tries a few).
json overlap_buckets_of(const TrainerConfig& c) {
  return c.comm.forward_overlap_buckets == -1 ? json("auto") : json(c.comm.forward_overlap_buckets);
}
void set_overlap_buckets(TrainerConfig& c, const json& v) {
  if (v == "auto") {
    c.comm.forward_overlap_buckets = -1;
  } else {
    set_value(c.comm.forward_overlap_buckets, v, "comm.forward_overlap_buckets");
  }
}

std::string overlap_counts(const std::string& path, const int& n) {
  return n >= -1 ? "" : path + " must be >= 0 (0 = off) or -1 (auto), got " + std::to_string(n);
}
std::string zero_stages(const std::string& path, const int& z) {
  return z >= 0 && z <= 3 ? ""
                          : path + " must be 0 (off), 1 (optimizer state sharded), 2 (gradients sharded too) or 3 " +
                                "(parameters sharded too), got " + std::to_string(z);
}
std::string loss_scales(const std::string& path, const double& s) {
  return s >= 0 || s == -1 ? ""
                           : path +
                                 " must be > 0 (dynamic from that scale), 0 (dynamic under fp16, else off) or -1 "
                                 "(off), got " +
                                 std::to_string(s);
}
std::string host_port(const std::string& path, const std::string& listen) {
  const auto colon = listen.rfind(':');
  return listen.empty() || (colon != std::string::npos && colon + 1 < listen.size())
             ? ""
             : path + " must be HOST:PORT (e.g. 0.0.0.0:29500), got '" + listen + "'";
}
std::string port(const std::string& path, const int& p) {
  return p >= -1 && p <= 65535 ? ""
                               : path + " must be a TCP port (0: any free one) or -1 (off), got " + std::to_string(p);
}
std::string address(const std::string& path, const std::string& host) {
  return host.empty() ? path + " must name an address to listen on (e.g. 127.0.0.1 or 0.0.0.0)" : "";
}

std::string overhead_share(const std::string& path, const double& share) {
  return share >= 0 && share < 1
             ? ""
             : path + " must be in [0, 1) (0 = every checkpoints.every_steps), got " + std::to_string(share);
}

// num_workers: a count, or "MIN:MAX" (an elastic size: recovery.min_workers MIN, num_workers MAX).
void set_workers(TrainerConfig& c, const json& v) {
  if (!v.is_string()) {
    set_value(c.num_workers, v, "num_workers");
    return;
  }
  const std::string s = v.get<std::string>();
  const auto colon = s.find(':');
  int n[2] = {0, 0};
  bool ok = colon != std::string::npos;
  for (int i = 0; ok && i < 2; ++i) {
    const std::string part = i == 0 ? s.substr(0, colon) : s.substr(colon + 1);
    size_t used = 0;
    try {
      n[i] = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    ok = !part.empty() && used == part.size();
  }
  if (!ok) {
    throw ConfigError("num_workers must be a count or MIN:MAX (an elastic size, e.g. 2:4), got '" + s + "'",
                      "num_workers");
  }
  if (n[0] < 1 || n[0] > n[1]) {
    throw ConfigError("num_workers " + s + ": MIN must be at least 1 and at most MAX", "num_workers");
  }
  c.recovery.min_workers = n[0];
  c.num_workers = n[1];
}

std::vector<SettingDescription> top_level() {
  return {
      row(DSGD_FIELD(num_workers), "--workers", kTunable,
          "Worker processes; MIN:MAX for an elastic size (--min-workers MIN)", in(1, 4096), nullptr, set_workers),
      row(DSGD_FIELD(strategy), "--strategy", kTunable, "Gradient synchronisation: simple, allreduce, ps or ps_async",
          Free{}),
      row(DSGD_FIELD(batch_size), "--batch-size", kTunable, "Global batch size (samples per step)", at_least(1)),
      row(DSGD_FIELD(devices_per_worker), "--devices-per-worker", kFixed, "Model replicas per worker process",
          in(1, 256)),
      row(DSGD_FIELD(device), "--device", kFixed,
          "Where replicas compute: auto (CUDA when the workers' LibTorch sees a GPU), cpu or cuda", Free{}),
      row(DSGD_FIELD(seed), "--seed", kTunable, "Seed for initial weights and shuffling", Free{}),
      row(DSGD_FIELD(initialization_hook), "", kFixed,
          "A registered worker function (DSGD_REGISTER_WORKER_FUNCTION) run before setup; \"\" = none", Free{}),
      row(DSGD_FIELD(threads_per_worker), "--threads", kTunable, "LibTorch threads per worker; 0 = cores / workers",
          at_least(0, " (0 = cores / workers)")),
  };
}

std::vector<SettingDescription> step_rows() {
  return {
      row(DSGD_FIELD(step.precision), "--precision", kTunable,
          "fp32; bf16: forward and loss under bfloat16 autocast (float32 weights and optimizer); fp16: the same in "
          "float16 with dynamic loss scaling (CUDA only)",
          Free{}),
      row(DSGD_FIELD(step.loss_scale), "--loss-scale", kTunable,
          "Dynamic loss scaling from this scale (a power of two); 0: 65536 under fp16, else off; -1: off", loss_scales),
      row(DSGD_FIELD(step.loss_scale_growth_interval), "--loss-scale-growth-interval", kFixed,
          "Finite steps in a row before the loss scale doubles", Free{}),
      row(DSGD_FIELD(step.nonfinite_policy), "--nonfinite", kFixed,
          "A NaN/infinite gradient: skip (the step, everywhere, and warn) or error (stop)", Free{}),
      row(DSGD_FIELD(step.scheduler_step_freq), "", kFixed,
          "When registered schedules step: batch, epoch or manual (the operator steps them)", Free{}),
      row(DSGD_FIELD(step.max_grad_norm), "--max-grad-norm", kTunable,
          "Clip the averaged gradients to this global L2 norm before each step (0: off)",
          at_least(0, " (0 = no clipping)")),
      row(DSGD_FIELD(step.accumulate_steps), "--accumulate-steps", kTunable,
          "Micro-batches per step: gradients summed locally, averaged once per step (1: off)",
          in(1, 4096, " (1 = no accumulation)")),
      row(DSGD_FIELD(step.zero_stage), "--zero", kTunable,
          "ZeRO stage: 1 = each replica keeps optimizer state for its share of the parameters only, 2 = and only "
          "their gradients, 3 = and only those parameters, each layer gathered as forward reaches it (0: off)",
          zero_stages),
      row(DSGD_FIELD(step.activation_checkpointing), "--activation-checkpointing", kTunable,
          "Drop each checkpointed unit's activations (the GPT's and ResNets' blocks) after its forward and "
          "recompute them in backward: less memory, about a third more compute",
          Free{}),
  };
}

std::vector<SettingDescription> comm_rows() {
  return {
      row(DSGD_FIELD(comm.allreduce_algo), "--allreduce-algo", kTunable, "auto (shared memory + Gloo), ring or hd",
          Free{}),
      row(DSGD_FIELD(comm.grad_shard_bytes), "--grad-shard-bytes", kTunable, "Gradient bucket size in bytes",
          positive()),
      row(DSGD_FIELD(comm.overlap), "!--no-overlap", kFixed,
          "Communicate gradients after backward instead of during it", Free{}),
      row(DSGD_FIELD(comm.forward_overlap_buckets), "--forward-overlap-buckets", kTunable,
          "Also overlap the next forward: this many buckets (spread over the layers) go after backward, first layer "
          "first, and each is applied as forward reaches it (0 = off; auto: tried on the first steps)",
          overlap_counts, overlap_buckets_of, set_overlap_buckets),
      row(DSGD_FIELD(comm.compression), "--compression", kTunable,
          "What crosses hosts (allreduce): none; fp16 / bf16: 16 bits a value on the wire, summed in float32; "
          "powersgd:R: PowerSGD's rank-R factors of each matrix (R default 4); the lossy ones with error feedback",
          Free{}, compression_of, set_compression),
      row(DSGD_FIELD(comm.powersgd_rank), "", kTunable, "PowerSGD's rank (also --compression powersgd:R), 1..1024",
          Free{}),
      row(DSGD_FIELD(comm.powersgd_start_steps), "--powersgd-start-steps", kFixed,
          "--compression powersgd: plain float32 steps first", Free{}),
      row(DSGD_FIELD(comm.timeout), "--comm-timeout-ms", kFixed,
          "Every collective's deadline (ms): bounds a collective that stalls with every process alive", positive()),
  };
}

std::vector<SettingDescription> ps_rows() {
  return {
      row(DSGD_FIELD(ps.shards), "--ps-shards", kTunable, "ps: parameter-server shards (0 = one per host)", Free{}),
      row(DSGD_FIELD(ps.update_on_shards), "--ps-update-on-shards", kFixed,
          "ps: the shards apply SGD and hold its momentum (optimizer state sharded); needs SGD", Free{}),
      row(DSGD_FIELD(ps.placement), "--ps-placement", kFixed,
          "ps: the shards live in the workers, or in processes of their own (--ps-shards of them; remote mode: "
          "start each with dsgd ps-server --shard S)",
          Free{}),
      row(DSGD_FIELD(ps.max_staleness), "--max-staleness", kTunable,
          "ps_async: a worker this many updates ahead of the slowest waits (-1 = never)", Free{}),
  };
}

std::vector<SettingDescription> launch_rows() {
  return {
      row(DSGD_FIELD(launch.launcher), "--launcher", kFixed,
          "Who starts the workers: local (this host), ssh (--hosts, over the system's ssh client; needs --listen "
          "HOST:PORT the hosts reach), mpirun (all at once; --hosts optional; a lost worker is not replaced), slurm "
          "(a job step per worker inside sbatch/salloc; needs --listen HOST:PORT the nodes reach), none (you do: "
          "`dsgd worker --driver`); auto: local, or none with --listen",
          Free{}),
      row(DSGD_FIELD(launch.listen), "--listen", kFixed,
          "HOST:PORT: wait for --workers workers started elsewhere (`dsgd worker`) instead of spawning", host_port),
      row(DSGD_FIELD(launch.token), "--token", kFixed,
          "Job token for --listen (default: $DSGD_TOKEN, else random, printed)", Free{}),
      row(DSGD_FIELD(launch.tls), "--tls", kFixed,
          "Mutual TLS on the control plane: auto (on where the driver starts every worker, with a CA it makes for "
          "the job; with --tls-dir wherever the workers run), on (an error where it cannot be had), off",
          Free{}),
      row(DSGD_FIELD(launch.tls_ca), "--tls-ca", kFixed, "The job's CA certificate (PEM)", Free{}),
      row(DSGD_FIELD(launch.tls_cert), "--tls-cert", kFixed, "A certificate of that CA (PEM)", Free{}),
      row(DSGD_FIELD(launch.tls_key), "--tls-key", kFixed, "The certificate's key (PEM)", Free{}),
      row(DSGD_FIELD(launch.worker_binary), "", kFixed, "What the driver starts; \"\" = this binary", Free{}),
      row(DSGD_FIELD(launch.hosts), "", kFixed,
          "ssh, mpirun: \"host\" or \"host:slots\" entries (the CLI reads them from --hosts FILE)", Free{}),
      row(DSGD_FIELD(launch.ssh_command), "--ssh-command", kFixed,
          "--launcher ssh: the ssh client and its options (e.g. \"ssh -p 2222 -i KEY\")", Free{}),
      row(DSGD_FIELD(launch.mpirun_command), "--mpirun-command", kFixed,
          "--launcher mpirun: mpirun and its options (e.g. \"mpirun --allow-run-as-root\")", Free{}),
      row(DSGD_FIELD(launch.srun_command), "--srun-command", kFixed,
          "--launcher slurm: srun and its options for every worker's step (e.g. \"srun --cpus-per-task=4\")", Free{}),
      row(DSGD_FIELD(launch.local_hosts), "--local-hosts", kTunable,
          "Spread local workers over this many pseudo-hosts (shared memory only within each)", at_least(1)),
      row(DSGD_FIELD(launch.registration_timeout), "", kFixed,
          "How long the driver waits at start for the next worker to register (ms; each arrival restarts it)",
          positive()),
      row(DSGD_FIELD(launch.memory_mib), "--memory-mib", kFixed,
          "Memory the workers started on this machine may hold together (MiB; checked before the first step)",
          at_least(0, " (0 = what the machine has available)")),
  };
}

std::vector<SettingDescription> recovery_rows() {
  return {
      row(DSGD_FIELD(recovery.heartbeat_timeout), "--heartbeat-timeout-ms", kFixed,
          "A worker silent this long (hung, or its network cut) is evicted", at_least(100, " ms")),
      row(DSGD_FIELD(recovery.max_failures), "--max-failures", kFixed,
          "Lost workers survived within any --failure-window; one more and the job fails", at_least(0)),
      row(DSGD_FIELD(recovery.failure_window), "--failure-window", kFixed,
          "The window --max-failures counts losses in (30s, 10m, 1h; 0: the whole job)", at_least(0, " ms")),
      row(DSGD_FIELD(recovery.standby_workers), "--standby", kFixed,
          "Standby workers: set up outside the group, each takes a lost worker's place in well under a second",
          in(0, 64)),
      row(DSGD_FIELD(recovery.wait_for_replacements), "--wait-for-replacements", kFixed,
          "After a loss without a standby, wait for new workers instead of going on with the survivors", Free{}),
      row(DSGD_FIELD(recovery.min_workers), "--min-workers", kFixed,
          "Elastic (also --workers MIN:MAX): start once this many workers are set up, take in more up to --workers, "
          "go on down to this many after losses, then wait for replacements (0 = a fixed size)",
          in(0, 4096)),
      row(DSGD_FIELD(recovery.from_peer), "!--no-from-peer", kFixed,
          "After a loss mid-training, restore the last snapshot and train the steps since again, instead of giving "
          "the new workers a survivor's state",
          Free{}),
      row(DSGD_FIELD(recovery.replace_lost_workers), "", kFixed,
          "Local mode: spawn new processes for lost workers and promoted standbys (with back-off)", Free{}),
      row(DSGD_FIELD(recovery.replacement_timeout), "", kFixed, "How long a new process has to register (ms)",
          positive()),
      row(DSGD_FIELD(recovery.on_straggler), "--on-straggler", kFixed,
          "A straggler named (computing >= 1.1x the others' step): warn, or evict it, a ready --standby taking its "
          "place",
          Free{}),
      row(DSGD_FIELD(recovery.driver_state_dir), "--driver-state", kFixed,
          "Keep what a driver needs to go on in this directory: this command started again with it (after the "
          "driver was killed or its host rebooted) takes the job up with the same workers, from the last snapshot; "
          "the workers wait --driver-grace-ms for it",
          Free{}),
      row(DSGD_FIELD(recovery.driver_grace), "--driver-grace-ms", kFixed,
          "With --driver-state: how long workers wait for a driver that stopped answering", in(1000, 86400000, " ms")),
  };
}

std::vector<SettingDescription> checkpoint_and_monitor_rows() {
  return {
      row(DSGD_FIELD(checkpoints.every_steps), "--checkpoint-every", kFixed,
          "Steps between snapshots, at least, and between --checkpoint-dir's checkpoints; a lost worker costs at "
          "most one interval (0 = once per epoch)",
          at_least(0, " (0 = once per train call)")),
      row(DSGD_FIELD(checkpoints.max_overhead), "--checkpoint-overhead", kFixed,
          "Longer intervals where snapshots would take more than this share of training time (0 = exactly every "
          "--checkpoint-every steps)",
          overhead_share),
      row(DSGD_FIELD(checkpoints.dir), "--checkpoint-dir", kFixed,
          "Also write a checkpoint here every --checkpoint-every steps (step-N), keeping --keep-checkpoints: each "
          "worker its share, in the background (docs/CHECKPOINTS.md)",
          Free{}),
      row(DSGD_FIELD(checkpoints.keep), "--keep-checkpoints", kFixed, "Checkpoints kept in --checkpoint-dir",
          at_least(1)),
      row(DSGD_FIELD(checkpoints.fail_on_write_error), "--fail-on-checkpoint-error", kFixed,
          "A --checkpoint-dir checkpoint that cannot be written (volume full) ends the job; without it: a warning, "
          "counted in the summary, and the next checkpoint tries again",
          Free{}),
      row(DSGD_FIELD(monitor.metrics_port), "--metrics-port", kFixed,
          "Serve the job's live figures for Prometheus at http://HOST:PORT/metrics (0: any free port, logged; -1: "
          "off)",
          port),
      row(DSGD_FIELD(monitor.metrics_host), "--metrics-host", kFixed,
          "The address --metrics-port listens on (0.0.0.0: every interface)", address),
      row(DSGD_FIELD(monitor.metrics_dir), "--metrics-dir", kFixed,
          "Write the dashboard's history (history.json) here as the job goes: `dsgd dashboard --metrics-dir DIR` "
          "shows it, during the job or after",
          Free{}),
  };
}

#undef DSGD_FIELD

}  // namespace

const std::vector<SettingDescription>& setting_descriptions() {
  static const std::vector<SettingDescription> table = [] {
    std::vector<SettingDescription> all;
    for (auto part :
         {top_level, step_rows, comm_rows, ps_rows, launch_rows, recovery_rows, checkpoint_and_monitor_rows}) {
      for (auto& d : part()) all.push_back(std::move(d));
    }
    return all;
  }();
  return table;
}

const SettingDescription* find_setting(const std::string& path) {
  const auto& all = setting_descriptions();
  const auto it = std::find_if(all.begin(), all.end(), [&](const SettingDescription& d) { return d.path == path; });
  return it == all.end() ? nullptr : &*it;
}

const std::vector<std::string>& setting_groups() {
  static const std::vector<std::string> groups = [] {
    std::vector<std::string> g;
    for (const auto& d : setting_descriptions()) {
      const auto dot = d.path.find('.');
      if (dot == std::string::npos) continue;
      const std::string group = d.path.substr(0, dot);
      if (std::find(g.begin(), g.end(), group) == g.end()) g.push_back(group);
    }
    return g;
  }();
  return groups;
}

std::vector<std::string> setting_names() {
  std::vector<std::string> out;
  for (const auto& d : setting_descriptions()) out.push_back(d.path);
  return out;
}

json settings_of(const TrainerConfig& config) {
  json out = json::object();
  for (const auto& d : setting_descriptions()) {
    if (d.path != "launch.token") out[d.path] = d.get(config);
  }
  return out;
}

json changed_settings(const TrainerConfig& config) {
  const json now = settings_of(config), defaults = settings_of(TrainerConfig{});
  json out = json::object();
  for (const auto& [path, v] : now.items()) {
    if (v != defaults[path]) out[path] = v;
  }
  return out;
}

void apply_settings(TrainerConfig& config, const json& values) {
  if (!values.is_object()) throw ConfigError("settings must be a JSON object, got " + values.dump());
  const auto& groups = setting_groups();
  for (const auto& [key, v] : values.items()) {
    if (key == "config") {  // the operator's own: merged key by key
      if (!v.is_object()) wrong("config", "an object", v);
      for (const auto& [k, x] : v.items()) config.config[k] = x;
      continue;
    }
    if (std::find(groups.begin(), groups.end(), key) != groups.end()) {
      if (!v.is_object()) wrong(key, "an object of its fields", v);
      json flat = json::object();
      for (const auto& [k, x] : v.items()) flat[key + "." + k] = x;
      apply_settings(config, flat);
      continue;
    }
    const SettingDescription* d = find_setting(key);
    if (d == nullptr) {
      throw ConfigError("unknown setting '" + key +
                            "': TrainerConfig's fields are num_workers, strategy, ... "
                            "and the groups' (step.max_grad_norm, recovery.standby_workers, ...; docs/SETTINGS.md)",
                        key);
    }
    d->set(config, v);
  }
}

void check_setting_rules(const TrainerConfig& config) {
  for (const auto& d : setting_descriptions()) {
    if (const std::string bad = d.rule(config); !bad.empty()) throw ConfigError(bad, d.path);
  }
}

}  // namespace dsgd
