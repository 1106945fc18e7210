#include "training/distributed_training.h"

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "framework/check.h"
#include "training/distributed.h"
#include "training/resume.h"
#include "training/signals.h"

namespace stillpoint {
namespace {

// The numbers a step's exchange carries, as text: doubles in hexadecimal
// (exact), strings with their length in front.
class Packer {
 public:
  Packer& Number(double value) {
    out_ << std::hexfloat << value << ' ';
    return *this;
  }
  Packer& Integer(int64_t value) {
    out_ << value << ' ';
    return *this;
  }
  Packer& Text(const std::string& text) {
    out_ << text.size() << ':' << text;
    return *this;
  }
  Packer& Stats(const SolverStats& s) {
    Number(s.iterations_mean).Number(s.iterations_max).Number(s.residual_max).Number(s.tolerance);
    Integer(s.converged).Integer(s.not_converged).Integer(s.inexact);
    Integer(static_cast<int64_t>(s.status_counts.size()));
    for (const auto& entry : s.status_counts) Text(entry.first).Integer(entry.second);
    return Text(s.brief);
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

class Unpacker {
 public:
  explicit Unpacker(const std::string& text) : in_(text) {}
  double Number() {
    // operator>> does not read hexadecimal floats (libstdc++): strtod does.
    std::string word;
    in_ >> word;
    in_.get();
    return std::strtod(word.c_str(), nullptr);
  }
  int64_t Integer() {
    int64_t value = 0;
    in_ >> value;
    in_.get();
    return value;
  }
  std::string Text() {
    std::size_t size = 0;
    in_ >> size;
    in_.get();  // ':'
    std::string text(size, '\0');
    in_.read(text.data(), static_cast<std::streamsize>(size));
    return text;
  }
  SolverStats Stats() {
    SolverStats s;
    s.iterations_mean = Number();
    s.iterations_max = Number();
    s.residual_max = Number();
    s.tolerance = Number();
    s.converged = Integer();
    s.not_converged = Integer();
    s.inexact = Integer();
    const int64_t statuses = Integer();
    for (int64_t k = 0; k < statuses; ++k) {
      const std::string status = Text();
      s.status_counts[status] = Integer();
    }
    s.brief = Text();
    return s;
  }
  bool ok() const { return !in_.fail(); }

 private:
  std::istringstream in_;
};

// "adjoint_warm_start/3" -> ("adjoint_warm_start/", 3, ""), "2.cell.dropout"
// -> ("", 2, ".cell.dropout"): the shard index inside a per-shard name.
struct IndexedName {
  std::string prefix;
  int64_t index = -1;
  std::string suffix;
};
IndexedName SplitIndex(const std::string& name, const std::string& prefix) {
  IndexedName out;
  if (name.rfind(prefix, 0) != 0) return out;
  std::size_t end = prefix.size();
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == prefix.size()) return out;
  out.prefix = prefix;
  out.index = std::stoll(name.substr(prefix.size(), end - prefix.size()));
  out.suffix = name.substr(end);
  return out;
}
std::string Renumbered(const IndexedName& n, int64_t index) {
  return n.prefix + std::to_string(index) + n.suffix;
}

const char* const kWarmStart = "adjoint_warm_start/";

// STILLPOINT_FAULT (ExchangeStepTotals).
struct InjectedFault {
  int rank = -1;
  int64_t step = -1;
  std::string kind;
};
const InjectedFault& FaultFromEnvironment() {
  static const InjectedFault fault = [] {
    InjectedFault f;
    const char* text = std::getenv("STILLPOINT_FAULT");
    if (text == nullptr) return f;
    char kind[16] = {};
    long long step = -1;
    if (std::sscanf(text, "%d:%lld:%15s", &f.rank, &step, kind) != 3) {
      throw ConfigError(std::string("STILLPOINT_FAULT='") + text +
                        "': expected RANK:STEP:error|nonfinite|kill");
    }
    f.step = step;
    f.kind = kind;
    if (f.kind != "error" && f.kind != "nonfinite" && f.kind != "kill") {
      throw ConfigError("STILLPOINT_FAULT: unknown kind '" + f.kind +
                        "' (error, nonfinite or kill)");
    }
    return f;
  }();
  return fault;
}

// The stop request the ranks last agreed on (jobs of several ranks).
int g_agreed_stop = 0;

}  // namespace

int AgreedStopRequest() { return WorldSize() == 1 ? StopRequested() : g_agreed_stop; }

void OnMainRank(const std::function<void()>& work) {
  if (WorldSize() == 1) return work();
  // "C" for bad input, "E" for another error, "" for none.
  std::string outcome;
  if (IsMainRank()) {
    try {
      work();
    } catch (const ConfigError& e) {
      outcome = std::string("C") + e.what();
    } catch (const std::exception& e) {
      outcome = std::string("E") + e.what();
    }
  }
  const std::string shared = AllGatherStrings(outcome).front();
  if (shared.empty()) return;
  if (shared[0] == 'C') throw ConfigError(shared.substr(1));
  throw Error(shared.substr(1));
}

RankShards RankShardsOf(int64_t shards_per_rank) {
  RankShards out;
  out.count = shards_per_rank;
  out.first = static_cast<int64_t>(WorldRank()) * shards_per_rank;
  out.total = static_cast<int64_t>(WorldSize()) * shards_per_rank;
  return out;
}

StepTotals ExchangeStepTotals(int64_t step, const std::string& failure,
                              const std::vector<double>& shard_losses,
                              std::pair<int64_t, int64_t> correct_counted,
                              const SolverStats& forward, const SolverStats& backward) {
  const InjectedFault& fault = FaultFromEnvironment();
  const bool faulty = fault.rank == WorldRank() && fault.step == step;
  if (faulty && fault.kind == "kill") std::raise(SIGKILL);
  AgreeOnFailure(faulty && fault.kind == "error" ? "injected error (STILLPOINT_FAULT)" : failure);
  Packer packer;
  packer.Integer(StopRequested()).Integer(static_cast<int64_t>(shard_losses.size()));
  for (const double loss : shard_losses) {
    packer.Number(faulty && fault.kind == "nonfinite" ? std::nan("") : loss);
  }
  packer.Integer(correct_counted.first).Integer(correct_counted.second);
  packer.Stats(forward).Stats(backward);
  const std::vector<std::string> all = AllGatherStrings(packer.str());
  StepTotals totals;
  int stop = 0;
  for (std::size_t rank = 0; rank < all.size(); ++rank) {
    Unpacker in(all[rank]);
    stop = std::max(stop, static_cast<int>(in.Integer()));
    const int64_t shards = in.Integer();
    for (int64_t s = 0; s < shards; ++s) {
      const double loss = in.Number();
      if (!std::isfinite(loss) && totals.nonfinite_rank < 0) {
        totals.nonfinite_rank = static_cast<int>(rank);
      }
      // In global shard order: ranks in order, each rank's shards in order.
      totals.loss += loss;
    }
    totals.correct += in.Integer();
    totals.counted += in.Integer();
    const SolverStats rank_forward = in.Stats();
    const SolverStats rank_backward = in.Stats();
    SP_CHECK(in.ok(), "distributed: rank ", rank, " sent an unreadable step summary");
    totals.forward.Merge(rank_forward);
    totals.backward.Merge(rank_backward);
  }
  if (stop != 0 && StopRequested() == 0) SetStopRequested(stop);
  g_agreed_stop = stop;
  return totals;
}

void GatherShardState(const std::vector<SequenceModel*>& models, int64_t first,
                      NamedTensors* solver_state, std::map<std::string, std::string>* streams) {
  CheckpointState mine;
  for (auto& [name, tensor] : WarmStartState(models)) {
    const IndexedName n = SplitIndex(name, kWarmStart);
    mine.solver_state.emplace_back(n.index >= 0 ? Renumbered(n, first + n.index) : name,
                                   std::move(tensor));
  }
  for (const auto& [name, stream] : RandomStreamState(models)) {
    const IndexedName n = SplitIndex(name, "");
    mine.random_streams[n.index >= 0 ? Renumbered(n, first + n.index) : name] = stream;
  }
  if (WorldSize() == 1) {
    *solver_state = std::move(mine.solver_state);
    *streams = std::move(mine.random_streams);
    return;
  }
  // The checkpoint's own encoding carries the tensors and streams.
  const std::vector<std::string> all = AllGatherStrings(SerializeCheckpoint(mine));
  solver_state->clear();
  streams->clear();
  for (std::size_t rank = 0; rank < all.size(); ++rank) {
    CheckpointState theirs =
        DeserializeCheckpoint(all[rank], "the shard state of rank " + std::to_string(rank));
    for (auto& entry : theirs.solver_state) solver_state->push_back(std::move(entry));
    for (auto& entry : theirs.random_streams) streams->insert(std::move(entry));
  }
}

void SelectShardState(const NamedTensors& all_solver_state,
                      const std::map<std::string, std::string>& all_streams, int64_t first,
                      int64_t count, NamedTensors* local_solver_state,
                      std::map<std::string, std::string>* local_streams) {
  // Copies first: the outputs may be the inputs.
  const NamedTensors solver_state = all_solver_state;
  const std::map<std::string, std::string> streams = all_streams;
  local_solver_state->clear();
  local_streams->clear();
  for (const auto& [name, tensor] : solver_state) {
    const IndexedName n = SplitIndex(name, kWarmStart);
    if (n.index < 0) {
      local_solver_state->emplace_back(name, tensor);
    } else if (n.index >= first && n.index < first + count) {
      local_solver_state->emplace_back(Renumbered(n, n.index - first), tensor);
    }
  }
  for (const auto& [name, stream] : streams) {
    const IndexedName n = SplitIndex(name, "");
    if (n.index < 0) {
      (*local_streams)[name] = stream;
    } else if (n.index >= first && n.index < first + count) {
      (*local_streams)[Renumbered(n, n.index - first)] = stream;
    }
  }
}

Config CheckpointConfig(const Config& config, const RankShards& shards) {
  if (shards.total == config.GetInt("train.shards")) return config;
  Config stored = config;
  stored.Set("train.shards=" + std::to_string(shards.total));
  return stored;
}

}  // namespace stillpoint
