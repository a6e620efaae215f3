#include "train_run.h"

#include "checkpointing.h"
#include "data_source.h"
#include "failure_record.h"
#include "forge/common/activity.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/json.h"
#include "forge/common/local_rank.h"
#include "forge/common/text.h"
#include "forge/common/trace.h"
#include "forge/trainer/device_runtime.h"
#include "forge/trainer/guard.h"
#include "forge/trainer/metrics.h"
#include "forge/trainer/parallel.h"
#include "forge/trainer/runtime.h"
#include "forge/trainer/staged_comm.h"
#include "forge/trainer/watchdog.h"
#include "job_gauges.h"
#include "plan.h"
#include "spec_check.h"
#include "teacher.h"
#include "tensorboard_log.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <bit>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <tuple>
#include <vector>

namespace forge::launcher {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Start-up time is measured from here (static initialisation, before main).
const Clock::time_point g_process_start = Clock::now();

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// SIGUSR1 (Slurm's --signal=B:USR1@N, forwarded by the batch script, or preemption) and SIGTERM ask the
// run to finish its step, save a recovery checkpoint and exit 75 so the job is requeued.
volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int signal) {
  g_stop_signal = signal;
}

struct Totals {
  int64_t steps = 0, tokens = 0;
  int64_t steps_run = 0;  // steps computed by this process (the MFU mean is over these)
  double mfu_sum = 0, last_loss = 0;
  double startup_s = 0, train_s = 0, bookkeeping_s = 0;
  int64_t skipped = 0, rewinds = 0, spikes = 0;
  // Samples this process trained per dataset domain (RunInfo::domains), over the data-parallel group.
  std::vector<int64_t> domain_samples;
  // What ending now would lose: the work after this process's newest committed checkpoint.
  double committed_at_s = -1;  // seconds since process start when its step ended; -1: none yet
  double kept_train_s = 0;     // step time of the steps that checkpoint holds
  // Checkpoints saved and not yet known to be on disk: step -> {train_s, seconds since process start} when
  // that step ended.
  std::map<int64_t, std::pair<double, double>> saved;

  // The saver has committed the checkpoints up to `step` (rank 0 learns it from its background write, the
  // moment it happens): the newest of them is what a failure from now on keeps.
  void committed_up_to(int64_t step) {
    const auto end = saved.upper_bound(step);
    if (end == saved.begin()) return;
    std::tie(kept_train_s, committed_at_s) = std::prev(end)->second;
    saved.erase(saved.begin(), end);
  }
};

struct RunInfo {
  const trainer::TrainSpec& spec;
  const comm::ProcessGroups& groups;
  const Config& config;
  double peak = 0, fpt = 0;
  Clock::time_point start;
  int64_t resumed_from = 0;          // the checkpoint step this process started from (0: fresh)
  std::vector<std::string> domains;  // the dataset's (MicroBatch::domains index them); empty: synthetic
  Json cache;                        // the node-local cache's work at open, summed over the ranks; null: none
  size_t peak_device_bytes = 0;      // the most device memory in use after a step (GPU runs)
};

// The traced steps' timelines: every rank writes its own, then rank 0 puts them on one timeline. A trace
// that cannot be written costs a warning, never the run.
void finish_trace(const comm::ProcessGroups& groups, const std::string& dir, const trainer::TraceSteps& w) {
  const std::string label = fmt::format("rank {} (tp {} dp {} pp {}) {}", groups.rank, groups.tp_rank,
                                        groups.dp_rank, groups.pp_rank, host_name());
  double failed = 0;
  try {
    Trace::stop_and_write(dir, groups.rank, label);
  } catch (const Error& e) {
    spdlog::warn("trace not written: {}", e.what());
    failed = 1;
  }
  // Also the barrier before rank 0 reads every rank's file.
  if (groups.world->all_reduce_sum(failed) > 0 || groups.rank != 0) return;
  try {
    const int ranks = merge_traces(dir);
    spdlog::info(
        "trace of steps {}-{}: {}/merged.json ({} ranks; open it in ui.perfetto.dev or chrome://tracing)",
        w.first, w.last, dir, ranks);
  } catch (const Error& e) {
    spdlog::warn("trace not merged: {}", e.what());
  }
}

// {domain: samples}: what the data actually delivered, to set against data.domain_weights.
Json domain_counts(const std::vector<std::string>& names, const std::vector<int64_t>& counts) {
  Json out = Json::object();
  for (size_t i = 0; i < names.size(); ++i) out[names[i]] = i < counts.size() ? counts[i] : 0;
  return out;
}

// The samples of each domain in this step's micro-batches, over the data-parallel group (every rank reads
// its group's slice; the tensor and pipeline peers of a slice read the same rows and are not added).
std::vector<int64_t> step_domain_samples(comm::ProcessGroups& g, std::span<const MicroBatch> batches,
                                         size_t domains) {
  std::vector<double> counts(domains, 0.0);
  for (const MicroBatch& b : batches)
    for (const uint16_t d : b.domains)
      if (d < domains) counts[d] += 1;
  g.dp->all_reduce(counts.data(), counts.size(), comm::CommType::kF64, comm::ReduceOp::kSum)->wait();
  return {counts.begin(), counts.end()};
}

