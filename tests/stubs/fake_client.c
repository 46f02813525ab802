/* A client library linked against the stub libcudart.so.13, so its references are the VERSIONED symbols
 * cudaMalloc@libcudart.so.13 / cudaFree@libcudart.so.13 -- like PyTorch's libc10_cuda.so. */
#include <stddef.h>
typedef int cudaError_t;
extern cudaError_t cudaMalloc(void **p, size_t size);
extern cudaError_t cudaFree(void *p);

int client_malloc(void **p, size_t size) { return cudaMalloc(p, size); }
int client_free(void *p) { return cudaFree(p); }
