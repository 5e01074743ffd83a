// Files for tests that write them: a fresh directory removed at scope exit,
// whole-file reads and writes, and a call run under a file size limit (how
// a test makes writes fail as they do on a full disk, which works as root
// too, where taking a directory's write permission does not).
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

namespace troupe::test {

/// A fresh directory under the system's temporary directory, named
/// `prefix`-XXXXXX, removed with everything in it at scope exit.
struct TempDir {
  std::filesystem::path path;

  explicit TempDir(std::string_view prefix = "troupe-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  /// The names directly inside, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

/// The whole file at `p` ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Writes `bytes` to `p`, replacing what is there.
inline void write_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

/// Runs `call` with files limited to `limit_bytes` (RLIMIT_FSIZE), so that
/// writes past it fail with EFBIG as a full disk's fail with ENOSPC
/// (SIGXFSZ ignored meanwhile), and returns its result once the limit is
/// lifted: nothing else, Catch2's reporting included, writes under it.
template <class Call>
auto with_file_size_limit(rlim_t limit_bytes, Call&& call) {
  struct rlimit old {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  struct sigaction ignore {
  }, old_action{};
  ignore.sa_handler = SIG_IGN;
  REQUIRE(::sigaction(SIGXFSZ, &ignore, &old_action) == 0);
  struct rlimit small = old;
  small.rlim_cur = limit_bytes;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  auto result = std::forward<Call>(call)();
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::sigaction(SIGXFSZ, &old_action, nullptr);
  return result;
}

}  // namespace troupe::test
