// The sandbox's system-call filter (seccomp, a classic BPF program): what
// the namespaces, the read-only mounts and the dropped privileges leave
// open, closed at the kernel's entry.
//
// - socket(AF_UNIX) fails with EACCES: the network namespace cuts every
//   network, but a unix socket is reached through its path, and the host's
//   files stay readable (a service listening on a socket outside the hidden
//   directories would otherwise be one connect away). So does a datagram
//   socketpair(AF_UNIX), whose ends may still sendto() or connect() a
//   path; a stream or seqpacket pair works (it is connected: EISCONN).
// - New namespaces fail with EPERM (unshare, setns, clone with a CLONE_NEW*
//   flag; clone3, whose flags a filter cannot read, with ENOSYS, so that
//   libc falls back to clone): a program may not make a user namespace, in
//   which it would hold every capability over fresh mount and network
//   namespaces, the kernel's largest attack surface for a program without
//   privileges.
// - The rest of the kernel's attack surface that untrusted code never needs
//   fails with EPERM: ptrace and cross-process memory access, mounts,
//   keyrings, bpf, perf events, userfaultfd, io_uring, modules, kexec,
//   clock setting, swap, quotas, handle-based opens, and the like (the
//   calls Docker's default profile refuses, as far as they apply here).
// - A call of another ABI than x86-64's (x32, i386 through int 0x80) kills
//   the process: the filter reads numbers in x86-64's table only.
//
// Elsewhere than x86-64 there is no filter (sandbox_seccomp_filter() is
// null) and the other layers stand alone.
#pragma once

struct sock_fprog;

namespace troupe::rl::reward {

/// The filter, built once; null where the architecture has none (see
/// above). Install it with seccomp(SECCOMP_SET_MODE_FILTER) after
/// PR_SET_NO_NEW_PRIVS, just before exec. Thread-safe.
const sock_fprog* sandbox_seccomp_filter();

}  // namespace troupe::rl::reward
