/* The compressed all-reduce from C: one communicator per MPI communicator, then one call per
 * bucket. Run: mpirun -np 2 allreduce_mpi */
#include <gift/gift_mpi.h>
#include <mpi.h>
#include <stdio.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  giftAllReduceConfig config = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  config.op = GIFT_REDUCE_AVG;
  giftComm* comm = NULL;
  giftResult_t rc = giftCommInitMpi(MPI_COMM_WORLD, &config, &comm);

  /* A bucket of two gradients; the result replaces the input (in place). */
  float weight[4 * 300], bias[300];
  for (int i = 0; i < 4 * 300; ++i) weight[i] = (float)(rank + 1) * 0.001f * (float)(i % 97);
  for (int i = 0; i < 300; ++i) bias[i] = (float)rank - 0.5f;
  const uint64_t weight_shape[2] = {4, 300}, bias_shape[1] = {300};
  const giftBucketTensor bucket[2] = {{"layer.weight", GIFT_DTYPE_F32, 2, weight_shape},
                                      {"layer.bias", GIFT_DTYPE_F32, 1, bias_shape}};
  const void* send[2] = {weight, bias};
  void* recv[2] = {weight, bias};
  if (rc == GIFT_OK) rc = giftAllReduceBucket(comm, bucket, send, recv, 2);

  if (rc != GIFT_OK) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, giftGetErrorString(rc), giftGetLastErrorMessage());
  } else if (rank == 0) {
    printf("weight[96] = %g, bias[0] = %g\n", weight[96], bias[0]);
  }
  giftCommDestroy(comm);
  MPI_Finalize();
  return rc == GIFT_OK ? 0 : 1;
}
