// The head's durable state: one SQLite database in WAL mode under the data
// directory, so that a head killed with -9 and started again on the same
// directory finds its nodes, placement groups, named actors and jobs.
//
// Records are (kind, id) -> bytes (the head encodes them; JSON for state,
// raw bytes for actor snapshots). Changes in one apply() commit together or
// not at all. Durability: every commit survives a crash of the head process
// (WAL, synchronous=NORMAL); a power loss may lose the last commits, not
// corrupt the database.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace troupe::cluster {

class Store {
 public:
  /// Opens (creating if needed) `dir`/head.db. Fails with a clear error when
  /// another head holds the directory, when the file is not a troupe
  /// database (or is damaged), or when it was written by a newer troupe.
  static Result<std::unique_ptr<Store>> open(const std::filesystem::path& dir);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  /// One change: a write (body set) or a deletion (body empty).
  struct Change {
    std::string kind;
    std::string id;
    std::optional<std::string> body;
  };
  /// Applies `changes` atomically. On failure (a full disk, say) nothing of
  /// them is written and the error says what to do.
  Status apply(const std::vector<Change>& changes);
  /// One write.
  Status put(std::string_view kind, std::string_view id, std::string_view body);
  /// One deletion (no error when absent).
  Status erase(std::string_view kind, std::string_view id);
  /// One record, or nullopt.
  Result<std::optional<std::string>> get(std::string_view kind, std::string_view id);
  /// Every record of a kind, by id.
  Result<std::vector<std::pair<std::string, std::string>>> all(std::string_view kind);

  /// Where the database is.
  const std::filesystem::path& path() const { return path_; }

  /// For tests of a full disk: caps the database at `pages` pages.
  Status limit_pages_for_test(int pages);

 private:
  Store(sqlite3* db, std::filesystem::path path, int lock_fd);
  Status exec(const char* sql);
  Status failed(const char* what, int rc) const;
  Status write_locked(const Change& c);

  sqlite3* db_;
  std::filesystem::path path_;
  int lock_fd_;
  sqlite3_stmt* put_ = nullptr;
  sqlite3_stmt* erase_ = nullptr;
  sqlite3_stmt* get_ = nullptr;
  sqlite3_stmt* all_ = nullptr;
};

}  // namespace troupe::cluster
