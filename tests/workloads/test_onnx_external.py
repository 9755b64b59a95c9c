"""External data of ONNX tensors (issue 34): the rule of opmap.workloads.onnx_data holds for every tensor the reader
touches, wherever it sits, against every kind of bad location.

The layout of each case: ``cwd/`` is the process's working directory and holds ``secret.txt``; the model lives in
``cwd/model/``; ``outside/secret.txt`` lies beside ``cwd``. The secret is ``TOPS`` (bytes 84 79 80 83): a model
that reads it as a uint8 tensor cast to int64 and used as an Expand shape shows ``84x79x80x83`` as a tensor shape.
Every location x every bad location must be refused in one OpmapError line (exit status 2 through the CLI), with
no byte of the secret in the terminal, the output folder or the run store; a good location (a file inside the
model's folder) is read from that folder, never from the working directory.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from opmap.errors import OpmapError
from opmap.workloads.onnx import load_onnx

SECRET = b"TOPS"  # 84 79 80 83
INSIDE = bytes([2, 3, 4, 5])  # the file inside the model's folder: the shape 2x3x4x5
# the secret as any output could show it: raw, as a shape, as a list, one byte repeated (a ConstantOfShape fill)
LEAKS = ("TOPS", "84x79", "84, 79", "84,79", "84x84", "84, 84", "84,84")
HANG_S = 10


def _ext(name: str, loc: str, n: int = 4) -> TensorProto:
    t = TensorProto(name=name, data_type=TensorProto.UINT8, dims=[n])
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=loc)
    t.external_data.add(key="length", value=str(n))
    return t


def _inline(name: str) -> TensorProto:
    return numpy_helper.from_array(np.frombuffer(INSIDE, np.uint8).copy(), name)


def _u8(name, shape=(4,)):
    return helper.make_tensor_value_info(name, TensorProto.UINT8, list(shape))


def _leak_tail(src: str) -> list:
    """``src`` (uint8 [4]) cast to int64 and used as the shape x (1, 1, 1, 1) expands to."""
    return [helper.make_node("Cast", [src], ["s64"], to=TensorProto.INT64),
            helper.make_node("Expand", ["x", "s64"], ["y"])]


def _branch(loc: str, where: str, name: str) -> object:
    """An If branch (or the graph inside one) that outputs ``r``: from an external initializer or Constant."""
    if where == "initializer":
        return helper.make_graph([helper.make_node("Identity", ["b"], ["r"])], name, [], [_u8("r")],
                                 initializer=[_ext("b", loc)])
    return helper.make_graph([helper.make_node("Constant", [], ["r"], value=_ext("b", loc))], name, [], [_u8("r")])


def _else() -> object:
    return helper.make_graph([helper.make_node("Constant", [], ["r"], value=_inline("e"))], "else", [], [_u8("r")])


def _if(loc: str, where: str, out: str = "r") -> object:
    return helper.make_node("If", ["cond"], [out], then_branch=_branch(loc, where, "then"), else_branch=_else())


def _model(loc: str, site: str):
    """A model whose tensor at ``site`` keeps its data at ``loc``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, 1])
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    trip = helper.make_tensor_value_info("trip", TensorProto.INT64, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inputs, outputs, inits, sparse, funcs = [x], [y], [], [], []
    if site == "initializer":
        nodes, inits = _leak_tail("s"), [_ext("s", loc)]
    elif site == "constant":
        nodes = [helper.make_node("Constant", [], ["s"], value=_ext("s", loc)), *_leak_tail("s")]
    elif site == "sparse-constant":
        sp = helper.make_sparse_tensor(_ext("v", loc), numpy_helper.from_array(np.arange(4, dtype=np.int64), "i"), [4])
        nodes = [helper.make_node("Constant", [], ["s"], sparse_value=sp), *_leak_tail("s")]
    elif site == "sparse-initializer":
        sparse = [helper.make_sparse_tensor(_ext("v", loc), numpy_helper.from_array(np.arange(4, dtype=np.int64),
                                                                                     "i"), [4])]
        nodes = [helper.make_node("Relu", ["x"], ["y"])]
    elif site == "constant-of-shape":
        nodes = [helper.make_node("Constant", [], ["n"], value=numpy_helper.from_array(np.array([4], np.int64))),
                 helper.make_node("ConstantOfShape", ["n"], ["s"], value=_ext("v", loc, 1)), *_leak_tail("s")]
    elif site in ("if-initializer", "if-constant"):
        inputs.append(cond)
        nodes = [_if(loc, site[3:], "s"), *_leak_tail("s")]
    elif site in ("loop-if-initializer", "loop-if-constant"):  # two deep: a Loop body holding an If
        body = helper.make_graph([helper.make_node("Identity", ["c"], ["c_out"]), _if(loc, site[8:])], "body",
                                 [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                                  helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                                 [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), _u8("r")])
        inputs += [trip, cond]
        nodes = [helper.make_node("Loop", ["trip", "cond"], ["rs"], body=body), helper.make_node("Relu", ["x"], ["y"])]
        outputs.append(helper.make_tensor_value_info("rs", TensorProto.UINT8, None))
    elif site == "function-constant":
        funcs = [helper.make_function("my.fn", "Leak", [], ["r"], [helper.make_node("Constant", [], ["r"],
                                                                                   value=_ext("b", loc))],
                                      [helper.make_opsetid("", 17)])]
        nodes = [helper.make_node("Relu", ["x"], ["y"])]
    else:
        raise AssertionError(site)
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits, sparse_initializer=sparse)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("my.fn", 1)] if funcs else [])
    return helper.make_model(g, opset_imports=opsets, functions=funcs)