// The node-local cache's work at open, over every rank of the job: counts summed, staging time the
// slowest rank's (every rank waits for its node's staging before the first step). Null without a cache.
Json job_cache_stats(comm::ProcessGroups& g, const trainer::TrainSpec& spec, const DataSource& data) {
  if (spec.cache_dir.empty() || data.version().empty()) return nullptr;
  const data::CacheStats mine = data.cache_stats();
  double sums[4] = {double(mine.hits), double(mine.misses), double(mine.fallbacks),
                    double(mine.bytes_staged)};
  double slowest = mine.staging_s;
  g.world->all_reduce(sums, 4, comm::CommType::kF64, comm::ReduceOp::kSum)->wait();
  g.world->all_reduce(&slowest, 1, comm::CommType::kF64, comm::ReduceOp::kMax)->wait();
  return {{"dir", spec.cache_dir},         {"hits", int64_t(sums[0])},         {"misses", int64_t(sums[1])},
          {"fallbacks", int64_t(sums[2])}, {"bytes_staged", int64_t(sums[3])}, {"staging_s", slowest}};
}

// Rank 0 writes the run's summary; the other ranks' view is in their metrics.
void write_summary(const RunInfo& run, const Totals& t, ExitCode code) {
  if (run.groups.rank != 0) return;
  const char* job = std::getenv("SLURM_JOB_ID");
  const double wall_s = seconds_since(run.start);
  // This process is one segment of the run (a requeue starts the next): what it cost and what it kept,
  // for the cost report's waste and ETTR (docs/ADMISSION.md, "Waste").
  const double process_s = seconds_since(g_process_start);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const bool done = code == ExitCode::kOk;
  Json segment{{"job_id", job != nullptr ? Json(job) : Json(nullptr)},
               {"resumed_from", run.resumed_from},
               {"last_step", t.steps},
               {"layout", run.groups.layout.str()},
               {"ranks", run.groups.layout.world()},
               {"start", now - process_s},
               {"end", now},
               {"startup_s", t.startup_s},
               {"train_s", t.train_s},
               {"kept_train_s", done ? t.train_s : t.kept_train_s},
               {"lost_s", done ? 0.0 : process_s - std::max(0.0, t.committed_at_s)},
               {"exit_class", std::string(exit_class_name(code))}};
  const std::string path = (fs::path(run.spec.dir) / "summary.json").string();
  Json segments = Json::array();
  std::error_code ec;
  if (fs::exists(path, ec)) {
    try {
      const Json previous = read_json(path);
      if (previous.contains("segments") && previous.at("segments").is_array())
        segments = previous.at("segments");
    } catch (const std::exception&) {
      // A damaged summary loses the earlier segments' detail only; the cost report falls back to sacct.
    }
  }
  segments.push_back(std::move(segment));
  const trainer::ParameterCounts params = trainer::parameter_counts(run.spec.model);
  Json s{{"name", run.spec.name},
         {"job_id", job != nullptr ? Json(job) : Json(nullptr)},
         {"spec_hash", run.config.hash()},
         {"steps", t.steps},
         {"tokens", t.tokens},
         {"wall_s", wall_s},
         {"mean_mfu", t.steps_run > 0 ? t.mfu_sum / double(t.steps_run) : 0.0},
         {"tokens_per_s", wall_s > 0 ? double(t.tokens) / wall_s : 0.0},
         {"final_loss", t.last_loss},
         {"peak_gflops", run.peak},
         {"flops_per_token", run.fpt},
         {"model", trainer::model_description(run.spec.model)},
         {"parameters", {{"total", params.total}, {"active", params.active}}},
         {"threads", run.spec.threads},
         {"layout", run.groups.layout.str()},
         {"ranks", run.groups.layout.world()},
         {"device", std::string(trainer::device_name(run.spec.device))},
         {"peak_device_mib", double(run.peak_device_bytes) / (1 << 20)},
         {"dtype", std::string(trainer::dtype_name(run.spec.dtype))},
         {"startup_s", t.startup_s},
         {"train_s", t.train_s},
         {"bookkeeping_s", t.bookkeeping_s},
         {"guard", {{"skipped_steps", t.skipped}, {"rewinds", t.rewinds}, {"loss_spikes", t.spikes}}},
         {"exit_code", int(code)},
         {"exit_class", std::string(exit_class_name(code))},
         {"segments", std::move(segments)}};
  if (!run.domains.empty()) s["data_domains"] = domain_counts(run.domains, t.domain_samples);
  if (!run.cache.is_null()) s["data_cache"] = run.cache;
  write_json_atomic(path, s);
}

// The process's peak resident memory (host; device memory joins it with the CUDA backend).
double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

std::string metrics_path(const trainer::TrainSpec& spec, int rank) {
  return (fs::path(spec.dir) / "metrics" / fmt::format("rank-{}.jsonl", rank)).string();
}

