#include "forge/ckpt/saver.h"

#include "fs.h"
#include "plan.h"

#include "forge/ckpt/store.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>

namespace forge::ckpt {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

constexpr size_t kWriteChunk = 16u << 20;

std::string done_marker(int rank) {
  return fmt::format("rank-{:05d}.done", rank);
}
std::string failed_marker(int rank) {
  return fmt::format("rank-{:05d}.failed", rank);
}

}  // namespace

AsyncPolicy parse_async_policy(std::string_view name) {
  if (name == "wait") return AsyncPolicy::kWait;
  if (name == "skip") return AsyncPolicy::kSkip;
  fail(ExitCode::kUsage, "ckpt.async_policy = {}: use wait or skip", name);
}

std::string_view outcome_name(Outcome outcome) {
  switch (outcome) {
    case Outcome::kPending:
      return "pending";
    case Outcome::kCommitted:
      return "committed";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kSkipped:
      return "skipped";
  }
  return "unknown";
}

Json SaveEvent::to_json() const {
  return Json{{"event", "ckpt_save"},
              {"step", step},
              {"tier", tier_name(tier)},
              {"outcome", outcome_name(outcome)},
              {"stall_s", stall_s},
              {"copy_s", copy_s},
              {"write_s", write_s},
              {"bytes", bytes},
              {"path", path},
              {"error", error}};
}

struct Saver::Job {
  SaveEvent event;
  std::string staging;
  std::string final_dir;
  std::optional<DirLock> staging_lock;  // rank 0
  CheckpointMeta meta;                  // rank 0
  detail::SavePlan plan;                // rank 0
  uint64_t my_bytes = 0;
  bool ok = false;
};

Saver::Saver(Coordinator& coord, SaverOptions options) : coord_(coord), options_(std::move(options)) {
  if (options_.run_dir.empty())
    fail(ExitCode::kUsage, "the checkpoint saver needs a run directory (run.dir)");
  if (options_.recovery_keep < 1)
    fail(ExitCode::kUsage, "ckpt.recovery_keep = {}: keep at least 1 recovery checkpoint",
         options_.recovery_keep);
  if (coord_.rank() == 0) {
    geometry_.resize(coord_.size());
    geometry_hash_.resize(coord_.size());
  }
}

Saver::~Saver() {
  if (worker_.joinable()) worker_.join();
  if (job_ && coord_.rank() == 0 && !job_->ok)
    spdlog::warn("checkpoint step {} was not committed: {}", job_->event.step, job_->event.error);
}

void Saver::record(const SaveEvent& e) {
  std::lock_guard<std::mutex> lock(events_mutex_);
  events_.push_back(e);
}

std::vector<SaveEvent> Saver::take_events() {
  std::lock_guard<std::mutex> lock(events_mutex_);
  return std::exchange(events_, {});
}

Json Saver::exchange(const Json& mine, const std::function<Json(const std::vector<Json>&)>& decide) {
  const auto gathered = coord_.gather(mine.dump());
  std::string reply_text;
  if (coord_.rank() == 0) {
    Json reply;
    try {
      std::vector<Json> all;
      for (const auto& s : gathered) all.push_back(Json::parse(s));
      reply = decide(all);
    } catch (const Error& e) {
      reply = Json{{"error", e.what()}, {"code", static_cast<int>(e.code())}};
    } catch (const std::exception& e) {
      reply = Json{{"error", e.what()}, {"code", static_cast<int>(ExitCode::kFailure)}};
    }
    reply_text = reply.dump();
  }
  Json reply = Json::parse(coord_.broadcast(reply_text));
  if (reply.contains("error")) throw Error(static_cast<ExitCode>(reply["code"].get<int>()), reply["error"]);
  return reply;
}

Json Saver::local_state() const {
  return Json{{"busy", busy_.load()}, {"failed", job_ && !busy_.load() && !job_->ok}};
}

Json Saver::finish_job_rank0(const std::vector<Json>& states) {
  for (const auto& s : states)
    if (s.value("failed", false)) abort_ = true;
  if (worker_.joinable()) worker_.join();
  Job& job = *job_;
  job.event.outcome = job.ok ? Outcome::kCommitted : Outcome::kFailed;
  failures_ = job.ok ? 0 : failures_ + 1;
  if (!job.ok) last_error_ = job.event.error;
  return Json{{"outcome", outcome_name(job.event.outcome)},
              {"write_s", job.event.write_s},
              {"bytes", job.event.bytes},
              {"path", job.event.path},
              {"error", job.event.error}};
}

