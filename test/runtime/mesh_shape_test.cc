// Mesh shapes: ranks and coordinates, slicing, ranges, flatten and rename,
// and the errors for bad selections.
#include <catch2/catch.hpp>

#include "troupe/mesh_shape.h"

using troupe::Shape;

TEST_CASE("mesh shape: ranks are row-major and coordinates map back to them", "[mesh]") {
  auto s = Shape::make({{"hosts", 2}, {"gpus", 4}}).value();
  CHECK(s.size() == 8);
  CHECK(s.to_string() == "{hosts=2, gpus=4}");
  for (size_t i = 0; i < s.size(); ++i) {
    CHECK(s.rank(i) == i);
    auto c = s.coords(i);
    REQUIRE(c.size() == 2);
    CHECK(c[0] == i / 4);
    CHECK(c[1] == i % 4);
    CHECK(s.index_of(c).value() == i);
  }
  CHECK_FALSE(s.index_of({2, 0}).has_value());
  CHECK_FALSE(s.index_of({1}).has_value());
}

TEST_CASE("mesh shape: slicing a dimension keeps the members' global ranks", "[mesh]") {
  auto s = Shape::make({{"hosts", 2}, {"gpus", 4}}).value();
  auto host1 = s.slice({{"hosts", 1}}).value();
  CHECK(host1.names() == std::vector<std::string>{"gpus"});
  CHECK(host1.ranks() == std::vector<size_t>{4, 5, 6, 7});
  auto gpu2 = s.at("gpus", 2).value();
  CHECK(gpu2.ranks() == std::vector<size_t>{2, 6});
  auto one = s.slice({{"hosts", 1}, {"gpus", 3}}).value();
  CHECK(one.size() == 1);
  CHECK(one.rank(0) == 7);
  CHECK(one.names().empty());

  auto evens = s.range("gpus", 0, 4, 2).value();
  CHECK(evens.sizes() == std::vector<size_t>{2, 2});
  CHECK(evens.ranks() == std::vector<size_t>{0, 2, 4, 6});
  CHECK(evens.coords(3) == std::vector<size_t>{1, 1});
  CHECK(evens.index_of_rank(4).value() == 2);
  CHECK_FALSE(evens.index_of_rank(5).has_value());
  // A slice of a slice.
  auto odd_hosts_evens = evens.at("hosts", 1).value();
  CHECK(odd_hosts_evens.ranks() == std::vector<size_t>{4, 6});
}

TEST_CASE("mesh shape: flatten and rename keep ranks, bad selections say what is wrong", "[mesh]") {
  auto s = Shape::make({{"hosts", 2}, {"gpus", 4}}).value();
  auto flat = s.range("gpus", 1, 3).value().flatten("members");
  CHECK(flat.names() == std::vector<std::string>{"members"});
  CHECK(flat.ranks() == std::vector<size_t>{1, 2, 5, 6});
  auto renamed = s.rename("gpus", "ranks").value();
  CHECK(renamed.names() == std::vector<std::string>{"hosts", "ranks"});
  CHECK(renamed.ranks() == s.ranks());

  CHECK_THAT(s.at("racks", 0).error().message(), Catch::Contains("no dimension 'racks'"));
  CHECK_THAT(s.at("hosts", 2).error().message(), Catch::Contains("out of range"));
  CHECK_THAT(s.range("gpus", 3, 3).error().message(), Catch::Contains("selects nothing"));
  CHECK_THAT(s.rename("gpus", "hosts").error().message(), Catch::Contains("exists already"));
  CHECK_THAT(Shape::make({{"a", 0}}).error().message(), Catch::Contains("size 0"));
  CHECK_THAT(Shape::make({{"a", 1}, {"a", 2}}).error().message(), Catch::Contains("twice"));
}

TEST_CASE("mesh shape: a shape travels through the codec unchanged", "[mesh]") {
  auto s = Shape::make({{"hosts", 2}, {"gpus", 4}}).value().range("gpus", 1, 4, 2).value();
  auto back = troupe::codec::decode<Shape>(troupe::codec::encode(s)).value();
  CHECK(back.names() == s.names());
  CHECK(back.sizes() == s.sizes());
  CHECK(back.ranks() == s.ranks());
}
