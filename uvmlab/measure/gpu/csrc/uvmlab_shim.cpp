// uvmlab_shim: turn the CUDA runtime's cudaMalloc into cudaMallocManaged, without rebuilding PyTorch.
//
// Loaded with LD_PRELOAD in front of a program that uses the CUDA runtime (PyTorch's libc10_cuda.so links
// cudaMalloc@libcudart.so.13; an unversioned definition in a preloaded object satisfies that versioned
// reference, so this one wins). The real functions are found with dlsym(RTLD_NEXT), falling back to the
// libcudart that is already loaded (found with dl_iterate_phdr) when the runtime sits in a RTLD_LOCAL scope
// (Python extension modules are dlopen'ed RTLD_LOCAL). No CUDA header or library is needed to build it:
// the few types, signatures and enum values used are declared in uvmlab_cuda_abi.h (values from CUDA 13.0
// driver_types.h), which tests/test_gpu_shim_headers.py checks against the real CUDA 13 (and 12) headers.
//
// Environment (read once, at load):
//   UVMLAB_SHIM_MODE          managed (default): cudaMalloc -> cudaMallocManaged(ptr, size, cudaMemAttachGlobal)
//                             passthrough: cudaMalloc stays cudaMalloc (baseline runs; the log still records)
//   UVMLAB_ADVISE             comma list of preferred_location_gpu, preferred_location_cpu, accessed_by,
//                             read_mostly: cudaMemAdvise issued on every managed allocation
//   UVMLAB_PREFETCH           off (default) | on_alloc: cudaMemPrefetchAsync(ptr, size, device, stream 0)
//                             after every managed allocation; uvmlab_prefetch_on_alloc(on) switches it at run
//                             time (a program's uvm.prefetch_new_allocations: the variable is read once, at load)
//   UVMLAB_BALLOON_BYTES      reserve this many bytes of device memory with the REAL cudaMalloc
//   UVMLAB_BALLOON_LEAVE_BYTES  or: reserve (free - this) bytes, free measured with the real cudaMemGetInfo
//                             (rounded down to 2 MiB). The balloon is inflated at the first intercepted call
//                             (the process's CUDA runtime is loaded by then), or by uvmlab_balloon(); it is
//                             released at exit (atexit, registered after the runtime's own handlers).
//                             When free memory is already at or below what to leave, no balloon is taken: the
//                             shim says so on stderr (always) and logs a balloon_alloc record of size 0.
//   UVMLAB_BALLOON_DEFER      1: do not take the balloon at the first intercepted call; the program takes it by
//                             calling uvmlab_balloon_take() (the GPU worker does after a warm-up iteration, so that
//                             lazily loaded modules, library handles and workspaces exist before the balloon is
//                             measured): every live managed range is prefetched to the host first, so that the free
//                             memory the balloon is computed from holds no managed page.
//   UVMLAB_REPORT_FREE_BYTES  N: the interposed cudaMemGetInfo answers free = min(N, the real total) (total unchanged),
//                             so that PyTorch's cuDNN workspace limit (CUDACachingAllocator cacheInfo's first guess is
//                             cudaMemGetInfo's free) is the same in the runs a comparison pairs; unset: cudaMemGetInfo
//                             passes through. uvmlab_real_mem_get_info() always answers the real figures.
//   UVMLAB_BALLOON_CLAIM      path of a file the shim creates (O_EXCL) before taking the balloon: only the first
//                             process of a step that allocates takes it; later ones (children inherit LD_PRELOAD)
//                             find the file and do not, and say so on stderr (always). The shim never changes the
//                             environment (no setenv: other threads may be reading it).
//   UVMLAB_ALLOC_LOG          append one binary record per intercepted call to this file ("%p" -> pid);
//                             buffered, flushed when the buffer fills, by uvmlab_flush_log(), and at exit.
//   UVMLAB_CUDART             path of the CUDA runtime to use when no loaded one is found
//   UVMLAB_SHIM_VERBOSE       1: one line per balloon/resolution event on stderr
//
// Log format (little endian), version 1; parsed by uvmlab.measure.gpu.shim.read_alloc_log:
//   header  64 bytes: char magic[8] = "UVMLBLOG"; u32 version = 1; u32 record_bytes = 56;
//           i64 monotonic_ns_at_load; i64 realtime_ns_at_load (same instant); 32 bytes zero
//   record  56 bytes: i64 t_ns (CLOCK_MONOTONIC at call start); i64 dur_ns (real call duration);
//           u64 ptr; u64 size; i64 arg (op-specific: flags, advice, device); i32 pid; u16 op; u16 reserved;
//           i32 result (cudaError_t); u32 reserved
// Ops: see enum Op below (the Python parser has the same table).

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "uvmlab_cuda_abi.h"

