#include "store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace troupe::cluster {

namespace {

constexpr int kSchemaVersion = 1;

/// Finalizes a statement on scope exit.
struct Finalize {
  sqlite3_stmt* s;
  ~Finalize() { sqlite3_finalize(s); }
};

}  // namespace

Status Store::failed(const char* what, int rc) const {
  std::string where = path_.string();
  switch (rc & 0xff) {
    case SQLITE_FULL:
      return Status(ErrorCode::storage, std::string("store: ") + what + ": the disk holding " + where +
                                                " is full; nothing was written; free space and retry");
    case SQLITE_IOERR:
      return Status(ErrorCode::storage, std::string("store: ") + what + ": I/O error on " + where + " (" +
                                                sqlite3_errstr(rc) + "); check the disk");
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return Status(ErrorCode::already_exists, std::string("store: ") + what + ": " + where +
                                                   " is locked by another process (another head on this data dir?)");
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return Status(ErrorCode::malformed, std::string("store: ") + what + ": " + where +
                                              " is not a troupe database or is damaged; move it aside to start "
                                              "a fresh cluster state");
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
      return Status(ErrorCode::invalid_argument, std::string("store: ") + what + ": cannot write " + where + " (" +
                                                     sqlite3_errstr(rc) + "); check --data-dir and its permissions");
    default:
      return Status(ErrorCode::invalid_argument,
                    std::string("store: ") + what + ": " + sqlite3_errstr(rc) + " (" + where + ")");
  }
}

Result<std::unique_ptr<Store>> Store::open(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return error(ErrorCode::invalid_argument,
                 "store: cannot create the data directory " + dir.string() + ": " + ec.message());
  }
  // One head per data directory: a second one gets a clear refusal rather
  // than two writers taking turns on the same state.
  std::filesystem::path lock = dir / "head.lock";
  int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return error(ErrorCode::invalid_argument,
                 "store: cannot open " + lock.string() + ": " + std::strerror(errno) + "; check --data-dir");
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return error(ErrorCode::already_exists, "store: another head is running on " + dir.string() +
                                                " (it holds " + lock.string() + "); stop it or use another --data-dir");
  }
  std::filesystem::path file = dir / "head.db";
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(file.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  std::unique_ptr<Store> store(new Store(db, file, fd));
  if (rc != SQLITE_OK) return error(store->failed("opening", rc));
  sqlite3_busy_timeout(db, 5000);
  if (Status s = store->exec("PRAGMA journal_mode=WAL"); !s.ok()) return error(s);
  if (Status s = store->exec("PRAGMA synchronous=NORMAL"); !s.ok()) return error(s);
  if (Status s = store->exec("CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);"
                             "CREATE TABLE IF NOT EXISTS records(kind TEXT NOT NULL, id TEXT NOT NULL, "
                             "body BLOB NOT NULL, PRIMARY KEY(kind, id)) WITHOUT ROWID;");
      !s.ok()) {
    return error(s);
  }
  // The schema version: refuse what a newer troupe wrote.
  sqlite3_stmt* v = nullptr;
  rc = sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key='schema_version'", -1, &v, nullptr);
  if (rc != SQLITE_OK) return error(store->failed("reading the schema version", rc));
  Finalize fv{v};
  rc = sqlite3_step(v);
  if (rc == SQLITE_ROW) {
    int version = sqlite3_column_int(v, 0);
    if (version > kSchemaVersion) {
      return error(ErrorCode::unsupported, "store: " + file.string() + " was written by a newer troupe (schema " +
                                               std::to_string(version) + ", this one reads " +
                                               std::to_string(kSchemaVersion) + "); upgrade troupe");
    }
  } else if (rc == SQLITE_DONE) {
    if (Status s = store->exec("INSERT INTO meta VALUES('schema_version', 1)"); !s.ok()) return error(s);
  } else {
    return error(store->failed("reading the schema version", rc));
  }
  struct {
    sqlite3_stmt** stmt;
    const char* sql;
  } statements[] = {
      {&store->put_, "INSERT INTO records(kind, id, body) VALUES(?, ?, ?) "
                     "ON CONFLICT(kind, id) DO UPDATE SET body = excluded.body"},
      {&store->erase_, "DELETE FROM records WHERE kind = ? AND id = ?"},
      {&store->get_, "SELECT body FROM records WHERE kind = ? AND id = ?"},
      {&store->all_, "SELECT id, body FROM records WHERE kind = ? ORDER BY id"},
  };
  for (auto& st : statements) {
    rc = sqlite3_prepare_v3(db, st.sql, -1, SQLITE_PREPARE_PERSISTENT, st.stmt, nullptr);
    if (rc != SQLITE_OK) return error(store->failed("preparing statements", rc));
  }
  return store;
}

