"""engine.gguf: writer -> reader round trips, agreement with gguf-py, and the real models."""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.errors import ModelFormatError
from engine.gguf import GGUFFile, GGUFValueType, TensorInfo, open_gguf, write_gguf
from engine.gguf import reader as reader_module
from engine.gguf import header as header_module
from engine.gguf.writer import infer_type
from engine.quant.types import GGMLType
from tests.gguf_factory import ARRAY, UINT8, KV, Enc, make_gguf

VT = GGUFValueType
RNG = np.random.default_rng(1234)


def _tensor_bytes(qtype: GGMLType, shape: tuple[int, ...]) -> bytes:
    from engine.quant.types import TYPES

    info = TYPES[qtype]
    n = int(np.prod(shape[1:], dtype=object)) * (shape[0] // info.block_size) * info.type_size
    return RNG.integers(0, 256, size=n, dtype=np.uint8).tobytes()


TENSORS = [
    ("token_embd.weight", GGMLType.Q8_0, (64, 5)),
    ("blk.0.attn_q.weight", GGMLType.Q4_K, (256, 3)),
    ("blk.0.attn_norm.weight", GGMLType.F32, (7,)),
    ("blk.0.ffn_up.weight", GGMLType.F16, (3, 2, 2, 2)),
    ("blk.0.empty", GGMLType.Q4_0, (0, 4)),
    ("output.weight", GGMLType.Q6_K, (512, 1)),
]

METADATA: dict[str, object] = {
    "general.architecture": "llama",
    "general.name": "round trip ✓ ünïcode",
    "llama.block_count": 12,
    "llama.context_length": 2048,
    "llama.rope.freq_base": 10000.0,
    "tokenizer.ggml.add_bos_token": True,
    "tokenizer.ggml.tokens": ["<s>", "</s>", "", "▁hello", "\n"],
    "tokenizer.ggml.scores": np.array([0.0, -1.5, 2.25, 3.0, -0.0], dtype=np.float32),
    "tokenizer.ggml.token_type": np.array([3, 3, 1, 1, 6], dtype=np.int32),
    "tokenizer.chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}" * 50,
    "big.positive": 1 << 40,
    "big.unsigned": (1 << 64) - 1,
    "neg": -5,
}
EXPLICIT_TYPES: dict[str, tuple[VT, VT | None]] = {
    "t.u8": (VT.UINT8, None), "t.i8": (VT.INT8, None), "t.u16": (VT.UINT16, None),
    "t.i16": (VT.INT16, None), "t.u32": (VT.UINT32, None), "t.i32": (VT.INT32, None),
    "t.f32": (VT.FLOAT32, None), "t.bool": (VT.BOOL, None), "t.str": (VT.STRING, None),
    "t.u64": (VT.UINT64, None), "t.i64": (VT.INT64, None), "t.f64": (VT.FLOAT64, None),
    "t.arr_u8": (VT.ARRAY, VT.UINT8), "t.arr_i64": (VT.ARRAY, VT.INT64), "t.arr_f64": (VT.ARRAY, VT.FLOAT64),
    "t.arr_bool": (VT.ARRAY, VT.BOOL), "t.arr_empty": (VT.ARRAY, VT.UINT32), "t.arr_u16": (VT.ARRAY, VT.UINT16),
}
EXPLICIT_VALUES: dict[str, object] = {
    "t.u8": 255, "t.i8": -128, "t.u16": 65535, "t.i16": -32768, "t.u32": 4294967295, "t.i32": -2147483648,
    "t.f32": 0.5, "t.bool": False, "t.str": "", "t.u64": 1 << 63, "t.i64": -(1 << 63), "t.f64": 1e300,
    "t.arr_u8": [0, 1, 255], "t.arr_i64": [-(1 << 63), 0, (1 << 63) - 1], "t.arr_f64": [1e-300, 2.0],
    "t.arr_bool": [True, False, True], "t.arr_empty": [], "t.arr_u16": np.array([1, 2], dtype=np.uint16),
}


@pytest.fixture
def written(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A file with every value type and a mix of tensor types (alignment 64, version 2)."""
    data = {name: _tensor_bytes(q, shape) for name, q, shape in TENSORS}
    path = tmp_path / "rt.gguf"
    write_gguf(
        path,
        {**METADATA, **EXPLICIT_VALUES},
        [(name, q, shape, data[name]) for name, q, shape in TENSORS],
        metadata_types=EXPLICIT_TYPES,
        alignment=64,
        version=2,
    )
    return path, data


def _same_value(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    return a == b and type(a) is type(b)


def test_round_trip(written: tuple[Path, dict[str, bytes]]) -> None:
    """Every value and tensor written comes back with the same type, value and bytes."""
    path, data = written
    with open_gguf(path) as f:
        assert isinstance(f, GGUFFile)
        assert (f.version, f.alignment) == (2, 64)
        assert f.data_offset % 64 == 0 and f.warnings == []
        assert f.metadata["general.alignment"] == 64
        assert f.metadata_types["general.alignment"] == (VT.UINT32, None)
        for key, value in {**METADATA, **EXPLICIT_VALUES}.items():
            assert _same_value(f.metadata[key], value if not isinstance(value, list) or not value
                               or isinstance(value[0], str) else np.array(value)), key
        for key, types in EXPLICIT_TYPES.items():
            assert f.metadata_types[key] == types, key
        assert f.metadata_types["llama.block_count"] == (VT.INT32, None)
        assert f.metadata_types["big.positive"] == (VT.INT64, None)
        assert f.metadata_types["big.unsigned"] == (VT.UINT64, None)
        assert f.metadata_types["tokenizer.ggml.scores"] == (VT.ARRAY, VT.FLOAT32)
        assert f.metadata["tokenizer.ggml.scores"].dtype == np.float32
        assert f.metadata["tokenizer.ggml.token_type"].dtype == np.int32
        assert f.metadata["t.arr_bool"].dtype == np.bool_
        assert f.metadata["t.arr_empty"].dtype == np.uint32 and f.metadata["t.arr_empty"].size == 0
        assert not f.metadata["tokenizer.ggml.scores"].flags.writeable
        assert list(f.tensors) == [t[0] for t in TENSORS]
        for name, qtype, shape in TENSORS:
            info = f.tensors[name]
            assert isinstance(info, TensorInfo)
            assert (info.qtype, info.shape, info.nbytes) == (qtype, shape, len(data[name]))
            assert info.offset % 64 == 0 and info.offset >= f.data_offset
            raw = f.raw(name)
            assert raw.dtype == np.uint8 and not raw.flags.writeable
            assert raw.tobytes() == data[name]
            rows = f.rows(name)
            assert rows.shape == (info.n_rows, info.type_info.row_bytes(shape[0]))
        empty = f.tensors["blk.0.empty"]
        assert (empty.n_elements, empty.n_rows, empty.nbytes) == (0, 4, 0)
        assert f.rows("blk.0.empty").shape == (4, 0)
        assert f.tensors["blk.0.ffn_up.weight"].n_rows == 8


def test_rewrite_is_metadata_identical(written: tuple[Path, dict[str, bytes]], tmp_path: Path) -> None:
    """Reading then writing with metadata_types gives back the same bytes."""
    path, _ = written
    with open_gguf(path) as f:
        copy = tmp_path / "copy.gguf"
        write_gguf(copy, f.metadata, [(t.name, t.qtype, t.shape, f.raw(t.name)) for t in f.tensors.values()],
                   metadata_types=f.metadata_types, alignment=f.alignment, version=f.version)
    assert copy.read_bytes() == path.read_bytes()


def test_nested_arrays_round_trip(tmp_path: Path) -> None:
    """An array of arrays (depth 2, the cap) is written and read back."""
    path = tmp_path / "nested.gguf"
    write_gguf(path, {"n": [["a", "b"], ["c"]], "m": [[1, 2], [3]]}, [])
    with open_gguf(path) as f:
        assert f.metadata["n"] == [["a", "b"], ["c"]]
        assert [list(x) for x in f.metadata["m"]] == [[1, 2], [3]]
        assert f.metadata_types["n"] == (VT.ARRAY, VT.ARRAY)


def test_infer_type_follows_gguf_py() -> None:
    """Python ints -> INT32 (INT64/UINT64 when wider), floats -> FLOAT32, as gguf-py's get_type."""
    assert infer_type(1) == (VT.INT32, None)
    assert infer_type(-(1 << 40)) == (VT.INT64, None)
    assert infer_type(1 << 63) == (VT.UINT64, None)
    assert infer_type(1.0) == (VT.FLOAT32, None)
    assert infer_type(True) == (VT.BOOL, None)
    assert infer_type("x") == (VT.STRING, None)
    assert infer_type(["a"]) == (VT.ARRAY, VT.STRING)
    assert infer_type([1, 1 << 40]) == (VT.ARRAY, VT.INT64)
    assert infer_type(np.zeros(2, np.float32)) == (VT.ARRAY, VT.FLOAT32)
    assert infer_type(np.uint16(3)) == (VT.UINT16, None)
    for bad in ([], [1, "a"], {"a": 1}, 1 << 64):
        with pytest.raises(ValueError):
            infer_type(bad)


def test_writer_rejects_bad_input_and_leaves_nothing(tmp_path: Path) -> None:
    """Bad tensors or metadata raise ValueError; the target and the folder are left untouched."""
    target = tmp_path / "out.gguf"
    target.write_bytes(b"keep me")
    bad_calls = [
        dict(metadata={}, tensors=[("a", GGMLType.F32, (4,), b"\0" * 15)]),              # wrong byte count
        dict(metadata={}, tensors=[("a", GGMLType.Q4_K, (100,), b"")]),                   # not a block multiple
        dict(metadata={}, tensors=[("n" * 64, GGMLType.F32, (1,), b"\0" * 4)]),           # name too long
        dict(metadata={"general.alignment": 64}, tensors=[]),                              # disagrees with 32
        dict(metadata={"x": 300}, tensors=[], metadata_types={"x": (VT.UINT8, None)}),     # does not fit
        dict(metadata={}, tensors=[], version=1),
        dict(metadata={}, tensors=[], alignment=48),
    ]
    for kwargs in bad_calls:
        metadata, tensors = kwargs.pop("metadata"), kwargs.pop("tensors")
        with pytest.raises(ValueError):
            write_gguf(target, metadata, tensors, **kwargs)
    assert target.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.gguf"]


def test_written_file_reads_identically_in_gguf_py(written: tuple[Path, dict[str, bytes]]) -> None:
    """gguf-py's GGUFReader sees the same metadata and tensors in a file from our writer."""
    path, data = written
    theirs = gguf.GGUFReader(path)
    with open_gguf(path) as f:
        _assert_agrees_with_gguf_py(f, theirs)
        for t in theirs.tensors:
            assert t.data.tobytes() == data[t.name]


def _assert_agrees_with_gguf_py(ours: GGUFFile, theirs: gguf.GGUFReader) -> None:
    """Every metadata key/type/value and every tensor name/type/shape/offset match."""
    fields = {k: v for k, v in theirs.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == list(ours.metadata)
    assert theirs.data_offset == ours.data_offset and theirs.alignment == ours.alignment
    for key, field in fields.items():
        vtype, item_type = ours.metadata_types[key]
        value = ours.metadata[key]
        types = [int(vtype)] + ([int(item_type)] if item_type is not None else [])
        if vtype == VT.ARRAY and len(value) == 0:  # type: ignore[arg-type]
            types = types[:1]  # gguf-py learns an array's item type from its first item
        assert [int(t) for t in field.types[:2]] == types, key
        expected = field.contents()
        if isinstance(value, np.ndarray):
            assert value.tolist() == expected, key
        elif isinstance(value, float):
            assert value == pytest.approx(expected, rel=0, abs=0) or (np.isnan(value) and np.isnan(expected)), key
        else:
            assert value == expected, key
    assert [t.name for t in theirs.tensors] == list(ours.tensors)
    for t in theirs.tensors:
        info = ours.tensors[t.name]
        assert int(t.tensor_type) == int(info.qtype), t.name
        assert tuple(int(d) for d in t.shape) == info.shape, t.name
        assert int(t.data_offset) == info.offset, t.name
        assert int(t.n_bytes) == info.nbytes and int(t.n_elements) == info.n_elements, t.name


@pytest.fixture(scope="module")
def smollm2_gguf_py(smollm2_path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(smollm2_path)


@pytest.fixture(scope="module")
def gemma3_gguf_py(gemma3_path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(gemma3_path)  # ~15 s: gguf-py builds one memmap per vocab string


@pytest.mark.slow
def test_smollm2_agrees_with_gguf_py(smollm2_path: Path, smollm2_gguf_py: gguf.GGUFReader) -> None:
    """SmolLM2 (BPE, 49k vocab, 48.9k merges): same metadata and tensors as gguf-py."""
    with open_gguf(smollm2_path) as f:
        assert f.warnings == []
        assert f.metadata["general.architecture"] == "llama"
        assert f.metadata_types["tokenizer.ggml.token_type"] == (VT.ARRAY, VT.INT32)
        _assert_agrees_with_gguf_py(f, smollm2_gguf_py)
        t = smollm2_gguf_py.tensors[5]
        assert np.array_equal(f.raw(t.name), t.data.reshape(-1).view(np.uint8))


@pytest.mark.slow
def test_gemma3_agrees_with_gguf_py(gemma3_path: Path, gemma3_gguf_py: gguf.GGUFReader) -> None:
    """gemma-3 (262k-token vocab, Q4_K/Q5_0/Q6_K/Q8_0): same metadata and tensors as gguf-py."""
    with open_gguf(gemma3_path) as f:
        assert len(f.metadata["tokenizer.ggml.tokens"]) == 262144
        assert f.metadata["tokenizer.ggml.scores"].dtype == np.float32
        _assert_agrees_with_gguf_py(f, gemma3_gguf_py)


def test_gemma3_parse_time(gemma3_path: Path) -> None:
    """Parsing the 262k-token vocab is fast (printed, not asserted: machines differ)."""
    open_gguf(gemma3_path).close()  # warm the page cache
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        with open_gguf(gemma3_path) as f:
            times.append(time.perf_counter() - t0)
            assert len(f.tensors) == 236
    print(f"\ngemma-3-270m open_gguf: best {1000 * min(times):.0f} ms of {len(times)}")


@pytest.mark.slow
@pytest.mark.parametrize("which", ["smollm2_path", "gemma3_path"])
def test_real_model_rewrite_is_byte_identical(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Writing a real model back out with its metadata_types reproduces the file byte for byte."""
    src: Path = request.getfixturevalue(which)
    out = tmp_path / src.name
    with open_gguf(src) as f:
        write_gguf(out, f.metadata, ((t.name, t.qtype, t.shape, f.raw(t.name)) for t in f.tensors.values()),
                   metadata_types=f.metadata_types, alignment=f.alignment, version=f.version)
    assert out.stat().st_size == src.stat().st_size
    assert _sha256(out) == _sha256(src)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


# -- GGUFFile behaviour -----------------------------------------------------------------------------

def test_check_unchanged_and_close(written: tuple[Path, dict[str, bytes]]) -> None:
    """raw() after a change on disk raises ModelFormatError; views survive close()."""
    path, data = written
    f = open_gguf(path)
    view = f.raw("token_embd.weight")
    f.check_unchanged()
    with open(path, "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(ModelFormatError, match="model file changed on disk; reload it"):
        f.raw("token_embd.weight")
    f.close()
    assert view.tobytes() == data["token_embd.weight"]
    with pytest.raises(ValueError, match="closed"):
        f.raw("token_embd.weight")


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo"])
def test_open_errors_become_model_format_errors(tmp_path: Path, kind: str) -> None:
    """OS-level failures are ModelFormatError with a message a user understands."""
    path = tmp_path / "x.gguf"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    expected = {"missing": "no such file", "directory": "is a directory", "fifo": "not a regular file"}[kind]
    with pytest.raises(ModelFormatError, match=expected):
        open_gguf(path)


def test_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PermissionError (simulated: the tests may run as root) becomes ModelFormatError."""
    path = tmp_path / "x.gguf"
    path.write_bytes(make_gguf())

    def deny(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(reader_module, "open", deny, raising=False)
    with pytest.raises(ModelFormatError, match="permission denied"):
        open_gguf(path)


def test_header_size_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Metadata larger than MAX_HEADER_BYTES is rejected instead of read into memory."""
    monkeypatch.setattr(header_module, "MAX_HEADER_BYTES", 100)
    monkeypatch.setattr(header_module, "_FIRST_READ", 64)
    path = tmp_path / "big.gguf"
    path.write_bytes(make_gguf())
    with pytest.raises(ModelFormatError, match=r"metadata and tensor infos exceed the 100 bytes limit"):
        open_gguf(path)


def test_array_item_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An array longer than MAX_ARRAY_ITEMS is rejected even when the bytes are there."""
    monkeypatch.setattr(header_module, "MAX_ARRAY_ITEMS", 3)
    path = tmp_path / "cap.gguf"
    path.write_bytes(make_gguf(kvs=[KV("a", ARRAY, Enc().u32(UINT8) + Enc().u64(4) + b"\1\2\3\4")]))
    with pytest.raises(ModelFormatError, match=r"metadata 'a' = 4: array declares 4 items \(max 3\)"):
        open_gguf(path)


def test_factory_default_is_valid_for_both_readers(tmp_path: Path) -> None:
    """The hostile-test factory's base file is a valid GGUF for us and for gguf-py."""
    path = tmp_path / "base.gguf"
    path.write_bytes(make_gguf())
    with open_gguf(path) as f:
        _assert_agrees_with_gguf_py(f, gguf.GGUFReader(path))
