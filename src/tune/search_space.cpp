// The search space: parsing, sampling, PBT's perturbation, and trial values into a TrainerConfig.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <type_traits>

#include "dsgd/common/error.h"
#include "dsgd/runtime/settings.h"
#include "dsgd/tune/tuner.h"

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

namespace {

// The tunable row `key` names: by its path ("comm.compression"), or by its last part where that
// names one tunable setting alone ("compression", as space files wrote it before paths).
const SettingDescription* tunable(const std::string& key) {
  if (const SettingDescription* d = find_setting(key)) return d->tunable ? d : nullptr;
  const SettingDescription* found = nullptr;
  for (const auto& d : setting_descriptions()) {
    const auto dot = d.path.rfind('.');
    if (d.tunable && dot != std::string::npos && d.path.substr(dot + 1) == key) {
      if (found != nullptr) return nullptr;
      found = &d;
    }
  }
  return found;
}

std::string fields_text() {
  std::string f;
  for (const auto& k : trainer_fields()) f += (f.empty() ? "" : ", ") + k;
  return f;
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
  for (const auto& [key, spec] : space.items()) {
    if (tunable(key) == nullptr && find_setting(key) != nullptr) {
      throw ConfigError(what + ": '" + key +
                        "' is a setting a search does not vary (it changes what a trial measures "
                        "or how it runs): set it in \"base\" or with the command's flags; the tunable ones are " +
                        fields_text());
    }
    s.domains_.emplace_back(key, parse_domain(key, spec, what));
  }
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
        out[key] = static_cast<int64_t>(std::clamp(std::round(values[key].get<double>() * factor), d.lo, d.hi));
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

const std::vector<std::string>& trainer_fields() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& d : setting_descriptions()) {
      if (d.tunable) n.push_back(d.path);
    }
    return n;
  }();
  return names;
}

TrainerConfig apply_values(TrainerConfig base, const json& values) {
  for (const auto& [key, v] : values.items()) {
    if (const SettingDescription* d = tunable(key)) {
      d->set(base, v);
    } else if (const SettingDescription* any = find_setting(key)) {
      any->set(base, v);  // "base" sets any setting; a space only the tunable ones (from_json)
    } else {
      base.config[key] = v;
    }
  }
  return base;
}

}  // namespace dsgd
