// The head's durable state: records survive a reopen and a kill -9 in the
// middle of writing; a batch commits whole or not at all (a full disk); a
// second head on the same directory, a damaged file and a newer schema are
// refused with errors that say what to do.
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "head/store.h"

using troupe::ErrorCode;
using troupe::cluster::Store;
namespace fs = std::filesystem;

namespace {
/// A fresh directory under the build's temp area, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("troupe-store-" + std::to_string(getpid()) + "-" +
                                        std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};
}  // namespace

TEST_CASE("store: records survive closing and reopening, binary bodies intact", "[store]") {
  TempDir dir;
  std::string blob("\0\1\2snapshot\xff", 12);
  {
    auto store = Store::open(dir.path).value();
    REQUIRE(store->put("node", "n1", R"({"cpus":8})").ok());
    REQUIRE(store->put("node", "n2", R"({"cpus":4})").ok());
    REQUIRE(store->put("snapshot", "actor-7", blob).ok());
    REQUIRE(store->put("node", "n1", R"({"cpus":16})").ok());  // overwrite
    REQUIRE(store->erase("node", "n2").ok());
    REQUIRE(store->erase("node", "absent").ok());
  }
  auto store = Store::open(dir.path).value();
  auto nodes = store->all("node").value();
  REQUIRE(nodes.size() == 1);
  CHECK(nodes[0].first == "n1");
  CHECK(nodes[0].second == R"({"cpus":16})");
  CHECK(store->get("snapshot", "actor-7").value() == blob);
  CHECK_FALSE(store->get("snapshot", "actor-8").value().has_value());
}

TEST_CASE("store: a second head on the same data directory is refused", "[store]") {
  TempDir dir;
  auto first = Store::open(dir.path);
  REQUIRE(first.has_value());
  auto second = Store::open(dir.path);
  REQUIRE_FALSE(second.has_value());
  CHECK(second.error().code() == ErrorCode::already_exists);
  CHECK_THAT(second.error().message(), Catch::Contains("another head is running on"));
  first->reset();
  CHECK(Store::open(dir.path).has_value());  // free again once the first is gone
}

TEST_CASE("store: a full disk fails the whole batch, says so, and leaves what was there", "[store]") {
  TempDir dir;
  auto store = Store::open(dir.path).value();
  REQUIRE(store->put("job", "j0", "before").ok());
  REQUIRE(store->limit_pages_for_test(8).ok());
  std::vector<Store::Change> batch;
  for (int i = 0; i < 200; ++i) batch.push_back({"job", "j" + std::to_string(i + 1), std::string(4000, 'x')});
  auto s = store->apply(batch);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == ErrorCode::storage);
  CHECK_THAT(s.message(), Catch::Contains("is full; nothing was written; free space and retry"));
  auto jobs = store->all("job").value();
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].second == "before");
}

TEST_CASE("store: kill -9 while writing loses no acknowledged record and tears none", "[store]") {
  TempDir dir;
  int ack[2];
  REQUIRE(pipe(ack) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(ack[0]);
    auto store = Store::open(dir.path);
    if (!store) _exit(2);
    for (int i = 0;; ++i) {
      std::string body(1000 + i % 500, static_cast<char>('a' + i % 26));
      if (!(*store)->put("rec", std::to_string(1'000'000 + i), body).ok()) _exit(3);
      if (write(ack[1], &i, sizeof(i)) != sizeof(i)) _exit(4);
    }
  }
  close(ack[1]);
  int acknowledged = -1, i = 0;
  while (acknowledged < 300 && read(ack[0], &i, sizeof(i)) == sizeof(i)) acknowledged = i;
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  while (read(ack[0], &i, sizeof(i)) == sizeof(i)) acknowledged = i;  // what it confirmed before dying
  close(ack[0]);
  REQUIRE(acknowledged >= 300);

  auto store = Store::open(dir.path);  // the dead writer's lock went with it
  REQUIRE(store.has_value());
  auto recs = (*store)->all("rec").value();
  REQUIRE(recs.size() >= static_cast<size_t>(acknowledged + 1));
  size_t torn = 0;
  for (size_t k = 0; k < recs.size(); ++k) {
    int n = std::stoi(recs[k].first) - 1'000'000;
    torn += recs[k].second != std::string(1000 + n % 500, static_cast<char>('a' + n % 26));
  }
  CHECK(torn == 0);
}

TEST_CASE("store: a file that is not a troupe database, or from a newer troupe, is refused clearly", "[store]") {
  TempDir dir;
  {
    std::ofstream f(dir.path / "head.db", std::ios::binary);
    f << std::string(8192, 'z');
  }
  auto bad = Store::open(dir.path);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code() == ErrorCode::malformed);
  CHECK_THAT(bad.error().message(), Catch::Contains("move it aside"));

  TempDir newer;
  Store::open(newer.path).value().reset();
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open((newer.path / "head.db").c_str(), &db) == SQLITE_OK);
  REQUIRE(sqlite3_exec(db, "UPDATE meta SET value = 99 WHERE key = 'schema_version'", nullptr, nullptr, nullptr) ==
          SQLITE_OK);
  sqlite3_close(db);
  auto future = Store::open(newer.path);
  REQUIRE_FALSE(future.has_value());
  CHECK_THAT(future.error().message(), Catch::Contains("written by a newer troupe"));
}