namespace {

// ---- the CUDA runtime types we need (uvmlab_cuda_abi.h: checked against the real headers by a test) -------------
using namespace uvmlab_abi;
constexpr size_t kTwoMiB = size_t(2) << 20;  // balloon rounding: UVM's VA block / root chunk size

typedef cudaMalloc_fn MallocFn;
typedef cudaMallocManaged_fn MallocManagedFn;
typedef cudaFree_fn FreeFn;
typedef cudaMemGetInfo_fn MemGetInfoFn;
typedef cudaGetDevice_fn GetDeviceFn;
typedef cudaRuntimeGetVersion_fn RuntimeGetVersionFn;
typedef cudaMemAdvise_fn13 Advise13Fn;
typedef cudaMemAdvise_fn12 Advise12Fn;
typedef cudaMemPrefetchAsync_fn13 Prefetch13Fn;
typedef cudaMemPrefetchAsync_fn12 Prefetch12Fn;

enum Op : uint16_t {
  OP_MALLOC = 1,           // intercepted cudaMalloc served by cudaMallocManaged (arg = flags)
  OP_FREE = 2,             // cudaFree passed through
  OP_MALLOC_DEVICE = 3,    // intercepted cudaMalloc served by the real cudaMalloc (passthrough mode, size 0)
  OP_BALLOON_ALLOC = 4,    // balloon piece, real cudaMalloc (arg = free bytes measured before, or -1)
  OP_BALLOON_FREE = 5,     // balloon piece released at exit
  OP_ADVISE = 6,           // cudaMemAdvise (arg = advice * 1000 + device; device -1 = CPU)
  OP_PREFETCH = 7,         // cudaMemPrefetchAsync (arg = device)
  OP_PLUGGABLE_MALLOC = 8, // uvmlab_malloc (CUDAPluggableAllocator) (arg = device)
  OP_PLUGGABLE_FREE = 9,   // uvmlab_free (arg = device)
};

// ---- configuration ------------------------------------------------------------------------------------------------
struct Config {
  bool managed = true;
  bool advise_pref_gpu = false, advise_pref_cpu = false, advise_accessed_by = false, advise_read_mostly = false;
  std::atomic<bool> prefetch_on_alloc{false};  // also switched at run time by uvmlab_prefetch_on_alloc()
  long long balloon_bytes = -1;        // -1: not set
  long long balloon_leave_bytes = -1;  // -1: not set
  bool balloon_defer = false;          // UVMLAB_BALLOON_DEFER=1: taken by uvmlab_balloon_take()
  long long report_free_bytes = -1;    // UVMLAB_REPORT_FREE_BYTES (-1: cudaMemGetInfo passes through)
  std::string balloon_claim;          // UVMLAB_BALLOON_CLAIM ("" = no claim file)
  std::string log_path;              // set once at parse time, never changed afterwards
  std::atomic<bool> log_on{false};   // false when unset or when the file cannot be opened
  std::string cudart_path;
  bool verbose = false;
  int64_t load_monotonic_ns = 0;  // clocks when the configuration was read (the shim's load): the log header
  int64_t load_realtime_ns = 0;
};

// Every global below is a leaky singleton built on first use: the shim may be called before C++ dynamic
// initialisation of this object has run, or after static destructors have (other threads still freeing at exit).
Config& cfg_instance();
#define g_cfg (cfg_instance())

[[noreturn]] void die_config(const char* var, const char* value, const char* expected) {
  fprintf(stderr, "uvmlab shim: %s=%s is not valid (expected %s); fix the variable or unset it\n", var, value,
          expected);
  fflush(stderr);
  _exit(2);
}

long long parse_size(const char* var, const char* text) {
  if (text == nullptr || *text == '\0') return -1;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-') die_config(var, text, "a whole number of bytes");
  return static_cast<long long>(v);
}

void parse_config(Config& c) {
  const char* mode = getenv("UVMLAB_SHIM_MODE");
  if (mode != nullptr && *mode != '\0') {
    if (strcmp(mode, "managed") == 0) c.managed = true;
    else if (strcmp(mode, "passthrough") == 0) c.managed = false;
    else die_config("UVMLAB_SHIM_MODE", mode, "managed or passthrough");
  }
  const char* advise = getenv("UVMLAB_ADVISE");
  if (advise != nullptr && *advise != '\0') {
    std::string s(advise);
    size_t start = 0;
    while (start <= s.size()) {
      size_t comma = s.find(',', start);
      std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (item == "preferred_location_gpu") c.advise_pref_gpu = true;
      else if (item == "preferred_location_cpu") c.advise_pref_cpu = true;
      else if (item == "accessed_by") c.advise_accessed_by = true;
      else if (item == "read_mostly") c.advise_read_mostly = true;
      else if (item != "none" && !item.empty())  // "none" and empty items ask for nothing
        die_config("UVMLAB_ADVISE", advise,
                   "a comma list of preferred_location_gpu, preferred_location_cpu, accessed_by, read_mostly");
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (c.advise_pref_gpu && c.advise_pref_cpu)
      die_config("UVMLAB_ADVISE", advise, "at most one preferred location");
  }
  const char* prefetch = getenv("UVMLAB_PREFETCH");
  if (prefetch != nullptr && *prefetch != '\0') {
    if (strcmp(prefetch, "on_alloc") == 0) c.prefetch_on_alloc = true;
    else if (strcmp(prefetch, "off") == 0) c.prefetch_on_alloc = false;
    else die_config("UVMLAB_PREFETCH", prefetch, "off or on_alloc");
  }
  c.balloon_bytes = parse_size("UVMLAB_BALLOON_BYTES", getenv("UVMLAB_BALLOON_BYTES"));
  c.balloon_leave_bytes = parse_size("UVMLAB_BALLOON_LEAVE_BYTES", getenv("UVMLAB_BALLOON_LEAVE_BYTES"));
  const char* defer = getenv("UVMLAB_BALLOON_DEFER");
  if (defer != nullptr && *defer != '\0') {
    if (strcmp(defer, "1") == 0) c.balloon_defer = true;
    else if (strcmp(defer, "0") != 0) die_config("UVMLAB_BALLOON_DEFER", defer, "0 or 1");
  }
  c.report_free_bytes = parse_size("UVMLAB_REPORT_FREE_BYTES", getenv("UVMLAB_REPORT_FREE_BYTES"));
  const char* claim = getenv("UVMLAB_BALLOON_CLAIM");
  if (claim != nullptr) c.balloon_claim = claim;
  if (c.balloon_bytes >= 0 && c.balloon_leave_bytes >= 0)
    die_config("UVMLAB_BALLOON_LEAVE_BYTES", getenv("UVMLAB_BALLOON_LEAVE_BYTES"),
               "to be unset when UVMLAB_BALLOON_BYTES is set (give one of the two)");
  const char* log = getenv("UVMLAB_ALLOC_LOG");
  if (log != nullptr && *log != '\0') {
    std::string p(log);
    size_t at = p.find("%p");
    if (at != std::string::npos) p.replace(at, 2, std::to_string(getpid()));
    c.log_path = p;
    c.log_on.store(true);
  }
  const char* cudart = getenv("UVMLAB_CUDART");
  if (cudart != nullptr) c.cudart_path = cudart;
  const char* verbose = getenv("UVMLAB_SHIM_VERBOSE");
  c.verbose = verbose != nullptr && strcmp(verbose, "1") == 0;
}

int64_t now_ns(clockid_t clock);

Config& cfg_instance() {
  static Config* c = [] {
    auto* fresh = new Config();
    parse_config(*fresh);
    fresh->load_monotonic_ns = now_ns(CLOCK_MONOTONIC);
    fresh->load_realtime_ns = now_ns(CLOCK_REALTIME);
    return fresh;
  }();
  return *c;
}

int64_t now_ns(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// ---- the allocation log ---------------------------------------------------------------------------------------------
#pragma pack(push, 1)
struct LogHeader {
  char magic[8];
  uint32_t version;
  uint32_t record_bytes;
  int64_t monotonic_ns;
  int64_t realtime_ns;
  uint8_t zero[32];
};
struct LogRecord {
  int64_t t_ns;
  int64_t dur_ns;
  uint64_t ptr;
  uint64_t size;
  int64_t arg;
  int32_t pid;
  uint16_t op;
  uint16_t reserved0;
  int32_t result;
  uint32_t reserved1;
};
#pragma pack(pop)
static_assert(sizeof(LogHeader) == 64, "log header is 64 bytes");
static_assert(sizeof(LogRecord) == 56, "log record is 56 bytes");

constexpr size_t kLogBufferRecords = 1024;  // 56 KiB; flushed when full

// getpid() is a system call (expensive in sandboxes); cached here and refreshed in a forked child.
std::atomic<int32_t> g_pid{static_cast<int32_t>(getpid())};

class AllocLog {
 public:
  void record(Op op, int64_t t_ns, int64_t dur_ns, const void* ptr, size_t size, int64_t arg, cudaError_t result) {
    if (!g_cfg.log_on.load(std::memory_order_relaxed)) return;
    LogRecord r{};
    r.t_ns = t_ns;
    r.dur_ns = dur_ns;
    r.ptr = reinterpret_cast<uint64_t>(ptr);
    r.size = size;
    r.arg = arg;
    r.pid = g_pid.load(std::memory_order_relaxed);
    r.op = op;
    r.result = result;
    std::lock_guard<std::mutex> lock(mu_);
    buf_.push_back(r);
    if (buf_.size() >= kLogBufferRecords) flush_locked();
  }
  void flush() {
    std::lock_guard<std::mutex> lock(mu_);
    flush_locked();
  }
  // fork(): held across the fork; the child must not write the parent's buffered records a second time.
  void lock_for_fork() { mu_.lock(); }
  void unlock_after_fork(bool child) {
    if (child) buf_.clear();
    mu_.unlock();
  }

 private:
  void open_locked() {
    // Opened lazily (at the first flush): processes that never allocate (e.g. the nsys launcher, which inherits
    // LD_PRELOAD) never create or touch the file. O_APPEND: records of several processes never overwrite.
    fd_ = open(g_cfg.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      fprintf(stderr, "uvmlab shim: cannot open UVMLAB_ALLOC_LOG %s: %s; allocation log disabled\n",
              g_cfg.log_path.c_str(), strerror(errno));
      g_cfg.log_on.store(false);
      return;
    }
    flock(fd_, LOCK_EX);
    struct stat st;
    if (fstat(fd_, &st) == 0 && st.st_size == 0) {
      LogHeader h{};
      memcpy(h.magic, "UVMLBLOG", 8);
      h.version = 1;
      h.record_bytes = sizeof(LogRecord);
      h.monotonic_ns = g_cfg.load_monotonic_ns;
      h.realtime_ns = g_cfg.load_realtime_ns;
      write_all(&h, sizeof h);
    }
    flock(fd_, LOCK_UN);
  }
  void flush_locked() {
    if (buf_.empty()) return;
    if (fd_ < 0) open_locked();
    if (fd_ >= 0) write_all(buf_.data(), buf_.size() * sizeof(LogRecord));
    buf_.clear();
  }
  void write_all(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return;
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  std::mutex mu_;
  std::vector<LogRecord> buf_;
  int fd_ = -1;
};

AllocLog& log_instance() {
  static AllocLog* l = new AllocLog();
  return *l;
}
#define g_log (log_instance())

// CLOCK_MONOTONIC when the allocation log is on, else 0 (no clock reads when nothing is recorded).
inline int64_t log_clock() { return g_cfg.log_on.load(std::memory_order_relaxed) ? now_ns(CLOCK_MONOTONIC) : 0; }

// ---- resolving the real runtime -------------------------------------------------------------------------------------
struct Real {
  MallocFn malloc = nullptr;
  MallocManagedFn malloc_managed = nullptr;
  FreeFn free = nullptr;
  MemGetInfoFn mem_get_info = nullptr;
  GetDeviceFn get_device = nullptr;
  RuntimeGetVersionFn runtime_get_version = nullptr;
  void* mem_advise = nullptr;
  void* mem_prefetch_async = nullptr;
  cudaDeviceSynchronize_fn device_synchronize = nullptr;
  int runtime_version = 0;
  std::string library;  // path of the object that provides cudaMalloc
};

Real& real_instance() {
  static Real* r = new Real();
  return *r;
}
#define g_real (real_instance())
std::once_flag g_resolve_once;
bool g_resolved = false;

// True when `path`'s file name is libcudart.so or libcudart.so.<digits>[.<digits>...]: the runtime, not any path
// that merely contains the string (a folder named libcudart.so.d, a libcudart.so.bak, libcudart.so_wrapper.so).
bool is_cudart_path(const char* path) {
  if (path == nullptr) return false;
  const char* base = strrchr(path, '/');
  base = base == nullptr ? path : base + 1;
  static const char kPrefix[] = "libcudart.so";
  if (strncmp(base, kPrefix, sizeof kPrefix - 1) != 0) return false;
  const char* rest = base + sizeof kPrefix - 1;
  while (*rest == '.') {
    ++rest;
    if (*rest < '0' || *rest > '9') return false;
    while (*rest >= '0' && *rest <= '9') ++rest;
  }
  return *rest == '\0';
}

int find_cudart_cb(dl_phdr_info* info, size_t, void* data) {
  const char* name = info->dlpi_name;
  if (is_cudart_path(name)) {
    *static_cast<std::string*>(data) = name;
    return 1;
  }
  return 0;
}

bool is_self(void* fn) {
  Dl_info self{}, other{};
  if (fn == nullptr) return false;
  if (dladdr(reinterpret_cast<void*>(&find_cudart_cb), &self) == 0) return false;
  if (dladdr(fn, &other) == 0) return false;
  return self.dli_fbase == other.dli_fbase;
}

void* lookup(void* handle, const char* name) {
  void* p = handle == nullptr ? dlsym(RTLD_NEXT, name) : dlsym(handle, name);
  return is_self(p) ? nullptr : p;
}

void resolve_all() {
  void* handle = nullptr;
  bool next_ok = lookup(nullptr, "cudaMallocManaged") != nullptr;
  if (!next_ok) {
    // The runtime is not in our global search scope (dlopen'ed RTLD_LOCAL): use the loaded copy.
    std::string loaded;
    dl_iterate_phdr(find_cudart_cb, &loaded);
    if (!loaded.empty()) handle = dlopen(loaded.c_str(), RTLD_NOLOAD | RTLD_LAZY);
    if (handle == nullptr && !g_cfg.cudart_path.empty()) handle = dlopen(g_cfg.cudart_path.c_str(), RTLD_LAZY);
    if (handle == nullptr) return;
  }
  g_real.malloc = reinterpret_cast<MallocFn>(lookup(handle, "cudaMalloc"));
  g_real.malloc_managed = reinterpret_cast<MallocManagedFn>(lookup(handle, "cudaMallocManaged"));
  g_real.free = reinterpret_cast<FreeFn>(lookup(handle, "cudaFree"));
  g_real.mem_get_info = reinterpret_cast<MemGetInfoFn>(lookup(handle, "cudaMemGetInfo"));
  g_real.get_device = reinterpret_cast<GetDeviceFn>(lookup(handle, "cudaGetDevice"));
  g_real.runtime_get_version = reinterpret_cast<RuntimeGetVersionFn>(lookup(handle, "cudaRuntimeGetVersion"));
  g_real.mem_advise = lookup(handle, "cudaMemAdvise");
  g_real.mem_prefetch_async = lookup(handle, "cudaMemPrefetchAsync");
  g_real.device_synchronize = reinterpret_cast<cudaDeviceSynchronize_fn>(lookup(handle, "cudaDeviceSynchronize"));
  if (g_real.runtime_get_version != nullptr) g_real.runtime_get_version(&g_real.runtime_version);
  Dl_info info{};
  if (g_real.malloc != nullptr && dladdr(reinterpret_cast<void*>(g_real.malloc), &info) != 0 && info.dli_fname)
    g_real.library = info.dli_fname;
  g_resolved = g_real.malloc != nullptr && g_real.malloc_managed != nullptr && g_real.free != nullptr;
  if (g_cfg.verbose)
    fprintf(stderr, "uvmlab shim: real CUDA runtime %s (version %d)%s\n", g_real.library.c_str(),
            g_real.runtime_version, handle != nullptr ? " found among loaded objects" : " via RTLD_NEXT");
}

bool resolve() {
  std::call_once(g_resolve_once, resolve_all);
  return g_resolved;
}

// ---- the balloon ------------------------------------------------------------------------------------------------------
struct Balloon {
  std::mutex mu;
  std::vector<std::pair<void*, size_t>> pieces;
};
Balloon& balloon_instance() {
  static Balloon* b = new Balloon();
  return *b;
}
#define g_balloon_mu (balloon_instance().mu)
#define g_balloon (balloon_instance().pieces)
std::atomic<bool> g_balloon_env_done{false};
bool g_atexit_registered = false;

void release_balloon() {
  std::lock_guard<std::mutex> lock(g_balloon_mu);
  for (auto& piece : g_balloon) {
    int64_t t0 = log_clock();
    cudaError_t rc = g_real.free != nullptr ? g_real.free(piece.first) : kCudaErrorInitializationError;
    g_log.record(OP_BALLOON_FREE, t0, log_clock() - t0, piece.first, piece.second, -1, rc);
  }
  g_balloon.clear();
}

void at_exit() {
  release_balloon();
  g_log.flush();
}

// True when the runtime says `bytes` are free: a balloon piece that failed although they are (fragmentation, memory
// not yet returned) is retried smaller; a request larger than the free memory is not (it cannot fit at all).
bool fits_free(size_t bytes) {
  size_t free_b = 0, total_b = 0;
  return g_real.mem_get_info != nullptr && g_real.mem_get_info(&free_b, &total_b) == kCudaSuccess && bytes <= free_b;
}

// Reserve `bytes` with the real cudaMalloc; measured_free is logged (-1 if not measured).
cudaError_t inflate(size_t bytes, int64_t measured_free) {
  if (!resolve()) return kCudaErrorInitializationError;
  if (bytes == 0) return kCudaSuccess;
  std::lock_guard<std::mutex> lock(g_balloon_mu);
  if (!g_atexit_registered) {
    // Registered now, after the CUDA runtime registered its own handlers, so ours runs before the runtime unloads.
    atexit(at_exit);
    g_atexit_registered = true;
  }
  // One cudaMalloc of the whole balloon first; when the device cannot give one range that large
  // (cudaErrorMemoryAllocation: fragmented memory, or memory freed but not yet back), the rest is taken in pieces,
  // halved down to 2 MiB, each logged; the balloon is then the sum of the pieces that succeeded.
  size_t left = bytes / kTwoMiB * kTwoMiB;
  if (left == 0) left = bytes;
  size_t piece = left;
  cudaError_t first_rc = kCudaSuccess;
  bool first = true;
  while (left > 0 && piece > 0) {
    void* p = nullptr;
    size_t ask = piece < left ? piece : left;
    int64_t t0 = log_clock();
    cudaError_t rc = g_real.malloc(&p, ask);
    g_log.record(OP_BALLOON_ALLOC, t0, log_clock() - t0, p, ask, first ? measured_free : -1, rc);
    if (first) first_rc = rc;
    first = false;
    if (g_cfg.verbose) fprintf(stderr, "uvmlab shim: balloon piece of %zu bytes -> error %d\n", ask, rc);
    if (rc == kCudaSuccess) {
      g_balloon.emplace_back(p, ask);
      left -= ask;
    } else if (rc == kCudaErrorMemoryAllocation && ask > kTwoMiB && fits_free(left)) {
      piece = ask / 2 / kTwoMiB * kTwoMiB;
      if (piece == 0) piece = kTwoMiB;
    } else {
      break;
    }
  }
  size_t held = 0;
  for (auto& pc : g_balloon) held += pc.second;
  if (left > 0 && held > 0)
    fprintf(stderr, "uvmlab shim: WARNING: the balloon holds %zu of the %zu bytes asked (the device gave no more)\n",
            held, bytes);
  return held > 0 ? kCudaSuccess : first_rc;
}

cudaError_t inflate_leaving(size_t leave_bytes) {
  if (!resolve()) return kCudaErrorInitializationError;
  if (g_real.mem_get_info == nullptr) return kCudaErrorInitializationError;
  size_t free_b = 0, total_b = 0;
  cudaError_t rc = g_real.mem_get_info(&free_b, &total_b);
  if (rc != kCudaSuccess) return rc;
  size_t bytes = free_b > leave_bytes ? (free_b - leave_bytes) / kTwoMiB * kTwoMiB : 0;
  if (bytes == 0) {
    // Nothing to take: the run gets less (or, within 2 MiB, exactly) the capacity asked for. Said always, and
    // logged as a balloon record of 0 bytes so that the run's result can say it too.
    g_log.record(OP_BALLOON_ALLOC, log_clock(), 0, nullptr, 0, static_cast<int64_t>(free_b), kCudaSuccess);
    fprintf(stderr,
            "uvmlab shim: WARNING: only %zu bytes are free, not more than the %zu to leave: no balloon; UVM gets "
            "%zu bytes, not the capacity asked for\n",
            free_b, leave_bytes, free_b);
    fflush(stderr);
    return kCudaSuccess;
  }
  return inflate(bytes, static_cast<int64_t>(free_b));
}

// True if this process may take the step's balloon: no claim file configured, or this process created it first.
bool claim_balloon() {
  if (g_cfg.balloon_claim.empty()) return true;
  int fd = open(g_cfg.balloon_claim.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) {
      // Said always (not only when verbose): a stale claim file from another run would silently cost the balloon.
      fprintf(stderr,
              "uvmlab shim: %s exists: another process of this step holds the balloon, so process %d takes "
              "none\n",
              g_cfg.balloon_claim.c_str(), static_cast<int>(getpid()));
      fflush(stderr);
      return false;
    }
    fprintf(stderr, "uvmlab shim: cannot create UVMLAB_BALLOON_CLAIM %s: %s; taking the balloon anyway\n",
            g_cfg.balloon_claim.c_str(), strerror(errno));
    return true;
  }
  std::string pid = std::to_string(getpid()) + "\n";
  ssize_t w = write(fd, pid.data(), pid.size());
  (void)w;
  close(fd);
  return true;
}

// The balloon requested by the environment, once, before the first managed allocation.
void balloon_from_env() {
  if (g_balloon_env_done.load(std::memory_order_acquire)) return;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (g_balloon_env_done.load(std::memory_order_relaxed)) return;
  if (g_cfg.balloon_defer) return;  // taken later by uvmlab_balloon_take()
  cudaError_t rc = kCudaSuccess;
  bool wanted = g_cfg.balloon_bytes > 0 || g_cfg.balloon_leave_bytes >= 0;
  if (wanted && !claim_balloon()) {
  } else if (g_cfg.balloon_bytes > 0) rc = inflate(static_cast<size_t>(g_cfg.balloon_bytes), -1);
  else if (g_cfg.balloon_leave_bytes >= 0) rc = inflate_leaving(static_cast<size_t>(g_cfg.balloon_leave_bytes));
  if (rc != kCudaSuccess)
    fprintf(stderr, "uvmlab shim: the balloon could not be reserved (CUDA error %d); the run is not oversubscribed "
            "as requested\n", rc);
  g_balloon_env_done.store(true, std::memory_order_release);
}

// ---- live managed allocations (the worker reads their total to measure the capacity UVM really has) ----------------
struct Live {
  std::mutex mu;
  std::unordered_map<uintptr_t, size_t> sizes;
  size_t bytes = 0;
};
Live& live_instance() {
  static Live* l = new Live();
  return *l;
}

void live_add(void* ptr, size_t size) {
  Live& l = live_instance();
  std::lock_guard<std::mutex> lock(l.mu);
  auto [it, fresh] = l.sizes.emplace(reinterpret_cast<uintptr_t>(ptr), size);
  if (!fresh) {  // a stale entry (cannot happen while frees take the entry out first; kept exact anyway)
    l.bytes -= it->second;
    it->second = size;
  }
  l.bytes += size;
}

// Take ptr's entry out BEFORE the real free: once the runtime has the memory back, another thread's allocation may
// return the same address, and its live_add must find no entry (it used to find the old one, count nothing, and
// then lose the entry to this free's removal). Returns the size taken out (0: not a live managed allocation).
size_t live_take(void* ptr) {
  Live& l = live_instance();
  std::lock_guard<std::mutex> lock(l.mu);
  auto it = l.sizes.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == l.sizes.end()) return 0;
  size_t size = it->second;
  l.bytes -= size;
  l.sizes.erase(it);
  return size;
}

// Every live managed range (a copy, taken under the lock).
std::vector<std::pair<uintptr_t, size_t>> live_ranges() {
  Live& l = live_instance();
  std::lock_guard<std::mutex> lock(l.mu);
  return {l.sizes.begin(), l.sizes.end()};
}

// ---- policies --------------------------------------------------------------------------------------------------------
thread_local int t_depth = 0;  // re-entrancy guard: calls made by the runtime itself go straight through

cudaError_t advise(const void* ptr, size_t size, int advice, int device) {
  if (g_real.mem_advise == nullptr) return kCudaErrorInitializationError;
  int64_t t0 = log_clock();
  cudaError_t rc;
  if (g_real.runtime_version >= kCuda13Version) {
    cudaMemLocation loc{device == kCudaCpuDeviceId ? kCudaMemLocationTypeHost : kCudaMemLocationTypeDevice,
                        device == kCudaCpuDeviceId ? 0 : device};
    rc = reinterpret_cast<Advise13Fn>(g_real.mem_advise)(ptr, size, advice, loc);
  } else {
    rc = reinterpret_cast<Advise12Fn>(g_real.mem_advise)(ptr, size, advice, device);
  }
  g_log.record(OP_ADVISE, t0, log_clock() - t0, ptr, size, advice * 1000LL + device, rc);
  return rc;
}

cudaError_t prefetch(const void* ptr, size_t size, int device, cudaStream_t stream) {
  if (g_real.mem_prefetch_async == nullptr) return kCudaErrorInitializationError;
  int64_t t0 = log_clock();
  cudaError_t rc;
  if (g_real.runtime_version >= kCuda13Version) {
    cudaMemLocation loc{kCudaMemLocationTypeDevice, device};
    rc = reinterpret_cast<Prefetch13Fn>(g_real.mem_prefetch_async)(ptr, size, loc, 0u, stream);
  } else {
    rc = reinterpret_cast<Prefetch12Fn>(g_real.mem_prefetch_async)(ptr, size, device, stream);
  }
  g_log.record(OP_PREFETCH, t0, log_clock() - t0, ptr, size, device, rc);
  return rc;
}

// Advice and prefetch failures are logged, never fatal: the allocation itself succeeded.
void apply_policies(void* ptr, size_t size, int device, cudaStream_t stream) {
  if (g_cfg.advise_pref_gpu) advise(ptr, size, kCudaMemAdviseSetPreferredLocation, device);
  if (g_cfg.advise_pref_cpu) advise(ptr, size, kCudaMemAdviseSetPreferredLocation, kCudaCpuDeviceId);
  if (g_cfg.advise_accessed_by) advise(ptr, size, kCudaMemAdviseSetAccessedBy, device);
  if (g_cfg.advise_read_mostly) advise(ptr, size, kCudaMemAdviseSetReadMostly, device);
  if (g_cfg.prefetch_on_alloc) prefetch(ptr, size, device, stream);
}

bool any_policy() {
  return g_cfg.advise_pref_gpu || g_cfg.advise_pref_cpu || g_cfg.advise_accessed_by || g_cfg.advise_read_mostly ||
         g_cfg.prefetch_on_alloc;
}

cudaError_t managed_alloc(void** ptr, size_t size, int device, cudaStream_t stream, Op op, int64_t arg) {
  int64_t t0 = log_clock();
  cudaError_t rc = g_real.malloc_managed(ptr, size, kCudaMemAttachGlobal);
  g_log.record(op, t0, log_clock() - t0, rc == kCudaSuccess ? *ptr : nullptr, size, arg, rc);
  if (rc == kCudaSuccess) live_add(*ptr, size);
  if (rc == kCudaSuccess && any_policy()) {
    if (device < 0 && g_real.get_device != nullptr) g_real.get_device(&device);
    apply_policies(*ptr, size, device < 0 ? 0 : device, stream);
  }
  return rc;
}

__attribute__((constructor)) void shim_init() {
  (void)cfg_instance();  // parse the environment now: a bad variable stops the program at load, not mid-run
  (void)log_instance();
  (void)balloon_instance();
  (void)live_instance();
  // fork(): every lock is taken before the fork (prepare) and released after it in both processes, so that the
  // child never inherits a map or buffer another thread was in the middle of changing (re-initialising a held
  // mutex in the child, as before, left whatever that thread had half-done).
  pthread_atfork(
      [] {
        g_log.lock_for_fork();
        live_instance().mu.lock();
        g_balloon_mu.lock();
      },
      [] {
        g_balloon_mu.unlock();
        live_instance().mu.unlock();
        g_log.unlock_after_fork(false);
      },
      [] {
        g_pid.store(static_cast<int32_t>(getpid()), std::memory_order_relaxed);
        g_balloon.clear();  // the parent's balloon: the child neither owns nor frees it at exit
        g_balloon_mu.unlock();
        live_instance().mu.unlock();
        g_log.unlock_after_fork(true);
      });
}

__attribute__((destructor)) void shim_fini() { g_log.flush(); }

}  // namespace

// ---- exported: the interposed runtime functions --------------------------------------------------------------------
extern "C" {

__attribute__((visibility("default"))) cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (!resolve()) return kCudaErrorInitializationError;
  if (t_depth > 0) return g_real.malloc(devPtr, size);
  if (devPtr == nullptr) return kCudaErrorInvalidValue;
  ++t_depth;
  balloon_from_env();
  cudaError_t rc;
  if (!g_cfg.managed || size == 0) {
    // cudaMallocManaged rejects size 0 (cudaErrorInvalidValue) while cudaMalloc accepts it: keep cudaMalloc's answer.
    int64_t t0 = log_clock();
    rc = g_real.malloc(devPtr, size);
    g_log.record(OP_MALLOC_DEVICE, t0, log_clock() - t0, rc == kCudaSuccess ? *devPtr : nullptr, size,
                 0, rc);
  } else {
    rc = managed_alloc(devPtr, size, -1, nullptr, OP_MALLOC, kCudaMemAttachGlobal);
  }
  --t_depth;
  return rc;
}

__attribute__((visibility("default"))) cudaError_t cudaFree(void* devPtr) {
  if (!resolve()) return kCudaErrorInitializationError;
  if (t_depth > 0) return g_real.free(devPtr);
  size_t taken = live_take(devPtr);
  int64_t t0 = log_clock();
  cudaError_t rc = g_real.free(devPtr);
  g_log.record(OP_FREE, t0, log_clock() - t0, devPtr, 0, 0, rc);
  if (rc != kCudaSuccess && taken > 0) live_add(devPtr, taken);  // the runtime kept it: still live
  return rc;
}

// ---- exported: CUDAPluggableAllocator entry points (no LD_PRELOAD needed) ----------------------------------------
__attribute__((visibility("default"))) void* uvmlab_malloc(ssize_t size, int device, cudaStream_t stream) {
  if (!resolve() || size < 0) return nullptr;
  ++t_depth;
  balloon_from_env();
  void* p = nullptr;
  cudaError_t rc = managed_alloc(&p, static_cast<size_t>(size), device, stream, OP_PLUGGABLE_MALLOC, device);
  --t_depth;
  return rc == kCudaSuccess ? p : nullptr;  // PyTorch treats nullptr as out of memory
}

__attribute__((visibility("default"))) void uvmlab_free(void* ptr, ssize_t size, int device, cudaStream_t) {
  if (!resolve()) return;
  size_t taken = live_take(ptr);
  int64_t t0 = log_clock();
  cudaError_t rc = g_real.free(ptr);
  g_log.record(OP_PLUGGABLE_FREE, t0, log_clock() - t0, ptr, size < 0 ? 0 : size, device, rc);
  if (rc != kCudaSuccess && taken > 0) live_add(ptr, taken);
}

// ---- exported: control -------------------------------------------------------------------------------------------------
/** cudaMemGetInfo: the real figures, or with UVMLAB_REPORT_FREE_BYTES=N free = min(N, total) (the same figure in the
 * runs a comparison pairs: PyTorch sizes cuDNN workspaces from it). */
__attribute__((visibility("default"))) cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
  if (!resolve() || g_real.mem_get_info == nullptr) return kCudaErrorInitializationError;
  cudaError_t rc = g_real.mem_get_info(free_b, total_b);
  if (rc == kCudaSuccess && g_cfg.report_free_bytes >= 0 && free_b != nullptr && total_b != nullptr) {
    size_t n = static_cast<size_t>(g_cfg.report_free_bytes);
    *free_b = n < *total_b ? n : *total_b;
  }
  return rc;
}

