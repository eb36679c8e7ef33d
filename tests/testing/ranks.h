// Runs one function per rank on its own thread and rethrows the first failure, naming its rank.
#pragma once

#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dsgd::testing {

inline void run_ranks(int size, const std::function<void(int rank)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    if (errors[static_cast<size_t>(r)]) {
      try {
        std::rethrow_exception(errors[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        throw std::runtime_error("rank " + std::to_string(r) + ": " + e.what());
      }
    }
  }
}

}  // namespace dsgd::testing
