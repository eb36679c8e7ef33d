/* Memory bandwidth probe: one core's memcpy and a[i] += b[i] (float32) over BYTES, median of 9.
 *   cc -O3 -o memcpy_bw memcpy_bw.c && ./memcpy_bw 104857600
 * Prints "copy_GBps sum_GBps" (bytes of the destination per second). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : (100u << 20);
  size_t n = bytes / sizeof(float);
  float* a = malloc(n * sizeof(float));
  float* b = malloc(n * sizeof(float));
  memset(a, 0, n * sizeof(float));
  for (size_t i = 0; i < n; ++i) b[i] = 1.0f;
  double copy[9], sum[9];
  for (int r = 0; r < 9; ++r) {
    double t0 = now();
    memcpy(a, b, n * sizeof(float));
    copy[r] = now() - t0;
    t0 = now();
    for (size_t i = 0; i < n; ++i) a[i] += b[i];
    sum[r] = now() - t0;
  }
  qsort(copy, 9, sizeof(double), cmp);
  qsort(sum, 9, sizeof(double), cmp);
  if (a[n - 1] != 2.0f) return 1; /* copy of b, plus b once: uses the result so no loop is elided */
  printf("%.2f %.2f\n", bytes / copy[4] / 1e9, bytes / sum[4] / 1e9);
  return 0;
}
