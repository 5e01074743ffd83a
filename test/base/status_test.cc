#include <catch2/catch.hpp>

#include "troupe/status.h"

using troupe::ErrorCode;
using troupe::Status;

TEST_CASE("a default Status is ok and prints as ok", "[base]") {
  Status s;
  CHECK(s.ok());
  CHECK(s.code() == ErrorCode::ok);
  CHECK(s.to_string() == "ok");
}

TEST_CASE("an error Status carries its code and message", "[base]") {
  Status s(ErrorCode::timeout, "ask: no reply within 5 ms");
  CHECK_FALSE(s.ok());
  CHECK(s.to_string() == "timeout: ask: no reply within 5 ms");
  CHECK(troupe::error_code_name(ErrorCode::actor_dead) == "actor_dead");
}

TEST_CASE("Result holds a value or the Status that explains its absence", "[base]") {
  troupe::Result<int> good = 3;
  troupe::Result<int> bad = troupe::error(ErrorCode::not_found, "no such child");
  CHECK(*good == 3);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code() == ErrorCode::not_found);
  CHECK(troupe::to_status(troupe::Result<void>()).ok());
}
