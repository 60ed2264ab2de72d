"""Made blocks spilled to scratch files, streamed batches and legacy repacks made on first use: what keeps a
preset sweep's resident memory at about one requantized copy (issue 25), with the products' numbers unchanged."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from engine.kernels import pages
from engine.kernels.dispatch import BlockProduct, compiled
from engine.quant import quantize
from engine.quant.types import GGMLType

T = GGMLType
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self/smaps: Linux")


def resident_kib(arr: np.ndarray) -> int:
    """Rss of the mapping holding arr's first byte, from /proc/self/smaps."""
    addr = arr.__array_interface__["data"][0]
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                lo, hi = (int(v, 16) for v in head[0].split("-"))
                inside = lo <= addr < hi
            elif inside and head[0] == "Rss:":
                return int(head[1])
    raise AssertionError("no mapping holds the array")


def q_blocks(qtype: GGMLType, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    return quantize(w, qtype)


def test_spill_maps_the_same_bytes_read_only_and_leaves_no_file(tmp_path: Path) -> None:
    arr = q_blocks(T.Q8_0, 64, 1024)
    mapped = pages.spill(arr, tmp_path)
    assert isinstance(mapped, np.memmap) and not mapped.flags.writeable
    assert mapped.shape == arr.shape and mapped.dtype == arr.dtype and np.array_equal(mapped, arr)
    assert list(tmp_path.iterdir()) == []  # unlinked at once: nothing stays on disk


def test_spill_keeps_the_array_where_no_scratch_file_can_be_written(tmp_path: Path) -> None:
    blocker = tmp_path / "a file"
    blocker.write_bytes(b"x")
    arr = q_blocks(T.Q4_0, 64, 1024)
    assert pages.spill(arr, blocker / "scratch") is arr  # a warning, and the blocks stay in memory
    small = np.zeros(16, np.uint8)
    assert pages.spill(small, tmp_path) is small  # under a page: not worth a file


@linux_only
def test_streaming_gives_back_the_pages_a_batch_read(tmp_path: Path) -> None:
    # the legacy quants' batches give their blocks back always with compiled kernels (the next test)
    for qtype in (T.Q6_K, T.F16) if compiled() else (T.Q8_0, T.Q4_0, T.Q6_K):
        blocks = pages.spill(q_blocks(qtype, 256, 2048, seed=int(qtype)), tmp_path)
        product = BlockProduct(qtype, blocks, 2048)
        x = np.random.default_rng(1).standard_normal((4, 2048)).astype(np.float32)
        plain = product(x)
        assert resident_kib(blocks) > 0, qtype.name  # read, and left resident
        with pages.streaming():
            streamed = product(x)
        assert resident_kib(blocks) == 0, qtype.name  # given back after the batch
        np.testing.assert_array_equal(streamed, plain)  # and faulted in again for the next one
        product(x)
        assert resident_kib(blocks) > 0, qtype.name  # outside streaming() nothing is released


@linux_only
def test_anon_copy_moves_a_mapping_into_anonymous_memory(tmp_path: Path) -> None:
    """The same bytes, in memory of the process's own; the file's pages given back chunk by chunk as copied."""
    blocks = pages.spill(q_blocks(T.Q8_0, 512, 2048, seed=3), tmp_path)
    np.asarray(blocks).sum()  # resident
    assert resident_kib(blocks) > 0
    copy = pages.anon_copy(blocks, chunk=1 << 16)
    assert not isinstance(copy, np.memmap) and copy.base is None and copy.flags.c_contiguous
    assert resident_kib(blocks) == 0
    np.testing.assert_array_equal(copy, blocks)  # (reading the mapping here faults it in again)
    assert pages.anon_copy(np.zeros((0, 34), np.uint8)).shape == (0, 34)


@linux_only
def test_a_legacy_weight_is_resident_once_in_a_chat() -> None:
    """A prompt reads the GGUF blocks, the decode steps the repacked planes: after each batch the blocks' pages
    leave the process (the page cache keeps them for the next prompt), so the model is not resident twice."""
    if not compiled():
        pytest.skip("the compiled kernels are not in use (no repack, no batch kernel)")
    for qtype in (T.Q4_1, T.Q8_0):
        blocks = pages.spill(q_blocks(qtype, 256, 2048, seed=int(qtype)), None)
        product = BlockProduct(qtype, blocks, 2048)
        x = np.random.default_rng(4).standard_normal((6, 2048)).astype(np.float32)
        prompt = product(x)
        assert resident_kib(blocks) == 0, qtype.name
        step = product(x[:1])  # a decode step: the planes (made from the blocks, which are given back again)
        assert product.repack_made and resident_kib(blocks) == 0, qtype.name
        np.testing.assert_array_equal(product(x), prompt)  # the next prompt faults the blocks in again
        assert resident_kib(blocks) == 0 and np.all(np.isfinite(step)), qtype.name


def test_a_legacy_repack_waits_for_the_first_one_row_product() -> None:
    if not compiled():
        pytest.skip("the compiled kernels are not in use (no repack, no batch kernel)")
    for qtype in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1):
        product = BlockProduct(qtype, q_blocks(qtype, 64, 512, seed=int(qtype)), 512)
        x = np.random.default_rng(2).standard_normal((5, 512)).astype(np.float32)
        batch = product(x)
        assert not product.repack_made, qtype.name  # prompts read the blocks: no second copy
        one = product(x[:1])
        assert product.repack_made, qtype.name
        assert np.all(np.isfinite(one)) and np.array_equal(product(x), batch)


def test_a_fused_legacy_product_is_its_parts_side_by_side() -> None:
    if not compiled():
        pytest.skip("the compiled kernels are not in use (no fused products)")
    for qtype in (T.Q8_0, T.Q4_0, T.Q5_1):
        parts = [q_blocks(qtype, n, 512, seed=n) for n in (64, 16, 16)]
        fused = BlockProduct.fused(qtype, parts, 512)
        alone = [BlockProduct(qtype, p, 512) for p in parts]
        x = np.random.default_rng(3).standard_normal((6, 512)).astype(np.float32)
        for rows in (x, x[:1]):  # the batch kernel on each part, then the stacked repack's one-row product
            np.testing.assert_array_equal(fused(rows), np.concatenate([p(rows) for p in alone], axis=1))
        assert fused.blocks is None and fused.repack_made



_ARENAS = """
import ctypes, sys, threading
from engine.kernels import pages
if sys.argv[1] == "limit":
    assert pages.limit_arenas(2)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
start = threading.Barrier(8)
def work():
    start.wait()  # all eight alive at once: each first malloc asks for an arena
    libc.malloc(4096)
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc.malloc_stats()  # one "Arena N:" block per arena, on stderr
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_limit_arenas_keeps_threads_to_two_arenas() -> None:
    import platform  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("needs glibc")
    root = Path(__file__).resolve().parents[3]

    def arenas(mode: str) -> int:
        run = subprocess.run([sys.executable, "-c", _ARENAS, mode], cwd=root, capture_output=True, text=True,
                             timeout=300, check=True)  # a hang guard only
        return run.stderr.count("Arena ")

    assert arenas("limit") == 2
    assert arenas("default") > 2  # eight threads get arenas of their own without the limit
