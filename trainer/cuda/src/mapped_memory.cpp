#include "mapped_memory.h"

#include "forge/common/error.h"
#include "forge/trainer/cuda/context.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <type_traits>

namespace forge::trainer::cuda {

namespace {

// The driver's virtual-memory calls, found through the runtime: the backend links only the runtime, so
// a machine without a driver still loads it (and says why it has no device).
struct Driver {
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuGetErrorName_v6000 error_name = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 attribute = nullptr;
  int device = -1;
  size_t granule = 0;
  std::string why;  // what is missing when granule == 0

  Driver() {
    const auto find = [this](const char* symbol, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
      const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found);
#else
      const cudaError_t err = cudaGetDriverEntryPoint(symbol, &p, cudaEnableDefault, &found);
#endif
      if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
        cudaGetLastError();
        if (why.empty()) why = fmt::format("the driver has no {}", symbol);
        return;
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    find("cuMemAddressReserve", reserve);
    find("cuMemAddressFree", free);
    find("cuMemCreate", create);
    find("cuMemRelease", release);
    find("cuMemMap", map);
    find("cuMemUnmap", unmap);
    find("cuMemSetAccess", set_access);
    find("cuMemGetAllocationGranularity", granularity);
    find("cuGetErrorName", error_name);
    find("cuDeviceGet", device_get);
    find("cuDeviceGetAttribute", attribute);
    if (!why.empty()) return;
    int supported = 0;
    CUdevice handle{};
    if (cudaGetDevice(&device) != cudaSuccess || device_get(&handle, device) != CUDA_SUCCESS ||
        attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, handle) !=
            CUDA_SUCCESS ||
        supported == 0) {
      cudaGetLastError();
      why = fmt::format("CUDA device {} has no virtual memory management", device);
      return;
    }
    const CUmemAllocationProp p = prop();
    if (granularity(&granule, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || granule == 0) {
      granule = 0;
      why = "cuMemGetAllocationGranularity failed";
    }
  }

  CUmemAllocationProp prop() const {
    CUmemAllocationProp p{};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device;
    return p;
  }

