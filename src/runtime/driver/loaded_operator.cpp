#include "dsgd/runtime/loaded_operator.h"

#include <unistd.h>

#include <filesystem>

#include "dsgd/common/error.h"
#include "dsgd/torch/operator.h"
#include "runtime/checkpoint/model_file.h"
#include "runtime/checkpoint/sharded_checkpoint.h"
#include "runtime/driver/checkpoint.h"
#include "runtime/driver/operator_runtime.h"
#include "torch/replica/replica.h"

namespace dsgd {
namespace {

class Loaded final : public LoadedOperator {
 public:
  Loaded(const runtime::Checkpoint& c, const std::string& path, int threads)
      : runtime_(runtime::operator_runtime(c.header, path, threads)),
        name_(c.header.value("operator", std::string())),
        config_(c.header["operator_config"]) {
    runtime_->load_state(c.state);
  }
  // A sharded checkpoint: read in this process, every tensor whole.
  Loaded(runtime::ShardReader& reader, const std::string& path, int threads)
      : runtime_(runtime::operator_runtime(reader.manifest().at("header"), path, threads)),
        name_(reader.manifest().at("header").value("operator", std::string())),
        config_(reader.manifest().at("header")["operator_config"]) {
    runtime_->read_share(reader);
  }
  TrainingOperator& op() override { return runtime_->op(); }
  const std::string& operator_name() const override { return name_; }
  const nlohmann::json& operator_config() const override { return config_; }

 private:
  std::unique_ptr<torch_glue::ReplicaRuntime> runtime_;
  std::string name_;
  nlohmann::json config_;
};

}  // namespace

namespace runtime {

std::unique_ptr<torch_glue::ReplicaRuntime> operator_runtime(const nlohmann::json& h, const std::string& path,
                                                             int threads) {
  if (!h.contains("operator_config")) {
    throw ConfigError(path + ": the checkpoint does not carry its operator's config (an older dsgd wrote it): load it "
                      "into a job of this dsgd (--load) and let that job write its checkpoints");
  }
  torch_glue::ReplicaOptions o;
  o.global_batch = 1;
  o.seed = h.value("seed", uint64_t{1});
  o.info.seed = o.seed;
  o.threads = threads;
  auto r = std::make_unique<torch_glue::ReplicaRuntime>(make_operator(h.value("operator", std::string())), o);
  r->setup(h["operator_config"]);  // ConfigError above if the operator is unknown
  return r;
}

}  // namespace runtime

std::unique_ptr<LoadedOperator> load_operator(const std::string& path, int threads) {
  if (threads < 1) throw ConfigError("load_operator: threads must be >= 1, got " + std::to_string(threads));
  // A checkpoint directory, or a root of step-* ones (the newest intact one, either format).
  return runtime::load_first_intact(path, [threads](const std::string& dir) -> std::unique_ptr<LoadedOperator> {
    if (runtime::is_sharded_checkpoint(dir)) {
      runtime::ShardReader reader(dir);
      return std::make_unique<Loaded>(reader, dir, threads);
    }
    return std::make_unique<Loaded>(runtime::read_checkpoint(dir), dir, threads);
  });
}

void export_model(const std::string& checkpoint, const std::string& out, int threads) {
  auto loaded = load_operator(checkpoint, threads);
  const std::string tmp = out + ".tmp." + std::to_string(::getpid());
  try {
    runtime::write_model_file(loaded->op(), tmp);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, out, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw DataError(out, "cannot rename the exported model into place: " + ec.message());
  }
}

}  // namespace dsgd