/** The real cudaMemGetInfo, whatever UVMLAB_REPORT_FREE_BYTES says (the worker's probes read this). */
__attribute__((visibility("default"))) int uvmlab_real_mem_get_info(size_t* free_b, size_t* total_b) {
  if (!resolve() || g_real.mem_get_info == nullptr) return kCudaErrorInitializationError;
  return g_real.mem_get_info(free_b, total_b);
}

/** With UVMLAB_BALLOON_DEFER=1: prefetch every live managed range to the host, wait for the device, then take the
 * balloon the environment asks for (UVMLAB_BALLOON_BYTES / _LEAVE_BYTES, with the claim file), once. Returns the
 * cudaError_t (0 also when there is nothing to take); *evicted_bytes (may be NULL) gets the bytes prefetched away. */
__attribute__((visibility("default"))) int uvmlab_balloon_take(size_t* evicted_bytes) {
  if (!resolve()) return kCudaErrorInitializationError;
  size_t evicted = 0;
  int device = 0;
  if (g_real.get_device != nullptr) g_real.get_device(&device);
  for (auto& r : live_ranges()) {
    cudaError_t rc;
    int64_t t0 = log_clock();
    if (g_real.mem_prefetch_async == nullptr) break;
    if (g_real.runtime_version >= kCuda13Version) {
      cudaMemLocation host{kCudaMemLocationTypeHost, 0};
      rc = reinterpret_cast<Prefetch13Fn>(g_real.mem_prefetch_async)(reinterpret_cast<void*>(r.first), r.second,
                                                                       host, 0u, nullptr);
    } else {
      rc = reinterpret_cast<Prefetch12Fn>(g_real.mem_prefetch_async)(reinterpret_cast<void*>(r.first), r.second,
                                                                       kCudaCpuDeviceId, nullptr);
    }
    g_log.record(OP_PREFETCH, t0, log_clock() - t0, reinterpret_cast<void*>(r.first), r.second, kCudaCpuDeviceId, rc);
    if (rc == kCudaSuccess) evicted += r.second;
  }
  if (g_real.device_synchronize != nullptr) g_real.device_synchronize();
  if (evicted_bytes != nullptr) *evicted_bytes = evicted;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  static bool taken = false;
  if (taken) return kCudaSuccess;
  taken = true;
  cudaError_t rc = kCudaSuccess;
  bool wanted = g_cfg.balloon_bytes > 0 || g_cfg.balloon_leave_bytes >= 0;
  if (!wanted || !claim_balloon()) return kCudaSuccess;
  if (g_cfg.balloon_bytes > 0) rc = inflate(static_cast<size_t>(g_cfg.balloon_bytes), -1);
  else rc = inflate_leaving(static_cast<size_t>(g_cfg.balloon_leave_bytes));
  if (rc != kCudaSuccess)
    fprintf(stderr, "uvmlab shim: the balloon could not be reserved (CUDA error %d); the run is not oversubscribed "
            "as requested\n", rc);
  return rc;
}

