// The processes of one data-parallel job: MPI ranks (docs/scale.md).
//
// `mpirun -np P stillpoint train CONFIG` (or `srun`) starts P processes of
// the same program; each is one rank of the job. The functions here are the
// only place stillpoint talks to MPI, so the rest of the code compiles
// without MPI headers, and a build without MPI (CMake option STILLPOINT_MPI
// off, or no MPI found) is a job of one rank: every collective below then
// returns what one process has.
//
// MPI is started only when a launcher started the process (Open MPI's
// mpirun, or a PMI/PMIx launcher such as srun): a plain `stillpoint train`
// never touches MPI. Collectives must be called by every rank in the same
// order (the trainer's control flow is the same on every rank because every
// decision is taken from values that the ranks have agreed on).
//
// Threads: MPI runs at MPI_THREAD_SERIALIZED, so at any time at most one
// thread of a process calls these functions (the gradient reducer's
// communication thread while a backward pass runs, the main thread
// otherwise; training/gradient_reducer.h hands over between them).
#pragma once

#include <cstddef>
#include <exception>
#include <string>
#include <vector>

namespace stillpoint {

// Starts MPI when a launcher started this process, and installs the
// finalizer run at exit. Call once, first thing in main; harmless when not
// launched by mpirun or srun. Throws Error when MPI fails to start.
void InitializeDistributed(int* argc, char*** argv);

// This process's rank in the job (0 .. WorldSize() - 1) and the number of
// ranks: 0 and 1 without MPI.
int WorldRank();
int WorldSize();
inline bool IsMainRank() { return WorldRank() == 0; }

// Every rank's `mine`, in rank order, on every rank (collective).
std::vector<std::string> AllGatherStrings(const std::string& mine);

// Blocks until every rank has called it (collective).
void Barrier();

// Point-to-point messages of raw bytes between two ranks, matched by `tag`
// (blocking; a message larger than INT_MAX bytes is sent in pieces).
void SendBytes(const void* data, std::size_t bytes, int to, int tag);
void ReceiveBytes(void* data, std::size_t bytes, int from, int tag);
// Copies `bytes` bytes from rank `root` to every rank (collective).
void BroadcastBytes(void* data, std::size_t bytes, int root);
// The same, started without waiting (MPI_Ibcast): `data` must stay put
// until FinishBroadcasts, which waits for every broadcast this thread
// started. Every rank starts its broadcasts in the same order.
void StartBroadcastBytes(void* data, std::size_t bytes, int root);
void FinishBroadcasts();

// Ends every process of the job with `exit_code` (MPI_Abort): for a failure
// that the ranks cannot all learn of at an agreed point. Without MPI the
// process exits with exit_code.
[[noreturn]] void AbortJob(int exit_code);

// The failure that one rank reported and every rank now knows: thrown on
// every rank by AgreeOnFailure, its message naming the rank ("rank 1: ...").
class RankFailure : public std::exception {
 public:
  RankFailure(int rank, std::string message);
  const char* what() const noexcept override { return what_.c_str(); }
  int rank() const { return rank_; }
  const std::string& message() const { return message_; }

 private:
  int rank_;
  std::string message_;
  std::string what_;
};

// Collective: every rank passes its failure message ("" when it has none).
// If some rank failed, throws RankFailure for the lowest such rank on every
// rank; otherwise returns. One process: throws for its own failure.
void AgreeOnFailure(const std::string& failure);

// Collective: the largest of every rank's value (e.g. a stop request).
int AgreeOnMax(int value);

}  // namespace stillpoint
