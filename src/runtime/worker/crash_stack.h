// A worker that crashes leaves its stack in the log: the driver sees only "killed by signal 11".
//
//   print_stack_on_crash();  // first thing in the process
#pragma once

namespace dsgd::runtime {

// Handlers for SIGSEGV, SIGBUS, SIGFPE and SIGILL that write the stack to stderr (async-signal-
// safe writes only), then take the default action, so the exit status stays the same.
void print_stack_on_crash();

}  // namespace dsgd::runtime