/** Reserve `bytes` more of device memory with the real cudaMalloc (held until exit). Returns the cudaError_t. */
__attribute__((visibility("default"))) int uvmlab_balloon(size_t bytes) { return inflate(bytes, -1); }

/** Reserve (free - leave_bytes) of device memory, rounded down to 2 MiB. Returns the cudaError_t. */
__attribute__((visibility("default"))) int uvmlab_balloon_leave(size_t leave_bytes) {
  return inflate_leaving(leave_bytes);
}

/** Bytes currently held by the balloon. */
__attribute__((visibility("default"))) size_t uvmlab_balloon_bytes(void) {
  std::lock_guard<std::mutex> lock(g_balloon_mu);
  size_t total = 0;
  for (auto& piece : g_balloon) total += piece.second;
  return total;
}

/** Bytes of managed memory the shim allocated and that are not freed yet (cudaMalloc-as-managed + pluggable). */
__attribute__((visibility("default"))) size_t uvmlab_live_managed_bytes(void) {
  Live& l = live_instance();
  std::lock_guard<std::mutex> lock(l.mu);
  return l.bytes;
}

/** Switch the prefetch after every managed allocation (UVMLAB_PREFETCH=on_alloc) on (on != 0) or off from now on;
 * returns the previous setting (1/0). Used by uvmlab.measure.gpu.program_backend (uvm.prefetch_new_allocations). */