// What the ranks tell each other after every step, in one exchange: their step times (stragglers are
// judged from them), whether a stop signal reached them (a signal may reach the ranks at different steps:
// they stop together, after the first step any of them saw it), and the samples each trained, as the data
// gave them (dataset-global ids and epochs), so that a reader or split that hands one sample to two
// data-parallel replicas is caught. Every rank reads the same number of samples per step.
struct RankStatus {
  std::vector<double> step_seconds;
  bool stop = false;
};
RankStatus exchange_status(comm::ProcessGroups& g, double seconds, bool stop,
                           std::span<const MicroBatch> batches, int64_t step) {
  std::vector<uint64_t> mine{std::bit_cast<uint64_t>(seconds), stop ? 1u : 0u};
  for (const MicroBatch& b : batches)
    for (size_t r = 0; r < b.sample_ids.size(); ++r)
      mine.push_back(trainer::sample_key(b.sample_ids[r], b.epochs[r]));
  const size_t per_rank = mine.size();
  std::vector<uint64_t> all(per_rank * size_t(g.world->size()));
  g.world->all_gather(mine.data(), all.data(), per_rank * sizeof(uint64_t), comm::CommType::kU8)->wait();
  RankStatus status;
  for (size_t r = 0; r < all.size(); r += per_rank) {
    status.step_seconds.push_back(std::bit_cast<double>(all[r]));
    status.stop = status.stop || all[r + 1] != 0;
  }
  if (g.layout.dp > 1) {
    // The replicas of this rank's place in the other dimensions, one per data-parallel rank.
    std::vector<std::vector<uint64_t>> ids(size_t(g.layout.dp));
    Layout::Coords c = g.layout.coords(g.rank);
    for (c.dp = 0; c.dp < g.layout.dp; ++c.dp) {
      const auto first = all.begin() + int64_t(size_t(g.layout.rank(c)) * per_rank + 2);
      ids[size_t(c.dp)].assign(first, first + int64_t(per_rank - 2));
    }
    trainer::check_no_duplicate_samples(step, ids);
  }
  return status;
}

// The data-parallel replicas must hold bitwise-identical parameters (ZeRO-1 gathers them, plain DP
// applies the same update): compare their checksums.
void compare_replicas(comm::ProcessGroups& g, trainer::GPT& model, int64_t step) {
  trainer::Backend& backend = model.backend();
  const uint64_t mine = backend.host_memory()
                            ? trainer::parameter_checksum(model.weights())
                            : trainer::parameter_checksum(backend.host_copy<float>(model.weights()));
  std::vector<uint64_t> all(size_t(g.layout.dp));
  g.dp->all_gather(&mine, all.data(), sizeof mine, comm::CommType::kU8)->wait();
  trainer::check_replicas(step, all);
}

// MemAvailable of this host, bytes (0 when /proc/meminfo cannot say).
double host_memory_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024.0;
  return 0;
}

// The memory plan against the hosts: the ranks of each host together need their weights, gradients,
// optimizer state and activations. A plan that cannot fit stops every rank at once, before the first step,
// with the numbers and what to change (class oom_host), instead of the kernel's OOM killer mid-run.
void check_memory_plan(comm::ProcessGroups& g, trainer::ParallelTrainer& t, double available_at_start) {
  const double mine[2] = {double(t.parameter_bytes() + t.optimizer_bytes() + t.model().activation_bytes()),
                          available_at_start};
  std::vector<double> all(2 * size_t(g.world->size()));
  g.world->all_gather(mine, all.data(), 2, comm::CommType::kF64)->wait();
  std::map<std::string, std::pair<double, double>> hosts;  // need, available
  for (int r = 0; r < g.world->size(); ++r) {
    auto& [need, available] = hosts[rank_host(r)];
    need += all[2 * size_t(r)];
    available = std::max(available, all[2 * size_t(r) + 1]);
  }
  for (const auto& [host, plan] : hosts) {
    if (plan.second <= 0 || plan.first <= plan.second) continue;
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    throw Error(
        ExitCode::kUsage,
        fmt::format("memory plan: the ranks on {} need {:.1f} GiB (weights, gradients, optimizer "
                    "state, activations; the plan above) but {:.1f} GiB are available; {}",
                    host, plan.first / kGiB, plan.second / kGiB, reaction(FailureClass::kOomHost).advice),
        Fault::kOomHost);
  }
}

// The dev cluster's stand-in for a failing GPU (docs/HEALTH.md): every fake GPU has a health file,
// $FORGE_DEVCLUSTER_DIR/gpu-health/<node>/gpu<i>, that forge-health reads and tests flip. A rank driving
// one that turned bad stops the way a CUDA error would, with class gpu, so the whole recovery chain runs
// without a GPU. Slurm sets no CUDA_VISIBLE_DEVICES for fake devices: rank L of a node drives gpuL, as
// on a node of its own. Empty outside the dev cluster or without GPUs.
std::string fake_gpu_health_file(const comm::Bootstrap& boot) {
  const char* cluster = std::getenv("FORGE_DEVCLUSTER_DIR");
  const char* node = std::getenv("SLURMD_NODENAME");
  if (cluster == nullptr || node == nullptr || std::getenv("SLURM_GPUS_ON_NODE") == nullptr) return {};
  return (fs::path(cluster) / "gpu-health" / node / fmt::format("gpu{}", boot.local_rank)).string();
}

void check_fake_gpu(const std::string& file, int rank) {
  if (file.empty()) return;
  std::ifstream in(file);
  std::string text;
  std::getline(in, text);
  if (text.empty() || text == "ok") return;
  throw Error(ExitCode::kFailure,
              fmt::format("rank {} on {}: GPU error: {} ({})", rank, node_name(), printable(text, 200), file),
              Fault::kGpu);
}

// The device a rank trains on (run.device) and the backend over it.
struct DeviceRun {
  trainer::DeviceRuntime* cuda = nullptr;  // set when the rank trains on a GPU
  std::unique_ptr<trainer::Backend> owned;
  trainer::Backend* backend = &trainer::cpu_backend();
  std::string description = "cpu";
};

