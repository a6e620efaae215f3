// Tokenizer encode throughput on one core: a text file's lines encoded as documents, as `forge-data
// prepare` encodes them (one EncodeCache per thread), and without a cache (every pre-token through BPE), then
// decode. CPU time of this thread; the file is read first. bench/tokenizer.sh runs it on the Unicode test
// corpus with each Hugging Face fixture tokenizer, next to the Python reference.
//
// usage: bench_tokenizer TOKENIZER TEXT_FILE [--json]
#include "forge/common/error.h"
#include "forge/common/json.h"
#include "forge/dataio/tokenizer.h"

#include <time.h>

#include <cstdio>
#include <string>
#include <vector>

using namespace forge::data;

namespace {

double thread_cpu_s() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  return forge::run_cli("bench_tokenizer", [&] {
    if (argc < 3) forge::fail(forge::ExitCode::kUsage, "usage: bench_tokenizer TOKENIZER TEXT_FILE [--json]");
    const bool json = argc > 3 && std::string(argv[3]) == "--json";
    const Tokenizer tok = Tokenizer::load(argv[1]);
    const std::string text = forge::read_file(argv[2]);
    std::vector<std::string_view> docs;
    for (size_t at = 0; at < text.size();) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      docs.push_back(std::string_view(text).substr(at, end - at));
      at = end + 1;
    }
    const double mb = double(text.size()) / 1e6;
    std::vector<int> ids;
    std::vector<std::vector<int>> encoded(docs.size());

    EncodeCache cache;
    double t = thread_cpu_s();
    uint64_t tokens = 0;
    for (size_t i = 0; i < docs.size(); ++i) {
      tok.encode(docs[i], encoded[i], cache);
      tokens += encoded[i].size();
    }
    const double cached_s = thread_cpu_s() - t;

    t = thread_cpu_s();
    for (const auto d : docs) tok.encode(d, ids);
    const double plain_s = thread_cpu_s() - t;

    t = thread_cpu_s();
    size_t decoded = 0;
    for (const auto& e : encoded) decoded += tok.decode(e).size();
    const double decode_s = thread_cpu_s() - t;

    const double hit_rate = double(cache.hits) / double(std::max<uint64_t>(1, cache.hits + cache.misses));
    if (json) {
      std::printf("%s\n", forge::Json{{"bytes", text.size()},
                                      {"tokens", tokens},
                                      {"encode_cached_mb_per_s", mb / cached_s},
                                      {"encode_uncached_mb_per_s", mb / plain_s},
                                      {"decode_mb_per_s", double(decoded) / 1e6 / decode_s},
                                      {"cache_hit_rate", hit_rate}}
                              .dump()
                              .c_str());
      return 0;
    }
    std::printf("bench_tokenizer: %s, %.1f MB in %zu lines, %llu tokens (%.2f bytes/token), one thread\n",
                argv[1], mb, docs.size(), static_cast<unsigned long long>(tokens),
                double(text.size()) / double(tokens));
    std::printf("  encode with cache     %8.1f MB/s  (%.1f%% of pre-tokens from the cache)\n", mb / cached_s,
                100 * hit_rate);
    std::printf("  encode without cache  %8.1f MB/s\n", mb / plain_s);
    std::printf("  decode                %8.1f MB/s\n", double(decoded) / 1e6 / decode_s);
    return 0;
  });
}
