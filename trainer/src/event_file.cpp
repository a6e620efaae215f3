#include "forge/trainer/event_file.h"

#include "forge/common/local_rank.h"

#include <fmt/format.h>
#include <unistd.h>
#include <boost/crc.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace forge::trainer {

namespace {

// Protocol buffer wire format: a key is (field << 3 | wire type); 0 varint, 1 fixed64, 2 bytes, 5 fixed32.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(v | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

void key(std::string& out, int field, int wire_type) {
  varint(out, uint64_t(field << 3 | wire_type));
}

void bytes_field(std::string& out, int field, std::string_view bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out.append(bytes);
}

template <typename T>
void fixed_field(std::string& out, int field, T value) {  // little-endian, as x86 and ARM store it
  key(out, field, sizeof(T) == 8 ? 1 : 5);
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));
  out.append(raw, sizeof(T));
}

// Event fields (event.proto) and Summary.Value fields (summary.proto).
enum EventField { kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5, kSessionLog = 6 };
enum ValueField { kTag = 1, kSimpleValue = 2, kTensor = 8, kMetadata = 9 };

std::string summary_of(const std::string& value) {
  std::string summary;
  bytes_field(summary, 1, value);  // Summary.value
  std::string event;
  bytes_field(event, kSummary, summary);
  return event;
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t c = crc32c(bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
  path_ =
      (fs::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}", seconds.count(), host_name(), getpid()))
          .string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw std::runtime_error(fmt::format("cannot create {}: {}", path_, std::strerror(errno)));
  std::string version;
  bytes_field(version, kFileVersion, "brain.Event:2");
  record(0, version);
  flush();
}

void EventFileWriter::record(int64_t step, std::string_view payload) {
  const double wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string event;
  fixed_field(event, kWallTime, wall);
  key(event, kStep, 0);
  varint(event, uint64_t(step));
  event.append(payload);
  char length[8];
  const uint64_t n = event.size();
  std::memcpy(length, &n, 8);
  const uint32_t length_crc = masked_crc32c({length, 8}), data_crc = masked_crc32c(event);
  out_.write(length, 8);
  out_.write(reinterpret_cast<const char*>(&length_crc), 4);
  out_.write(event.data(), std::streamsize(event.size()));
  out_.write(reinterpret_cast<const char*>(&data_crc), 4);
}

void EventFileWriter::scalar(std::string_view tag, int64_t step, double value) {
  std::string v;
  bytes_field(v, kTag, tag);
  fixed_field(v, kSimpleValue, float(value));
  record(step, summary_of(v));
}

void EventFileWriter::text(std::string_view tag, int64_t step, std::string_view markdown) {
  std::string plugin, metadata, tensor, v;
  bytes_field(plugin, 1, "text");    // PluginData.plugin_name
  bytes_field(metadata, 1, plugin);  // SummaryMetadata.plugin_data
  key(tensor, 1, 0);                 // TensorProto.dtype = DT_STRING
  varint(tensor, 7);
  bytes_field(tensor, 2, "");        // TensorProto.tensor_shape: a scalar
  bytes_field(tensor, 8, markdown);  // TensorProto.string_val
  bytes_field(v, kTag, tag);
  bytes_field(v, kTensor, tensor);
  bytes_field(v, kMetadata, metadata);
  record(step, summary_of(v));
}

void EventFileWriter::restart(int64_t step) {
  std::string session_log, event;
  key(session_log, 1, 0);  // SessionLog.status = START
  varint(session_log, 1);
  bytes_field(event, kSessionLog, session_log);
  record(step, event);
}

void EventFileWriter::flush() {
  out_.flush();
  if (!out_) throw std::runtime_error(fmt::format("cannot write {}: {}", path_, std::strerror(errno)));
}

}  // namespace forge::trainer