__attribute__((visibility("default"))) int uvmlab_prefetch_on_alloc(int on) {
  return g_cfg.prefetch_on_alloc.exchange(on != 0) ? 1 : 0;
}

/** Release the balloon now (it is otherwise released at exit). */
__attribute__((visibility("default"))) void uvmlab_balloon_release(void) { release_balloon(); }

/** Write buffered log records to UVMLAB_ALLOC_LOG now. */
__attribute__((visibility("default"))) void uvmlab_flush_log(void) { g_log.flush(); }

/** 1 once the real runtime has been found (resolving it first if needed), else 0. */
__attribute__((visibility("default"))) int uvmlab_shim_resolved(void) { return resolve() ? 1 : 0; }

/** Path of the object that provides the real cudaMalloc ("" if not found). */
__attribute__((visibility("default"))) const char* uvmlab_shim_real_library(void) {
  resolve();
  return g_real.library.c_str();
}

/** The log format version this shim writes. */
__attribute__((visibility("default"))) int uvmlab_shim_log_version(void) { return 1; }

}  // extern "C"

// The interposed definitions have exactly the signatures of uvmlab_cuda_abi.h (which a test checks against the
// real CUDA headers).
static_assert(std::is_same<decltype(&cudaMalloc), MallocFn>::value, "cudaMalloc signature");
static_assert(std::is_same<decltype(&cudaFree), FreeFn>::value, "cudaFree signature");
static_assert(std::is_same<decltype(&cudaMemGetInfo), MemGetInfoFn>::value, "cudaMemGetInfo signature");
