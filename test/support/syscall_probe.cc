// A program for the sandbox tests to run inside a sandbox: it makes the
// system calls the sandbox's filter refuses, each raw (no libc fallback in
// the way), and prints each one's errno, so that a test can check every
// branch of the filter. With the argument "x32" it makes one call through
// the x32 ABI instead, which the filter answers by killing the process.
#include <errno.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace {

// "name errno" for a call expected to fail; "name ok" if it succeeded.
void report(const char* name, long rc) {
  if (rc < 0) {
    std::printf("%s %d\n", name, errno);
  } else {
    std::printf("%s ok\n", name);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "x32") == 0) {
    // getpid through the x32 table (__X32_SYSCALL_BIT).
    syscall(SYS_getpid | 0x40000000);
    std::printf("x32 survived\n");
    return 0;
  }
  report("clone_newuser", syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0));
  report("clone_newnet", syscall(SYS_clone, CLONE_NEWNET | SIGCHLD, 0, 0, 0, 0));
  clone_args args{};
  args.flags = CLONE_NEWUSER;
  args.exit_signal = SIGCHLD;
  report("clone3", syscall(SYS_clone3, &args, sizeof args));
  report("unshare", syscall(SYS_unshare, CLONE_NEWUSER));
  report("ptrace", syscall(SYS_ptrace, PTRACE_TRACEME, 0, 0, 0));
  report("unix_socket", syscall(SYS_socket, AF_UNIX, SOCK_STREAM, 0));
  int pair[2];
  report("dgram_pair", syscall(SYS_socketpair, AF_UNIX, SOCK_DGRAM, 0, pair));
  report("stream_pair", syscall(SYS_socketpair, AF_UNIX, SOCK_STREAM, 0, pair));
  report("inet_socket", syscall(SYS_socket, AF_INET, SOCK_STREAM, 0));
  // A plain fork still works (clone without namespace flags).
  const long child = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
  if (child == 0) _exit(0);
  report("fork", child);
  return 0;
}
