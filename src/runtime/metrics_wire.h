// How metrics travel between workers and the driver on the control plane (JSON).
//
//   out["metrics"] = metrics_to_json(m);                 // worker
//   Metrics m = metrics_from_json(j.at("metrics"));      // driver
//
// JSON has no NaN or infinity (nlohmann writes them as null), yet a diverging loss is exactly
// what a user must see. Non-finite values travel as the strings "nan", "inf" and "-inf".
#pragma once

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "dsgd/error.h"
#include "dsgd/metrics.h"

namespace dsgd::runtime {

inline nlohmann::json metrics_to_json(const Metrics& m) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : m) {
    if (std::isfinite(v)) {
      j[k] = v;
    } else {
      j[k] = std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
    }
  }
  return j;
}

inline Metrics metrics_from_json(const nlohmann::json& j) {
  Metrics m;
  for (const auto& [k, v] : j.items()) {
    if (v.is_number()) {
      m[k] = v.get<double>();
    } else if (v == "nan") {
      m[k] = std::numeric_limits<double>::quiet_NaN();
    } else if (v == "inf" || v == "-inf") {
      m[k] = v == "inf" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
    } else {
      throw Error("metric '" + k + "' is not a number: " + v.dump());
    }
  }
  return m;
}

}  // namespace dsgd::runtime