  // A failed call: out of memory is the configuration's (exit 64, as a failed cudaMalloc), anything else
  // the device's (69).
  [[noreturn]] void fail(const char* call, CUresult r) const {
    const char* name = "unknown";
    if (error_name != nullptr) error_name(r, &name);
    const bool oom = r == CUDA_ERROR_OUT_OF_MEMORY;
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    throw Error(
        oom ? ExitCode::kUsage : ExitCode::kComm,
        fmt::format("CUDA device {} rank {}: {} failed: {} ({:.1f} of {:.1f} GiB free)", device, error_rank(),
                    call, name, double(free_bytes) / (1 << 30), double(total) / (1 << 30)),
        oom ? Fault::kOomDevice : Fault::kGpu);
  }
  void check(const char* call, CUresult r) const {
    if (r != CUDA_SUCCESS) fail(call, r);
  }
};

const Driver& driver() {
  static const Driver* d = new Driver();  // kept for the process, as the CUDA context is
  return *d;
}

// Releases whose granules wait for the stream, oldest first (one stream: they complete in this order).
struct Retiring {
  MappedMemory* memory;
  cudaEvent_t done;
  size_t first, last;
};
std::deque<Retiring>& retiring() {
  static auto* q = new std::deque<Retiring>();
  return *q;
}

}  // namespace

void MappedMemory::unmap_released(bool wait) {
  if (wait) synchronize();
  auto& q = retiring();
  while (!q.empty()) {
    const cudaError_t state = cudaEventQuery(q.front().done);
    if (state == cudaErrorNotReady) break;
    check_cuda(state, "cudaEventQuery (a release's event)");
    const Retiring r = q.front();
    q.pop_front();
    cudaEventDestroy(r.done);
    r.memory->unmap(r.first, r.last);
  }
}

size_t MappedMemory::granule(std::string* why) {
  const Driver& d = driver();
  if (why != nullptr) *why = d.why;
  return d.granule;
}

MappedMemory::MappedMemory(size_t bytes) : granule_(granule()) {
  const Driver& d = driver();
  if (granule_ == 0) usage_fail("MappedMemory: " + d.why);
  const size_t n = (std::max<size_t>(bytes, 1) + granule_ - 1) / granule_;
  bytes_ = n * granule_;
  CUdeviceptr base = 0;
  d.check("cuMemAddressReserve", d.reserve(&base, bytes_, granule_, 0, 0));
  base_ = uintptr_t(base);
  state_.assign(n, State::kUnmapped);
  map(0, n);
}

MappedMemory::~MappedMemory() {
  // As cudaFree, it waits for the device: nothing queued still reads it.
  cudaStreamSynchronize(stream());
  auto& q = retiring();
  for (auto it = q.begin(); it != q.end();) {
    if (it->memory != this) {
      ++it;
      continue;
    }
    cudaEventDestroy(it->done);
    it = q.erase(it);
  }
  const Driver& d = driver();
  for (size_t g = 0; g < state_.size(); ++g)
    if (state_[g] != State::kUnmapped) d.unmap(CUdeviceptr(base_ + g * granule_), granule_);
  d.free(CUdeviceptr(base_), bytes_);
}

void MappedMemory::map(size_t first, size_t last) {
  if (first >= last) return;
  const Driver& d = driver();
  const CUmemAllocationProp prop = d.prop();
  for (size_t g = first; g < last; ++g) {
    CUmemGenericAllocationHandle handle{};
    CUresult r = d.create(&handle, granule_, &prop, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {  // what waits for the device may free enough
      unmap_released(true);
      r = d.create(&handle, granule_, &prop, 0);
    }
    d.check("cuMemCreate (a granule of device memory)", r);
    const CUdeviceptr at = CUdeviceptr(base_ + g * granule_);
    r = d.map(at, granule_, 0, handle, 0);
    d.release(handle);  // the mapping holds the memory; unmapping frees it
    d.check("cuMemMap", r);
    state_[g] = State::kMapped;
  }
  CUmemAccessDesc access{};
  access.location = d.prop().location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  d.check("cuMemSetAccess",
          d.set_access(CUdeviceptr(base_ + first * granule_), (last - first) * granule_, &access, 1));
  check_cuda(cudaMemsetAsync(reinterpret_cast<void*>(base_ + first * granule_), 0, (last - first) * granule_,
                             stream()),
             "cudaMemsetAsync (memory taken back)");
}

void MappedMemory::unmap(size_t first, size_t last) {
  const Driver& d = driver();
  for (size_t g = first; g < last; ++g) {
    if (state_[g] != State::kRetiring) continue;  // taken back meanwhile
    d.check("cuMemUnmap", d.unmap(CUdeviceptr(base_ + g * granule_), granule_));
    state_[g] = State::kUnmapped;
  }
}

void MappedMemory::release(size_t offset, size_t bytes) {
  unmap_released(false);
  bytes = std::min(bytes, bytes_ - std::min(offset, bytes_));
  if (bytes == 0) return;
  const size_t end = offset + bytes;
  const size_t first = (offset + granule_ - 1) / granule_, last = end / granule_;
  // What lies outside whole granules stays mapped, zeroed (an unmapped granule there was zeroed before).
  const auto zero = [&](size_t lo, size_t hi) {
    for (size_t at = lo; at < hi;) {
      const size_t g = at / granule_, next = std::min(hi, (g + 1) * granule_);
      if (state_[g] != State::kUnmapped)
        check_cuda(cudaMemsetAsync(reinterpret_cast<void*>(base_ + at), 0, next - at, stream()),
                   "cudaMemsetAsync (a released range)");
      at = next;
    }
  };
  if (first >= last) return zero(offset, end);
  zero(offset, first * granule_);
  zero(last * granule_, end);
  bool any = false;
  for (size_t g = first; g < last; ++g)
    if (state_[g] == State::kMapped) {
      state_[g] = State::kRetiring;
      any = true;
    }
  if (!any) return;
  cudaEvent_t done = nullptr;
  check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check_cuda(cudaEventRecord(done, stream()), "cudaEventRecord (a release)");
  retiring().push_back({this, done, first, last});
}

void MappedMemory::acquire(size_t offset, size_t bytes) {
  unmap_released(false);
  bytes = std::min(bytes, bytes_ - std::min(offset, bytes_));
  if (bytes == 0) return;
  const size_t first = offset / granule_, last = (offset + bytes + granule_ - 1) / granule_;
  for (size_t g = first; g < last;) {
    if (state_[g] == State::kMapped) {
      ++g;
      continue;
    }
    if (state_[g] == State::kRetiring) {  // still mapped: taken back as it is, zeroed
      state_[g] = State::kMapped;
      check_cuda(cudaMemsetAsync(reinterpret_cast<void*>(base_ + g * granule_), 0, granule_, stream()),
                 "cudaMemsetAsync (memory taken back)");
      ++g;
      continue;
    }
    size_t run = g;
    while (run < last && state_[run] == State::kUnmapped) ++run;
    map(g, run);
    g = run;
  }
}

size_t MappedMemory::mapped_bytes(size_t offset, size_t bytes) const {
  bytes = std::min(bytes, bytes_ - std::min(offset, bytes_));
  size_t n = 0;
  for (size_t at = offset, end = offset + bytes; at < end;) {
    const size_t g = at / granule_, next = std::min(end, (g + 1) * granule_);
    if (state_[g] != State::kUnmapped) n += next - at;
    at = next;
  }
  return n;
}

}  // namespace forge::trainer::cuda
