// Which host a process is on, as the shared-memory paths of the collectives
// see it: two processes with the same host id can map each other's
// segments through /proc/<pid>/fd (collectives/shm_slots.h), so ring slots
// and arenas are only offered between them, and a group spread over
// several host ids runs hierarchically (collectives/hierarchy.h).
#pragma once

#include <string>

namespace troupe::collectives {

/// This process's host id: the kernel's boot id and the pid namespace's
/// inode (a process of another machine, container or pid namespace cannot
/// reach this one's /proc/<pid>/fd). TROUPE_HOST_ID, when set and not
/// empty, replaces it (as NCCL_HOSTID does NCCL's): processes with
/// different values never share memory, which is how one machine stands in
/// for several hosts. Read once.
const std::string& host_id();

}  // namespace troupe::collectives
