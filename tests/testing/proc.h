// Reading /proc/<pid>/... of processes that may exit while they are read.
#pragma once

#include <fstream>
#include <iterator>
#include <string>

namespace dsgd::testing {

// The whole file; "" where it cannot be read, also when its process exits during the read
// (libstdc++'s filebuf then throws "No such process" from underflow).
inline std::string read_proc(const std::string& path) {
  try {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace dsgd::testing
