"""Type stub of the compiled extension inferd._waker (ext/_waker.pyx)."""


def write_byte_holding_gil(fd: int) -> int: ...
