#!/usr/bin/env bash
# Runs the test suite under ThreadSanitizer with an instrumented CAF.
#
# Debian's libcaf_core is not built with -fsanitize=thread, so TSan cannot see
# the synchronisation inside CAF's mailboxes and reports thousands of false
# races. This script builds CAF 0.17.6 from Debian's source package with TSan
# (into build-caf-tsan/, once), builds troupe with TROUPE_SANITIZE=thread
# (into build-tsan/) and runs the suite against the instrumented CAF.
# Needs root the first time (apt-get source via a private deb-src list).
# Arguments are Catch2 test specs; without any, everything but [huge] (256 MiB
# over UCX, which TSan slows past UCX's own endpoint keepalive) and [sandbox]
# (see below) runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
caf="$root/build-caf-tsan"
if [[ ! -f $caf/lib/libcaf_core.so ]]; then
  work="$caf/src"
  mkdir -p "$work/lists"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main" \
    > "$work/src.list"
  opts=(-o "Dir::Etc::SourceList=$work/src.list" -o "Dir::Etc::SourceParts=-" -o "Dir::State::Lists=$work/lists")
  apt-get "${opts[@]}" update -q
  # Only the upstream tarball is needed (Debian's patches are packaging); the
  # archive may no longer serve every file of the source package.
  (cd "$work" && apt-get "${opts[@]}" source --download-only actor-framework=0.17.6-2.1) || true
  [[ -f $work/actor-framework_0.17.6.orig.tar.gz ]] || { echo "tsan: could not fetch CAF 0.17.6 sources" >&2; exit 1; }
  tar -C "$work" -xzf "$work"/actor-framework_0.17.6.orig.tar.gz
  cmake -S "$work/actor-framework-0.17.6" -B "$caf" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer -w" \
    -DCAF_NO_EXAMPLES=yes -DCAF_NO_IO=yes -DCAF_NO_OPENCL=yes -DCAF_NO_OPENSSL=yes -DCAF_NO_PYTHON=yes \
    -DCAF_NO_TOOLS=yes -DCAF_NO_UNIT_TESTS=yes
  cmake --build "$caf" --target libcaf_core_shared 2>/dev/null || cmake --build "$caf"
fi
BUILD_DIR="$root/build-tsan" bash "$root/scripts/build.sh" -DTROUPE_SANITIZE=thread -DTROUPE_BUILD_BENCH=OFF
# UCX's memory hooks (libucm patches mmap/madvise at load time) crash under
# TSan's interceptors at thread exit; troupe does not need them.
export UCX_MEM_MMAP_HOOK_MODE=${UCX_MEM_MMAP_HOOK_MODE:-none} UCX_MEM_MALLOC_HOOKS=${UCX_MEM_MALLOC_HOOKS:-no}
# [sandbox] is left out by default: the sandbox starts its programs with
# clone() sharing the caller's memory, which TSan does not support ("starting
# new threads after multi-threaded fork"), and TSan's own sigaction wrappers
# hide the handlers the tests check.
LD_LIBRARY_PATH="$caf/lib" TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 suppressions=$root/scripts/tsan.supp" \
  "$root/build-tsan/test/troupe_tests" "${@:-~[huge]~[sandbox]}"
