// TensorBoard event files, written directly: the TFRecord framing (length, masked CRC32C of the length,
// the bytes, masked CRC32C of the bytes) around Event protocol buffers encoded field by field — only the
// fields TensorBoard's scalar and text plugins read (tensorflow/core/util/event.proto, summary.proto).
// No TensorFlow and no protobuf runtime.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace forge::trainer {

uint32_t crc32c(std::string_view bytes);         // Castagnoli; crc32c("123456789") == 0xE3069283
uint32_t masked_crc32c(std::string_view bytes);  // as TFRecord stores it

class EventFileWriter {
 public:
  // Creates `dir` and a new events.out.tfevents.<seconds>.<host>.<pid> in it, opened by the file-version
  // event. Throws std::runtime_error naming the path when it cannot.
  explicit EventFileWriter(const std::string& dir);
  void scalar(std::string_view tag, int64_t step, double value);
  // Shown by TensorBoard's text plugin (markdown).
  void text(std::string_view tag, int64_t step, std::string_view markdown);
  // A SessionLog START at `step`: TensorBoard drops the events of later steps written before it, so a
  // run resumed from a checkpoint shows one curve, not the abandoned steps and their repeat.
  void restart(int64_t step);
  // Throws std::runtime_error when the file could not be written (disk full, removed directory).
  void flush();
  const std::string& path() const { return path_; }

 private:
  void record(int64_t step, std::string_view payload);  // payload: the Event fields after wall time and step

  std::string path_;
  std::ofstream out_;
};

}  // namespace forge::trainer
