#include "torch/sync/server_steps.h"

#include <algorithm>

#include "dsgd/common/error.h"

namespace dsgd::torch_glue {
namespace {

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

ServerSteps::ServerSteps(const std::vector<torch::Tensor>& params, const strategy::BucketPlan& plan,
                         strategy::ServerUpdates& servers)
    : params_(params), plan_(plan), servers_(servers), applied_(std::make_unique<bool[]>(plan.buckets().size())) {}

void ServerSteps::set_optimizer(uint32_t id, Optimizer optimizer) {
  id_ = id;
  optimizer_ = std::move(optimizer);
  restart();
}

void ServerSteps::restart() {
  init_ = true;
  if (servers_.starts_servers_eagerly() && optimizer_.options) start_now();
}

void ServerSteps::copy_state_flat(torch::Tensor& params, torch::Tensor& momentum) {
  torch::NoGradGuard no_grad;
  params = copy_flat(params_, plan_);
  std::vector<torch::Tensor> m;
  for (size_t i = 0; i < params_.size(); ++i) m.push_back(optimizer_.momentum(i));
  const bool all = std::all_of(m.begin(), m.end(), [](const torch::Tensor& t) { return t.defined(); });
  momentum = all ? copy_flat(m, plan_) : torch::Tensor();
}

void ServerSteps::start_now() {
  torch::Tensor params, momentum;
  copy_state_flat(params, momentum);
  const auto& buckets = plan_.buckets();
  for (size_t i = 0; i < buckets.size(); ++i) {
    servers_.start_servers(key(i), params.data_ptr<float>() + buckets[i].offset,
                           momentum.defined() ? momentum.data_ptr<float>() + buckets[i].offset : nullptr,
                           buckets[i].count);
  }
  init_ = false;
  drop_optimizer_momentum();  // the servers hold it now
}

std::shared_ptr<comm::Work> ServerSteps::launch(size_t bucket, float* data, bool first) {
  if (!optimizer_.options) {
    throw Error("the strategy updates parameters on its servers, but this model's optimizer was not given to it "
                "(ServerSteps::set_optimizer)");
  }
  if (first) {
    step_sgd_ = optimizer_.options();
    if (init_) copy_state_flat(init_params_, init_momentum_);
  }
  const auto& b = plan_.buckets()[bucket];
  strategy::ShardUpdate u;
  u.key = key(bucket);
  u.data = data;
  u.count = b.count;
  u.sgd = step_sgd_;
  u.init = init_;
  if (u.init) {
    u.params = init_params_.data_ptr<float>() + b.offset;
    if (init_momentum_.defined()) u.momentum = init_momentum_.data_ptr<float>() + b.offset;
  }
  return servers_.update_async(u, &applied_[bucket]);
}

bool ServerSteps::finish_step() {
  bool applied = true;
  for (size_t b = 0; b < plan_.buckets().size(); ++b) applied = applied && applied_[b];
  if (init_) {  // the servers started from this replica's state and own it now
    init_ = false;
    init_params_ = init_momentum_ = torch::Tensor();
    drop_optimizer_momentum();
  }
  return applied;
}

void ServerSteps::drop_optimizer_momentum() {
  // Until the servers start from it (the next step), the optimizer's copy is the only one.
  if (!optimizer_.set_momentum || init_) return;
  for (size_t i = 0; i < params_.size(); ++i) optimizer_.set_momentum(i, torch::Tensor());
}

void ServerSteps::gather_state() {
  auto momentum = torch::empty({static_cast<int64_t>(plan_.total_elements())}, torch::kFloat32);
  // Asynchronous servers also hold newer parameters than the replicas: those come back too.
  const bool with_params = servers_.starts_servers_eagerly();
  auto params = with_params ? torch::empty_like(momentum) : torch::Tensor();
  const auto& buckets = plan_.buckets();
  auto has = std::make_unique<bool[]>(buckets.size());
  std::vector<std::shared_ptr<comm::Work>> works;
  for (size_t i = 0; i < buckets.size(); ++i) {
    works.push_back(servers_.gather_state_async(key(i), with_params ? params.data_ptr<float>() + buckets[i].offset
                                                                    : nullptr,
                                                momentum.data_ptr<float>() + buckets[i].offset, buckets[i].count,
                                                &has[i]));
  }
  comm::wait_all(works);
  torch::NoGradGuard no_grad;
  if (with_params) {
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& s = plan_.slot(i);
      params_[i].copy_(params.narrow(0, static_cast<int64_t>(s.offset), static_cast<int64_t>(s.count))
                           .view(params_[i].sizes()));
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& s = plan_.slot(i);
    if (!has[s.bucket]) continue;
    optimizer_.set_momentum(i, momentum.narrow(0, static_cast<int64_t>(s.offset), static_cast<int64_t>(s.count))
                                   .view(params_[i].sizes())
                                   .clone());
  }
}

}  // namespace dsgd::torch_glue