// Resolves run.device, parallel.comm and precision.dtype = auto in `spec`, and binds the rank's GPU. auto
// looks for a GPU only where a driver is installed: opening the CUDA plugin costs a process a third of a
// second, and the dev cluster's GPUs are fake (auto trains on CPU there).
DeviceRun open_device(trainer::TrainSpec& spec, int rank) {
  DeviceRun d;
  std::string why = "no NVIDIA driver on this node (/dev/nvidiactl)";
  int gpus = 0;
  if (spec.device == trainer::Device::kCuda ||
      (spec.device == trainer::Device::kAuto && fs::exists("/dev/nvidiactl"))) {
    d.cuda = trainer::cuda_runtime(&why);
    if (d.cuda != nullptr) gpus = d.cuda->visible_devices(&why);
  }
  const bool asked_auto = spec.device == trainer::Device::kAuto;
  trainer::resolve_device(spec, gpus, why);
  if (spec.device != trainer::Device::kCuda) {
    // A node with a driver where auto still trains on CPU says why, once.
    if (asked_auto && fs::exists("/dev/nvidiactl") && rank == 0)
      spdlog::warn("run.device = auto trains on cpu: {}", why);
    d.cuda = nullptr;
    return d;
  }
  d.description = d.cuda->bind(rank, spec.parallel.comm == trainer::CommKind::kMpi);
  d.owned = d.cuda->backend();
  d.backend = d.owned.get();
  return d;
}

// What a rank's model asks of device memory: its stage's plan (plan.h), computed before anything is
// allocated.
std::string device_plan(const trainer::TrainSpec& spec, const comm::ProcessGroups& g, int zero_nodes) {
  const StagePlan st = make_plan(spec, zero_nodes).stages.at(size_t(g.pp_rank));
  const double gib = 1024.0 * 1024.0 * 1024.0;
  return fmt::format(
      "{:.0f} parameters held (weights and gradients {:.2f} GiB, AdamW moments {:.2f} GiB), activations "
      "{:.2f} GiB for data.batch = {} x {} positions, {:.2f} GiB in all (forge-train --plan shows every "
      "part)",
      st.held, double(st.weights + st.gradients) / gib, double(st.optimizer) / gib,
      double(st.activations) / gib, spec.batch, spec.model.seq_len, double(st.total()) / gib);
}

// The communicator the process groups are split from: NCCL over GPU memory, or MPI, which moves host
// memory (staged through it on a GPU: parallel.comm = mpi).
std::unique_ptr<comm::Comm> group_world(std::unique_ptr<comm::Comm> mpi, DeviceRun& d,
                                        const trainer::TrainSpec& spec) {
  if (d.cuda == nullptr) return mpi;
  if (spec.parallel.comm == trainer::CommKind::kNccl)
    return trainer::staged_comm(d.cuda->nccl(*mpi), *d.backend, trainer::CommMemory::kDevice);
  return trainer::staged_comm(std::move(mpi), *d.backend, trainer::CommMemory::kHost);
}

// One rank's run: set up by the constructor (every check that can reject the spec or the data runs before
// the model's memory is allocated; then the process groups, the trainer, the resume), trained by run(),
// one step after another, each ending in one metrics record.
class TrainingRun {
 public:
  TrainingRun(const Config& config, trainer::TrainSpec spec, bool force_new, const comm::Bootstrap& boot,
              std::unique_ptr<comm::Comm> world, double memory_available);
  // Trains to spec.steps; returns the exit code (failures are thrown after summary.json is written).
  int run();

 private:
  // What one step cost beside its computation (the record's data and checkpoint fields).
  struct StepCosts {
    double data_s = 0;
    uint64_t data_bytes = 0;
    double checkpoint_stall_s = 0;
  };
  // Writes the step's metrics record (file, TensorBoard, gauges, rank 0's progress line): the step's
  // figures, its costs, the checkpoint and guard events, the stragglers and replica checks of the ranks'
  // status exchange. Throws (exit 74) when a checkpoint failed. Returns whether a rank got a stop signal.
  bool record_step(const StepCosts& costs, int64_t tokens_so_far, bool first_record);
  void take_checkpoint_events(Json& rec);
  void take_guard_events(Json& rec);
  void publish();
  // A signal asked the job to stop after this step: a recovery checkpoint, the summary, exit 75.
  [[noreturn]] void stop_preempted(int64_t tokens_so_far);
  // The metrics file from the checkpoint of `step` on (a resume, a rewind); a record it restored in place
  // of the step's lost one goes to TensorBoard too.
  void open_metrics(int64_t step);
  void on_hang(const trainer::Hang& hang);

  const Config& config_;
  const std::string spec_hash_;
  trainer::TrainSpec spec_;
  int zero_nodes_ = 1;  // the nodes a data-parallel group spans (plan.h)
  DeviceRun device_;
  std::unique_ptr<DataSource> data_;
  comm::ProcessGroups groups_;
  std::unique_ptr<trainer::ParallelPlan> teacher_layers_;  // a distillation teacher's under cp (teacher.h)
  std::optional<RunInfo> info_;
  std::unique_ptr<trainer::ParallelTrainer> trainer_;
  std::string gpu_health_;
  std::optional<RunCheckpoints> checkpoints_;
  int64_t first_step_ = 0;
  std::optional<TensorBoardLog> tensorboard_;
  std::optional<trainer::MetricsWriter> metrics_;
  std::optional<JobGauges> gauges_;