Store::Store(sqlite3* db, std::filesystem::path path, int lock_fd) : db_(db), path_(std::move(path)), lock_fd_(lock_fd) {}

Store::~Store() {
  for (sqlite3_stmt* s : {put_, erase_, get_, all_}) sqlite3_finalize(s);
  sqlite3_close_v2(db_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

Status Store::exec(const char* sql) {
  char* msg = nullptr;
  int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &msg);
  sqlite3_free(msg);
  return rc == SQLITE_OK ? Status() : failed("setting up", rc);
}

Status Store::write_locked(const Change& c) {
  sqlite3_stmt* s = c.body ? put_ : erase_;
  sqlite3_reset(s);
  sqlite3_bind_text(s, 1, c.kind.data(), static_cast<int>(c.kind.size()), SQLITE_STATIC);
  sqlite3_bind_text(s, 2, c.id.data(), static_cast<int>(c.id.size()), SQLITE_STATIC);
  if (c.body) sqlite3_bind_blob(s, 3, c.body->data(), static_cast<int>(c.body->size()), SQLITE_STATIC);
  int rc = sqlite3_step(s);
  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
  return rc == SQLITE_DONE ? Status() : failed(c.body ? "writing" : "deleting", rc);
}

Status Store::apply(const std::vector<Change>& changes) {
  if (changes.empty()) return {};
  int rc = sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return failed("starting a transaction", rc);
  for (const Change& c : changes) {
    if (Status s = write_locked(c); !s.ok()) {
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      return s;
    }
  }
  rc = sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) {
    Status s = failed("committing", rc);
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return s;
  }
  return {};
}

Status Store::put(std::string_view kind, std::string_view id, std::string_view body) {
  return apply({Change{std::string(kind), std::string(id), std::string(body)}});
}

Status Store::erase(std::string_view kind, std::string_view id) {
  return apply({Change{std::string(kind), std::string(id), std::nullopt}});
}

Result<std::optional<std::string>> Store::get(std::string_view kind, std::string_view id) {
  sqlite3_reset(get_);
  sqlite3_bind_text(get_, 1, kind.data(), static_cast<int>(kind.size()), SQLITE_STATIC);
  sqlite3_bind_text(get_, 2, id.data(), static_cast<int>(id.size()), SQLITE_STATIC);
  int rc = sqlite3_step(get_);
  std::optional<std::string> out;
  if (rc == SQLITE_ROW) {
    auto* p = static_cast<const char*>(sqlite3_column_blob(get_, 0));
    out.emplace(p ? p : "", static_cast<size_t>(sqlite3_column_bytes(get_, 0)));
    rc = SQLITE_DONE;
  }
  sqlite3_reset(get_);
  sqlite3_clear_bindings(get_);
  if (rc != SQLITE_DONE) return error(failed("reading", rc));
  return out;
}

Result<std::vector<std::pair<std::string, std::string>>> Store::all(std::string_view kind) {
  sqlite3_reset(all_);
  sqlite3_bind_text(all_, 1, kind.data(), static_cast<int>(kind.size()), SQLITE_STATIC);
  std::vector<std::pair<std::string, std::string>> out;
  int rc;
  while ((rc = sqlite3_step(all_)) == SQLITE_ROW) {
    auto* id = reinterpret_cast<const char*>(sqlite3_column_text(all_, 0));
    auto* body = static_cast<const char*>(sqlite3_column_blob(all_, 1));
    out.emplace_back(std::string(id ? id : "", static_cast<size_t>(sqlite3_column_bytes(all_, 0))),
                     std::string(body ? body : "", static_cast<size_t>(sqlite3_column_bytes(all_, 1))));
  }
  sqlite3_reset(all_);
  sqlite3_clear_bindings(all_);
  if (rc != SQLITE_DONE) return error(failed("reading", rc));
  return out;
}

Status Store::limit_pages_for_test(int pages) {
  std::string sql = "PRAGMA max_page_count=" + std::to_string(pages);
  return exec(sql.c_str());
}

}  // namespace troupe::cluster
