// `dsgd bench allreduce`: forks --procs local ranks that meet through a file store in a temp
// directory and time allreduce over each size, printing latency, algorithm bandwidth and bus
// bandwidth (busbw = algbw * 2(n-1)/n), the median of --iters timed runs after warm-up.
// Results are verified against the closed form, so a fast wrong answer is an error.
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "dsgd/comm/group.h"
#include "dsgd/comm/hierarchical.h"
#include "dsgd/comm/shm_group.h"
#include "dsgd/common/error.h"

namespace dsgd::cli {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct BenchFlags {
  int procs = 2;
  std::vector<std::string> sizes = {"4", "4K", "64K", "1M", "16M", "100M"};
  std::string algo = "auto";
  int iters = 20;
  int warmup = 3;
  bool json = false;
  std::string pin = "auto";
  int hosts = 1;  // --algo hier: ranks split into this many pseudo-hosts
};

size_t parse_size(const std::string& s) {
  size_t pos = 0;
  const double v = std::stod(s, &pos);
  const std::string unit = s.substr(pos);
  double mult = 1;
  if (unit == "K" || unit == "KB") mult = 1e3;
  else if (unit == "KiB") mult = 1024;
  else if (unit == "M" || unit == "MB") mult = 1e6;
  else if (unit == "MiB") mult = 1 << 20;
  else if (unit == "G" || unit == "GB") mult = 1e9;
  else if (!unit.empty()) throw ConfigError("--bytes " + s + ": unknown unit '" + unit + "' (use K, KiB, M, MiB, G)");
  if (v < 0) throw ConfigError("--bytes " + s + ": must not be negative");
  return static_cast<size_t>(v * mult);
}

// One rank: returns median seconds per allreduce for each size (rank 0's view).
std::vector<double> run_rank(const BenchFlags& f, const std::vector<size_t>& sizes, const std::string& dir, int rank) {
  if (f.pin == "on" || (f.pin == "auto" && f.algo == "shm")) {
    // One core per rank (round robin): two shm ranks left on one core spin against each other.
    // Gloo ranks run three threads each (caller, collective thread, Gloo's event loop) and do
    // better unpinned.
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(rank % std::max(1, static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN))), &set);
    ::sched_setaffinity(0, sizeof(set), &set);
  }
  auto store = comm::make_file_store(dir);
  std::unique_ptr<comm::Group> group;
  std::unique_ptr<comm::ShmGroup> shm;
  std::unique_ptr<comm::HierarchicalGroup> hier;
  const size_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  if (f.algo == "hier") {
    comm::GroupOptions go;
    go.host = "pseudo-host-" + std::to_string(rank * f.hosts / f.procs);
    comm::ShmOptions so;
    so.slot_bytes = std::max<size_t>(4096, std::min<size_t>(max_bytes, size_t{64} << 20));
    hier = comm::HierarchicalGroup::create(store, rank, f.procs, go, so);
  } else if (f.algo == "shm") {
    comm::ShmOptions o;
    // A slot that holds the largest message, so every size runs zero-copy (the data lives in
    // the segment, as gradient buckets do); capped at 256 MiB per rank.
    o.slot_bytes = std::max<size_t>(4096, std::min<size_t>(max_bytes, size_t{256} << 20));
    shm = comm::ShmGroup::create(store, rank, f.procs, o);
  } else {
    group = comm::Group::create(store, rank, f.procs);
  }
  const auto algorithm = f.algo == "shm" || f.algo == "hier" ? comm::AllreduceAlgorithm::kAuto
                                                             : comm::parse_allreduce_algorithm(f.algo);
  std::vector<float> heap;
  std::vector<double> medians;
  for (size_t bytes : sizes) {
    const size_t count = std::max<size_t>(1, bytes / sizeof(float));
    float* data;
    if (shm && count * sizeof(float) <= shm->buffer_bytes()) {
      data = static_cast<float*>(shm->buffer());  // gradients kept in the segment: zero-copy
    } else {
      heap.assign(count, 0);
      data = heap.data();
    }
    std::vector<double> times;
    for (int it = 0; it < f.warmup + f.iters; ++it) {
      std::fill(data, data + count, static_cast<float>(rank + 1));
      if (shm) {
        shm->barrier();
      } else {
        (hier ? hier->global() : *group).barrier();
      }
      const auto t0 = Clock::now();
      if (hier) {
        hier->allreduce(data, count, comm::DataType::kFloat32, comm::ReduceOp::kSum);
      } else if (shm) {
        shm->allreduce(data, count, comm::DataType::kFloat32, comm::ReduceOp::kSum);
      } else {
        group->allreduce(data, count, comm::DataType::kFloat32, comm::ReduceOp::kSum, algorithm);
      }
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (it >= f.warmup) times.push_back(s);
      const float expected = static_cast<float>(f.procs * (f.procs + 1) / 2);
      if (data[0] != expected || data[count - 1] != expected) {
        throw Error("allreduce gave " + std::to_string(data[0]) + ", expected " + std::to_string(expected));
      }
    }
    // Every rank's view differs a little; the slowest rank's median is the operation's time.
    std::sort(times.begin(), times.end());
    double median = times[times.size() / 2];
    if (shm) {
      shm->barrier();
    } else {
      (hier ? hier->global() : *group).allreduce(&median, 1, comm::DataType::kFloat64, comm::ReduceOp::kMax);
    }
    medians.push_back(median);
  }
  return medians;
}

