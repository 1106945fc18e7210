#include "layers/energy_context.h"

#include "framework/check.h"

namespace stillpoint {

int64_t ContextBatchSize(const std::vector<ContextEntry>& entries, const std::string& who) {
  int64_t batch = -1;
  for (const ContextEntry& entry : entries) {
    if (!entry.per_sample) continue;
    SP_CHECK(entry.value->rank() >= 1, who, ": per-sample member '", entry.name,
             "' needs a sample axis, got shape ", entry.value->shape());
    SP_CHECK(batch < 0 || entry.value->dim(0) == batch, who, ": per-sample member '", entry.name,
             "' has ", entry.value->dim(0), " samples but the context has ",
             DescribeContextEntries(entries));
    batch = entry.value->dim(0);
  }
  return batch;
}

std::string DescribeContextEntries(const std::vector<ContextEntry>& entries) {
  if (entries.empty()) return "no entries";
  std::string text;
  for (const ContextEntry& entry : entries) {
    if (!text.empty()) text += ", ";
    text += std::string(entry.name) + (entry.per_sample ? " " : " (shared) ") +
            entry.value->shape().ToString();
  }
  return text;
}

bool SelectsEverySample(const std::vector<int64_t>& ids, int64_t batch) {
  if (static_cast<int64_t>(ids.size()) != batch) return false;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

void CheckSampleIds(const std::vector<int64_t>& ids, int64_t batch, const std::string& who) {
  for (int64_t id : ids) {
    SP_CHECK(id >= 0 && id < batch, who, ": sample id ", id, " outside [0, ", batch, ")");
  }
}

const ContextFields<NoContext>& NoContext::Fields() {
  static const auto fields = ContextFields<NoContext>("NoContext");
  return fields;
}

}  // namespace stillpoint