std::optional<SaveEvent> Saver::apply_outcome(const Json& reply) {
  failures_ = reply.value("failures", failures_);
  last_error_ = reply.value("last_error", last_error_);
  if (!reply.contains("prev")) return std::nullopt;
  if (worker_.joinable()) worker_.join();
  const Json& p = reply["prev"];
  SaveEvent e = job_->event;
  e.outcome = p["outcome"] == "committed" ? Outcome::kCommitted : Outcome::kFailed;
  e.write_s = p["write_s"].get<double>();
  e.bytes = p["bytes"].get<uint64_t>();
  e.path = p["path"].get<std::string>();
  e.error = p["error"].get<std::string>();
  job_.reset();
  if (e.outcome == Outcome::kFailed)
    spdlog::warn("checkpoint save of step {} ({}) failed, training goes on from the previous checkpoint: {}",
                 e.step, tier_name(e.tier), e.error);
  record(e);
  return e;
}

SaveEvent Saver::save_async(Tier tier, const CheckpointMeta& meta, const std::vector<TensorData>& tensors) {
  const auto t0 = std::chrono::steady_clock::now();
  const int rank = coord_.rank();
  Json mine = local_state();
  std::vector<Slice> slices;
  try {
    for (const auto& t : tensors) {
      slices.push_back(t.slice.normalized());
      if (!t.data && slices.back().elements() > 0)
        fail(ExitCode::kUsage, "tensor '{}': no data pointer", t.slice.name);
    }
  } catch (const Error& e) {
    mine["error"] = e.what();  // reported by rank 0 to every rank, so all fail together
  }
  Json geom = Json::array();
  for (const auto& s : slices) geom.push_back(s.to_json());
  const std::string geom_hash = xxh3_64_hex(geom.dump());
  mine["geom_hash"] = geom_hash;
  if (geom_hash != sent_geometry_) mine["geom"] = geom;
  sent_geometry_ = geom_hash;

  detail::SavePlan plan;
  std::optional<DirLock> staging_lock;
  const Json reply = exchange(mine, [&](const std::vector<Json>& all) {
    bool any_busy = false;
    for (size_t r = 0; r < all.size(); ++r) {
      if (all[r].contains("error"))
        fail(ExitCode::kUsage, "rank {}: {}", r, all[r]["error"].get<std::string>());
      if (all[r].contains("geom")) {
        geometry_[r].clear();
        for (const auto& j : all[r]["geom"]) geometry_[r].push_back(Slice::from_json(j));
        geometry_hash_[r] = all[r]["geom_hash"];
      } else if (geometry_hash_[r] != all[r]["geom_hash"]) {
        fail(ExitCode::kFailure, "rank {} sent a geometry hash rank 0 does not know", r);
      }
      any_busy = any_busy || all[r]["busy"].get<bool>();
    }
    Json out;
    if (any_busy && options_.policy == AsyncPolicy::kSkip) return Json{{"action", "skip"}};
    plan = detail::make_plan(geometry_);  // before finishing the previous save: an error here changes nothing
    if (job_) out["prev"] = finish_job_rank0(all);
    out["action"] = "save";
    try {
      const std::string tdir = tier_dir(options_.run_dir, tier);
      std::error_code ec;
      fs::create_directories(tdir, ec);
      if (ec) fail(ExitCode::kIo, "cannot create checkpoint directory '{}': {}", tdir, ec.message());
      const std::string staging =
          (fs::path(tdir) / fmt::format(".step-{:08d}.partial-{}", meta.step, detail::random_nonce()))
              .string();
      if (!fs::create_directory(staging, ec) || ec)
        fail(ExitCode::kIo, "cannot create checkpoint directory '{}': {}", staging, ec.message());
      staging_lock = DirLock::try_exclusive(staging);
      out["staging"] = staging;
    } catch (const Error& e) {
      failures_ += 1;
      last_error_ = e.what();
      out["action"] = "failed";
      out["error_text"] = e.what();
    }
    Json skip = Json::object();
    for (size_t r = 0; r < plan.owned.size(); ++r) {
      Json list = Json::array();
      for (size_t i = 0; i < plan.owned[r].size(); ++i)
        if (!plan.owned[r][i]) list.push_back(i);
      if (!list.empty()) skip[std::to_string(r)] = list;
    }
    out["skip"] = skip;
    uint64_t total = 0;
    for (uint64_t b : plan.file_bytes) total += b;
    out["bytes"] = total;
    out["failures"] = failures_;
    out["last_error"] = last_error_;
    return out;
  });
  apply_outcome(reply);

  SaveEvent event;
  event.step = meta.step;
  event.tier = tier;
  const std::string action = reply["action"];
  if (failures_ >= options_.max_consecutive_failures)
    fail(ExitCode::kIo,
         "{} checkpoint saves in a row failed (last: {}); stopping: resume from the newest valid "
         "checkpoint once the cause is fixed",
         failures_, last_error_);
  if (action == "skip") {
    event.outcome = Outcome::kSkipped;
    event.stall_s = seconds_since(t0);
    record(event);
    return event;
  }
  if (action == "failed") {
    event.outcome = Outcome::kFailed;
    event.error = reply["error_text"];
    event.stall_s = seconds_since(t0);
    spdlog::warn("checkpoint save of step {} failed, training goes on from the previous checkpoint: {}",
                 meta.step, event.error);
    record(event);
    return event;
  }

  if (worker_.joinable()) worker_.join();  // the buffer is ours again
  job_.reset();
  std::vector<char> owned(slices.size(), 1);
  if (reply["skip"].contains(std::to_string(rank)))
    for (const auto& i : reply["skip"][std::to_string(rank)]) owned[i.get<size_t>()] = 0;
  std::vector<uint64_t> at;
  const uint64_t my_bytes = detail::part_layout(slices, owned, &at);
  const auto tc = std::chrono::steady_clock::now();
  if (my_bytes > capacity_) {
    buffer_.reset();
    buffer_ = options_.allocate_snapshot
                  ? options_.allocate_snapshot(my_bytes)
                  : std::shared_ptr<char>(new char[my_bytes], std::default_delete<char[]>());
    capacity_ = my_bytes;
  }
  uint64_t pos = 0;
  for (size_t i = 0; i < slices.size() && my_bytes > 0; ++i) {
    if (!owned[i] || slices[i].bytes() == 0) continue;
    std::memset(buffer_.get() + pos, 0, at[i] - pos);  // padding: the file's bytes are all defined
    if (options_.read_piece)
      options_.read_piece(buffer_.get() + at[i], tensors[i].data, slices[i].bytes());
    else
      std::memcpy(buffer_.get() + at[i], tensors[i].data, slices[i].bytes());
    pos = at[i] + slices[i].bytes();
  }
  if (my_bytes > pos) std::memset(buffer_.get() + pos, 0, my_bytes - pos);

  auto job = std::make_unique<Job>();
  job->event = event;
  job->event.copy_s = seconds_since(tc);
  job->event.bytes = reply["bytes"].get<uint64_t>();
  job->staging = reply["staging"];
  job->final_dir = checkpoint_dir(options_.run_dir, tier, meta.step);
  job->event.path = job->final_dir;
  job->my_bytes = my_bytes;
  if (rank == 0) {
    job->staging_lock = std::move(staging_lock);
    job->meta = meta;
    job->plan = std::move(plan);
  }
  job->event.stall_s = seconds_since(t0);
  job_ = std::move(job);
  abort_ = false;
  busy_ = true;
  worker_ = std::thread([this] { run_job(*job_); });
  return job_->event;
}

