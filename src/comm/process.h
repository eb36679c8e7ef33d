// Process liveness on this host, for naming the peer at fault.
#pragma once

namespace dsgd::comm {

// True if process `pid` on this host has exited (or is a zombie awaiting its parent).
bool process_gone(int pid);

}  // namespace dsgd::comm
