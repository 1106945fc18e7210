#include "training/distributed.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "framework/check.h"

// STILLPOINT_WITH_MPI is defined for this file alone when the build has MPI
// (CMake option STILLPOINT_MPI); no other file includes mpi.h.
#ifdef STILLPOINT_WITH_MPI
#include <mpi.h>
#endif

namespace stillpoint {

RankFailure::RankFailure(int rank, std::string message)
    : rank_(rank),
      message_(std::move(message)),
      what_("rank " + std::to_string(rank) + ": " + message_) {}

#ifdef STILLPOINT_WITH_MPI
namespace {

bool g_started = false;
int g_rank = 0;
int g_size = 1;

// A launcher's mark in the environment: Open MPI's mpirun, PMIx (srun
// --mpi=pmix, prterun) and PMI-1/2 (srun --mpi=pmi2, MPICH's hydra).
bool StartedByLauncher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

void Check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(detail::StrCat("MPI: ", what, " failed on rank ", g_rank, ": ",
                             std::string(text, length)));
}

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// MPI counts are ints: larger messages go in pieces of at most this many bytes.
constexpr std::size_t kMaxPiece = static_cast<std::size_t>(INT_MAX);

}  // namespace

void InitializeDistributed(int* argc, char*** argv) {
  if (g_started || !StartedByLauncher()) return;
  int provided = 0;
  Check(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  g_started = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  // Errors come back as codes (Check turns them into exceptions) instead of
  // ending the job without a word.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  SP_CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI: this MPI library provides thread level ",
           provided, "; stillpoint needs MPI_THREAD_SERIALIZED");
  std::atexit(FinalizeAtExit);
}

int WorldRank() { return g_rank; }
int WorldSize() { return g_size; }

std::vector<std::string> AllGatherStrings(const std::string& mine) {
  if (g_size == 1) return {mine};
  const int length = static_cast<int>(mine.size());
  SP_CHECK(mine.size() <= kMaxPiece, "MPI: a gathered string of ", mine.size(), " bytes");
  std::vector<int> lengths(g_size);
  Check(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD),
        "MPI_Allgather");
  std::vector<int> offsets(g_size, 0);
  int64_t total = 0;
  for (int r = 0; r < g_size; ++r) {
    SP_CHECK(total + lengths[r] <= INT_MAX, "MPI: gathered strings exceed ", INT_MAX, " bytes");
    offsets[r] = static_cast<int>(total);
    total += lengths[r];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  Check(MPI_Allgatherv(mine.data(), length, MPI_BYTE, all.data(), lengths.data(), offsets.data(),
                       MPI_BYTE, MPI_COMM_WORLD),
        "MPI_Allgatherv");
  std::vector<std::string> out;
  for (int r = 0; r < g_size; ++r) out.push_back(all.substr(offsets[r], lengths[r]));
  return out;
}

void Barrier() {
  if (g_size > 1) Check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

void SendBytes(const void* data, std::size_t bytes, int to, int tag) {
  const char* p = static_cast<const char*>(data);
  do {
    const std::size_t piece = std::min(bytes, kMaxPiece);
    Check(MPI_Send(p, static_cast<int>(piece), MPI_BYTE, to, tag, MPI_COMM_WORLD), "MPI_Send");
    p += piece;
    bytes -= piece;
  } while (bytes > 0);
}

void ReceiveBytes(void* data, std::size_t bytes, int from, int tag) {
  char* p = static_cast<char*>(data);
  do {
    const std::size_t piece = std::min(bytes, kMaxPiece);
    Check(MPI_Recv(p, static_cast<int>(piece), MPI_BYTE, from, tag, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE),
          "MPI_Recv");
    p += piece;
    bytes -= piece;
  } while (bytes > 0);
}

void BroadcastBytes(void* data, std::size_t bytes, int root) {
  if (g_size == 1) return;
  char* p = static_cast<char*>(data);
  do {
    const std::size_t piece = std::min(bytes, kMaxPiece);
    Check(MPI_Bcast(p, static_cast<int>(piece), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    p += piece;
    bytes -= piece;
  } while (bytes > 0);
}

// Broadcasts started and not yet finished (MPI_THREAD_SERIALIZED: one
// thread at a time calls MPI, so one list serves).
std::vector<MPI_Request> g_broadcasts;

void StartBroadcastBytes(void* data, std::size_t bytes, int root) {
  if (g_size == 1) return;
  char* p = static_cast<char*>(data);
  do {
    const std::size_t piece = std::min(bytes, kMaxPiece);
    MPI_Request request;
    Check(MPI_Ibcast(p, static_cast<int>(piece), MPI_BYTE, root, MPI_COMM_WORLD, &request),
          "MPI_Ibcast");
    g_broadcasts.push_back(request);
    p += piece;
    bytes -= piece;
  } while (bytes > 0);
}

void FinishBroadcasts() {
  if (g_broadcasts.empty()) return;
  std::vector<MPI_Request> requests;
  requests.swap(g_broadcasts);
  Check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
        "MPI_Waitall");
}

void AbortJob(int exit_code) {
  if (g_started) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

int AgreeOnMax(int value) {
  if (g_size == 1) return value;
  int result = value;
  Check(MPI_Allreduce(&value, &result, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  return result;
}

#else  // one process: no MPI in this build

void InitializeDistributed(int*, char***) {}
int WorldRank() { return 0; }
int WorldSize() { return 1; }
std::vector<std::string> AllGatherStrings(const std::string& mine) { return {mine}; }
void Barrier() {}
void SendBytes(const void*, std::size_t, int to, int) {
  throw Error(detail::StrCat("SendBytes to rank ", to, ": this build has no MPI"));
}
void ReceiveBytes(void*, std::size_t, int from, int) {
  throw Error(detail::StrCat("ReceiveBytes from rank ", from, ": this build has no MPI"));
}
void BroadcastBytes(void*, std::size_t, int) {}
void StartBroadcastBytes(void*, std::size_t, int) {}
void FinishBroadcasts() {}
void AbortJob(int exit_code) { std::_Exit(exit_code); }
int AgreeOnMax(int value) { return value; }

#endif

void AgreeOnFailure(const std::string& failure) {
  if (WorldSize() == 1) {
    if (!failure.empty()) throw RankFailure(0, failure);
    return;
  }
  // A flag first, so the common case (no failure) moves one int.
  if (AgreeOnMax(failure.empty() ? 0 : 1) == 0) return;
  const std::vector<std::string> failures = AllGatherStrings(failure);
  for (std::size_t rank = 0; rank < failures.size(); ++rank) {
    if (!failures[rank].empty()) throw RankFailure(static_cast<int>(rank), failures[rank]);
  }
}

}  // namespace stillpoint
