// Our kernels' products on every core: the rows of W in blocks, taken one at a time by the thread
// that runs the product (MLX's stream thread) and by helper threads of this process.
//
// Why: MLX runs each stream's work on one thread, so a product runs on one core. Splitting a step's
// products over two MLX streams (one per core) made every product a crossing between the streams'
// threads, each crossing a sleep and a wake-up of a thread (~240 of them in a SmolLM2 decode step;
// `perf`: futex wake-ups and their waits were ~15 % of all samples). Here the helpers take blocks
// of the same product while the stream thread does: no crossing in MLX's graph, and the stream
// thread never waits for a helper that has not started (it takes whatever blocks are left itself,
// and waits only for blocks a helper is computing). Each output row is computed by one thread,
// exactly as alone: the numbers do not depend on who computed which block.
//
// Hand-written rather than OpenMP: libgomp's helpers spin for milliseconds between products by
// default (a process-wide setting), taking the core the engine thread builds the next step on, and
// it is not on every machine that loads the addon. Helpers here spin a few microseconds, yielding
// the core to any thread that wants it, then sleep until the next product.
//
// The helpers never touch MLX (plain memory) and are never destroyed: the pool is leaked, so a
// process exiting while one sleeps destroys nothing under it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include <sched.h>

namespace {

class RowPool {
 public:
  // Calls run(ctx, n0, n1) for consecutive blocks [n0, n1) covering [0, n), each `multiple` rows
  // long (but the last), on this thread and the helpers; returns when every block is done.
  void for_blocks(int n, int multiple, int blocks, void (*run)(const void*, int, int), const void* ctx) {
    multiple = std::max(multiple, 1);
    const int per = std::max(multiple, (n / std::max(blocks, 1) + multiple - 1) / multiple * multiple);
    const int count = (n + per - 1) / per;
    // One product at a time: another thread's product (another MLX stream, another test) while
    // this one runs is computed by its own thread alone.
    std::unique_lock<std::mutex> mine(busy_, std::try_to_lock);
    if (helpers_ == 0 || count <= 1 || count > 0xFFFF || !mine.owns_lock()) {
      for (int b = 0; b < count; b++) {
        run(ctx, b * per, std::min(n, (b + 1) * per));
      }
      return;
    }
    // Publish the job, then its generation with the block count and the first block: a helper
    // reads the job's fields only after claiming a block of its generation, and they change only
    // when that job is done.
    job_ = Job{run, ctx, n, per};
    done_.store(0, std::memory_order_relaxed);
    const uint64_t gen = (state_.load(std::memory_order_relaxed) >> 32) + 1;
    state_.store(gen << 32 | uint64_t(count) << 16, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lk(mtx_);
      cv_.notify_all();
    }
    work(gen);
    // Blocks a helper is still computing; should it have lost its core meanwhile, giving this one
    // up lets it finish.
    for (int i = 1; done_.load(std::memory_order_acquire) < count; i++) {
      pause();
      if (i % 64 == 0) {
        sched_yield();
      }
    }
    // A block that threw (an allocation failure) on any thread fails the product here, on the
    // stream's thread, where MLX turns it into the evaluation's error; every block has ended, so
    // nothing still reads the caller's `ctx`.
    if (std::exception_ptr e = std::exchange(error_, nullptr)) {
      std::rethrow_exception(e);
    }
  }

  static RowPool& get() {
    // Leaked on purpose (see above).
    static RowPool* pool = new RowPool(threads());
    return *pool;
  }

 private:
  struct Job {
    void (*run)(const void*, int, int);
    const void* ctx;
    int n, per;
  };

  // Threads for a product: one per core this process may run on, at most four (a decode step's
  // products are a few hundred kilobytes; more threads would mostly spin).
  static int threads() {
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : int(std::thread::hardware_concurrency());
    return std::clamp(cores, 1, 4);
  }

  // As many helpers as the system lets it start (none: every product on its stream's thread).
  explicit RowPool(int threads) {
    for (int i = 1; i < threads; i++) {
      try {
        std::thread([this] { helper(); }).detach();
        helpers_++;
      } catch (const std::system_error&) {
        break;
      }
    }
  }

  static void pause() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }

  // Claims and runs blocks of generation `gen` until none is left.
  void work(uint64_t gen) {
    uint64_t s = state_.load(std::memory_order_acquire);
    for (;;) {
      const int next = int(s & 0xFFFF), count = int((s >> 16) & 0xFFFF);
      if ((s >> 32) != gen || next >= count) {
        return;
      }
      if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        continue;
      }
      const Job j = job_;
      try {
        j.run(j.ctx, next * j.per, std::min(j.n, (next + 1) * j.per));
      } catch (...) {
        std::lock_guard<std::mutex> lk(mtx_);
        if (!error_) {
          error_ = std::current_exception();
        }
      }
      done_.fetch_add(1, std::memory_order_release);
      s = state_.load(std::memory_order_acquire);
    }
  }

  void helper() {
    uint64_t seen = 0;
    for (;;) {
      // Spin a little (products of a decode step come tens of microseconds apart), giving the
      // core to any other thread that is ready to run, then sleep until the next generation.
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
      uint64_t gen = state_.load(std::memory_order_acquire) >> 32;
      for (int i = 0; gen == seen; i++) {
        if (i % 64 == 63) {
          if (std::chrono::steady_clock::now() > until) {
            break;
          }
          sched_yield();
        }
        pause();
        gen = state_.load(std::memory_order_acquire) >> 32;
      }
      if (gen == seen) {
        std::unique_lock<std::mutex> lk(mtx_);
        sleeping_.fetch_add(1, std::memory_order_seq_cst);
        cv_.wait(lk, [&] { return (state_.load(std::memory_order_seq_cst) >> 32) != seen; });
        sleeping_.fetch_sub(1, std::memory_order_relaxed);
        gen = state_.load(std::memory_order_acquire) >> 32;
      }
      seen = gen;
      work(gen);
    }
  }

  // How long a helper spins after a product (20 µs to 1 ms measured alike on two cores: decode
  // steps' products come closer together than that).
  static constexpr int kSpinMicros = 50;
  int helpers_ = 0;
  // The first exception a block of the current product threw (read once every block is done).
  std::exception_ptr error_;
  Job job_{};
  // The current product: generation (bits 32-63), blocks (16-31), next block to claim (0-15).
  std::atomic<uint64_t> state_{0};
  std::atomic<int> done_{0};
  std::atomic<int> sleeping_{0};
  std::mutex mtx_, busy_;
  std::condition_variable cv_;
};

// Blocks a product's rows are cut into: enough that a helper starting late still takes a share,
// few enough that claiming them costs nothing (4, 8 and 16 measured alike on two cores).
constexpr int kBlocks = 8;

// for_blocks with a lambda.
template <class F>
void parallel_rows(int n, int multiple, const F& f) {
  RowPool& pool = RowPool::get();
  pool.for_blocks(n, multiple, kBlocks, [](const void* ctx, int n0, int n1) { (*static_cast<const F*>(ctx))(n0, n1); }, &f);
}

}  // namespace
