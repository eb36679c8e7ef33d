// Process liveness on this host, for naming the peer at fault; the host's name.
#pragma once

#include <string>

namespace dsgd::comm {

// This machine's host name (gethostname), "localhost" if it has none: GroupOptions::host's default.
std::string this_host();

// True if process `pid` on this host has exited (or is a zombie awaiting its parent).
bool process_gone(int pid);

}  // namespace dsgd::comm