SITES = ("initializer", "constant", "sparse-constant", "sparse-initializer", "constant-of-shape", "if-initializer",
         "if-constant", "loop-if-initializer", "loop-if-constant", "function-constant")


def _layout(tmp: Path) -> tuple[Path, Path, Path]:
    cwd, model, outside = tmp / "cwd", tmp / "cwd" / "model", tmp / "outside"
    for d in (model, outside):
        d.mkdir(parents=True)
    (cwd / "secret.txt").write_bytes(SECRET)
    (outside / "secret.txt").write_bytes(SECRET)
    return cwd, model, outside


def _bad(kind: str, model: Path, outside: Path) -> str:
    """Make the files a bad location ``kind`` needs; return the location."""
    if kind == "absolute":
        return str(outside / "secret.txt")
    if kind == "dotdot":
        return "../secret.txt"
    if kind == "dotdot-inside":  # a name that climbs out through a folder that exists
        (model / "sub").mkdir()
        return "sub/../../secret.txt"
    if kind == "link-out":
        (model / "link.bin").symlink_to(outside / "secret.txt")
        return "link.bin"
    if kind == "link-folder":
        (model / "sub").symlink_to(outside, target_is_directory=True)
        return "sub/secret.txt"
    if kind == "missing-beside-cwd":  # the original leak: no such file beside the model, one in the cwd
        return "secret.txt"
    if kind == "fifo":
        os.mkfifo(model / "pipe")
        return "pipe"
    if kind == "dev-zero":
        return "/dev/zero"
    if kind == "link-dev-zero":
        (model / "zero").symlink_to("/dev/zero")
        return "zero"
    if kind == "folder":
        (model / "dir").mkdir()
        return "dir"
    raise AssertionError(kind)


BAD = ("absolute", "dotdot", "dotdot-inside", "link-out", "link-folder", "missing-beside-cwd", "fifo", "dev-zero",
       "link-dev-zero", "folder")


class Hang(Exception):
    pass


