// A small SQLite layer shared by the databases of the project (the quota ledger, the model registry): an
// open connection, prepared statements and BEGIN IMMEDIATE transactions whose failures are forge::Error
// with the database's name and path in the message. Kept out of forge_common (library forge_sqlite) so
// that programs without a database do not link SQLite.
#pragma once

#include "forge/common/error.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

struct sqlite3;
struct sqlite3_stmt;

namespace forge::sqlite {

// How a database's failures read. Every message names "<noun> '<path>'"; a damaged file (not a database,
// or corrupt) is always ExitCode::kData, other failures `code`.
struct Errors {
  std::string noun = "database";  // "ledger", "registry"
  ExitCode code = ExitCode::kIo;  // exit code of failures other than damage
  std::string damaged_hint;       // what to do about a damaged file, appended after ": "
  std::string access_hint;        // what to do when it cannot be opened or written, appended after ": "
};

class Db {
 public:
  enum class Mode { kExisting, kCreate };
  // Opens `path` read-write (kCreate: creating it if missing) and waits up to 10 s for locks that other
  // connections hold, so a concurrent writer delays this one instead of failing it.
  Db(std::string path, Mode mode, Errors errors);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  // Runs one or more statements without results.
  void exec(const std::string& sql, const char* what = "exec") const;
  // Throws the connection's current error as forge::Error; `what` names the operation that failed.
  [[noreturn]] void fail(const char* what) const;
  // Rows changed by the last INSERT, UPDATE or DELETE.
  int64_t changes() const;
  // Keeps the -wal and -shm files when the last connection closes (SQLITE_FCNTL_PERSIST_WAL), so that
  // files created once by their owner are not recreated, owned by whoever opens the database next.
  void keep_wal_files() const;

  sqlite3* handle() const { return db_; }
  const std::string& path() const { return path_; }

 private:
  sqlite3* db_ = nullptr;
  std::string path_;
  Errors errors_;
};

// A database a group shares through a setgid tool (docs/ADMISSION.md, "Privilege model"): kCreate makes a
// missing file 0660 minus the umask (SQLite's own would be 0644, which the group could not write); WAL
// mode with -wal and -shm kept once made (keep_wal_files), synchronous=NORMAL. The quota ledger and the
// model registry open themselves this way.
std::unique_ptr<Db> open_shared(const std::string& path, Db::Mode mode, Errors errors);

// A prepared statement that finalizes itself. After step() returns false (done) it is reset with its
// bindings cleared, ready to be bound and run again.
class Stmt {
 public:
  Stmt(const Db& db, const std::string& sql);
  ~Stmt();
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& bind(int i, const std::string& v);
  Stmt& bind(int i, int64_t v);
  Stmt& bind(int i, int v) { return bind(i, static_cast<int64_t>(v)); }
  Stmt& bind(int i, double v);
  Stmt& bind(int i, const std::optional<int64_t>& v);
  Stmt& bind(int i, const std::optional<std::string>& v);
  Stmt& bind_null(int i);
  // True while there is a row to read.
  bool step();

  std::string text(int c) const;  // "" for NULL
  int64_t integer(int c) const;
  double real(int c) const;
  bool is_null(int c) const;
  const char* column_name(int c) const;

 private:
  const Db& db_;
  sqlite3_stmt* s_ = nullptr;
};

// BEGIN IMMEDIATE ... COMMIT: takes the write lock at once (waiting for it like any lock), so that what
// the transaction reads cannot change before it writes. Rolls back when left without commit().
class Transaction {
 public:
  explicit Transaction(const Db& db);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit();

 private:
  const Db& db_;
  bool done_ = false;
};

}  // namespace forge::sqlite
