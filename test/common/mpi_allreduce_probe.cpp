// Each rank contributes rank+1; the all-reduced sum must be n(n+1)/2 on every rank. Prints one line per
// rank, "rank=R size=S node=N sum=X", with the node from SLURMD_NODENAME so cluster tests can check
// placement (test/slurm/cluster_smoke.sh parses it).
#include <mpi.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long contribution = rank + 1, sum = 0;
  MPI_Allreduce(&contribution, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  const long expected = static_cast<long>(size) * (size + 1) / 2;
  const char* node = std::getenv("SLURMD_NODENAME");
  std::printf("rank=%d size=%d node=%s sum=%ld\n", rank, size, node ? node : "?", sum);
  std::fflush(stdout);
  int ok = sum == expected, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  MPI_Finalize();
  return all_ok ? 0 : 1;
}
