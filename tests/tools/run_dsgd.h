// Runs the built `dsgd` binary (DSGD_BINARY) as a user would, for the command-line tests.
//
//   CliRun r = run_dsgd("train --help");          // or run_command("any shell line 2>&1")
//   EXPECT_EQ(r.exit_code, 0) << r.output;
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace dsgd::testing {

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// `command` under sh, stdout and stderr together as written (append "2>&1" for stderr).
inline CliRun run_command(const std::string& command) {
  CliRun r;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline CliRun run_dsgd(const std::string& args) { return run_command(std::string(DSGD_BINARY) + " " + args + " 2>&1"); }

}  // namespace dsgd::testing
