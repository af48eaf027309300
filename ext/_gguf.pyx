# cython: language_level=3, boundscheck=False, wraparound=False
"""inferd._gguf: a GGUF header's string arrays read in C.

A vocabulary is 10^5 strings and its merges as many again, each a little-endian u64 length and its UTF-8 bytes;
read one by one in Python they took most of a header walk, and the header walk comes before anything else of a
load can start (the tensors' offsets follow the vocabulary)."""
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint64_t
from libc.string cimport memcpy

# why a read stopped short (STRINGS_OK: it did not)
STRINGS_OK = 0
STRINGS_NO_LENGTH = 1  # fewer than 8 bytes left for the next length
STRINGS_SHORT = 2  # fewer bytes left than the length says
STRINGS_NOT_UTF8 = 3


def read_strings(const unsigned char[::1] buf, Py_ssize_t pos, Py_ssize_t count):
    """`count` strings from byte `pos` of `buf`: (strings, pos after them, STRINGS_OK), or where it stopped:
    (the strings before, the position of the failing length or string, why). Bad UTF-8 is left to the caller to
    name, with the decoder's error cleared."""
    cdef Py_ssize_t size = buf.shape[0], i
    cdef const char *base = <const char *>&buf[0] if size else NULL
    cdef uint64_t n
    out = []
    for i in range(count):
        if size - pos < 8:
            return out, pos, STRINGS_NO_LENGTH
        memcpy(&n, base + pos, 8)  # little-endian, as the host (the kernels are x86's)
        pos += 8
        if n > <uint64_t>(size - pos):
            return out, pos, STRINGS_SHORT
        try:
            out.append(PyUnicode_DecodeUTF8(base + pos, <Py_ssize_t>n, NULL))
        except UnicodeDecodeError:
            return out, pos, STRINGS_NOT_UTF8
        pos += <Py_ssize_t>n
    return out, pos, STRINGS_OK
