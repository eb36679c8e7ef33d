#include "runtime/worker/crash_stack.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <initializer_list>

namespace dsgd::runtime {
namespace {

void print_stack_and_die(int sig) {
  const char* what = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE" : "SIGILL";
  (void)!::write(STDERR_FILENO, "dsgd worker: fatal ", 19);
  (void)!::write(STDERR_FILENO, what, std::strlen(what));
  (void)!::write(STDERR_FILENO, ", stack:\n", 9);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void print_stack_on_crash() {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) ::signal(sig, print_stack_and_die);
}

}  // namespace dsgd::runtime
