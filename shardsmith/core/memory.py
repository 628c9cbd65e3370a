"""Process-wide malloc settings for jobs that hold many large buffers (image bodies, decode buffers)."""


def return_large_buffers(threshold: int = 1 << 20) -> None:
    """Serve allocations of `threshold` bytes and more with mmap, so freeing them returns memory to the OS.

    glibc raises its mmap threshold after the first large free (up to 32 MiB) and then keeps later
    buffers in per-thread heaps it seldom trims. Process-wide: the resize process sets 8 MiB
    (process.tune_allocator; lower there made small images 16% dearer, every decode buffer a fresh
    mapping). No-op without glibc.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, threshold)  # -3: M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def keep_freed_heap(limit: int) -> None:
    """Keep up to `limit` bytes freed at the top of each malloc heap instead of returning them at once.

    Setting the mmap threshold (return_large_buffers) also pins glibc's trim threshold at 128 KiB, so every
    freed decode buffer under the threshold went back to the OS and the next image faulted its pages in
    again: 1.2 ms of system time per web-size image in the resize process, a fifth of the codec's cost.
    No-op without glibc.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-1, limit)  # -1: M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def reuse_freed_buffers(kept: int = 64 << 20) -> None:
    """Serve every buffer up to 32 MiB from one malloc heap and keep up to `kept` bytes of it freed, so a
    body buffer is made of the pages the last body left, not of fresh ones the kernel must fault in and zero.

    For the fetching process: its bodies are freed once written to the raw cache, so the next ones reuse them.
    One heap for all its threads (they take turns under the GIL): with a heap per thread, 32 threads held
    743 MiB for 256 MiB of bodies. Bodies must be read into buffers of their final size (Fetcher._http): a
    buffer grown in such a heap is copied at each growth. No-op without glibc.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-8, 1)  # M_ARENA_MAX
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD, glibc's largest
        libc.mallopt(-1, kept)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass
