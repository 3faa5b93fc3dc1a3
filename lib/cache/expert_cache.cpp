// Creating and destroying the cache: the slots, the staging buffers, the read
// engine and the threads; slot addresses.
#include "cache/expert_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cache/sizing.h"
#include "io/device_registrar.h"
#include "io/read_engine.h"

namespace xpack::cache {

namespace {

// Hash workers with verification on. One xxh3 of a 13.4 MB object takes about
// 1 ms, a read of it from the disk 6-7 ms: one worker keeps up with the disk,
// a second one keeps a burst of completions from queueing behind each other.
constexpr unsigned kHashWorkers = 2;

}  // namespace

ExpertCache::ExpertCache(ObjectSource src, device::Device& dev, const CacheOptions& opts)
    : src_(std::move(src)), dev_(dev), opts_(opts), telemetry_(src_.n_layers) {}

Result<std::unique_ptr<ExpertCache>> ExpertCache::create(ObjectSource source,
                                                         device::Device& device,
                                                         const CacheOptions& opts) {
  XPACK_TRY(check_options(source, opts));
  std::unique_ptr<ExpertCache> c(new ExpertCache(std::move(source), device, opts));
  XPACK_TRY(c->init());
  return c;
}

Status ExpertCache::init() {
  XPACK_ASSIGN_OR_RETURN(device::MemoryInfo mem, dev_.memory_info());
  XPACK_ASSIGN_OR_RETURN(SlotSizing sizing, size_slots(src_, opts_, mem));
  n_slots_ = sizing.count;
  slot_stride_ = sizing.stride;
  XPACK_ASSIGN_OR_RETURN(void* base, dev_.allocate(n_slots_ * slot_stride_));
  slots_base_ = static_cast<uint8_t*>(base);

  slots_.resize(n_slots_);
  for (auto& s : slots_) {
    XPACK_ASSIGN_OR_RETURN(s.ready, dev_.create_event());
  }
  dir_ = std::make_unique<SlotDirectory>(n_slots_, make_policy(opts_.policy));
  XPACK_TRY(init_host_tier());

  staging_.resize(opts_.staging_slots);
  for (auto& st : staging_) {
    XPACK_ASSIGN_OR_RETURN(st.copied, dev_.create_event());
  }
  registrar_ = std::make_unique<io::DeviceHostRegistrar>(dev_);
  io::EngineConfig ec;
  ec.paths = {src_.path};
  ec.slot_count = opts_.staging_slots;  // the engine calls its staging buffers slots
  ec.slot_bytes = src_.read_bytes;
  ec.queue_depth = std::max<uint32_t>(opts_.queue_depth, 1);
  ec.read_splits = opts_.read_splits;
  ec.direct_io = opts_.direct_io;
  ec.registrar = registrar_.get();
  ec.faults = opts_.faults;
  ec.wakeable = true;
  ec.on_complete = [this](const io::Completion& c) { on_read_complete(c); };
  XPACK_ASSIGN_OR_RETURN(engine_, io::ReadEngine::create(std::move(ec)));
  telemetry_.update([&](stats::Counters& c) {
    c.staging_page_bytes = engine_->arena().page_bytes();
    c.staging_huge_fraction = engine_->arena().huge_fraction();
  });

  if (!opts_.trace_path.empty()) {
    XPACK_ASSIGN_OR_RETURN(trace_, stats::RoutingTraceWriter::open(opts_.trace_path));
  }
  hashing_.assign(staging_.size(), 0);
  if (opts_.verify)
    for (unsigned i = 0; i < kHashWorkers; ++i) hash_threads_.emplace_back([this] { hash_loop(); });
  io_thread_ = std::thread([this] { io_loop(); });
  return {};
}

ExpertCache::~ExpertCache() {
  if (io_thread_.joinable()) {
    bool sleeping;
    {
      std::lock_guard lk(mu_);
      stop_ = true;
      sleeping = io_sleeping_;
    }
    notify_io(sleeping);
    io_thread_.join();
  }
  // After the I/O thread: the workers finish the hashes it queued, then leave.
  {
    std::lock_guard hl(hash_mu_);
    hash_stop_ = true;
  }
  hash_cv_.notify_all();
  for (auto& t : hash_threads_) t.join();
  (void)dev_.synchronize();
  if (engine_) (void)write_stats();
  if (trace_) (void)trace_->flush();
  engine_.reset();  // unregisters the staging arena before the registrar goes
  if (slots_base_) dev_.deallocate(slots_base_);
  if (frames_base_) {
    dev_.unregister_host(frames_base_);
    munmap(frames_base_, frames_bytes_);
  }
}

Status ExpertCache::init_host_tier() {
  XPACK_ASSIGN_OR_RETURN(FrameSizing frames, size_frames(src_, opts_, n_slots_));
  if (frames.count == 0) return {};
  frame_stride_ = frames.stride;
  uint64_t bytes = uint64_t(frames.count) * frames.stride;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    return err(-e, "cache: cannot map a host tier of {} bytes ({} frames): {}", bytes, frames.count,
               std::strerror(e));
  }
  // Whole 2 MiB pages: pinning and the DMA engine walk 512x fewer pages. Advice
  // only (THP in madvise mode needs it; without THP the tier still works).
  (void)madvise(p, bytes, MADV_HUGEPAGE);
  frames_base_ = static_cast<uint8_t*>(p);
  frames_bytes_ = bytes;
  Status reg = dev_.register_host(p, bytes);
  if (!reg.ok()) {
    munmap(p, bytes);
    frames_base_ = nullptr;
    return err(reg.error().code, "cache: cannot pin a host tier of {} bytes ({} frames; lower "
               "host_cache_bytes, or raise the memory limit): {}", bytes, frames.count, reg.error().message);
  }
  host_ = std::make_unique<HostTier>(frames.count);
  return {};
}

void* ExpertCache::slot_data(uint32_t slot) const {
  return slot < n_slots_ ? slots_base_ + uint64_t(slot) * slot_stride_ : nullptr;
}

}  // namespace xpack::cache
