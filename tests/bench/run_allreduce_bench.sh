#!/usr/bin/env bash
# The compressed all-reduce against MPI_Allreduce (fp32), 2 and 4 ranks, over shared memory
# and over TCP loopback; one table. BUILD_DIR picks the build, SIZES the buckets in MiB,
# GIFT_BENCH_REPS the repetitions (median reported).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bench=${BUILD_DIR:-$root/build}/tests/bench/bench_allreduce
sizes=${SIZES:-1 4 16 64 256}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1

printf '%-5s %2s %6s %10s %10s %5s %9s %9s %9s %9s %9s %9s\n' link np MiB fp32_MiB gift_MiB ratio \
  mpi_ms gift_ms coords_ms local_ms rss_MiB win_Gb/s
for link in shm tcp; do
  btl=self,vader
  [ "$link" = tcp ] && btl=self,tcp
  for np in 2 4; do
    # Ranks beyond the cores share them: fewer repetitions keep the run short.
    reps=${GIFT_BENCH_REPS:-$([ "$np" -gt "$(nproc)" ] && echo 3 || echo 5)}
    GIFT_BENCH_LINK=$link GIFT_BENCH_REPS=$reps OMPI_MCA_btl=$btl \
      mpirun -np "$np" "$bench" $sizes
  done
done
cat <<'TXT'
fp32_MiB/gift_MiB: bytes each rank sends (ring all-reduce 2(N-1)/N x 4 B per element; ours
2(N-1) fixed-size messages). mpi_ms/gift_ms: median time of the slowest rank; coords_ms: the
same bucket as one matrix of 1024 columns in GIFT coordinates (rank-32 whitener). local_ms: gift
time minus its two exchanges timed alone. win_Gb/s: link bandwidth below which ours is faster,
(fp32 bytes - our bytes) / local time, for bandwidth-bound links.
TXT
