/* A stub CUDA runtime for tests (no GPU): exports the few runtime functions the uvmlab shim uses and records
 * every call, one line each, to the file named by FAKE_CUDART_LOG:
 *     <function> ptr=<hex> size=<bytes> <extra key=value...> -> <cudaError_t>
 * "Device" memory is an address range reserved with mmap (MAP_NORESERVE: no host memory until touched, and no
 * other allocation can fall inside it); managed memory is host memory from calloc; cudaMalloc counts against FAKE_CUDART_TOTAL_BYTES (default 16 GiB)
 * minus FAKE_CUDART_CONTEXT_BYTES (default 256 MiB), so cudaMemGetInfo answers like a card with a context;
 * managed allocations do not count (UVM may evict them). FAKE_CUDART_VERSION (default 13000) selects the
 * cudaMemAdvise / cudaMemPrefetchAsync ABI this stub decodes: CUDA 13 passes a struct cudaMemLocation
 * {int type; int id;} by value (one 8-byte register); CUDA 12 passes an int device.
 * cudaMemAdvise / cudaMemPrefetchAsync answer as the CUDA 13.0 cuda_runtime_api.h documents them: "The memory
 * range must refer to managed memory allocated via cudaMallocManaged ..., or it may also refer to system-allocated
 * memory on systems with non-zero cudaDevAttrPageableMemoryAccess"; anything else is cudaErrorInvalidValue (1).
 * So a range inside one cudaMallocManaged allocation succeeds; a range in cudaMalloc (device) memory, or one
 * running past the end of its managed allocation, fails with 1; memory this stub did not allocate counts as
 * system-allocated memory: it succeeds only with FAKE_CUDART_PAGEABLE_ACCESS=1 (default 0, as on a PCIe GPU
 * without HMM). cudaDeviceGetAttribute answers cudaDevAttrPageableMemoryAccess (88) from that variable and
 * cudaDevAttrConcurrentManagedAccess (89) from FAKE_CUDART_CONCURRENT_MANAGED (default 1); other attributes are
 * cudaErrorInvalidValue.
 * cudaPointerGetAttributes answers as the CUDA 13.0 cuda_runtime_api.h documents it: cudaMemoryTypeManaged (3) for a
 * pointer inside a cudaMallocManaged allocation (devicePointer = hostPointer = the pointer), cudaMemoryTypeDevice (2)
 * inside a cudaMalloc allocation (hostPointer NULL), else cudaMemoryTypeUnregistered (0) with cudaSuccess ("In CUDA
 * 11.0 forward passing host pointer will return cudaMemoryTypeUnregistered ... and call will return cudaSuccess");
 * a NULL attributes pointer is cudaErrorInvalidValue; FAKE_CUDART_NO_DEVICE=1 makes it cudaErrorNoDevice (100).
 * cudaGetErrorName names the codes this stub returns, and "unrecognized error code" for others, as the runtime does.
 * Built with a version script (libcudart.so.13 node) and soname libcudart.so.13, like NVIDIA's runtime. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>

typedef int cudaError_t;
typedef void *cudaStream_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static size_t device_used = 0;

#define MAX_ALLOCS 4096
static void *alloc_ptr[MAX_ALLOCS];
static size_t alloc_size[MAX_ALLOCS];
static int alloc_device[MAX_ALLOCS];

static size_t env_size(const char *name, size_t fallback) {
    const char *v = getenv(name);
    return (v && *v) ? (size_t)strtoull(v, NULL, 10) : fallback;
}
static int version(void) { return (int)env_size("FAKE_CUDART_VERSION", 13000); }
static size_t total_bytes(void) { return env_size("FAKE_CUDART_TOTAL_BYTES", (size_t)16 << 30); }
static size_t context_bytes(void) { return env_size("FAKE_CUDART_CONTEXT_BYTES", (size_t)256 << 20); }

static void record(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void record(const char *fmt, ...) {
    const char *path = getenv("FAKE_CUDART_LOG");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

static void remember(void *p, size_t size, int device) {
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (alloc_ptr[i] == NULL) { alloc_ptr[i] = p; alloc_size[i] = size; alloc_device[i] = device; return; }
}

cudaError_t cudaMalloc(void **p, size_t size) {
    pthread_mutex_lock(&mu);
    cudaError_t rc = 0;
    if (size == 0) { *p = NULL; }
    else if (device_used + size > total_bytes() - context_bytes()) { *p = NULL; rc = 2; /* cudaErrorMemoryAllocation */ }
    else {
        void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) { *p = NULL; rc = 2; }
        else { *p = m; device_used += size; remember(*p, size, 1); }
    }
    pthread_mutex_unlock(&mu);
    record("cudaMalloc ptr=%p size=%zu -> %d", *p, size, rc);
    return rc;
}

