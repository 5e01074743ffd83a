#include "io/atomic_write.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <string>
#include <system_error>
#include <utility>

namespace troupe::rl::io {

namespace fs = std::filesystem;

namespace {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

Status failed(int err, const std::string& doing) {
  return Status(ErrorCode::storage, errno_text(err) + " (" + doing + ")");
}

// 0 or the errno.
int write_all(int fd, std::span<const std::byte> bytes) {
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(left, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    p += n;
    left -= static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

Status write_atomically(const fs::path& path, std::span<const std::span<const std::byte>> pieces) {
  if (!path.has_filename()) return Status(ErrorCode::invalid_argument, "the path names no file");
  // O_EXCL keeps two writers (or a crashed one's leftover) apart.
  static std::atomic<uint64_t> counter{0};
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  fs::path temp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    temp = dir / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                  std::to_string(counter.fetch_add(1)));
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return failed(errno, "creating the temporary file " + temp.string());
  auto abandon = [&](int err, const std::string& doing) {
    if (fd >= 0) ::close(fd);
    ::unlink(temp.c_str());
    return failed(err, doing);
  };
  for (std::span<const std::byte> piece : pieces) {
    if (int err = write_all(fd, piece); err != 0) return abandon(err, "writing " + temp.string());
  }
  if (::fsync(fd) != 0) return abandon(errno, "syncing " + temp.string());
  // A delayed write error shows at the close on some filesystems (NFS).
  if (::close(std::exchange(fd, -1)) != 0) return abandon(errno, "closing " + temp.string());
  if (::rename(temp.c_str(), path.c_str()) != 0) return abandon(errno, "renaming " + temp.string() + " to it");
  // The rename lasts once the directory is synced. Some filesystems cannot
  // sync a directory (EINVAL): they offer nothing more to wait for.
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return failed(errno, "opening the directory to sync it; the file is in place");
  const int synced = ::fsync(dir_fd) == 0 ? 0 : errno;
  ::close(dir_fd);
  if (synced != 0 && synced != EINVAL) {
    return failed(synced, "syncing the directory; the file is in place but may not survive a crash");
  }
  return {};
}

Status write_atomically(const fs::path& path, std::string_view text) {
  const std::span<const std::byte> piece = std::as_bytes(std::span(text.data(), text.size()));
  return write_atomically(path, std::span(&piece, 1));
}

}  // namespace troupe::rl::io
