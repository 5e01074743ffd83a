// Shared-memory slot segments (runtime/src/collectives/shm_slots.h): what a
// receiver offers, another process maps; bytes written on one side are read
// on the other; offers that name something else are refused, not mapped.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "collectives/host_id.h"
#include "collectives/shm_slots.h"

using troupe::ErrorCode;
using troupe::collectives::SlotSegment;
using troupe::collectives::SlotsOffer;

TEST_CASE("shm slots: a segment offered by one process is written by another and read back", "[collectives][shm]") {
  auto inbox = SlotSegment::create(4, 1000);
  REQUIRE(inbox.has_value());
  CHECK(inbox->slots() == 4);
  CHECK(inbox->slot_bytes() == 4096);  // rounded up to a page
  CHECK(reinterpret_cast<uintptr_t>(inbox->slot(3)) % 4096 == 0);
  SlotsOffer offer = inbox->offer();
  CHECK(offer.pid == getpid());

  // A child process (another address space) maps the offer and writes slot 2.
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto outbox = SlotSegment::open(offer);
    if (!outbox) _exit(2);
    std::memset(outbox->slot(2), 0x5a, 4096);
    std::memcpy(outbox->slot(2), "from the child", 15);
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  CHECK(std::string(reinterpret_cast<const char*>(inbox->slot(2))) == "from the child");
  CHECK(static_cast<unsigned char>(inbox->slot(2)[4095]) == 0x5a);
  CHECK(static_cast<unsigned char>(inbox->slot(1)[0]) == 0);  // other slots untouched
}

TEST_CASE("shm slots: an offer that names another segment, or none, is refused without mapping it",
          "[collectives][shm]") {
  auto inbox = SlotSegment::create(2, 4096);
  REQUIRE(inbox.has_value());
  SlotsOffer offer = inbox->offer();

  SECTION("wrong cookie (another host's process with the same pid and fd)") {
    offer.cookie ^= 1;
    auto r = SlotSegment::open(offer);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::unsupported);
    CHECK_THAT(r.error().message(), Catch::Contains("not the segment offered"));
  }
  SECTION("more slots than the segment has") {
    offer.slots = 64;
    auto r = SlotSegment::open(offer);
    REQUIRE_FALSE(r.has_value());
    CHECK_THAT(r.error().message(), Catch::Contains("not the segment offered"));
  }
  SECTION("another host id (TROUPE_HOST_ID set apart), even where the fd could be opened") {
    offer.host += "-elsewhere";
    auto r = SlotSegment::open(offer);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::unsupported);
    CHECK_THAT(r.error().message(), Catch::Contains("a segment of host"));
  }
  SECTION("an fd that is not open there") {
    offer.fd = 100000;
    auto r = SlotSegment::open(offer);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::unsupported);
  }
  SECTION("absurd sizes are malformed") {
    offer.slot_bytes = uint64_t{1} << 40;
    auto r = SlotSegment::open(offer);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::malformed);
  }
  SECTION("a zero-slot segment cannot be made") {
    auto r = SlotSegment::create(0, 4096);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code() == ErrorCode::invalid_argument);
  }
}

TEST_CASE("shm slots: the memory outlives the receiver's handle while a sender maps it", "[collectives][shm]") {
  auto inbox = SlotSegment::create(1, 4096);
  REQUIRE(inbox.has_value());
  auto outbox = SlotSegment::open(inbox->offer());
  REQUIRE(outbox.has_value());
  std::memcpy(inbox->slot(0), "kept", 5);
  *inbox = SlotSegment();  // the receiver goes (its process dying does the same)
  CHECK(std::string(reinterpret_cast<const char*>(outbox->slot(0))) == "kept");
}

TEST_CASE("host id: the boot id and the pid namespace, unless TROUPE_HOST_ID names one, and offers carry it",
          "[collectives][shm]") {
  const std::string& id = troupe::collectives::host_id();
  if (const char* set = std::getenv("TROUPE_HOST_ID"); set != nullptr && *set != '\0') {
    CHECK(id == set);
  } else {
    std::string boot;
    std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
    struct stat ns {};
    REQUIRE(::stat("/proc/self/ns/pid", &ns) == 0);
    CHECK(id == boot + "/pidns:" + std::to_string(ns.st_ino));
  }
  auto inbox = SlotSegment::create(1, 4096);
  REQUIRE(inbox.has_value());
  CHECK(inbox->offer().host == id);
}
