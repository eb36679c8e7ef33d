// Reading integer fields from JSON that a user wrote or that came off a disk. nlohmann's own
// conversion casts a float to the integer type unchecked: '{"synthetic_samples": 1e24}' was
// undefined behaviour (found by tests/fuzz/config_fuzzer.cpp) and 3.7 silently became 3.
//
//   int64_t n = integer_field(config, "synthetic_samples", int64_t{8192});  // throws std::invalid_argument
#pragma once

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>

namespace dsgd {

// The integer under `key` of `object`, or `fallback` when the key is absent. JSON has one number
// type, so a whole float (1e4) is accepted. A fraction, a number outside T's range or a value that
// is not a number throws std::invalid_argument naming the key and the value found.
template <typename T>
T integer_field(const nlohmann::json& object, const std::string& key, T fallback) {
  static_assert(std::numeric_limits<T>::is_integer);
  const auto it = object.find(key);
  if (it == object.end()) return fallback;
  const auto fail = [&](const std::string& why) -> T {
    throw std::invalid_argument("'" + key + "' must be " + why + ", got " + it->dump());
  };
  const std::string range = "a whole number in " + std::to_string(std::numeric_limits<T>::min()) + ".." +
                            std::to_string(std::numeric_limits<T>::max());
  if (it->is_number_unsigned()) {
    const auto v = it->template get<uint64_t>();
    return std::in_range<T>(v) ? static_cast<T>(v) : fail(range);
  }
  if (it->is_number_integer()) {
    const auto v = it->template get<int64_t>();
    return std::in_range<T>(v) ? static_cast<T>(v) : fail(range);
  }
  if (it->is_number_float()) {
    const double v = it->template get<double>();
    // [min, 2^digits) are exact doubles; inside them the cast is defined.
    const double lo = static_cast<double>(std::numeric_limits<T>::min());
    const double hi = std::ldexp(1.0, std::numeric_limits<T>::digits);
    if (std::isfinite(v) && v == std::trunc(v) && v >= lo && v < hi) return static_cast<T>(v);
    return fail(range);
  }
  return fail("a number");
}

}  // namespace dsgd