std::optional<SaveEvent> Saver::wait() {
  const Json reply = exchange(local_state(), [&](const std::vector<Json>& all) {
    Json out;
    if (job_) out["prev"] = finish_job_rank0(all);
    out["failures"] = failures_;
    out["last_error"] = last_error_;
    return out;
  });
  auto e = apply_outcome(reply);
  if (failures_ >= options_.max_consecutive_failures)
    fail(ExitCode::kIo,
         "{} checkpoint saves in a row failed (last: {}); stopping: resume from the newest valid "
         "checkpoint once the cause is fixed",
         failures_, last_error_);
  return e;
}

SaveEvent Saver::save(Tier tier, const CheckpointMeta& meta, const std::vector<TensorData>& tensors) {
  SaveEvent started = save_async(tier, meta, tensors);
  if (started.outcome != Outcome::kPending) return started;
  auto done = wait();
  done->stall_s = started.stall_s;
  return *done;
}

void Saver::run_job(Job& job) {
  const auto t0 = std::chrono::steady_clock::now();
  const int rank = coord_.rank();
  try {
    std::string own_xxh3;
    if (job.my_bytes > 0) {
      const std::string path = (fs::path(job.staging) / detail::part_file_name(rank)).string();
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) fail(ExitCode::kIo, "cannot write '{}' (open failed: {})", path, std::strerror(errno));
      try {
        Xxh3Stream h;
        for (uint64_t off = 0; off < job.my_bytes; off += kWriteChunk) {
          const size_t n = std::min<uint64_t>(kWriteChunk, job.my_bytes - off);
          h.update(buffer_.get() + off, n);
          detail::write_all(fd, buffer_.get() + off, n, path);
        }
        detail::fsync_or_throw(fd, path);
        own_xxh3 = h.hex();
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
    }
    if (rank == 0) {
      commit(job, own_xxh3);
    } else {
      write_json_atomic((fs::path(job.staging) / done_marker(rank)).string(),
                        Json{{"bytes", job.my_bytes}, {"xxh3", own_xxh3}});
    }
    job.ok = true;
  } catch (const std::exception& e) {
    job.event.error = e.what();
    if (rank == 0) {
      job.staging_lock.reset();
      detail::remove_tree(job.staging);
    } else {
      try {
        write_file_atomic((fs::path(job.staging) / failed_marker(rank)).string(), e.what());
      } catch (const std::exception&) {
        // Rank 0 then waits for this part until commit_timeout_s and fails the save itself.
      }
    }
  }
  job.event.write_s = seconds_since(t0);
  busy_ = false;
}

