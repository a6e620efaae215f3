// What forge-health looks at, behind one interface: the checks (checks.h) and the node actions
// (health.h) see the machine only through Probes, so unit tests replace the machine, not the logic.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace forge::health {

struct CommandOutput {
  int status = 0;          // exit status; 128+N when killed by signal N
  bool not_found = false;  // the program could not be started
  bool timed_out = false;  // killed after the timeout
  std::string out, err;
};

struct DiskSpace {
  uint64_t free_bytes = 0, total_bytes = 0;    // free to unprivileged users (f_bavail)
  uint64_t free_inodes = 0, total_inodes = 0;  // total 0: the file system has no inode limit
};

struct ProcessInfo {
  int pid = 0;
  int ppid = 0;
  std::string comm;               // /proc/PID/comm
  std::vector<std::string> argv;  // /proc/PID/cmdline
  std::string mnt_ns;             // readlink /proc/PID/ns/mnt, "" if unreadable
  std::string slurm_job_id;       // SLURM_JOB_ID from /proc/PID/environ, "" if none or unreadable
};

class Probes {
 public:
  virtual ~Probes() = default;
  // statvfs(path); nullopt with `error` set when it fails.
  virtual std::optional<DiskSpace> disk_space(const std::string& path, std::string& error) = 0;
  // The whole file, or nullopt when it does not exist or cannot be read.
  virtual std::optional<std::string> read_file(const std::string& path) = 0;
  virtual bool is_directory(const std::string& path) = 0;
  virtual bool exists(const std::string& path) = 0;  // any file type (sockets included)
  // Whether `program` resolves on PATH (or is an executable path).
  virtual bool have_program(const std::string& program) = 0;
  // Runs argv (no shell) with `input` on stdin; killed after timeout_s.
  virtual CommandOutput run(const std::vector<std::string>& argv, const std::string& input,
                            double timeout_s) = 0;
  virtual int64_t now_s() = 0;                              // wall clock, seconds since the epoch
  virtual double uptime_s() = 0;                            // CLOCK_MONOTONIC: the kernel log's time base
  virtual std::string getenv(const std::string& name) = 0;  // "" when unset
  // The kernel ring buffer (/dev/kmsg records "prio,seq,usec,flags;text"); empty if unreadable.
  virtual std::vector<std::string> kernel_log() = 0;
  virtual std::vector<ProcessInfo> processes() = 0;
  virtual int self_pid() = 0;
  virtual bool kill_process(int pid) = 0;  // SIGKILL; false if it failed
  // Writes, fsyncs, reads back and removes a test file in `dir`; "" on success, else what failed.
  virtual std::string write_read_test(const std::string& dir) = 0;
};

// The real machine.
std::unique_ptr<Probes> system_probes();

}  // namespace forge::health
