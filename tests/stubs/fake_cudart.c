/* A stub CUDA runtime for tests (no GPU): exports the runtime functions uvmlab's shim and its Python side call, and
 * records every call, one line each, to the file named by FAKE_CUDART_LOG:
 *     <function> ptr=<hex> size=<bytes> <extra key=value...> -> <cudaError_t>
 * Built with a version script (libcudart.so.13 node) and soname libcudart.so.13, like NVIDIA's runtime.
 *
 * Memory. "Device" memory is an address range reserved with mmap (MAP_NORESERVE: no host memory until touched, and no
 * other allocation can fall inside it); managed memory is host memory (calloc). The card has FAKE_CUDART_TOTAL_BYTES
 * (default 16 GiB), of which FAKE_CUDART_CONTEXT_BYTES (default 256 MiB) is taken by the context and other tenants.
 * cudaMemGetInfo's free = total - context - device bytes - RESIDENT managed bytes: CUDA 13.0 cuda_runtime_api.h
 * cudaMemGetInfo returns "the amount of memory on the device that is free according to the OS", and managed pages
 * resident on the GPU occupy device memory. Managed memory becomes resident when it is prefetched to the device
 * (cudaMemPrefetchAsync) or touched by a "kernel" (fake_cudart_gpu_touch, the stub's own export); a prefetch to the
 * host makes it non-resident; a resident set larger than the free memory evicts other managed allocations first (as
 * UVM does), and what still does not fit stays on the host [approximation: residency is counted in bytes per
 * allocation, not per page]. FAKE_CUDART_MAX_CHUNK_BYTES (default: no limit) is the largest cudaMalloc that can
 * succeed (fragmented device memory: a larger one is cudaErrorMemoryAllocation even when free says there is room).
 * The allocation table grows without bound (the real runtime has no 4,096-allocation limit).
 *
 * Return codes, each from the CUDA 13.0 headers (/usr/local/cuda-13.0/include; enum values in driver_types.h:
 * cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorInitializationError = 3, cudaErrorNoDevice = 100,
 * cudaErrorInvalidDevice = 101, cudaErrorInvalidResourceHandle = 400):
 * - cudaMallocManaged: "flags must be one of cudaMemAttachGlobal or cudaMemAttachHost" (0x01, 0x02) and "If size is 0,
 *   cudaMallocManaged returns cudaErrorInvalidValue" (cuda_runtime_api.h); any other flags -> cudaErrorInvalidValue
 *   (the one argument error its \return list names).
 * - cudaFree: "If cudaFree(devPtr) has already been called before, an error is returned. If devPtr is 0, no operation
 *   is performed. cudaFree() returns cudaErrorValue in case of failure" and its \return list names
 *   cudaErrorInvalidValue: a pointer this runtime did not allocate, or one already freed -> cudaErrorInvalidValue.
 * - cudaMemAdvise: "The memory range must refer to managed memory allocated via cudaMallocManaged ..., or ...
 *   system-allocated pageable memory" on devices with non-zero cudaDevAttrPageableMemoryAccess, else
 *   cudaErrorInvalidValue; an advice outside enum cudaMemoryAdvise (1..6) -> cudaErrorInvalidValue. The location
 *   matters only for cudaMemAdviseSetPreferredLocation (3) and cudaMemAdviseSetAccessedBy (5) ("The location argument
 *   is ignored for this advice" for the others): cudaMemLocationTypeInvalid (0) or an unknown type ->
 *   cudaErrorInvalidValue ("All other location types are invalid"); a device that is not a valid ordinal ->
 *   cudaErrorInvalidDevice ("id must be a valid device ordinal"); a device whose cudaDevAttrConcurrentManagedAccess is
 *   0 -> cudaErrorInvalidDevice ("the device must have a non-zero value for the device attribute
 *   cudaDevAttrConcurrentManagedAccess"; the header's \return list has cudaErrorInvalidValue and
 *   cudaErrorInvalidDevice, and the device is what is wrong).
 * - cudaMemPrefetchAsync: "flags - flags for future use, must be zero now" -> cudaErrorInvalidValue otherwise;
 *   cudaMemLocationTypeDevice needs "a device ordinal ... which must have non-zero value for the device attribute
 *   concurrentManagedAccess" -> cudaErrorInvalidDevice for a bad ordinal or with the attribute 0;
 *   cudaMemLocationTypeInvalid (0) or an unknown type -> cudaErrorInvalidValue; the same range rule as cudaMemAdvise.
 *   CUDA 12 (FAKE_CUDART_VERSION < 13000): an int device, cudaCpuDeviceId (-1) the host.
 * - cudaMemGetInfo: cudaErrorInvalidValue for a NULL pointer.
 * - cudaDeviceGetAttribute: attributes 75/76 from FAKE_CUDART_CC (e.g. 90 = 9.0, default 80), 83 managed memory (1),
 *   88 cudaDevAttrPageableMemoryAccess from FAKE_CUDART_PAGEABLE_ACCESS (default 0), 89
 *   cudaDevAttrConcurrentManagedAccess from FAKE_CUDART_CONCURRENT_MANAGED (default 1), 100
 *   PageableMemoryAccessUsesHostPageTables and 101 DirectManagedMemAccessFromHost from FAKE_CUDART_ATS (default 0);
 *   another attribute -> cudaErrorInvalidValue; a device >= FAKE_CUDART_DEVICE_COUNT (default 1) ->
 *   cudaErrorInvalidDevice; FAKE_CUDART_NO_DEVICE=1 -> cudaErrorNoDevice everywhere it is checked.
 * - cudaPointerGetAttributes: cudaMemoryTypeManaged (3) inside a cudaMallocManaged allocation, cudaMemoryTypeDevice
 *   (2) inside a cudaMalloc allocation, else cudaMemoryTypeUnregistered (0) with cudaSuccess ("In CUDA 11.0 forward
 *   passing host pointer will return cudaMemoryTypeUnregistered ... and call will return cudaSuccess"); NULL
 *   attributes -> cudaErrorInvalidValue.
 * - Streams and events (cudaStreamCreateWithFlags, cudaEventCreateWithFlags, cudaEventRecord, cudaStreamWaitEvent,
 *   cudaStreamSynchronize, cudaEventDestroy, cudaStreamDestroy, cudaDeviceSynchronize): handles are opaque tokens;
 *   an event or stream this runtime did not create -> cudaErrorInvalidResourceHandle (400). The null stream (0) is
 *   valid everywhere.
 * cudaGetErrorName names the codes this stub returns, and "unrecognized error code" for others, as the runtime does. */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;

