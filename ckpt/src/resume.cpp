#include "forge/ckpt/resume.h"

#include "forge/common/error.h"

#include <spdlog/spdlog.h>

namespace forge::ckpt {

bool all_true(Coordinator& coord, bool mine) {
  const auto all = coord.gather(mine ? "1" : "0");
  bool ok = true;
  for (const auto& s : all) ok = ok && s == "1";
  return coord.broadcast(ok ? "1" : "0") == "1";
}

namespace {

// Rank 0's candidates, newest first, as every rank's list.
std::vector<std::string> candidates(Coordinator& coord, const std::string& run_dir) {
  Json list = Json::array();
  if (coord.rank() == 0) {
    std::vector<CkptRef> refs;
    for (const auto& e : list_checkpoints(run_dir)) refs.push_back(CkptRef{e.tier, e.step});
    for (const auto& r : resume_order(refs)) list.push_back(checkpoint_dir(run_dir, r.tier, r.step));
  }
  return Json::parse(coord.broadcast(list.dump())).get<std::vector<std::string>>();
}

}  // namespace

std::optional<Checkpoint> open_for_resume(Coordinator& coord, const std::string& run_dir,
                                          const Expectations& expect) {
  for (const auto& dir : candidates(coord, run_dir)) {
    std::optional<Checkpoint> ckpt;
    std::string problem;
    try {
      ckpt.emplace(Checkpoint::open(dir));
      ckpt->verify(coord.rank(), coord.size());
    } catch (const Error& e) {
      problem = e.what();
    }
    const auto problems = coord.gather(problem);
    Json verdict = Json::object();
    if (coord.rank() == 0) {
      for (size_t r = 0; r < problems.size(); ++r)
        if (!problems[r].empty()) {
          verdict["damaged"] = problems[r];
          break;
        }
      if (!verdict.contains("damaged") && ckpt) {
        try {
          check_expectations(ckpt->manifest(), expect, dir);
        } catch (const Error& e) {
          verdict["error"] = e.what();
          verdict["code"] = static_cast<int>(e.code());
        }
      }
    }
    verdict = Json::parse(coord.broadcast(verdict.dump()));
    if (verdict.contains("error"))
      throw Error(static_cast<ExitCode>(verdict["code"].get<int>()), verdict["error"]);
    if (verdict.contains("damaged")) {
      spdlog::warn("not resuming from {}: {}; falling back to the next older checkpoint", dir,
                   verdict["damaged"].get<std::string>());
      continue;
    }
    spdlog::info("resuming from {} (step {}, loss {})", dir, ckpt->manifest().meta.step,
                 ckpt->manifest().meta.loss);
    return ckpt;
  }
  return std::nullopt;
}

}  // namespace forge::ckpt
