// The CUDA runtime ABI the uvmlab shim relies on, declared without any CUDA header (the shim builds anywhere).
//
// This is the one list of every intercepted or called runtime function and every constant the shim uses. The shim
// instantiates the lists with its own declarations (below); tests/test_gpu_shim_headers.py compiles
// tests/stubs/check_cuda_abi.cpp, which instantiates the same lists with the REAL CUDA headers
// (/usr/local/cuda-13*/include, and CUDA 12 where installed) and static_asserts that every signature and constant
// matches. Values: CUDA 13.0 driver_types.h and cuda_runtime_api.h (/usr/local/cuda-13.0/include).
#ifndef UVMLAB_CUDA_ABI_H_
#define UVMLAB_CUDA_ABI_H_

#include <cstddef>

// X(name, return type, parameter list): functions whose signature is the same in CUDA 12 and 13.
// ERR = cudaError_t.
#define UVMLAB_CUDA_COMMON_FUNCTIONS(X, ERR)                \
  X(cudaMalloc, ERR, (void**, size_t))                      \
  X(cudaMallocManaged, ERR, (void**, size_t, unsigned int)) \
  X(cudaFree, ERR, (void*))                                 \
  X(cudaMemGetInfo, ERR, (size_t*, size_t*))                \
  X(cudaGetDevice, ERR, (int*))                             \
  X(cudaRuntimeGetVersion, ERR, (int*))                     \
  X(cudaDeviceSynchronize, ERR, (void))

// Functions taking an enum cudaDeviceAttr (ATTR), the same in CUDA 12 and 13. Not called by the shim: uvmlab's
// Python side calls it through ctypes (uvmlab/measure/gpu/cudart.py); listed here so that its signature is checked too.
#define UVMLAB_CUDA_ATTR_FUNCTIONS(X, ERR, ATTR) \
  X(cudaDeviceGetAttribute, ERR, (int*, ATTR, int))

// Functions uvmlab's Python side calls through ctypes (uvmlab/measure/gpu/program_backend.py), not the shim; listed
// here so that their signatures are checked too (PATTR = struct cudaPointerAttributes). The same in CUDA 12 and 13.
#define UVMLAB_CUDA_PYTHON_FUNCTIONS(X, ERR, PATTR)              \
  X(cudaPointerGetAttributes, ERR, (PATTR*, const void*))        \
  X(cudaGetErrorName, const char*, (ERR))

// Streams and events uvmlab.measure.gpu.hints uses through ctypes (prefetch-next-kernel's side stream), the same in
// CUDA 12 and 13 (STREAM = cudaStream_t, EVENT = cudaEvent_t).
#define UVMLAB_CUDA_STREAM_FUNCTIONS(X, ERR, STREAM, EVENT)              \
  X(cudaStreamCreateWithFlags, ERR, (STREAM*, unsigned int))             \
  X(cudaEventCreateWithFlags, ERR, (EVENT*, unsigned int))               \
  X(cudaEventRecord, ERR, (EVENT, STREAM))                               \
  X(cudaStreamWaitEvent, ERR, (STREAM, EVENT, unsigned int))

// CUDA >= 13.0: cudaMemAdvise / cudaMemPrefetchAsync take a struct cudaMemLocation by value (ADV = the advice
// enum, LOC = struct cudaMemLocation, STREAM = cudaStream_t).
#define UVMLAB_CUDA13_FUNCTIONS(X, ERR, ADV, LOC, STREAM)              \
  X(cudaMemAdvise, ERR, (const void*, size_t, ADV, LOC))               \
  X(cudaMemPrefetchAsync, ERR, (const void*, size_t, LOC, unsigned int, STREAM))

// CUDA 12.x: the same two functions take an int device (cudaMemAdvise_v2 had the location form).
#define UVMLAB_CUDA12_FUNCTIONS(X, ERR, ADV, LOC, STREAM)  \
  X(cudaMemAdvise, ERR, (const void*, size_t, ADV, int)) \
  X(cudaMemPrefetchAsync, ERR, (const void*, size_t, int, STREAM))

// C(shim name, CUDA name): integer constants.
#define UVMLAB_CUDA_CONSTANTS(C)                                    \
  C(kCudaSuccess, cudaSuccess)                                      \
  C(kCudaErrorInvalidValue, cudaErrorInvalidValue)                  \
  C(kCudaErrorInitializationError, cudaErrorInitializationError)    \
  C(kCudaErrorMemoryAllocation, cudaErrorMemoryAllocation)          \
  C(kCudaStreamNonBlocking, cudaStreamNonBlocking)                  \
  C(kCudaEventDisableTiming, cudaEventDisableTiming)                \
  C(kCudaMemAttachGlobal, cudaMemAttachGlobal)                      \
  C(kCudaMemAdviseSetReadMostly, cudaMemAdviseSetReadMostly)        \
  C(kCudaMemAdviseSetPreferredLocation, cudaMemAdviseSetPreferredLocation) \
  C(kCudaMemAdviseSetAccessedBy, cudaMemAdviseSetAccessedBy)        \
  C(kCudaMemAdviseUnsetReadMostly, cudaMemAdviseUnsetReadMostly)    \
  C(kCudaMemAdviseUnsetPreferredLocation, cudaMemAdviseUnsetPreferredLocation) \
  C(kCudaMemAdviseUnsetAccessedBy, cudaMemAdviseUnsetAccessedBy)    \
  C(kCudaMemoryTypeUnregistered, cudaMemoryTypeUnregistered)        \
  C(kCudaMemoryTypeDevice, cudaMemoryTypeDevice)                    \
  C(kCudaMemoryTypeManaged, cudaMemoryTypeManaged)                  \
  C(kCudaCpuDeviceId, cudaCpuDeviceId)                              \
  C(kCudaDevAttrPageableMemoryAccess, cudaDevAttrPageableMemoryAccess) \
  C(kCudaDevAttrConcurrentManagedAccess, cudaDevAttrConcurrentManagedAccess)

// The same for constants that exist from CUDA 12.2 on (struct cudaMemLocation).
#define UVMLAB_CUDA_LOCATION_CONSTANTS(C)                  \
  C(kCudaMemLocationTypeDevice, cudaMemLocationTypeDevice) \
  C(kCudaMemLocationTypeHost, cudaMemLocationTypeHost)

namespace uvmlab_abi {

typedef int cudaError_t;  // enum cudaError: an int-sized enum
typedef void* cudaStream_t;  // struct CUstream_st*
typedef int cudaMemoryAdvise;  // enum cudaMemoryAdvise
typedef int cudaDeviceAttr;  // enum cudaDeviceAttr

struct cudaMemLocation {  // CUDA >= 12.2 driver_types.h; passed by value (one 8-byte register on x86-64)
  int type;
  int id;
};

constexpr cudaError_t kCudaSuccess = 0;
constexpr cudaError_t kCudaErrorInvalidValue = 1;
constexpr cudaError_t kCudaErrorInitializationError = 3;
constexpr cudaError_t kCudaErrorMemoryAllocation = 2;  // the balloon's retry in pieces
constexpr unsigned kCudaStreamNonBlocking = 0x01;  // hints.py STREAM_NON_BLOCKING
constexpr unsigned kCudaEventDisableTiming = 0x02;  // hints.py EVENT_DISABLE_TIMING
constexpr unsigned kCudaMemAttachGlobal = 0x01;
constexpr int kCudaMemAdviseSetReadMostly = 1;
constexpr int kCudaMemAdviseSetPreferredLocation = 3;
constexpr int kCudaMemAdviseSetAccessedBy = 5;
constexpr int kCudaMemAdviseUnsetReadMostly = 2;           // program_backend.py ADVICE_CODES
constexpr int kCudaMemAdviseUnsetPreferredLocation = 4;
constexpr int kCudaMemAdviseUnsetAccessedBy = 6;
constexpr int kCudaMemoryTypeUnregistered = 0;  // enum cudaMemoryType (program_backend.py MEMORY_TYPE_*)
constexpr int kCudaMemoryTypeDevice = 2;
constexpr int kCudaMemoryTypeManaged = 3;
constexpr int kCudaCpuDeviceId = -1;
constexpr int kCudaDevAttrPageableMemoryAccess = 88;     // uvmlab/measure/gpu/cudart.py DEV_ATTR_PAGEABLE_MEMORY_ACCESS
constexpr int kCudaDevAttrConcurrentManagedAccess = 89;  // uvmlab/measure/gpu/cudart.py DEV_ATTR_CONCURRENT_MANAGED_ACCESS
// The members of struct cudaPointerAttributes uvmlab reads (CUDA 12 and 13 driver_types.h; CUDA 13 appends
// long reserved[8], so callers pass a buffer of CUDA 13's size). program_backend.py's ctypes mirror has this layout.
struct cudaPointerAttributesHead {
  int type;  // enum cudaMemoryType
  int device;
  void* devicePointer;
  void* hostPointer;
};
constexpr size_t kCudaPointerAttributesBufferBytes = 128;  // program_backend.py POINTER_ATTRIBUTES_BUFFER_BYTES

constexpr int kCudaMemLocationTypeDevice = 1;
constexpr int kCudaMemLocationTypeHost = 2;
constexpr int kCuda13Version = 13000;  // cudaRuntimeGetVersion of CUDA 13.0 (CUDART_VERSION)

// Function pointer types: <name>_fn (common), <name>_fn13 / <name>_fn12 (version-dependent).
#define UVMLAB_ABI_FN(name, ret, params) typedef ret(*name##_fn) params;
UVMLAB_CUDA_COMMON_FUNCTIONS(UVMLAB_ABI_FN, cudaError_t)
#undef UVMLAB_ABI_FN
#define UVMLAB_ABI_FN(name, ret, params) typedef ret(*name##_fn) params;
UVMLAB_CUDA_ATTR_FUNCTIONS(UVMLAB_ABI_FN, cudaError_t, cudaDeviceAttr)
#undef UVMLAB_ABI_FN
#define UVMLAB_ABI_FN13(name, ret, params) typedef ret(*name##_fn13) params;
UVMLAB_CUDA13_FUNCTIONS(UVMLAB_ABI_FN13, cudaError_t, cudaMemoryAdvise, cudaMemLocation, cudaStream_t)
#undef UVMLAB_ABI_FN13
#define UVMLAB_ABI_FN12(name, ret, params) typedef ret(*name##_fn12) params;
UVMLAB_CUDA12_FUNCTIONS(UVMLAB_ABI_FN12, cudaError_t, cudaMemoryAdvise, cudaMemLocation, cudaStream_t)
#undef UVMLAB_ABI_FN12

}  // namespace uvmlab_abi

#endif  // UVMLAB_CUDA_ABI_H_
