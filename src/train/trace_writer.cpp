#include "train/trace_writer.hpp"

#include "core/output_file.hpp"

#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.hpp"

namespace mpiformer {

TraceWriter::TraceWriter(bool enabled, const std::string& path, int rank, int stage, int dp_rank,
                         int tp_rank)
    : rank_(rank),
      origin_(Clock::now()),
      origin_epoch_us_(std::chrono::duration<double, std::micro>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count()) {
  if (!enabled) return;
  file_ = open_output_stream(path, OutputMode::kReplace, "[run] trace");
  // Track names carry the rank, the stage, the replica and the tensor rank.
  std::fprintf(file_,
               "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": "
               "\"rank %d (stage %d, replica %d, tensor rank %d)\"}},\n"
               "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"args\": "
               "{\"sort_index\": %d}}",
               rank, rank, stage, dp_rank, tp_rank, rank, rank);
}

TraceWriter::~TraceWriter() {
  if (file_ == nullptr) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
}

void TraceWriter::span(const char* name, Clock::time_point begin, Clock::time_point end,
                       int64_t step, int micro, int chunk) {
  if (file_ == nullptr) return;
  using us = std::chrono::duration<double, std::micro>;
  std::fprintf(file_,
               ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": 0, \"ts\": %.1f, "
               "\"dur\": %.1f, \"args\": {\"step\": %lld, \"micro_batch\": %d%s}}",
               name, rank_, origin_epoch_us_ + us(begin - origin_).count(),
               us(end - begin).count(), static_cast<long long>(step), micro,
               chunk >= 0 ? (", \"chunk\": " + std::to_string(chunk)).c_str() : "");
}

void TraceWriter::flush() {
  if (file_ != nullptr) std::fflush(file_);
}

}  // namespace mpiformer
