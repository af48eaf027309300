# cython: language_level=3
"""inferd._waker: one pipe write that keeps the GIL (see inferd/engine/loop_waker.py for why it must)."""
from posix.unistd cimport write


def write_byte_holding_gil(int fd):
    """Writes one zero byte to fd and returns what write(2) returned (-1 on error, e.g. a full non-blocking pipe),
    without releasing the GIL, unlike os.write and socket.send."""
    cdef char zero = 0
    return write(fd, &zero, 1)
