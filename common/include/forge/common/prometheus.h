// Prometheus' text exposition format, for node_exporter's textfile collector: a file of gauges that the
// collector exports with the node's metrics. Written whole and renamed into place (write_file_atomic), so
// a scrape never sees half a file; the collector reads only names ending in ".prom".
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace forge {

using PromLabels = std::vector<std::pair<std::string, std::string>>;

class PromGauges {
 public:
  // One sample of gauge `name`; HELP and TYPE are written once per name, before its first sample.
  void set(const std::string& name, std::string_view help, const PromLabels& labels, double value);
  std::string text() const;

 private:
  struct Family {
    std::string name, help, samples;
  };
  std::vector<Family> families_;
};

}  // namespace forge
