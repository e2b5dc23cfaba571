"""The no-device libcuda.so.1: a shared library, written here byte by byte, whose every `cu*` function answers
CUDA_ERROR_NO_DEVICE, so that cuDNN loads on a machine without the NVIDIA driver.

One cuDNN sublibrary links against the CUDA driver; nothing is faked at the cuDNN level. The library is an ELF
image made in memory (no C compiler, nothing prebuilt): one function returning 100, exported under each `cu*` name
cuDNN mentions. It is code that gets run, so this process never puts it in a directory: it is written into a sealed
memory file (memfd), read back and compared, and loaded from there. Only the list of names, which takes ~1 s to scan
out of cuDNN, is cached, and each name is checked before it is used. (`emit --format cpp` writes the image into the
C++ project the user names, beside the sources they build and run: docs/cpp.md.)
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import mmap
import os
import platform
import re
import struct
import sys
from pathlib import Path

CUDA_ERROR_NO_DEVICE = 100

_CU_NAME = re.compile(r"cu[A-Z][A-Za-z0-9_]{2,}")
_SYMBOLS_FORMAT = 1

#: per machine (platform.machine()): the ELF machine number and `return CUDA_ERROR_NO_DEVICE;` in its code
_MACHINES = {
    "x86_64": (62, b"\xb8" + struct.pack("<I", CUDA_ERROR_NO_DEVICE) + b"\xc3"),  # mov eax, 100; ret
    "aarch64": (183, struct.pack("<II", 0x52800000 | CUDA_ERROR_NO_DEVICE << 5, 0xD65F03C0)),  # mov w0, #100; ret
}
_MACHINES["AMD64"], _MACHINES["arm64"] = _MACHINES["x86_64"], _MACHINES["aarch64"]
_PAGE = 0x10000  # the largest page size of either (64 KiB arm64 kernels): the two segments never share a page


class StandInUnavailable(Exception):
    """The stand-in cannot be made or loaded here; the message says why."""


def note(text: str) -> None:
    print(f"cudnn-dsl: note: {text}", file=sys.stderr)


def _digest(names: list[str]) -> str:
    return hashlib.sha256("\n".join(names).encode()).hexdigest()


def driver_symbols(lib_dir: Path) -> list[str]:
    """The cu* names cuDNN's libraries mention, cached under cache_dir(), keyed by the libraries' sizes and times.

    The list is data, never code: a cached list is used only when every entry is a plain cu* identifier and its
    checksum matches. A damaged list is scanned again, and a cache that cannot be written is skipped; either is
    said in one line on stderr."""
    from cudnn_dsl.store.files import StoreProblem, atomic_write, loads, read_regular
    from cudnn_dsl.store.keys import cache_dir

    libs = sorted(lib_dir.glob("libcudnn*.so*"))
    signature = [_SYMBOLS_FORMAT, str(lib_dir), [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in libs]]
    path = cache_dir() / "no-device-driver" / f"{hashlib.sha256(json.dumps(signature).encode()).hexdigest()[:16]}.json"
    damaged = None
    try:
        data = read_regular(path, 1 << 22, "the driver symbol cache")  # None: no cache yet
        if data is not None:
            d = loads(data)  # every failure a ValueError: deep nesting, bad UTF-8 too
            names = d["names"]
            if (
                isinstance(names, list)
                and names
                and all(isinstance(n, str) and _CU_NAME.fullmatch(n) for n in names)
                and d["sha256"] == _digest(names)
            ):
                return names
            damaged = "not a list of cu* names with their checksum"
    except (StoreProblem, ValueError, KeyError, TypeError) as e:
        damaged = str(e) or type(e).__name__

    pattern = re.compile(_CU_NAME.pattern.encode())
    found: set[bytes] = set()
    try:
        for lib in libs:  # ~1 GB: map it rather than read it
            with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                found.update(pattern.findall(m))
    except (OSError, ValueError) as e:
        raise StandInUnavailable(f"cannot read the cuDNN libraries in {lib_dir} ({e})") from None
    names = sorted(n.decode() for n in found)
    if not names:
        raise StandInUnavailable(f"the cuDNN libraries in {lib_dir} name no CUDA driver functions")
    try:
        atomic_write(path, json.dumps({"names": names, "sha256": _digest(names)}))
    except OSError as e:
        note(
            f"cannot write the cache directory {cache_dir()} ({e.strerror or e}); cuDNN's driver symbols are not "
            "cached, so every deviceless run scans cuDNN again (~1 s)"
        )
        return names
    if damaged:
        note(f"{path} was damaged ({damaged}); scanned cuDNN again and rewrote it")
    return names


# ---- the ELF image ----------------------------------------------------------------------------------------------


def _elf_hash(name: bytes) -> int:
    """The System V ABI's symbol hash (DT_HASH)."""
    h = 0
    for c in name:
        h = (h << 4) + c
        g = h & 0xF0000000
        h = (h ^ (g >> 24)) & ~g & 0xFFFFFFFF
    return h


