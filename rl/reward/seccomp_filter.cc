#include "reward/seccomp_filter.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace troupe::rl::reward {

#if defined(__x86_64__)

namespace {

// Calls untrusted code has no use for (see the header).
constexpr long kDenied[] = {
    SYS_ptrace,          SYS_process_vm_readv, SYS_process_vm_writev, SYS_kcmp,
    SYS_mount,           SYS_umount2,          SYS_pivot_root,        SYS_chroot,
    SYS_unshare,         SYS_setns,            SYS_mount_setattr,     SYS_fsopen,
    SYS_fsconfig,        SYS_fsmount,          SYS_fspick,            SYS_move_mount,
    SYS_open_tree,       SYS_keyctl,           SYS_add_key,           SYS_request_key,
    SYS_bpf,             SYS_perf_event_open,  SYS_userfaultfd,       SYS_io_uring_setup,
    SYS_io_uring_enter,  SYS_io_uring_register, SYS_kexec_load,       SYS_kexec_file_load,
    SYS_init_module,     SYS_finit_module,     SYS_delete_module,     SYS_reboot,
    SYS_swapon,          SYS_swapoff,          SYS_acct,              SYS_quotactl,
    SYS_name_to_handle_at, SYS_open_by_handle_at, SYS_lookup_dcookie, SYS_syslog,
    SYS_fanotify_init,   SYS_iopl,             SYS_ioperm,            SYS_modify_ldt,
    SYS_settimeofday,    SYS_clock_settime,    SYS_clock_adjtime,     SYS_adjtimex,
    SYS_vhangup,         SYS_uselib,
};

constexpr unsigned kNewNamespaces =
    CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP;

constexpr unsigned kNr = offsetof(seccomp_data, nr);
constexpr unsigned kArch = offsetof(seccomp_data, arch);
// The low 32 bits of the first argument (x86-64 is little-endian).
constexpr unsigned kArg0 = offsetof(seccomp_data, args);
constexpr unsigned kArg1 = offsetof(seccomp_data, args) + sizeof(uint64_t);
// The type's bits of socket()'s and socketpair()'s second argument (the
// rest are SOCK_NONBLOCK and SOCK_CLOEXEC).
constexpr unsigned kSocketTypeMask = 0xf;

sock_filter stmt(unsigned short code, unsigned k) { return BPF_STMT(code, k); }
sock_filter jump(unsigned short code, unsigned k, unsigned char jt, unsigned char jf) {
  return BPF_JUMP(code, k, jt, jf);
}
sock_filter fail_with(int err) { return stmt(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<unsigned>(err) & 0xffff)); }

std::vector<sock_filter> build() {
  std::vector<sock_filter> f;
  f.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, kArch));
  f.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0));
  f.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
  f.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, kNr));
  // x32's numbers are x86-64's with bit 30 set.
  f.push_back(jump(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1));
  f.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
  for (long nr : kDenied) {
    f.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<unsigned>(nr), 0, 1));
    f.push_back(fail_with(EPERM));
  }
  f.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1));
  f.push_back(fail_with(ENOSYS));
  // clone: its flags are the first argument.
  f.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 4));
  f.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, kArg0));
  f.push_back(jump(BPF_JMP | BPF_JSET | BPF_K, kNewNamespaces, 0, 1));
  f.push_back(fail_with(EPERM));
  f.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  // socket: its domain is the first argument.
  f.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, 0, 4));
  f.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, kArg0));
  f.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, AF_UNIX, 0, 1));
  f.push_back(fail_with(EACCES));
  f.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  // socketpair: a datagram pair may still sendto() or connect() a path;
  // a connected stream or seqpacket pair may not (EISCONN).
  f.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, SYS_socketpair, 0, 7));
  f.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, kArg0));
  f.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, AF_UNIX, 0, 4));
  f.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, kArg1));
  f.push_back(stmt(BPF_ALU | BPF_AND | BPF_K, kSocketTypeMask));
  f.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, SOCK_DGRAM, 0, 1));
  f.push_back(fail_with(EACCES));
  f.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  f.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  return f;
}

}  // namespace

const sock_fprog* sandbox_seccomp_filter() {
  static const std::vector<sock_filter> filter = build();
  static const sock_fprog program{static_cast<unsigned short>(filter.size()),
                                  const_cast<sock_filter*>(filter.data())};
  return &program;
}

#else

const sock_fprog* sandbox_seccomp_filter() { return nullptr; }

#endif

}  // namespace troupe::rl::reward