@pytest.fixture
def alarm():
    """A read that blocks (a FIFO opened by onnx's own loader) fails the test instead of hanging it."""
    def ring(_s, _f):
        raise Hang()

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(HANG_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _no_leak(*texts: str, folders=()) -> None:
    blobs = [t.encode() for t in texts]
    for folder in folders:
        blobs += [p.read_bytes() for p in Path(folder).rglob("*") if p.is_file() and not p.is_symlink()]
    for blob in blobs:
        assert not any(leak.encode() in blob for leak in LEAKS), blob[:300]


@pytest.mark.parametrize("kind", BAD)
@pytest.mark.parametrize("site", SITES)
def test_every_tensor_refuses_every_bad_location(tmp_path, monkeypatch, capsys, alarm, site, kind):
    from opmap.cli import main

    cwd, model, outside = _layout(tmp_path)
    path = model / "m.onnx"
    save(_model(_bad(kind, model, outside), site), str(path))
    monkeypatch.chdir(cwd)
    with pytest.raises(OpmapError) as e:
        load_onnx(str(path))
    assert "\n" not in str(e.value) and "m.onnx" in str(e.value)
    store = tmp_path / "store"
    monkeypatch.setenv("OPMAP_STORE", str(store / "runs.duckdb"))
    capsys.readouterr()
    rc = main(["analyze", "model/m.onnx", "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("opmap: error:"), err
    assert not (tmp_path / "out").exists() and not out.strip()
    _no_leak(out, err, str(e.value), folders=[store])


@pytest.mark.parametrize("site", SITES)
def test_a_file_inside_the_folder_is_read_from_the_folder(tmp_path, monkeypatch, alarm, site):
    """The same name in the working directory and in the model's folder: the value comes from the folder."""
    cwd, model, _ = _layout(tmp_path)
    (model / "secret.txt").write_bytes(INSIDE)
    path = model / "m.onnx"
    save(_model("secret.txt", site), str(path))
    monkeypatch.chdir(cwd)
    w = load_onnx(str(path))
    shapes = [n.outputs[0].shape for n in w.graph.nodes if n.outputs]
    if site in ("constant", "constant-of-shape"):  # values the reader reads: the Expand target
        want = (2, 3, 4, 5) if site == "constant" else (2, 2, 2, 2)
        assert want in shapes, shapes
    assert not any(s[:2] == (84, 79) or s[:2] == (84, 84) for s in shapes), shapes


def test_random_locations_never_read_outside_the_folder(tmp_path, monkeypatch, alarm):
    """Seeded location strings built from the parts an attacker tries (``..``, ``.``, separators of both kinds,
    absolute roots, drive letters, NUL, links in and out): each is refused in one line, or read from inside the
    model's folder (the Expand target is then 2x3x4x5, the folder's bytes)."""
    cwd, model, outside = _layout(tmp_path)
    (model / "secret.txt").write_bytes(INSIDE)
    (model / "sub").mkdir()
    (model / "sub" / "secret.txt").write_bytes(INSIDE)
    (model / "out").symlink_to(outside, target_is_directory=True)
    (model / "in.bin").symlink_to(model / "secret.txt")
    monkeypatch.chdir(cwd)
    parts = ["..", ".", "sub", "out", "secret.txt", "in.bin", "model", "cwd", str(outside), "/", "\\", "C:", "\0",
             "", "%2e%2e", "...", "/dev/zero", str(cwd)]
    rng = random.Random(20261206)
    read = refused = 0
    for i in range(300):
        loc = rng.choice(["/", "\\", ""]).join(rng.choice(parts) for _ in range(rng.randint(1, 5)))
        path = model / f"r{i}.onnx"
        save(_model(loc, "constant"), str(path))
        try:
            w = load_onnx(str(path))
        except OpmapError as e:
            assert "\n" not in str(e)
            _no_leak(str(e))
            refused += 1
            continue
        shapes = [n.outputs[0].shape for n in w.graph.nodes if n.outputs]
        assert (2, 3, 4, 5) in shapes, (loc, shapes)
        read += 1
    assert refused > 100 and read > 0  # both kinds drawn