def elf_image(names: list[str], machine: str | None = None) -> bytes:
    """A 64-bit little-endian ELF shared library named libcuda.so.1 exporting `names`, each at one function that
    returns CUDA_ERROR_NO_DEVICE.

    Two segments: read+execute (headers, the code, the symbol and string tables, the hash table) and, on a page
    of its own, read+write (the dynamic section, which the loader may update in place). No relocations, no
    dependencies, no section headers; PT_GNU_STACK says the stack is not executable."""
    arch = machine or platform.machine()
    if arch not in _MACHINES:
        raise StandInUnavailable(f"no no-device libcuda.so.1 for this processor ({arch}): run where the driver is")
    e_machine, code = _MACHINES[arch]
    strtab = bytearray(b"\0libcuda.so.1\0")  # the soname at offset 1
    name_at = []
    for n in names:
        name_at.append(len(strtab))
        strtab += n.encode() + b"\0"
    count = len(names) + 1  # symbol 0 is the null symbol
    buckets, chains = [0] * max(1, count // 2), [0] * count
    for i, n in enumerate(names, start=1):  # each bucket a chain, the last name first
        b = _elf_hash(n.encode()) % len(buckets)
        chains[i], buckets[b] = buckets[b], i
    hashtab = struct.pack(f"<II{len(buckets)}I{count}I", len(buckets), count, *buckets, *chains)

    text_at = 64 + 4 * 56  # after the ELF header and four program headers
    sym_at = text_at + 16
    str_at = sym_at + 24 * count
    hash_at = (str_at + len(strtab) + 7) & ~7
    text_end = hash_at + len(hashtab)
    dyn_at = (text_end + _PAGE - 1) & ~(_PAGE - 1)
    # STB_GLOBAL STT_FUNC (0x12), st_shndx 1: defined (any index but SHN_UNDEF and the reserved ones)
    symtab = bytes(24) + b"".join(struct.pack("<IBBHQQ", at, 0x12, 0, 1, text_at, len(code)) for at in name_at)
    tags = ((4, hash_at), (5, str_at), (6, sym_at), (10, len(strtab)), (11, 24), (14, 1), (0, 0))
    dynamic = b"".join(struct.pack("<qQ", tag, value) for tag, value in tags)  # DT_HASH ... DT_SONAME, DT_NULL

    ident = b"\x7fELF" + bytes((2, 1, 1)) + bytes(9)  # 64-bit, little-endian, version 1, System V ABI
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, e_machine, 1, 0, 64, 0, 0, 64, 56, 4, 64, 0, 0)  # ET_DYN
    segments = (
        (1, 5, 0, text_end, _PAGE),  # PT_LOAD, R+X
        (1, 6, dyn_at, len(dynamic), _PAGE),  # PT_LOAD, R+W
        (2, 6, dyn_at, len(dynamic), 8),  # PT_DYNAMIC
        (0x6474E551, 6, 0, 0, 16),  # PT_GNU_STACK, R+W
    )
    phdrs = b"".join(struct.pack("<IIQQQQQQ", t, f, at, at, at, n, n, a) for t, f, at, n, a in segments)
    image = bytearray(dyn_at + len(dynamic))
    for at, part in ((0, header + phdrs), (text_at, code), (sym_at, symtab), (str_at, strtab), (hash_at, hashtab)):
        image[at : at + len(part)] = part
    image[dyn_at:] = dynamic
    return bytes(image)


def stand_in_image(lib_dir: Path) -> bytes:
    """The stand-in for the cuDNN libraries in lib_dir, for this processor: what load_stand_in loads, and the file
    the C++ projects of `emit --format cpp` load where there is no driver."""
    return elf_image(driver_symbols(lib_dir))


def load_stand_in(lib_dir: Path) -> None:
    """Makes the stand-in for the cuDNN libraries in lib_dir and loads it, as libcuda.so.1, for the process.

    The image goes into a memory file sealed against any change, is read back and compared, and is loaded from
    the file descriptor: no path another process could swap it at."""
    image = stand_in_image(lib_dir)
    seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
    try:
        fd = os.memfd_create("libcuda.so.1", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (AttributeError, OSError) as e:  # no memfd: not Linux, or a kernel before 3.17
        raise StandInUnavailable(f"cannot make a memory file for the no-device libcuda.so.1 ({e})") from None
    try:
        os.write(fd, image)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        if os.pread(fd, len(image) + 1, 0) != image:
            raise StandInUnavailable("the no-device libcuda.so.1 read back differs from what was written")
        ctypes.CDLL(f"/proc/self/fd/{fd}", mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise StandInUnavailable(f"cannot load the no-device libcuda.so.1 ({e})") from None
    finally:
        os.close(fd)  # a loaded library stays mapped
