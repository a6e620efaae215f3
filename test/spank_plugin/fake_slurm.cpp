#include "fake_slurm.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace fake {

Host& host() {
  static Host h;
  return h;
}

void reset(spank_context_t context) {
  Host& h = host();
  const auto options = h.options;
  h = Host{};
  h.options = options;  // registered once per load, like Slurm
  h.context = context;
}

namespace {
void record(std::vector<std::string>& sink, const char* format, va_list ap) {
  char buf[16384];
  vsnprintf(buf, sizeof buf, format, ap);
  sink.emplace_back(buf);
  host().formats.emplace_back(format);
}
slurm_job_info_t g_job;
job_info_msg_t g_msg;
}  // namespace

}  // namespace fake

extern "C" {

spank_context_t spank_context(void) {
  return fake::host().context;
}

spank_err_t spank_option_register(spank_t, struct spank_option* opt) {
  fake::host().options.push_back(*opt);
  return static_cast<spank_err_t>(ESPANK_SUCCESS);
}

void slurm_error(const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  fake::record(fake::host().errors, format, ap);
  va_end(ap);
}

void slurm_info(const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  fake::record(fake::host().infos, format, ap);
  va_end(ap);
}

spank_err_t spank_job_control_setenv(spank_t, const char* name, const char* value, int) {
  fake::host().control_env[name] = value;
  return static_cast<spank_err_t>(ESPANK_SUCCESS);
}

spank_err_t spank_setenv(spank_t, const char* name, const char* value, int) {
  fake::host().job_env[name] = value;
  return static_cast<spank_err_t>(ESPANK_SUCCESS);
}

spank_err_t spank_getenv(spank_t, const char* name, char* buf, int len) {
  const auto& env = fake::host().job_env;
  const auto it = env.find(name);
  if (it == env.end()) return static_cast<spank_err_t>(ESPANK_ENV_NOEXIST);
  if (static_cast<int>(it->second.size()) >= len) return static_cast<spank_err_t>(ESPANK_NOSPACE);
  std::snprintf(buf, static_cast<size_t>(len), "%s", it->second.c_str());
  return static_cast<spank_err_t>(ESPANK_SUCCESS);
}

spank_err_t spank_get_item(spank_t, spank_item_t item, ...) {
  va_list ap;
  va_start(ap, item);
  spank_err_t rc = static_cast<spank_err_t>(ESPANK_SUCCESS);
  switch (item) {
    case S_JOB_ID:
      *va_arg(ap, uint32_t*) = fake::host().job_id;
      break;
    case S_JOB_UID:
      *va_arg(ap, uid_t*) = fake::host().uid;
      break;
    case S_JOB_GID:
      *va_arg(ap, gid_t*) = fake::host().gid;
      break;
    default:
      rc = static_cast<spank_err_t>(ESPANK_BAD_ARG);
  }
  va_end(ap);
  return rc;
}

int slurm_load_job(job_info_msg_t** resp, uint32_t, uint16_t) {
  const fake::Host& h = fake::host();
  if (!h.job_loads) return SLURM_ERROR;
  std::memset(&fake::g_job, 0, sizeof fake::g_job);
  fake::g_job.num_nodes = h.num_nodes;
  fake::g_job.req_switch = h.req_switch;
  fake::g_job.time_limit = h.time_limit;
  fake::g_job.tres_alloc_str = const_cast<char*>(h.tres.c_str());
  fake::g_job.qos = const_cast<char*>(h.qos.c_str());
  fake::g_job.account = const_cast<char*>(h.account.c_str());
  fake::g_job.admin_comment = h.admin_comment.empty() ? nullptr : const_cast<char*>(h.admin_comment.c_str());
  fake::g_msg.record_count = 1;
  fake::g_msg.job_array = &fake::g_job;
  *resp = &fake::g_msg;
  return SLURM_SUCCESS;
}

void slurm_free_job_info_msg(job_info_msg_t*) {}
int slurm_get_errno(void) {
  return 0;
}
char* slurm_strerror(int) {
  return const_cast<char*>("Unable to contact slurm controller");
}

}  // extern "C"