  Totals totals_;
  // The watchdog's snapshot of the totals: it writes summary.json (exit class "comm") while the loop is
  // stuck, so it must not read what the loop is writing.
  std::mutex snapshot_mutex_;
  Totals snapshot_;
  std::optional<trainer::StepGuard> guard_;
  std::optional<trainer::StragglerDetector> stragglers_;
  std::vector<MicroBatch> batches_;
  trainer::StepStats st_;
  bool summary_written_ = false;
};

TrainingRun::TrainingRun(const Config& config, trainer::TrainSpec spec, bool force_new,
                         const comm::Bootstrap& boot, std::unique_ptr<comm::Comm> world,
                         double memory_available)
    : config_(config), spec_hash_(config.hash()), spec_(std::move(spec)) {
  device_ = open_device(spec_, boot.rank);
  // Each rank's node: for failure records that name a peer, and the plan's data-parallel nodes.
  const std::vector<std::string> hosts = comm::gather_node_names(*world, node_name());
  if (int(hosts.size()) == spec_.layout.world()) zero_nodes_ = data_parallel_nodes(spec_.layout, hosts);
  check_memory_cap(make_plan(spec_, zero_nodes_));  // the device resolved: the plan is this run's
  data_ = open_data(config, spec_, spec_.layout.coords(boot.rank).dp, *world, *device_.backend);
  std::optional<trainer::ModelSpec> teacher_config;
  if (trainer::traits(spec_.objective).companion == trainer::Companion::kTeacher)
    teacher_config = check_teacher(config, spec_, data_->tokenizer());
  check_resume_spec(config, spec_.dir, force_new);
  std::error_code ec;
  fs::create_directories(fs::path(spec_.dir) / "metrics", ec);
  if (ec) fail(ExitCode::kIo, "cannot create run directory {}/metrics: {}", spec_.dir, ec.message());

  set_rank_hosts(hosts);
  groups_ = comm::make_groups(group_world(std::move(world), device_, spec_), spec_.layout);
  trainer::use_threads(spec_.threads);
  info_.emplace(RunInfo{spec_, groups_, config, 0, trainer::flops_per_token(spec_.model), Clock::now(), 0,
                        data_->domains(), job_cache_stats(groups_, spec_, *data_)});
  RunInfo& info = *info_;
  if (groups_.rank == 0 && !info.cache.is_null())
    spdlog::info(
        "data cache {}: {} shards read from the cache, {} staged ({:.1f} MB, slowest rank {:.2f} s), {} "
        "read from the shared copy (all ranks)",
        spec_.cache_dir, info.cache["hits"].get<int64_t>(), info.cache["misses"].get<int64_t>(),
        double(info.cache["bytes_staged"].get<int64_t>()) / 1e6, info.cache["staging_s"].get<double>(),
        info.cache["fallbacks"].get<int64_t>());
  // MFU is the job's: its tokens against every rank's peak (rank 0 measures one rank's).
  double peak = spec_.peak_gflops;
  if (peak <= 0 && device_.cuda != nullptr) {
    peak = device_.cuda->peak_bf16_gflops();
    if (peak <= 0 && groups_.rank == 0)
      spdlog::warn("{} is not in the table of BF16 peaks: set run.peak_gflops for MFU", device_.description);
  } else if (peak <= 0) {
    peak = groups_.rank == 0 ? trainer::measure_sgemm_gflops(2048, 2) : 0.0;
    groups_.world->all_reduce(&peak, 1, comm::CommType::kF64, comm::ReduceOp::kMax)->wait();
  }
  info.peak = peak * groups_.layout.world();
  // The teacher runs where the student's classifier is (teacher.h).
  std::shared_ptr<trainer::GPT> teacher;
  if (teacher_config && groups_.last_stage()) {
    if (spec_.layout.cp > 1)
      teacher_layers_ = trainer::ParallelPlan::context_only(*groups_.cp, spec_.parallel.cp_comm);
    teacher = load_teacher(spec_, *teacher_config, *device_.backend, teacher_layers_.get());
  }
  // Out of device memory while the model's buffers are allocated: the error names the allocation; the plan
  // says what the rank needed.
  try {
    trainer_ =
        std::make_unique<trainer::ParallelTrainer>(spec_, groups_, *device_.backend, std::move(teacher));
  } catch (const Error& e) {
    if (e.fault() != Fault::kOomDevice) throw;
    throw Error(e.code(),
                fmt::format("{}; the plan of rank {}: {}", e.what(), groups_.rank,
                            device_plan(spec_, groups_, zero_nodes_)),
                e.fault());
  }
  data_->set_policy(*trainer_);
  const std::string plan = trainer_->describe_plan();
  if (groups_.rank == 0) fmt::print(stderr, "{}", plan);
  if (device_.cuda == nullptr) check_memory_plan(groups_, *trainer_, memory_available);
  gpu_health_ = fake_gpu_health_file(boot);
  checkpoints_.emplace(config, spec_, *trainer_, *data_);
  first_step_ = checkpoints_->resume();
  info.resumed_from = first_step_;
  set_last_finished_step(first_step_);
  tensorboard_.emplace(spec_.dir, groups_.rank, first_step_);
  open_metrics(first_step_);
  gauges_.emplace(groups_);
  spdlog::info(
      "run '{}': {}; steps {}..{} on {}, layout {} ({}), {} {} over {}, {} threads per rank, {} parameters "
      "on this rank, peak {:.0f} GFLOP/s, spec {}",
      spec_.name, trainer::model_description(spec_.model), first_step_ + 1, spec_.steps, data_->describe(),
      groups_.layout.str(), boot.describe(), device_.description, trainer::dtype_name(spec_.dtype),
      trainer::comm_name(spec_.parallel.comm), spec_.threads, trainer_->held_model().weights().size(),
      info.peak, spec_hash_);
  std::signal(SIGUSR1, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

void TrainingRun::open_metrics(int64_t step) {
  metrics_.reset();
  metrics_.emplace(metrics_path(spec_, groups_.rank), step, checkpoints_->loaded_outcome());
  if (!metrics_->restored().is_null()) tensorboard_->write(metrics_->restored());
}

void TrainingRun::publish() {
  std::lock_guard lock(snapshot_mutex_);
  snapshot_ = totals_;
}

void TrainingRun::on_hang(const trainer::Hang& hang) {
  Totals t;
  {
    std::lock_guard lock(snapshot_mutex_);
    t = snapshot_;
  }
  t.committed_up_to(checkpoints_->committed_step());  // a save may have committed since the last step
  try {
    write_summary(*info_, t, ExitCode::kComm);
  } catch (const std::exception&) {
    // The exit code still says what happened.
  }
  // A rank waiting on a peer names that peer when it knows it (send/recv); a rank stuck in its own work
  // (compute, data, a checkpoint) names itself; one waiting in a collective leaves the naming to the
  // stuck rank's own record.
  FailureRecord r{FailureClass::kComm, int(ExitCode::kComm), t.steps, {}, {hang.line}};
  if (hang.peer >= 0)
    r.suspects.push_back({hang.peer, rank_host(hang.peer)});
  else if (!is_communication(hang.what))
    r.suspects.push_back({groups_.rank, node_name()});
  write_failure_record(spec_.dir, JobKey::from_environment(), r, config_.hash());
  trainer::exit_on_hang(hang);
}

void TrainingRun::take_checkpoint_events(Json& rec) {
  totals_.committed_up_to(checkpoints_->committed_step());  // rank 0, as soon as it is on disk
  for (const auto& e : checkpoints_->take_events()) {
    rec["ckpt_events"].push_back(e.to_json());
    if (e.outcome == ckpt::Outcome::kCommitted) totals_.committed_up_to(e.step);  // every rank, later
    // Training on without the checkpoints the schedule promises would waste what a failure costs.
    if (e.outcome == ckpt::Outcome::kFailed)
      fail(ExitCode::kIo,
           "the {} checkpoint of step {} could not be written: {}; free space or fix "
           "permissions under {}/checkpoints, then resubmit (the run resumes from its last checkpoint)",
           ckpt::tier_name(e.tier), e.step, e.error, spec_.dir);
  }
}

void TrainingRun::take_guard_events(Json& rec) {
  trainer::StepGuard& guard = *guard_;
  for (auto& e : guard.take_events()) {
    if (e["kind"] == "loss_spike")
      spdlog::warn("step {}: loss spike {:.4f} (z = {:.1f} over the last {} steps)", st_.step, st_.loss,
                   e["z"].get<double>(), spec_.guard.spike_window);
    else if (e["kind"] == "dead_expert")
      spdlog::warn("step {}: dead expert {}/{}: no token for {} steps (guard.dead_expert_steps)", st_.step,
                   e["layer"].get<int>(), e["expert"].get<int>(), e["idle_steps"].get<int64_t>());
    else if (e["kind"] == "expert_imbalance")
      spdlog::warn(
          "step {}: MoE block {}: the busiest expert gets {:.1f}x the mean (guard.expert_imbalance = {})",
          st_.step, e["layer"].get<int>(), e["max_over_mean"].get<double>(), spec_.guard.expert_imbalance);
    else if (e["kind"] == "nonfinite" && e["action"] == "skip")
      spdlog::warn(
          "step {}: loss {}, gradient norm {}: update skipped ({} in a row, guard.max_bad_steps = {})",
          st_.step, st_.loss, st_.grad_norm, guard.consecutive_bad(), spec_.guard.max_bad_steps);
    rec["guard_events"].push_back(std::move(e));
  }
  totals_.spikes = guard.spikes();
}

bool TrainingRun::record_step(const StepCosts& costs, int64_t tokens_so_far, bool first_record) {
  RunInfo& info = *info_;
  std::vector<int64_t> step_domains;
  if (!info.domains.empty()) {
    step_domains = step_domain_samples(groups_, batches_, info.domains.size());
    for (size_t i = 0; i < step_domains.size(); ++i) totals_.domain_samples[i] += step_domains[i];
  }
  Json rec = trainer::metrics_record(st_, tokens_so_far, info.fpt, info.peak);
  rec["spec_hash"] = spec_hash_;
  rec["data_wait_ms"] = costs.data_s * 1e3;
  rec["data_bytes"] = costs.data_bytes;
  rec["ckpt_stall_ms"] = costs.checkpoint_stall_s * 1e3;
  rec["comm_ms"] = st_.comm_s * 1e3;
  rec["bubble_ms"] = st_.bubble_s * 1e3;
  rec["compute_ms"] = (st_.seconds - st_.comm_s - st_.bubble_s) * 1e3;
  rec["comm_bytes"] = st_.comm_bytes;
  rec["peak_rss_mib"] = peak_rss_mib();
  if (device_.cuda != nullptr) {
    info.peak_device_bytes = std::max(info.peak_device_bytes, device_.backend->device_bytes_in_use());
    rec["device_mem_mib"] = double(info.peak_device_bytes) / (1 << 20);
  }
  if (!step_domains.empty()) rec["data_domains"] = domain_counts(info.domains, step_domains);
  if (Json rollout = data_->step_metrics(); !rollout.is_null()) {
    // The training forward's agreement with the sampler is the rollout's figure, wherever measured (at one
    // update per rollout the loss measures it: GrpoOptions::on_policy).
    for (const char* key : {"logp_diff_mean", "logp_diff_max"})
      if (rec.contains(key)) {
        rollout[key] = rec[key];
        rec.erase(key);
      }
    rec["rollout"] = std::move(rollout);
  }
  // The cache works once, at open: this rank's part goes with the process's first record.
  if (first_record && !info.cache.is_null()) rec["data_cache"] = data_->cache_stats().to_json();
  std::optional<TraceSpan> span(std::in_place, "status exchange", "bookkeeping");
  const RankStatus status = exchange_status(groups_, st_.seconds, g_stop_signal != 0, batches_, st_.step);
  if (groups_.layout.world() > 1) {
    const auto slow = stragglers_->observe(status.step_seconds);
    if (!slow.empty()) {
      rec["stragglers"] = slow;
      if (groups_.rank == 0)
        spdlog::warn("step {}: rank(s) {} slower than the median step time by more than {:.0f}% for {} steps",
                     st_.step, fmt::join(slow, ","), 100 * spec_.guard.straggler_margin,
                     spec_.guard.straggler_steps);
    }
  }
  if (groups_.layout.dp > 1 && trainer::checksum_due(st_.step, spec_.guard.checksum_every)) {
    span.emplace("replica checksums", "bookkeeping");
    compare_replicas(groups_, trainer_->model(), st_.step);
  }
  span.emplace("metrics", "bookkeeping");
  if (!st_.finite) rec["skipped"] = true;
  if (first_record && first_step_ > 0) rec["resumed_from"] = first_step_;
  take_checkpoint_events(rec);
  take_guard_events(rec);
  totals_.mfu_sum += rec["mfu"].get<double>();
  metrics_->write(rec);
  tensorboard_->write(rec);
  const double process_s = seconds_since(g_process_start);
  gauges_->update(rec, {process_s - std::max(0.0, totals_.committed_at_s), totals_.kept_train_s / process_s});
  if (groups_.rank == 0)
    fmt::print(stderr, "step {}/{} loss {:.4f} gnorm {:.3f} lr {:.2e} {:.0f} ms {:.0f} tok/s mfu {:.1f}%{}\n",
               st_.step, spec_.steps, st_.loss, st_.grad_norm, st_.lr, st_.seconds * 1e3,
               rec["tokens_per_s"].get<double>(), 100.0 * rec["mfu"].get<double>(),
               rec.contains("rollout") ? fmt::format(" reward {:.3f} reply {:.0f} tok, generation {:.0f} ms",
                                                     rec["rollout"]["reward"].get<double>(),
                                                     rec["rollout"]["reply_tokens"].get<double>(),
                                                     rec["rollout"]["generation_ms"].get<double>())
                                       : std::string());
  return status.stop;
}

void TrainingRun::stop_preempted(int64_t tokens_so_far) {
  mark_activity("checkpoint");
  checkpoints_->save_now(st_, tokens_so_far, batches_);
  totals_.saved[st_.step] = {totals_.train_s, seconds_since(g_process_start)};
  totals_.committed_up_to(st_.step);  // save_now returns once it is committed
  publish();
  // Ranks the signal did not reach stop because a peer got it (SIGUSR1 from srun or the batch script).
  // The planned path, said once for the job by rank 0, after its summary is written and before any rank
  // leaves: srun --kill-on-bad-exit ends the whole step at the first rank that exits 75.
  write_summary(*info_, totals_, ExitCode::kPreempted);
  summary_written_ = true;
  if (groups_.rank == 0)
    fmt::print(stderr,
               "forge-train: stopped: preempted (signal {}) after step {}: recovery checkpoint saved; the "
               "requeued job resumes from it\n",
               g_stop_signal != 0 ? int(g_stop_signal) : SIGUSR1, st_.step);
  groups_.world->barrier();
  throw Error(ExitCode::kPreempted, "");  // exit 75; the line above said why
}

int TrainingRun::run() {
  totals_.steps = first_step_;
  totals_.domain_samples.assign(info_->domains.size(), 0);
  snapshot_ = totals_;
  guard_.emplace(spec_.guard);
  stragglers_.emplace(spec_.guard.straggler_margin, spec_.guard.straggler_steps);
  mark_activity("start-up");
  trainer::Watchdog watchdog(spec_.guard.watchdog_s, groups_.rank,
                             [this](const trainer::Hang& hang) { on_hang(hang); });
  trainer::ParallelTrainer& trainer = *trainer_;
  trainer::StepGuard& guard = *guard_;
  bool first_record =
      true;  // the process's first record (a resume's is marked, the cache's work goes with it)
  const trainer::TraceSteps tracing = spec_.trace.window(first_step_, spec_.steps);
  const std::string trace_dir =
      (fs::path(spec_.dir) / "trace" / fmt::format("steps-{}-{}", tracing.first, tracing.last)).string();
  totals_.startup_s = seconds_since(g_process_start);
  try {
    for (int64_t step = first_step_; step < spec_.steps; ++step) {
      if (step + 1 == tracing.first) {
        // A window traced before (a resumed run) is replaced whole: its ranks may have been others.
        std::error_code ec;
        if (groups_.rank == 0) fs::remove_all(trace_dir, ec);
        Trace::start();
      }
      TraceSpan step_span("step", "step", int(step + 1));
      const auto t0 = Clock::now();
      mark_activity("data");
      StepCosts costs;
      const uint64_t bytes_before = data_->bytes_read();
      {
        TraceSpan span("data fetch", "data");
        data_->next(step, batches_);
      }
      costs.data_s = seconds_since(t0);
      costs.data_bytes = data_->bytes_read() - bytes_before;
      check_fake_gpu(gpu_health_, groups_.rank);
      if (guard.before_step(step + 1, groups_.rank, batches_)) trainer.inject_nan_once();
      st_ = trainer.step(batches_);
      const auto t1 = Clock::now();
      const trainer::GuardAction action = guard.after_step(st_);  // exit 71 when non-finite steps persist
      totals_.steps_run += 1;
      totals_.train_s += st_.seconds;
      totals_.skipped = guard.skipped();
      totals_.rewinds = guard.rewinds();
      if (action == trainer::GuardAction::kRewind) {
        mark_activity("checkpoint");
        spdlog::warn("step {}: loss {}, gradient norm {}: rewinding to the newest checkpoint", st_.step,
                     st_.loss, st_.grad_norm);
        const int64_t back = checkpoints_->rewind();
        guard.rewound_to(back);
        // The metrics tell one story: records after the checkpoint are trained again.
        tensorboard_->restart(back);
        open_metrics(back);
        totals_.steps = back;
        publish();
        step = back - 1;
        continue;
      }
      totals_.steps = st_.step;
      set_last_finished_step(st_.step);
      totals_.tokens += st_.tokens;
      if (st_.finite) totals_.last_loss = st_.loss;
      const int64_t tokens_so_far = st_.step * st_.tokens;
      mark_activity("checkpoint");
      const auto t2 = Clock::now();
      // A skipped step's weights are those of the step before: not worth a checkpoint of their own.
      if (action == trainer::GuardAction::kApply) {
        TraceSpan span("checkpoint snapshot", "checkpoint");
        checkpoints_->after_step(st_, tokens_so_far, batches_);
      }
      const bool saved = checkpoints_->last_saved_step() == st_.step;
      if (saved)
        totals_.saved[st_.step] = {totals_.train_s,
                                   std::chrono::duration<double>(t1 - g_process_start).count()};
      const auto t3 = Clock::now();
      // What a save held training up: the snapshot and everything around it (the verification batch's
      // forward pass, the ranks agreeing on the plan), not only the copy the saver times.
      costs.checkpoint_stall_s = saved ? std::chrono::duration<double>(t3 - t2).count() : 0.0;
      const bool stop = record_step(costs, tokens_so_far, first_record);
      first_record = false;
      // Bookkeeping: everything in the step that is neither data, compute nor a checkpoint stall.
      totals_.bookkeeping_s += std::chrono::duration<double>(t2 - t1).count() + seconds_since(t3);
      publish();
      if (st_.step == tracing.last) finish_trace(groups_, trace_dir, tracing);
      // (a preemption inside a rollout stops after its last update: a checkpoint holds no rollout)
      if (stop && st_.step < spec_.steps && spec_.rl.between_rollouts(st_.step))
        stop_preempted(tokens_so_far);
    }
    mark_activity("checkpoint");
    if (st_.step > 0) checkpoints_->finish(st_, st_.step * st_.tokens, batches_);
    watchdog.stop();
  } catch (const Error& e) {
    watchdog.stop();
    totals_.committed_up_to(checkpoints_->committed_step());
    if (!summary_written_) write_summary(*info_, totals_, e.code());
    throw;
  }
  write_summary(*info_, totals_, ExitCode::kOk);
  spdlog::info("run '{}' finished: {} steps, {} tokens, final loss {:.4f}, {:.1f} s", spec_.name,
               totals_.steps, totals_.tokens, totals_.last_loss, seconds_since(info_->start));
  return 0;
}

}  // namespace

int train(const Config& config, const trainer::TrainSpec& requested, bool force_new, comm::Bootstrap& boot) {
  // An elastic job may have more ranks than its layout uses (elastic_spec): the rest leave the job's
  // communicator and wait for the others at the exit.
  const double memory_available = host_memory_available();
  const bool idle = boot.rank >= requested.layout.world();
  std::unique_ptr<comm::Comm> world = boot.world->split(idle ? 1 : 0, boot.rank, "world");
  if (idle) {
    spdlog::info("rank {} idle: the elastic layout {} uses {} of the {} ranks started", boot.rank,
                 requested.layout.str(), requested.layout.world(), boot.size);
    return 0;
  }
  TrainingRun run(config, requested, force_new, boot, std::move(world), memory_available);
  return run.run();
}

}  // namespace forge::launcher
