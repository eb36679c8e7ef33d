/* The OpenMPI peer for `dsgd bench allreduce`: MPI_Allreduce (sum, float32) over the given
 * sizes, median of ITERS timed runs after 3 warm-up runs, the slowest rank's median.
 *   mpicc -O2 -o mpi_allreduce mpi_allreduce.c
 *   mpirun --allow-run-as-root --oversubscribe -np 2 ./mpi_allreduce ITERS BYTES...
 * Prints one line per size: "bytes latency_us algbw_GBps busbw_GBps". Verifies the result. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int iters = argc > 1 ? atoi(argv[1]) : 20;
  for (int a = 2; a < argc; ++a) {
    size_t count = strtoull(argv[a], NULL, 10) / sizeof(float);
    if (count == 0) count = 1;
    float* buf = malloc(count * sizeof(float));
    double* times = malloc(sizeof(double) * iters);
    for (int it = 0; it < iters + 3; ++it) {
      for (size_t i = 0; i < count; ++i) buf[i] = (float)(rank + 1);
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double t = MPI_Wtime() - t0;
      if (it >= 3) times[it - 3] = t;
      if (buf[0] != (float)(size * (size + 1) / 2) || buf[count - 1] != buf[0]) {
        fprintf(stderr, "rank %d: wrong result %f\n", rank, buf[0]);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    qsort(times, iters, sizeof(double), cmp);
    double median = times[iters / 2], slowest;
    MPI_Allreduce(&median, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      double bytes = (double)(count * sizeof(float)), algbw = bytes / slowest / 1e9;
      printf("%.0f %.2f %.3f %.3f\n", bytes, slowest * 1e6, algbw, algbw * 2.0 * (size - 1) / size);
      fflush(stdout);
    }
    free(buf);
    free(times);
  }
  MPI_Finalize();
  return 0;
}
