#include "forge/common/sqlite.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

namespace forge::sqlite {
namespace {

std::string with_hint(const std::string& hint) {
  return hint.empty() ? "" : ": " + hint;
}

}  // namespace

Db::Db(std::string path, Mode mode, Errors errors) : path_(std::move(path)), errors_(std::move(errors)) {
  const int flags = SQLITE_OPEN_READWRITE | (mode == Mode::kCreate ? SQLITE_OPEN_CREATE : 0);
  if (sqlite3_open_v2(path_.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
    try {
      fail("open");
    } catch (...) {
      sqlite3_close(db_);
      db_ = nullptr;
      throw;
    }
  }
  sqlite3_busy_timeout(db_, 10000);
}

Db::~Db() {
  sqlite3_close(db_);
}

void Db::exec(const std::string& sql, const char* what) const {
  char* err = nullptr;
  const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
  sqlite3_free(err);  // the same text as sqlite3_errmsg, which fail() reads
  if (rc != SQLITE_OK) fail(what);
}

void Db::fail(const char* what) const {
  // The primary result code decides the exit class: a file that is not (or no longer) a database is
  // damaged data; locks and permissions get their own advice; everything else is the caller's code.
  const int code = db_ ? sqlite3_errcode(db_) & 0xff : SQLITE_NOMEM;
  const std::string why = db_ ? sqlite3_errmsg(db_) : "out of memory";
  const Errors& e = errors_;
  switch (code) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      forge::fail(ExitCode::kData, "{} '{}' is damaged ({}: {}){}", e.noun, path_, what, why,
                  with_hint(e.damaged_hint));
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      forge::fail(e.code, "{} '{}' stayed locked by another process ({}: {}): try again", e.noun, path_, what,
                  why);
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_AUTH:
      forge::fail(e.code, "cannot use {} '{}' ({}: {}){}", e.noun, path_, what, why,
                  with_hint(e.access_hint));
    default:
      forge::fail(e.code, "{} '{}': {}: {}", e.noun, path_, what, why);
  }
}

int64_t Db::changes() const {
  return sqlite3_changes64(db_);
}

void Db::keep_wal_files() const {
  int on = 1;
  if (const int rc = sqlite3_file_control(db_, "main", SQLITE_FCNTL_PERSIST_WAL, &on); rc != SQLITE_OK)
    forge::fail(errors_.code, "{} '{}': cannot keep its WAL files: {}", errors_.noun, path_,
                sqlite3_errstr(rc));
}

Stmt::Stmt(const Db& db, const std::string& sql) : db_(db) {
  if (sqlite3_prepare_v2(db.handle(), sql.c_str(), -1, &s_, nullptr) != SQLITE_OK) db.fail("prepare");
}

Stmt::~Stmt() {
  sqlite3_finalize(s_);
}

Stmt& Stmt::bind(int i, const std::string& v) {
  sqlite3_bind_text(s_, i, v.c_str(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}

Stmt& Stmt::bind(int i, int64_t v) {
  sqlite3_bind_int64(s_, i, v);
  return *this;
}

Stmt& Stmt::bind(int i, double v) {
  sqlite3_bind_double(s_, i, v);
  return *this;
}

Stmt& Stmt::bind(int i, const std::optional<int64_t>& v) {
  return v ? bind(i, *v) : bind_null(i);
}

Stmt& Stmt::bind(int i, const std::optional<std::string>& v) {
  return v ? bind(i, *v) : bind_null(i);
}

Stmt& Stmt::bind_null(int i) {
  sqlite3_bind_null(s_, i);
  return *this;
}

bool Stmt::step() {
  const int rc = sqlite3_step(s_);
  if (rc == SQLITE_ROW) return true;
  if (rc != SQLITE_DONE) db_.fail("step");
  sqlite3_reset(s_);
  sqlite3_clear_bindings(s_);
  return false;
}

std::string Stmt::text(int c) const {
  const auto* p = sqlite3_column_text(s_, c);
  return p ? std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(s_, c)))
           : std::string();
}

int64_t Stmt::integer(int c) const {
  return sqlite3_column_int64(s_, c);
}

double Stmt::real(int c) const {
  return sqlite3_column_double(s_, c);
}

bool Stmt::is_null(int c) const {
  return sqlite3_column_type(s_, c) == SQLITE_NULL;
}

const char* Stmt::column_name(int c) const {
  const char* n = sqlite3_column_name(s_, c);
  return n ? n : "?";
}

Transaction::Transaction(const Db& db) : db_(db) {
  db_.exec("BEGIN IMMEDIATE", "begin");
}

Transaction::~Transaction() {
  if (!done_) sqlite3_exec(db_.handle(), "ROLLBACK", nullptr, nullptr, nullptr);
}

void Transaction::commit() {
  db_.exec("COMMIT", "commit");
  done_ = true;
}

std::unique_ptr<Db> open_shared(const std::string& path, Db::Mode mode, Errors errors) {
  if (mode == Db::Mode::kCreate)
    if (const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0660); fd >= 0)
      ::close(fd);
  auto db = std::make_unique<Db>(path, mode, std::move(errors));
  // -wal and -shm stay once created: a setgid tool run by a user would otherwise recreate them owned by
  // that user, who could then write them directly.
  db->keep_wal_files();
  db->exec("PRAGMA journal_mode=WAL", "journal mode");
  db->exec("PRAGMA synchronous=NORMAL", "synchronous");
  return db;
}

}  // namespace forge::sqlite