void Saver::commit(Job& job, const std::string& own_xxh3) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path staging(job.staging);
  Manifest m;
  if (job.my_bytes > 0) m.files[detail::part_file_name(0)] = FileEntry{job.my_bytes, own_xxh3};
  for (int r = 1; r < coord_.size(); ++r) {
    if (job.plan.file_bytes[r] == 0) continue;
    const fs::path done = staging / done_marker(r), failed = staging / failed_marker(r);
    auto sleep = std::chrono::microseconds(500);
    while (!fs::exists(done)) {
      if (fs::exists(failed))
        fail(ExitCode::kIo, "rank {} could not write its part: {}", r, read_file(failed.string()));
      if (abort_) fail(ExitCode::kIo, "rank {} reported a failed write", r);
      if (seconds_since(t0) > options_.commit_timeout_s)
        fail(ExitCode::kIo, "rank {}'s part did not arrive within {} s", r, options_.commit_timeout_s);
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(50000));
    }
    const Json d = read_json(done.string());
    if (d["bytes"].get<uint64_t>() != job.plan.file_bytes[r])
      fail(ExitCode::kIo, "rank {} wrote {} bytes, the plan says {}", r, d["bytes"].get<uint64_t>(),
           job.plan.file_bytes[r]);
    m.files[detail::part_file_name(r)] = FileEntry{job.plan.file_bytes[r], d["xxh3"].get<std::string>()};
    fs::remove(done);
  }
  const std::string index = detail::index_to_json(job.plan.tensors).dump() + "\n";
  m.files[kIndexFile] =
      FileEntry{index.size(), detail::write_new_file((staging / kIndexFile).string(), index)};
  if (!job.meta.verification_bytes.empty())
    m.files[kVerifyBatchFile] =
        FileEntry{job.meta.verification_bytes.size(),
                  detail::write_new_file((staging / kVerifyBatchFile).string(), job.meta.verification_bytes)};
  m.tier = std::string(tier_name(job.event.tier));
  m.meta = job.meta;
  m.meta.verification_bytes.clear();
  m.world_size = coord_.size();
  m.created_unix = detail::now_unix();
  m.stall_s = job.event.stall_s;
  m.write_s = seconds_since(t0);
  const std::string manifest = m.to_json().dump(2) + "\n";
  write_file_atomic((staging / kManifestFile).string(), manifest);
  detail::write_new_file((staging / kCommittedFile).string(), detail::committed_text(xxh3_64_hex(manifest)));
  fsync_dir(job.staging);
  detail::publish_dir(job.staging, job.final_dir);
  committed_step_.store(job.meta.step);
  job.staging_lock.reset();
  try {
    for (const auto& gone :
         apply_retention(options_.run_dir, options_.recovery_keep, CkptRef{job.event.tier, job.meta.step}))
      spdlog::info("retention removed {}", gone);
  } catch (const std::exception& e) {
    spdlog::warn("retention after checkpoint step {} failed: {}", job.meta.step, e.what());
  }
}

}  // namespace forge::ckpt
