// GradSync over strategies that update parameters on their servers (ps with
// ps_update_on_shards, ps_async): buckets go out as gradients and come back as parameters; the
// servers start from a replica's parameters and momentum and give them back for snapshots.
#include <algorithm>

#include "dsgd/error.h"
#include "torch/grad_sync.h"

namespace dsgd::torch_glue {
namespace {

// Servers that start before any replica's first step (ServerUpdates::starts_servers_eagerly).
bool starts_eagerly(strategy::GradientStrategy& s) {
  const auto* servers = s.server_updates();
  return servers != nullptr && servers->starts_servers_eagerly();
}

// `tensors` (one per parameter) packed as the plan packs gradients.
torch::Tensor copy_flat(const std::vector<torch::Tensor>& tensors, const strategy::BucketPlan& plan) {
  auto flat = torch::empty({static_cast<int64_t>(plan.total_elements())}, torch::kFloat32);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& s = plan.slot(i);
    flat.narrow(0, static_cast<int64_t>(s.offset), static_cast<int64_t>(s.count)).copy_(tensors[i].reshape({-1}));
  }
  return flat;
}

}  // namespace

void GradSync::set_server_optimizer(uint32_t id, ServerOptimizer optimizer) {
  server_id_ = id;
  server_ = std::move(optimizer);
  applied_ = std::make_unique<bool[]>(plan_.buckets().size());
  restart_servers();
}

void GradSync::restart_servers() {
  init_servers_ = true;
  if (starts_eagerly(*strategy_) && server_.options) start_servers_now();
}

void GradSync::copy_state_flat(torch::Tensor& params, torch::Tensor& momentum) {
  torch::NoGradGuard no_grad;
  params = copy_flat(params_, plan_);
  std::vector<torch::Tensor> m;
  for (size_t i = 0; i < params_.size(); ++i) m.push_back(server_.momentum(i));
  const bool all = std::all_of(m.begin(), m.end(), [](const torch::Tensor& t) { return t.defined(); });
  momentum = all ? copy_flat(m, plan_) : torch::Tensor();
}

void GradSync::start_servers_now() {
  torch::Tensor params, momentum;
  copy_state_flat(params, momentum);
  const auto& buckets = plan_.buckets();
  for (size_t i = 0; i < buckets.size(); ++i) {
    strategy_->server_updates()->start_servers(
        (uint64_t{server_id_} << 32) | i, params.data_ptr<float>() + buckets[i].offset,
        momentum.defined() ? momentum.data_ptr<float>() + buckets[i].offset : nullptr, buckets[i].count);
  }
  init_servers_ = false;
  drop_optimizer_momentum();  // the servers hold it now
}

void GradSync::launch_update_locked(size_t bucket) {
  if (!server_.options) {
    throw Error("the strategy updates parameters on its servers, but this model's optimizer was not given to it "
                "(GradSync::set_server_optimizer)");
  }
  if (next_launch_ == 0) {  // the step's first launch
    step_sgd_ = server_.options();
    if (init_servers_) copy_state_flat(init_params_, init_momentum_);
  }
  const auto& b = plan_.buckets()[bucket];
  strategy::ShardUpdate u;
  u.key = (uint64_t{server_id_} << 32) | bucket;
  u.data = flat_.data_ptr<float>() + b.offset;
  u.count = b.count;
  u.sgd = step_sgd_;
  u.init = init_servers_;
  if (u.init) {
    u.params = init_params_.data_ptr<float>() + b.offset;
    if (init_momentum_.defined()) u.momentum = init_momentum_.data_ptr<float>() + b.offset;
  }
  works_[bucket] = strategy_->server_updates()->update_async(u, &applied_[bucket]);
}

void GradSync::drop_optimizer_momentum() {
  // Until the servers start from it (the next step), the optimizer's copy is the only one.
  if (!server_.set_momentum || init_servers_) return;
  for (size_t i = 0; i < params_.size(); ++i) server_.set_momentum(i, torch::Tensor());
}

void GradSync::gather_server_state() {
  if (!strategy_->server_updates()) return;
  auto momentum = torch::empty({static_cast<int64_t>(plan_.total_elements())}, torch::kFloat32);
  // Asynchronous servers also hold newer parameters than the replicas: those come back too.
  const bool with_params = starts_eagerly(*strategy_);
  auto params = with_params ? torch::empty_like(momentum) : torch::Tensor();
  const auto& buckets = plan_.buckets();
  auto has = std::make_unique<bool[]>(buckets.size());
  std::vector<std::shared_ptr<comm::Work>> works;
  for (size_t i = 0; i < buckets.size(); ++i) {
    works.push_back(strategy_->server_updates()->gather_state_async(
        (uint64_t{server_id_} << 32) | i, with_params ? params.data_ptr<float>() + buckets[i].offset : nullptr,
        momentum.data_ptr<float>() + buckets[i].offset, buckets[i].count, &has[i]));
  }
  comm::wait_all(works);
  if (with_params) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& s = plan_.slot(i);
      params_[i].copy_(params.narrow(0, static_cast<int64_t>(s.offset), static_cast<int64_t>(s.count))
                           .view(params_[i].sizes()));
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& s = plan_.slot(i);
    if (!has[s.bucket]) continue;
    server_.set_momentum(i, momentum.narrow(0, static_cast<int64_t>(s.offset), static_cast<int64_t>(s.count))
                                .view(params_[i].sizes())
                                .clone());
  }
}

}  // namespace dsgd::torch_glue
