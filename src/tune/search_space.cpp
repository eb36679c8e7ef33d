// The search space: parsing, sampling, PBT's perturbation, and trial values into a TrainerConfig.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <type_traits>

#include "dsgd/error.h"
#include "dsgd/tune.h"

namespace dsgd {
namespace {

using json = nlohmann::json;

double bound(const json& v, const std::string& where) {
  if (!v.is_number()) throw ConfigError(where + ": bounds must be numbers, got " + v.dump());
  const double x = v.get<double>();
  if (!std::isfinite(x)) throw ConfigError(where + ": bounds must be finite");
  return x;
}

Domain parse_domain(const std::string& key, const json& spec, const std::string& what) {
  Domain d;
  if (!spec.is_object()) {
    d.values = spec;
    return d;
  }
  const std::string where = what + ": key '" + key + "'";
  if (spec.size() != 1) {
    throw ConfigError(where + " must name one distribution (choice, grid, uniform, loguniform, randint), got " +
                      spec.dump());
  }
  const auto& [name, arg] = *spec.items().begin();
  static const std::map<std::string, Domain::Kind> kinds = {{"choice", Domain::Kind::kChoice},
                                                            {"grid", Domain::Kind::kGrid},
                                                            {"uniform", Domain::Kind::kUniform},
                                                            {"loguniform", Domain::Kind::kLogUniform},
                                                            {"randint", Domain::Kind::kRandInt}};
  const auto it = kinds.find(name);
  if (it == kinds.end()) {
    throw ConfigError(where + ": unknown distribution '" + name +
                      "'; use choice, grid, uniform, loguniform or randint");
  }
  d.kind = it->second;
  if (!arg.is_array() || arg.empty()) throw ConfigError(where + ": '" + name + "' takes a non-empty list");
  if (d.kind == Domain::Kind::kChoice || d.kind == Domain::Kind::kGrid) {
    d.values = arg;
    return d;
  }
  if (arg.size() != 2) throw ConfigError(where + ": '" + name + "' takes [low, high], got " + arg.dump());
  d.lo = bound(arg[0], where);
  d.hi = bound(arg[1], where);
  if (!(d.lo < d.hi) && !(d.kind == Domain::Kind::kRandInt && d.lo == d.hi)) {
    throw ConfigError(where + ": '" + name + "' needs low < high, got " + arg.dump());
  }
  if (d.kind == Domain::Kind::kLogUniform && d.lo <= 0) {
    throw ConfigError(where + ": 'loguniform' needs 0 < low, got " + arg.dump());
  }
  if (d.kind == Domain::Kind::kRandInt && (d.lo != std::floor(d.lo) || d.hi != std::floor(d.hi))) {
    throw ConfigError(where + ": 'randint' takes whole numbers, got " + arg.dump());
  }
  return d;
}

json draw(const Domain& d, std::mt19937_64& gen) {
  switch (d.kind) {
    case Domain::Kind::kConstant:
      return d.values;
    case Domain::Kind::kChoice:
    case Domain::Kind::kGrid:
      return d.values[std::uniform_int_distribution<size_t>(0, d.values.size() - 1)(gen)];
    case Domain::Kind::kUniform:
      return std::uniform_real_distribution<double>(d.lo, d.hi)(gen);
    case Domain::Kind::kLogUniform:
      return std::exp(std::uniform_real_distribution<double>(std::log(d.lo), std::log(d.hi))(gen));
    case Domain::Kind::kRandInt:
      return std::uniform_int_distribution<int64_t>(static_cast<int64_t>(d.lo), static_cast<int64_t>(d.hi))(gen);
  }
  return nullptr;
}

}  // namespace

SearchSpace SearchSpace::parse(const std::string& json_text, const std::string& what) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw ConfigError(what + " is not valid JSON: " + e.what());
  }
  return from_json(j, what);
}

SearchSpace SearchSpace::from_json(const json& space, const std::string& what) {
  if (!space.is_object()) throw ConfigError(what + " must be a JSON object of key: distribution");
  if (space.empty()) throw ConfigError(what + " is empty: name at least one key to search over");
  SearchSpace s;
  s.source_ = space;
  for (const auto& [key, spec] : space.items()) s.domains_.emplace_back(key, parse_domain(key, spec, what));
  return s;
}

size_t SearchSpace::grid_points() const {
  size_t n = 1;
  for (const auto& [key, d] : domains_) {
    if (d.kind == Domain::Kind::kGrid) n *= d.values.size();
  }
  return n;
}

json SearchSpace::sample(size_t grid_index, std::mt19937_64& gen) const {
  json out = json::object();
  size_t rest = grid_index % grid_points();
  for (const auto& [key, d] : domains_) {
    if (d.kind == Domain::Kind::kGrid) {
      out[key] = d.values[rest % d.values.size()];
      rest /= d.values.size();
    } else {
      out[key] = draw(d, gen);
    }
  }
  return out;
}