cudaError_t cudaMallocManaged(void **p, size_t size, unsigned int flags) {
    cudaError_t rc = 0;
    if (size == 0) { *p = NULL; rc = 1; /* cudaErrorInvalidValue, like the real runtime */ }
    else {
        *p = calloc(1, size);
        if (!*p) rc = 2;
        pthread_mutex_lock(&mu);
        remember(*p, size, 0);
        pthread_mutex_unlock(&mu);
    }
    record("cudaMallocManaged ptr=%p size=%zu flags=%u -> %d", *p, size, flags, rc);
    return rc;
}

cudaError_t cudaFree(void *p) {
    const char *kind = "none";
    size_t size = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; p && i < MAX_ALLOCS; i++)
        if (alloc_ptr[i] == p) {
            kind = alloc_device[i] ? "device" : "managed";
            size = alloc_size[i];
            if (alloc_device[i]) device_used -= size;
            alloc_ptr[i] = NULL;
            break;
        }
    pthread_mutex_unlock(&mu);
    if (p && strcmp(kind, "device") == 0) munmap(p, size);
    else if (p) free(p);
    record("cudaFree ptr=%p size=%zu kind=%s -> 0", p, size, kind);
    return 0;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    pthread_mutex_lock(&mu);
    *total_b = total_bytes();
    *free_b = total_bytes() - context_bytes() - device_used;
    pthread_mutex_unlock(&mu);
    record("cudaMemGetInfo free=%zu total=%zu -> 0", *free_b, *total_b);
    return 0;
}

cudaError_t cudaGetDevice(int *device) { *device = (int)env_size("FAKE_CUDART_DEVICE", 0); return 0; }
cudaError_t cudaRuntimeGetVersion(int *v) { *v = version(); return 0; }
/* The driver's CUDA version (FAKE_CUDART_DRIVER_VERSION, default the runtime's; 0 = no driver, as the real call
 * answers without one). */
cudaError_t cudaDriverGetVersion(int *v) { *v = (int)env_size("FAKE_CUDART_DRIVER_VERSION", (size_t)version()); return 0; }

/* cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) (cuda_runtime_api.h; an enum
 * is an int in the C ABI). Answers cudaDevAttrComputeCapabilityMajor (75) and Minor (76) from FAKE_CUDART_CC
 * (e.g. 90 = 9.0, default 80), cudaDevAttrPageableMemoryAccess (88) from FAKE_CUDART_PAGEABLE_ACCESS (default 0)
 * and cudaDevAttrConcurrentManagedAccess (89) from FAKE_CUDART_CONCURRENT_MANAGED (default 1);
 * FAKE_CUDART_NO_DEVICE=1 makes every call cudaErrorNoDevice (100); another attribute or a device other than 0 is
 * cudaErrorInvalidValue (1) / cudaErrorInvalidDevice (101). */
cudaError_t cudaDeviceGetAttribute(int *value, int attr, int device) {
    cudaError_t rc = 0;
    int cc = (int)env_size("FAKE_CUDART_CC", 80);
    if (env_size("FAKE_CUDART_NO_DEVICE", 0)) rc = 100;
    else if (device != 0) rc = 101;
    else if (attr == 75) *value = cc / 10;
    else if (attr == 76) *value = cc % 10;
    else if (attr == 88) *value = (int)env_size("FAKE_CUDART_PAGEABLE_ACCESS", 0);
    else if (attr == 89) *value = (int)env_size("FAKE_CUDART_CONCURRENT_MANAGED", 1);
    else rc = 1;
    record("cudaDeviceGetAttribute attr=%d device=%d value=%d -> %d", attr, device, rc ? -1 : *value, rc);
    return rc;
}

/* cudaSuccess when [p, p + count) may be advised or prefetched (see the header comment), else cudaErrorInvalidValue.
 * Managed ranges are looked up first: they are real memory, while a device allocation's stand-in is only 4 KiB,
 * so its nominal range may cover unrelated addresses. */