int run_bench_allreduce(BenchFlags& f) {
  std::vector<size_t> sizes;
  try {
    if (f.procs < 1 || f.procs > 256) throw ConfigError("--procs must be in 1..256, got " + std::to_string(f.procs));
    if (f.iters < 1) throw ConfigError("--iters must be >= 1");
    if (f.algo != "shm" && f.algo != "hier") comm::parse_allreduce_algorithm(f.algo);
    if (f.hosts < 1 || f.hosts > f.procs) {
      throw ConfigError("--hosts must be in 1..--procs (" + std::to_string(f.procs) + "), got " +
                        std::to_string(f.hosts));
    }
    for (const auto& s : f.sizes) sizes.push_back(parse_size(s));
  } catch (const ConfigError& e) {
    std::cerr << "dsgd bench allreduce: error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::invalid_argument&) {
    std::cerr << "dsgd bench allreduce: error: --bytes takes sizes such as 4, 64K, 16M, 100M\n";
    return kExitUsage;
  }
  char tmpl[] = "/tmp/dsgd-bench-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::cerr << "dsgd bench allreduce: error: cannot create a temporary directory\n";
    return kExitFailure;
  }
  const std::string dir = tmpl;
  std::vector<pid_t> children;
  for (int r = 1; r < f.procs; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      try {
        run_rank(f, sizes, dir, r);
        ::_exit(0);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        ::_exit(1);
      }
    }
    children.push_back(pid);
  }
  int rc = 0;
  std::vector<double> medians;
  try {
    medians = run_rank(f, sizes, dir, 0);
  } catch (const std::exception& e) {
    std::cerr << "dsgd bench allreduce: rank 0: " << e.what() << "\n";
    rc = kExitFailure;
    for (pid_t pid : children) ::kill(pid, SIGKILL);
  }
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = kExitFailure;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (rc != 0) return rc;

  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < sizes.size(); ++i) {
    const double bytes = static_cast<double>(std::max<size_t>(sizeof(float), sizes[i] / sizeof(float) * sizeof(float)));
    const double algbw = bytes / medians[i] / 1e9;
    rows.push_back({{"bytes", static_cast<size_t>(bytes)},
                    {"latency_us", medians[i] * 1e6},
                    {"algbw_gbps", algbw},
                    {"busbw_gbps", algbw * 2.0 * (f.procs - 1) / f.procs}});
  }
  if (f.json) {
    std::cout << nlohmann::json{{"procs", f.procs}, {"algo", f.algo}, {"iters", f.iters}, {"results", rows}}.dump(2)
              << "\n";
  } else {
    std::printf("allreduce, %d processes, algorithm %s, median of %d\n", f.procs, f.algo.c_str(), f.iters);
    std::printf("%12s %14s %14s %14s\n", "bytes", "latency (us)", "algbw (GB/s)", "busbw (GB/s)");
    for (const auto& r : rows) {
      std::printf("%12zu %14.1f %14.3f %14.3f\n", r["bytes"].get<size_t>(), r["latency_us"].get<double>(),
                  r["algbw_gbps"].get<double>(), r["busbw_gbps"].get<double>());
    }
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int* exit_code) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks that print (or emit as JSON) their measurements");
  bench->require_subcommand(1);
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* ar = bench->add_subcommand("allreduce", "Time allreduce among local processes");
  ar->footer(
      "\nExamples:\n"
      "  dsgd bench allreduce --procs 2 --algo shm\n"
      "  dsgd bench allreduce --procs 4 --bytes 4 1M 100M --algo ring --json\n"
      "  dsgd bench allreduce --procs 4 --hosts 2 --algo hier\n"
      "\nRanks are forked processes meeting through a file store; results are verified.");
  ar->add_option("--procs", flags->procs, "Processes (ranks)")->capture_default_str();
  ar->add_option("--bytes", flags->sizes, "Message sizes (4, 64K, 16M, 100M, 1MiB ...)")->capture_default_str();
  ar->add_option("--algo", flags->algo,
                 "ring, hd, auto (Gloo over TCP), shm (shared memory), hier (shm per host + Gloo among hosts)")
      ->capture_default_str();
  ar->add_option("--hosts", flags->hosts, "--algo hier: split the ranks into this many pseudo-hosts")
      ->capture_default_str();
  ar->add_option("--iters", flags->iters, "Timed iterations per size (median reported)")->capture_default_str();
  ar->add_option("--warmup", flags->warmup, "Untimed iterations per size")->capture_default_str();
  ar->add_flag("--json", flags->json, "Print JSON instead of a table");
  ar->add_option("--pin", flags->pin, "Pin rank r to core r % cores: on, off, auto (shm only)")
      ->check(CLI::IsMember({"on", "off", "auto"}))
      ->capture_default_str();
  ar->callback([flags, exit_code] { *exit_code = run_bench_allreduce(*flags); });
}

}  // namespace dsgd::cli
