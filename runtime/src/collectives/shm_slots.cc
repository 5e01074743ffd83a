#include "collectives/shm_slots.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "collectives/host_id.h"

namespace troupe::collectives {
namespace {

constexpr uint64_t kMagic = 0x74726f7570657331;  // "troupes1"
constexpr size_t kPageBytes = 4096;
/// The first page holds the header; slots start after it, page aligned.
struct Header {
  uint64_t magic;
  uint64_t cookie;
  uint64_t slots;
  uint64_t slot_bytes;
};
static_assert(sizeof(Header) <= kPageBytes);

/// A bound on one segment, so that a bad offer cannot make a process map
/// (or a bad argument create) an absurd amount of memory: 1 TiB, the
/// largest CollectiveBuffer.
constexpr uint64_t kMaxSegmentBytes = uint64_t{1} << 40;

std::string errno_text() { return std::strerror(errno); }

uint64_t round_up_pages(uint64_t bytes) { return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes; }

}  // namespace

SlotSegment::SlotSegment(SlotSegment&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)),
      base_(std::exchange(o.base_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)),
      offer_(o.offer_),
      dev_(o.dev_),
      inode_(o.inode_) {}

SlotSegment& SlotSegment::operator=(SlotSegment&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = std::exchange(o.fd_, -1);
    base_ = std::exchange(o.base_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    offer_ = o.offer_;
    dev_ = o.dev_;
    inode_ = o.inode_;
  }
  return *this;
}

SlotSegment::~SlotSegment() { release(); }

void SlotSegment::release() {
  if (base_ != nullptr) ::munmap(base_, map_bytes_);
  if (fd_ >= 0) ::close(fd_);
  base_ = nullptr;
  fd_ = -1;
  map_bytes_ = 0;
}

Result<SlotSegment> SlotSegment::create(uint32_t slots, uint64_t slot_bytes, const char* name) {
  slot_bytes = round_up_pages(slot_bytes);
  if (slots == 0 || slot_bytes == 0 || slot_bytes * slots > kMaxSegmentBytes) {
    return error(ErrorCode::invalid_argument, "collectives: a slot segment of " + std::to_string(slots) + " x " +
                                                  std::to_string(slot_bytes) + " bytes is out of bounds");
  }
  SlotSegment s;
  s.fd_ = ::memfd_create(name, MFD_CLOEXEC);
  if (s.fd_ < 0) return error(ErrorCode::unsupported, "collectives: memfd_create: " + errno_text());
  s.map_bytes_ = kPageBytes + slot_bytes * slots;
  if (::ftruncate(s.fd_, static_cast<off_t>(s.map_bytes_)) != 0) {
    return error(ErrorCode::storage, "collectives: sizing a " + std::to_string(s.map_bytes_) +
                                         "-byte shared segment: " + errno_text());
  }
  void* p = ::mmap(nullptr, s.map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd_, 0);
  if (p == MAP_FAILED) return error(ErrorCode::storage, "collectives: mapping a shared segment: " + errno_text());
  s.base_ = static_cast<std::byte*>(p);
  uint64_t cookie = 0;
  if (::getrandom(&cookie, sizeof cookie, 0) != sizeof cookie) {
    return error(ErrorCode::unsupported, "collectives: getrandom: " + errno_text());
  }
  Header h{kMagic, cookie, slots, slot_bytes};
  std::memcpy(s.base_, &h, sizeof h);
  s.offer_ = SlotsOffer{static_cast<int64_t>(::getpid()), s.fd_, cookie, slots, slot_bytes, host_id()};
  return s;
}

Result<SlotSegment> SlotSegment::open(const SlotsOffer& offer) {
  if (offer.slots == 0 || offer.slot_bytes == 0 || offer.slot_bytes % kPageBytes != 0 ||
      offer.slot_bytes * offer.slots > kMaxSegmentBytes || offer.pid <= 0 || offer.fd < 0) {
    return error(ErrorCode::malformed, "collectives: a slot offer is malformed (" + std::to_string(offer.slots) +
                                           " x " + std::to_string(offer.slot_bytes) + " bytes)");
  }
  if (offer.host != host_id()) {
    return error(ErrorCode::unsupported, "collectives: a segment of host " + offer.host + ", and this is " + host_id());
  }
  std::string path = "/proc/" + std::to_string(offer.pid) + "/fd/" + std::to_string(offer.fd);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return error(ErrorCode::unsupported, "collectives: opening " + path + ": " + errno_text());
  SlotSegment s;
  s.map_bytes_ = kPageBytes + offer.slot_bytes * offer.slots;
  // Not the segment offered (another host's pid, a reused fd number) when it
  // is smaller than said or its header differs: checked before any write.
  off_t size = ::lseek(fd, 0, SEEK_END);
  if (size < 0 || static_cast<uint64_t>(size) < s.map_bytes_) {
    ::close(fd);
    return error(ErrorCode::unsupported, "collectives: " + path + " is not the segment offered");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    return error(ErrorCode::unsupported, "collectives: " + path + ": fstat: " + why);
  }
  s.dev_ = st.st_dev;
  s.inode_ = st.st_ino;
  void* p = ::mmap(nullptr, s.map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the memory
  if (p == MAP_FAILED) return error(ErrorCode::unsupported, "collectives: mapping " + path + ": " + errno_text());
  s.base_ = static_cast<std::byte*>(p);
  Header h;
  std::memcpy(&h, s.base_, sizeof h);
  if (h.magic != kMagic || h.cookie != offer.cookie || h.slots != offer.slots || h.slot_bytes != offer.slot_bytes) {
    return error(ErrorCode::unsupported, "collectives: " + path + " is not the segment offered");
  }
  s.offer_ = offer;
  return s;
}

bool SlotSegment::still_offered() const {
  struct stat st {};
  const std::string path = "/proc/" + std::to_string(offer_.pid) + "/fd/" + std::to_string(offer_.fd);
  return ::stat(path.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == inode_;
}

std::byte* SlotSegment::slot(uint32_t index) const {
  if (index >= offer_.slots || base_ == nullptr) {
    std::fprintf(stderr, "troupe: collectives: slot %u of a %u-slot segment\n", index, offer_.slots);
    std::abort();
  }
  return base_ + kPageBytes + offer_.slot_bytes * index;
}

}  // namespace troupe::collectives
