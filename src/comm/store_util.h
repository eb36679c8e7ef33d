// Helpers shared by the Store implementations.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace dsgd::comm {

// Throws dsgd::TimeoutError: "<where>: waited 10000 ms for keys a, b (2 of 5 missing)".
[[noreturn]] void throw_wait_timeout(const std::string& where, const std::vector<std::string>& missing,
                                     std::chrono::milliseconds timeout);

// The integer value of a counter key; throws dsgd::CommError if it holds something else.
int64_t parse_counter(const std::string& key, const std::string& value);

}  // namespace dsgd::comm