enum {
    kSuccess = 0,
    kInvalidValue = 1,        /* cudaErrorInvalidValue */
    kMemoryAllocation = 2,    /* cudaErrorMemoryAllocation */
    kNoDevice = 100,          /* cudaErrorNoDevice */
    kInvalidDevice = 101,     /* cudaErrorInvalidDevice */
    kInvalidHandle = 400,     /* cudaErrorInvalidResourceHandle */
};
enum { kLocInvalid = 0, kLocDevice = 1, kLocHost = 2, kLocHostNuma = 3, kLocHostNumaCurrent = 4 };

struct alloc {
    uintptr_t ptr;
    size_t size;
    int device;      /* 1: cudaMalloc, 0: managed */
    size_t resident; /* managed bytes on the GPU */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static size_t device_used = 0;
static size_t managed_resident = 0;
static struct alloc *allocs = NULL;
static size_t n_allocs = 0, cap_allocs = 0;

static size_t env_size(const char *name, size_t fallback) {
    const char *v = getenv(name);
    return (v && *v) ? (size_t)strtoull(v, NULL, 10) : fallback;
}
static int version(void) { return (int)env_size("FAKE_CUDART_VERSION", 13000); }
static size_t total_bytes(void) { return env_size("FAKE_CUDART_TOTAL_BYTES", (size_t)16 << 30); }
static size_t context_bytes(void) { return env_size("FAKE_CUDART_CONTEXT_BYTES", (size_t)256 << 20); }
static int device_count(void) { return (int)env_size("FAKE_CUDART_DEVICE_COUNT", 1); }
static int concurrent_managed(void) { return (int)env_size("FAKE_CUDART_CONCURRENT_MANAGED", 1); }
static int no_device(void) { return (int)env_size("FAKE_CUDART_NO_DEVICE", 0); }

static void record(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
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

/* free memory as cudaMemGetInfo reports it; caller holds mu */
static size_t free_locked(void) {
    size_t used = context_bytes() + device_used + managed_resident;
    return used >= total_bytes() ? 0 : total_bytes() - used;
}

static void remember_locked(void *p, size_t size, int device) {
    if (n_allocs == cap_allocs) {
        cap_allocs = cap_allocs ? 2 * cap_allocs : 1024;
        allocs = realloc(allocs, cap_allocs * sizeof *allocs);
        if (!allocs) abort();
    }
    allocs[n_allocs++] = (struct alloc){(uintptr_t)p, size, device, 0};
}

/* the allocation containing address a (kind: 1 device, 0 managed, -1 either); caller holds mu */
static struct alloc *find_locked(uintptr_t a, int kind) {
    for (size_t i = 0; i < n_allocs; i++)
        if ((kind < 0 || allocs[i].device == kind) && a >= allocs[i].ptr && a < allocs[i].ptr + allocs[i].size)
            return &allocs[i];
    return NULL;
}

/* make up to `want` more bytes of `a` resident, evicting other managed allocations when free memory runs out */
static void make_resident_locked(struct alloc *a, size_t want) {
    if (want > a->size - a->resident) want = a->size - a->resident;
    size_t room = free_locked();
    for (size_t i = 0; i < n_allocs && room < want; i++) {
        struct alloc *o = &allocs[i];
        if (o == a || o->device || !o->resident) continue;
        size_t take = o->resident < want - room ? o->resident : want - room;
        o->resident -= take;
        managed_resident -= take;
        room += take;
    }
    if (want > room) want = room;
    a->resident += want;
    managed_resident += want;
}

static void make_host_locked(struct alloc *a, size_t count) {
    size_t drop = count < a->resident ? count : a->resident;
    a->resident -= drop;
    managed_resident -= drop;
}

cudaError_t cudaMalloc(void **p, size_t size) {
    if (p == NULL) return kInvalidValue;
    pthread_mutex_lock(&mu);
    cudaError_t rc = kSuccess;
    size_t max_chunk = env_size("FAKE_CUDART_MAX_CHUNK_BYTES", (size_t)-1);
    if (size > free_locked() && size <= free_locked() + managed_resident) {
        /* device allocations may evict resident managed pages (UVM gives PMA its chunks back under pressure) */
        for (size_t i = 0; i < n_allocs && size > free_locked(); i++)
            if (!allocs[i].device) make_host_locked(&allocs[i], size - free_locked());
    }
    if (size == 0) { *p = NULL; }
    else if (size > free_locked() || size > max_chunk) { *p = NULL; rc = kMemoryAllocation; }
    else {
        void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) { *p = NULL; rc = kMemoryAllocation; }
        else { *p = m; device_used += size; remember_locked(*p, size, 1); }
    }
    pthread_mutex_unlock(&mu);
    record("cudaMalloc ptr=%p size=%zu -> %d", *p, size, rc);
    return rc;
}

cudaError_t cudaMallocManaged(void **p, size_t size, unsigned int flags) {
    cudaError_t rc = kSuccess;
    if (p == NULL) return kInvalidValue;
    if (size == 0 || (flags != 0x01 && flags != 0x02)) { *p = NULL; rc = kInvalidValue; }
    else {
        *p = calloc(1, size);
        if (!*p) rc = kMemoryAllocation;
        else {
            pthread_mutex_lock(&mu);
            remember_locked(*p, size, 0);
            pthread_mutex_unlock(&mu);
        }
    }
    record("cudaMallocManaged ptr=%p size=%zu flags=%u -> %d", *p, size, flags, rc);
    return rc;
}

cudaError_t cudaFree(void *p) {
    const char *kind = "none";
    size_t size = 0;
    cudaError_t rc = kSuccess;
    if (p == NULL) {
        record("cudaFree ptr=(nil) size=0 kind=none -> 0");
        return kSuccess;
    }
    pthread_mutex_lock(&mu);
    struct alloc *a = NULL;
    for (size_t i = 0; i < n_allocs; i++)
        if (allocs[i].ptr == (uintptr_t)p) { a = &allocs[i]; break; }
    if (a == NULL) rc = kInvalidValue; /* never allocated here, or already freed */
    else {
        kind = a->device ? "device" : "managed";
        size = a->size;
        if (a->device) device_used -= size;
        else managed_resident -= a->resident;
        *a = allocs[--n_allocs];
    }
    pthread_mutex_unlock(&mu);
    if (rc == kSuccess) {
        if (strcmp(kind, "device") == 0) munmap(p, size);
        else free(p);
        size_t delay = env_size("FAKE_CUDART_FREE_DELAY_US", 0); /* widens the window after the memory is released */
        if (delay) usleep((useconds_t)delay);
    }
    record("cudaFree ptr=%p size=%zu kind=%s -> %d", p, size, kind, rc);
    return rc;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    if (free_b == NULL || total_b == NULL) return kInvalidValue;
    pthread_mutex_lock(&mu);
    *total_b = total_bytes();
    *free_b = free_locked();
    pthread_mutex_unlock(&mu);
    record("cudaMemGetInfo free=%zu total=%zu -> 0", *free_b, *total_b);
    return kSuccess;
}

cudaError_t cudaGetDevice(int *device) { *device = (int)env_size("FAKE_CUDART_DEVICE", 0); return kSuccess; }
cudaError_t cudaGetDeviceCount(int *count) {
    if (no_device()) { *count = 0; return kNoDevice; }
    *count = device_count();
    return kSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) { *v = version(); return kSuccess; }
/* The driver's CUDA version (FAKE_CUDART_DRIVER_VERSION, default the runtime's; 0 = no driver, as the real call
 * answers without one). */
cudaError_t cudaDriverGetVersion(int *v) { *v = (int)env_size("FAKE_CUDART_DRIVER_VERSION", (size_t)version()); return kSuccess; }

/* cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device): see the header comment. */
cudaError_t cudaDeviceGetAttribute(int *value, int attr, int device) {
    cudaError_t rc = kSuccess;
    int cc = (int)env_size("FAKE_CUDART_CC", 80);
    if (no_device()) rc = kNoDevice;
    else if (device < 0 || device >= device_count()) rc = kInvalidDevice;
    else if (attr == 75) *value = cc / 10;
    else if (attr == 76) *value = cc % 10;
    else if (attr == 83) *value = 1;
    else if (attr == 88) *value = (int)env_size("FAKE_CUDART_PAGEABLE_ACCESS", 0);
    else if (attr == 89) *value = concurrent_managed();
    else if (attr == 100 || attr == 101) *value = (int)env_size("FAKE_CUDART_ATS", 0);
    else rc = kInvalidValue;
    record("cudaDeviceGetAttribute attr=%d device=%d value=%d -> %d", attr, device, rc ? -1 : *value, rc);
    return rc;
}

/* cudaSuccess when [p, p + count) may be advised or prefetched (see the header comment), else cudaErrorInvalidValue.
 * Managed ranges are looked up first; a range inside device memory is refused. */
static cudaError_t hint_range_ok(const void *p, size_t count) {
    uintptr_t a = (uintptr_t)p;
    cudaError_t rc = kInvalidValue;
    pthread_mutex_lock(&mu);
    struct alloc *m = find_locked(a, 0);
    int found = m != NULL;
    if (m) rc = (count <= m->ptr + m->size - a) ? kSuccess : kInvalidValue;
    else if (find_locked(a, 1)) found = 1; /* device memory: rc stays cudaErrorInvalidValue */
    pthread_mutex_unlock(&mu);
    if (!found && p != NULL && env_size("FAKE_CUDART_PAGEABLE_ACCESS", 0)) rc = kSuccess; /* system-allocated memory */
    return rc;
}

/* the device-location rule shared by cudaMemAdvise (advice 3 and 5) and cudaMemPrefetchAsync */
static cudaError_t location_ok(int type, int id) {
    if (type == kLocDevice) {
        if (id < 0 || id >= device_count()) return kInvalidDevice;
        if (!concurrent_managed()) return kInvalidDevice;
        return kSuccess;
    }
    if (type == kLocHost || type == kLocHostNuma || type == kLocHostNumaCurrent) return kSuccess;
    return kInvalidValue; /* cudaMemLocationTypeInvalid (0) or unknown */
}

/* CUDA 12: an int device, cudaCpuDeviceId (-1) the host */
static cudaError_t device12_ok(int device) {
    if (device == -1) return kSuccess;
    if (device < 0 || device >= device_count()) return kInvalidDevice;
    if (!concurrent_managed()) return kInvalidDevice;
    return kSuccess;
}

/* CUDA 13: (ptr, count, advice, struct cudaMemLocation loc); CUDA 12: (ptr, count, advice, int device). */
cudaError_t cudaMemAdvise(const void *p, size_t count, int advice, uint64_t loc) {
    int type = (int)(uint32_t)(loc & 0xffffffffu), id = (int)(uint32_t)(loc >> 32);
    cudaError_t rc = kSuccess;
    if (advice < 1 || advice > 6) rc = kInvalidValue;
    else if (advice == 3 || advice == 5) rc = version() >= 13000 ? location_ok(type, id) : device12_ok((int)(uint32_t)loc);
    if (rc == kSuccess) rc = hint_range_ok(p, count);
    if (version() >= 13000)
        record("cudaMemAdvise ptr=%p size=%zu advice=%d loc_type=%d loc_id=%d -> %d", p, count, advice, type, id, rc);
    else
        record("cudaMemAdvise ptr=%p size=%zu advice=%d device=%d -> %d", p, count, advice, (int)(uint32_t)loc, rc);
    return rc;
}

static void prefetch_residency(const void *p, size_t count, int to_device) {
    pthread_mutex_lock(&mu);
    struct alloc *m = find_locked((uintptr_t)p, 0);
    if (m) {
        if (to_device) make_resident_locked(m, count);
        else make_host_locked(m, count);
    }
    pthread_mutex_unlock(&mu);
}

/* CUDA 13: (ptr, count, struct cudaMemLocation loc, unsigned flags, stream); CUDA 12: (ptr, count, int dev, stream) */
cudaError_t cudaMemPrefetchAsync(const void *p, size_t count, uint64_t a3, uint64_t a4, uint64_t a5) {
    cudaError_t rc;
    if (version() >= 13000) {
        int type = (int)(uint32_t)(a3 & 0xffffffffu), id = (int)(uint32_t)(a3 >> 32);
        unsigned flags = (unsigned)a4;
        rc = flags != 0 ? kInvalidValue : location_ok(type, id);
        if (rc == kSuccess) rc = hint_range_ok(p, count);
        if (rc == kSuccess) prefetch_residency(p, count, type == kLocDevice);
        record("cudaMemPrefetchAsync ptr=%p size=%zu loc_type=%d loc_id=%d flags=%u stream=%p -> %d", p, count, type,
               id, flags, (void *)a5, rc);
    } else {
        int device = (int)(uint32_t)a3;
        rc = device12_ok(device);
        if (rc == kSuccess) rc = hint_range_ok(p, count);
        if (rc == kSuccess) prefetch_residency(p, count, device >= 0);
        record("cudaMemPrefetchAsync ptr=%p size=%zu device=%d stream=%p -> %d", p, count, device, (void *)a4, rc);
    }
    return rc;
}

/* The stub's own export (not a CUDA function): a "kernel" touches [p, p + count) on the GPU, as real first touches
 * fault managed pages in. Returns 0, or cudaErrorInvalidValue outside managed memory. */
int fake_cudart_gpu_touch(const void *p, size_t count) {
    pthread_mutex_lock(&mu);
    struct alloc *m = find_locked((uintptr_t)p, 0);
    if (m) make_resident_locked(m, count);
    pthread_mutex_unlock(&mu);
    record("fake_cudart_gpu_touch ptr=%p size=%zu -> %d", p, count, m ? 0 : 1);
    return m ? 0 : kInvalidValue;
}

/* The first four members of struct cudaPointerAttributes (CUDA 12 and 13 driver_types.h; CUDA 13 appends
 * long reserved[8]): only these are written, so a caller's CUDA 12-sized struct is never overrun. */
struct fake_pointer_attributes { int type; int device; void *devicePointer; void *hostPointer; };

cudaError_t cudaPointerGetAttributes(struct fake_pointer_attributes *attr, const void *p) {
    cudaError_t rc = kSuccess;
    int type = 0; /* cudaMemoryTypeUnregistered */
    if (attr == NULL) rc = kInvalidValue;
    else if (no_device()) rc = kNoDevice;
    else {
        pthread_mutex_lock(&mu);
        if (find_locked((uintptr_t)p, 0)) type = 3;      /* cudaMemoryTypeManaged */
        else if (find_locked((uintptr_t)p, 1)) type = 2; /* cudaMemoryTypeDevice */
        pthread_mutex_unlock(&mu);
        attr->type = type;
        attr->device = type ? (int)env_size("FAKE_CUDART_DEVICE", 0) : -1; /* no device: the header leaves it undefined */
        attr->devicePointer = type ? (void *)p : NULL;
        attr->hostPointer = type == 3 ? (void *)p : NULL;
    }
    record("cudaPointerGetAttributes ptr=%p type=%d -> %d", p, rc ? -1 : type, rc);
    return rc;
}

/* ---- streams and events: opaque tokens (the header comment) ---------------------------------------------------- */
#define MAX_HANDLES 4096
static void *handles[MAX_HANDLES];
static int handle_kind[MAX_HANDLES]; /* 1 stream, 2 event */

static void *new_handle(int kind) {
    pthread_mutex_lock(&mu);
    void *h = NULL;
    for (int i = 0; i < MAX_HANDLES; i++)
        if (handles[i] == NULL) { h = handles[i] = malloc(16); handle_kind[i] = kind; break; }
    pthread_mutex_unlock(&mu);
    return h;
}
static int valid_handle(void *h, int kind) {
    if (h == NULL) return kind == 1; /* the null stream */
    int ok = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_HANDLES; i++)
        if (handles[i] == h && handle_kind[i] == kind) { ok = 1; break; }
    pthread_mutex_unlock(&mu);
    return ok;
}
static cudaError_t drop_handle(void *h, int kind) {
    cudaError_t rc = kInvalidHandle;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_HANDLES; i++)
        if (h != NULL && handles[i] == h && handle_kind[i] == kind) { free(h); handles[i] = NULL; rc = kSuccess; break; }
    pthread_mutex_unlock(&mu);
    return rc;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    if (s == NULL || flags > 1) return kInvalidValue; /* cudaStreamDefault 0, cudaStreamNonBlocking 1 */
    *s = new_handle(1);
    record("cudaStreamCreateWithFlags stream=%p flags=%u -> 0", *s, flags);
    return kSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    cudaError_t rc = drop_handle(s, 1);
    record("cudaStreamDestroy stream=%p -> %d", s, rc);
    return rc;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    if (e == NULL || flags > 0x0f) return kInvalidValue;
    *e = new_handle(2);
    record("cudaEventCreateWithFlags event=%p flags=%u -> 0", *e, flags);
    return kSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    cudaError_t rc = drop_handle(e, 2);
    record("cudaEventDestroy event=%p -> %d", e, rc);
    return rc;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    cudaError_t rc = valid_handle(e, 2) && valid_handle(s, 1) ? kSuccess : kInvalidHandle;
    record("cudaEventRecord event=%p stream=%p -> %d", e, s, rc);
    return rc;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    cudaError_t rc = valid_handle(e, 2) && valid_handle(s, 1) ? kSuccess : kInvalidHandle;
    if (rc == kSuccess && flags > 1) rc = kInvalidValue;
    record("cudaStreamWaitEvent stream=%p event=%p flags=%u -> %d", s, e, flags, rc);
    return rc;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    cudaError_t rc = valid_handle(s, 1) ? kSuccess : kInvalidHandle;
    record("cudaStreamSynchronize stream=%p -> %d", s, rc);
    return rc;
}
cudaError_t cudaDeviceSynchronize(void) {
    record("cudaDeviceSynchronize -> 0");
    return kSuccess;
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
    case 400: return "cudaErrorInvalidResourceHandle";
    default: return "unrecognized error code";
    }
}