static cudaError_t hint_range_ok(const void *p, size_t count) {
    uintptr_t a = (uintptr_t)p;
    cudaError_t rc = 1;
    int found = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_ALLOCS && !found; i++) {
        uintptr_t b = (uintptr_t)alloc_ptr[i];
        if (b && !alloc_device[i] && a >= b && a < b + alloc_size[i]) {
            found = 1;
            rc = (count <= b + alloc_size[i] - a) ? 0 : 1;
        }
    }
    for (int i = 0; i < MAX_ALLOCS && !found; i++) {
        uintptr_t b = (uintptr_t)alloc_ptr[i];
        if (b && alloc_device[i] && a >= b && a < b + alloc_size[i]) found = 1; /* device memory: rc stays 1 */
    }
    pthread_mutex_unlock(&mu);
    if (!found && p != NULL && env_size("FAKE_CUDART_PAGEABLE_ACCESS", 0)) rc = 0; /* system-allocated memory */
    return rc;
}

/* CUDA 13: (ptr, count, advice, struct cudaMemLocation loc); CUDA 12: (ptr, count, advice, int device). */
cudaError_t cudaMemAdvise(const void *p, size_t count, int advice, uint64_t loc) {
    cudaError_t rc = hint_range_ok(p, count);
    if (version() >= 13000)
        record("cudaMemAdvise ptr=%p size=%zu advice=%d loc_type=%d loc_id=%d -> %d", p, count, advice,
               (int)(uint32_t)(loc & 0xffffffffu), (int)(uint32_t)(loc >> 32), rc);
    else
        record("cudaMemAdvise ptr=%p size=%zu advice=%d device=%d -> %d", p, count, advice, (int)(uint32_t)loc, rc);
    return rc;
}

/* CUDA 13: (ptr, count, struct cudaMemLocation loc, unsigned flags, stream); CUDA 12: (ptr, count, int dev, stream) */
cudaError_t cudaMemPrefetchAsync(const void *p, size_t count, uint64_t a3, uint64_t a4, uint64_t a5) {
    cudaError_t rc = hint_range_ok(p, count);
    if (version() >= 13000)
        record("cudaMemPrefetchAsync ptr=%p size=%zu loc_type=%d loc_id=%d flags=%u stream=%p -> %d", p, count,
               (int)(uint32_t)(a3 & 0xffffffffu), (int)(uint32_t)(a3 >> 32), (unsigned)a4, (void *)a5, rc);
    else
        record("cudaMemPrefetchAsync ptr=%p size=%zu device=%d stream=%p -> %d", p, count, (int)(uint32_t)a3,
               (void *)a4, rc);
    return rc;
}

/* The first four members of struct cudaPointerAttributes (CUDA 12 and 13 driver_types.h; CUDA 13 appends
 * long reserved[8]): only these are written, so a caller's CUDA 12-sized struct is never overrun. */
struct fake_pointer_attributes { int type; int device; void *devicePointer; void *hostPointer; };

cudaError_t cudaPointerGetAttributes(struct fake_pointer_attributes *attr, const void *p) {
    cudaError_t rc = 0;
    int type = 0; /* cudaMemoryTypeUnregistered */
    uintptr_t a = (uintptr_t)p;
    if (attr == NULL) rc = 1;
    else if (env_size("FAKE_CUDART_NO_DEVICE", 0)) rc = 100;
    else {
        pthread_mutex_lock(&mu);
        for (int i = 0; i < MAX_ALLOCS && type == 0; i++) {
            uintptr_t b = (uintptr_t)alloc_ptr[i];
            if (b && !alloc_device[i] && a >= b && a < b + alloc_size[i]) type = 3; /* cudaMemoryTypeManaged */
        }
        for (int i = 0; i < MAX_ALLOCS && type == 0; i++) {
            uintptr_t b = (uintptr_t)alloc_ptr[i];
            if (b && alloc_device[i] && a >= b && a < b + alloc_size[i]) type = 2; /* cudaMemoryTypeDevice */
        }
        pthread_mutex_unlock(&mu);
        attr->type = type;
        attr->device = type ? (int)env_size("FAKE_CUDART_DEVICE", 0) : -1; /* no device: the header leaves it undefined */
        attr->devicePointer = type ? (void *)p : NULL;
        attr->hostPointer = type == 3 ? (void *)p : NULL;
    }
    record("cudaPointerGetAttributes ptr=%p type=%d -> %d", p, rc ? -1 : type, rc);
    return rc;
}

/* const char* cudaGetErrorName(cudaError_t error): the enum names (driver_types.h) of the codes this stub returns. */
const char *cudaGetErrorName(cudaError_t error) {
    switch (error) {
    case 0: return "cudaSuccess";
    case 1: return "cudaErrorInvalidValue";
    case 2: return "cudaErrorMemoryAllocation";
    case 3: return "cudaErrorInitializationError";
    case 100: return "cudaErrorNoDevice";
    case 101: return "cudaErrorInvalidDevice";
    default: return "unrecognized error code";
    }
}