json SearchSpace::perturb(const json& values, double resample_probability, std::mt19937_64& gen) const {
  json out = values;
  std::uniform_real_distribution<double> u(0, 1);
  for (const auto& [key, d] : domains_) {
    if (d.kind == Domain::Kind::kConstant || !values.contains(key)) continue;
    if (u(gen) < resample_probability) {
      out[key] = draw(d, gen);
      continue;
    }
    const double factor = u(gen) < 0.5 ? 0.8 : 1.2;
    switch (d.kind) {
      case Domain::Kind::kUniform:
      case Domain::Kind::kLogUniform:
        out[key] = std::clamp(values[key].get<double>() * factor, d.lo, d.hi);
        break;
      case Domain::Kind::kRandInt:
        out[key] = static_cast<int64_t>(
            std::clamp(std::round(values[key].get<double>() * factor), d.lo, d.hi));
        break;
      case Domain::Kind::kChoice:
      case Domain::Kind::kGrid: {  // a neighbour in the list
        const auto at = std::find(d.values.begin(), d.values.end(), values[key]);
        const auto i = static_cast<int64_t>(at - d.values.begin());
        const auto n = static_cast<int64_t>(d.values.size());
        out[key] = d.values[static_cast<size_t>(std::clamp<int64_t>(i + (factor > 1 ? 1 : -1), 0, n - 1))];
        break;
      }
      case Domain::Kind::kConstant:
        break;
    }
  }
  return out;
}

namespace {

template <typename T>
void set_number(const json& v, const std::string& key, T* field) {
  if (!v.is_number()) throw ConfigError("trial value '" + key + "' must be a number, got " + v.dump());
  if constexpr (std::is_integral_v<T>) {
    const double x = v.get<double>();
    if (x != std::floor(x)) throw ConfigError("trial value '" + key + "' must be a whole number, got " + v.dump());
    *field = static_cast<T>(x);
  } else {
    *field = v.get<T>();
  }
}

template <typename E>
void set_choice(const json& v, const std::string& key, Choice<E>* field) {
  if (!v.is_string()) throw ConfigError("trial value '" + key + "' must be a string, got " + v.dump());
  *field = v.get<std::string>();
}

using Setter = std::function<void(TrainerConfig&, const json&, const std::string&)>;

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> s = {
      {"batch_size", [](TrainerConfig& c, const json& v, const std::string& k) { set_number(v, k, &c.batch_size); }},
      {"num_workers", [](TrainerConfig& c, const json& v, const std::string& k) { set_number(v, k, &c.num_workers); }},
      {"threads_per_worker",
       [](TrainerConfig& c, const json& v, const std::string& k) { set_number(v, k, &c.threads_per_worker); }},
      {"grad_shard_bytes",
       [](TrainerConfig& c, const json& v, const std::string& k) { set_number(v, k, &c.comm.grad_shard_bytes); }},
      {"seed", [](TrainerConfig& c, const json& v, const std::string& k) { set_number(v, k, &c.seed); }},
      {"powersgd_rank",
       [](TrainerConfig& c, const json& v, const std::string& k) { set_number(v, k, &c.comm.powersgd_rank); }},
      {"forward_overlap_buckets", [](TrainerConfig& c, const json& v,
                                     const std::string& k) { set_number(v, k, &c.comm.forward_overlap_buckets); }},
      {"loss_scale",
       [](TrainerConfig& c, const json& v, const std::string& k) { set_number(v, k, &c.step.loss_scale); }},
      {"local_hosts",
       [](TrainerConfig& c, const json& v, const std::string& k) { set_number(v, k, &c.launch.local_hosts); }},
      {"strategy", [](TrainerConfig& c, const json& v, const std::string& k) { set_choice(v, k, &c.strategy); }},
      {"compression",
       [](TrainerConfig& c, const json& v, const std::string& k) { set_choice(v, k, &c.comm.compression); }},
      {"precision", [](TrainerConfig& c, const json& v, const std::string& k) { set_choice(v, k, &c.step.precision); }},
      {"allreduce_algo",
       [](TrainerConfig& c, const json& v, const std::string& k) { set_choice(v, k, &c.comm.allreduce_algo); }},
  };
  return s;
}

}  // namespace

const std::vector<std::string>& trainer_fields() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& [k, s] : setters()) n.push_back(k);
    return n;
  }();
  return names;
}

TrainerConfig apply_values(TrainerConfig base, const json& values) {
  for (const auto& [key, v] : values.items()) {
    const auto it = setters().find(key);
    if (it != setters().end()) {
      it->second(base, v, key);
    } else {
      base.config[key] = v;
    }
  }
  return base;
}

}  // namespace dsgd
