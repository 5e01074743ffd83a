// The two-host suite's entry point: network namespaces stand in for hosts.
// Where they are not permitted (no root, a container without CAP_SYS_ADMIN,
// no `ip`), every test reports as skipped (ctest's SKIP_RETURN_CODE).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "support/catch_session.h"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing |= std::strncmp(argv[i], "--list", 6) == 0;
  if (!listing) {
    std::string probe = "troupe-probe-" + std::to_string(getpid());
    std::string cmd = "ip netns add " + probe + " >/dev/null 2>&1 && ip netns del " + probe + " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      std::printf("network namespaces are not permitted here (needs root and `ip`): two-host tests skipped\n");
      return 77;
    }
  }
  return troupe::test::run_catch_session(argc, argv);
}
