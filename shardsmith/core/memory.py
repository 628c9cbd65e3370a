"""Process-wide malloc settings for jobs that hold many large buffers (image bodies, decode buffers)."""


def return_large_buffers(threshold: int = 1 << 20) -> None:
    """Serve allocations of `threshold` bytes and more with mmap, so freeing them returns memory to the OS.

    glibc raises its mmap threshold after the first large free (up to 32 MiB) and then keeps later
    bodies in per-thread heaps it seldom trims: a download job with 32 threads held 743 MiB for 256 MiB of
    bodies. A fixed threshold brought it to 418 MiB. Process-wide: the fetching process sets 1 MiB, the
    resize process 8 MiB (process.tune_allocator; lower there made small images 16% dearer, every decode
    buffer a fresh mapping). No-op without glibc.
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
