// Compile-time check of the uvmlab shim's CUDA declarations (uvmlab/measure/gpu/csrc/uvmlab_cuda_abi.h) against the real
// CUDA runtime headers. Built by tests/test_gpu_shim_headers.py with -I<cuda>/include -I<uvmlab/measure/gpu/csrc>; it has
// no code: it compiles if and only if every intercepted or called signature and every constant matches.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <type_traits>

#include "uvmlab_cuda_abi.h"

#define UVMLAB_CHECK_FN(name, ret, params)                                   \
  static_assert(std::is_same<decltype(&::name), ret(*) params>::value, \
                #name ": the shim's signature differs from the CUDA headers");

UVMLAB_CUDA_COMMON_FUNCTIONS(UVMLAB_CHECK_FN, ::cudaError_t)
UVMLAB_CUDA_ATTR_FUNCTIONS(UVMLAB_CHECK_FN, ::cudaError_t, enum ::cudaDeviceAttr)
UVMLAB_CUDA_PYTHON_FUNCTIONS(UVMLAB_CHECK_FN, ::cudaError_t, struct ::cudaPointerAttributes)
UVMLAB_CUDA_STREAM_FUNCTIONS(UVMLAB_CHECK_FN, ::cudaError_t, ::cudaStream_t, ::cudaEvent_t)
#if CUDART_VERSION >= 13000
static_assert(CUDART_VERSION >= uvmlab_abi::kCuda13Version, "the shim's CUDA 13 version switch");
UVMLAB_CUDA13_FUNCTIONS(UVMLAB_CHECK_FN, ::cudaError_t, enum ::cudaMemoryAdvise, struct ::cudaMemLocation,
                        ::cudaStream_t)
#else
static_assert(CUDART_VERSION < uvmlab_abi::kCuda13Version, "the shim's CUDA 13 version switch");
UVMLAB_CUDA12_FUNCTIONS(UVMLAB_CHECK_FN, ::cudaError_t, enum ::cudaMemoryAdvise, struct ::cudaMemLocation,
                        ::cudaStream_t)
#endif

#define UVMLAB_CHECK_CONST(ours, theirs)                                                            \
  static_assert(static_cast<long long>(uvmlab_abi::ours) == static_cast<long long>(theirs), \
                #ours " differs from the CUDA headers' " #theirs);

UVMLAB_CUDA_CONSTANTS(UVMLAB_CHECK_CONST)
#if CUDART_VERSION >= 12020
UVMLAB_CUDA_LOCATION_CONSTANTS(UVMLAB_CHECK_CONST)
static_assert(sizeof(uvmlab_abi::cudaMemLocation) == sizeof(::cudaMemLocation), "cudaMemLocation size");
static_assert(offsetof(uvmlab_abi::cudaMemLocation, type) == offsetof(::cudaMemLocation, type),
              "cudaMemLocation.type offset");
static_assert(offsetof(uvmlab_abi::cudaMemLocation, id) == offsetof(::cudaMemLocation, id),
              "cudaMemLocation.id offset");
#endif

// The head of struct cudaPointerAttributes that the Python side reads (program_backend.py _PointerAttributes).
static_assert(offsetof(uvmlab_abi::cudaPointerAttributesHead, type) == offsetof(::cudaPointerAttributes, type),
              "cudaPointerAttributes.type offset");
static_assert(offsetof(uvmlab_abi::cudaPointerAttributesHead, device) == offsetof(::cudaPointerAttributes, device),
              "cudaPointerAttributes.device offset");
static_assert(offsetof(uvmlab_abi::cudaPointerAttributesHead, devicePointer) ==
                  offsetof(::cudaPointerAttributes, devicePointer),
              "cudaPointerAttributes.devicePointer offset");
static_assert(offsetof(uvmlab_abi::cudaPointerAttributesHead, hostPointer) ==
                  offsetof(::cudaPointerAttributes, hostPointer),
              "cudaPointerAttributes.hostPointer offset");
static_assert(sizeof(::cudaPointerAttributes) <= uvmlab_abi::kCudaPointerAttributesBufferBytes,
              "cudaPointerAttributes fits the buffer the Python side passes");
static_assert(sizeof(enum ::cudaMemoryType) == sizeof(int), "cudaMemoryType size");

// The shim's stand-in types have the size of the real ones (they cross the ABI by value).
static_assert(sizeof(uvmlab_abi::cudaError_t) == sizeof(::cudaError_t), "cudaError_t size");
static_assert(sizeof(uvmlab_abi::cudaStream_t) == sizeof(::cudaStream_t), "cudaStream_t size");
static_assert(sizeof(uvmlab_abi::cudaMemoryAdvise) == sizeof(enum ::cudaMemoryAdvise), "cudaMemoryAdvise size");
static_assert(sizeof(uvmlab_abi::cudaDeviceAttr) == sizeof(enum ::cudaDeviceAttr), "cudaDeviceAttr size");
