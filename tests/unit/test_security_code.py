"""No code path unpickles data from a topic or from an unverified file.

An AST scan of every project module: each call that can run code while loading
data must be one of the reviewed, guarded forms below.  Adding a ``pickle.loads``,
a ``torch.load`` without ``weights_only=True``, a ``joblib.load``, a skops load
without the trusted-type check, or a faust pickle serializer fails this test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("aip", "clients", "config", "events", "models", "placement", "producers", "streams", "transport", "workloads")

# (module attribute or name called) -> why it is dangerous
UNSAFE_CALLS = {
    ("pickle", "loads"): "unpickles",
    ("pickle", "load"): "unpickles",
    ("pickle", "Unpickler"): "unpickles",
    ("cloudpickle", "loads"): "unpickles",
    ("cloudpickle", "load"): "unpickles",
    ("dill", "loads"): "unpickles",
    ("dill", "load"): "unpickles",
    ("joblib", "load"): "unpickles",
    ("marshal", "loads"): "loads code objects",
    ("shelve", "open"): "unpickles",
    ("yaml", "load"): "constructs arbitrary objects",
    ("pandas", "read_pickle"): "unpickles",
    ("pd", "read_pickle"): "unpickles",
    ("numpy", "load"): "unpickles with allow_pickle",
    ("np", "load"): "unpickles with allow_pickle",
}

# the reviewed exceptions: (file, function) -> the guard that must precede the call in that function
GUARDED = {
    ("models/persist.py", "load_signed"): "compare_digest",  # HMAC verified before pickle.loads
}


def modules() -> list[Path]:
    out: list[Path] = []
    for pkg in PACKAGES:
        out.extend(p for p in (ROOT / pkg).rglob("*.py") if ".venv" not in p.parts)
    return out


def _dotted(func: ast.expr) -> tuple[str, str] | None:
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return func.value.id, func.attr
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute):
        return func.value.attr, func.attr
    return None


def findings(path: Path) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(), filename=rel)
    out: list[str] = []
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node

    def function_of(node: ast.AST) -> ast.AST | None:
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("pickle", "cloudpickle", "dill", "joblib"):
            names = {a.name for a in node.names}
            if names & {"load", "loads", "Unpickler"}:
                out.append(f"{rel}:{node.lineno}: from {node.module} import {', '.join(sorted(names))}")
        if not isinstance(node, ast.Call):
            continue
        dotted = _dotted(node.func)
        keywords = {k.arg: k.value for k in node.keywords}
        if dotted == ("torch", "load"):
            wo = keywords.get("weights_only")
            if not (isinstance(wo, ast.Constant) and wo.value is True):
                out.append(f"{rel}:{node.lineno}: torch.load without weights_only=True")
            continue
        if dotted is not None and dotted[1] in ("load", "loads") and dotted[0] in ("sio", "skops", "io") and "skops" in path.read_text():
            fn = function_of(node)
            body = ast.unparse(fn) if fn is not None else ""
            if "get_untrusted_types" not in body or "raise" not in body:
                out.append(f"{rel}:{node.lineno}: skops load without checking untrusted types first")
            continue
        if dotted in (("np", "load"), ("numpy", "load")):
            ap = keywords.get("allow_pickle")
            if ap is None or (isinstance(ap, ast.Constant) and ap.value is False):
                continue  # numpy's default and explicit False refuse object arrays
        if dotted in UNSAFE_CALLS:
            fn = function_of(node)
            guard = GUARDED.get((rel, getattr(fn, "name", "")))
            if guard is not None and fn is not None:
                src = ast.unparse(fn)
                call = ast.unparse(node)
                if guard in src and src.index(guard) < src.index(call):
                    continue
            out.append(f"{rel}:{node.lineno}: {dotted[0]}.{dotted[1]} {UNSAFE_CALLS[dotted]}")
        if isinstance(node.func, ast.Name) and node.func.id in ("eval", "exec"):
            out.append(f"{rel}:{node.lineno}: {node.func.id}()")
        for name in ("value_serializer", "key_serializer", "serializer"):
            v = keywords.get(name)
            if isinstance(v, ast.Constant) and isinstance(v.value, str) and "pickle" in v.value:
                out.append(f"{rel}:{node.lineno}: faust {name}={v.value!r} unpickles topic data")
    return out


def test_no_code_path_unpickles_untrusted_data() -> None:
    found = [f for path in modules() for f in findings(path)]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import pickle\ndef f(b):\n    return pickle.loads(b)\n",
        "import torch\ndef f(p):\n    return torch.load(p)\n",
        "import torch\ndef f(p):\n    return torch.load(p, weights_only=False)\n",
        "import joblib\ndef f(p):\n    return joblib.load(p)\n",
        "from pickle import loads\n",
        "import faust\napp = faust.App('x', value_serializer='pickle')\n",
        "import skops.io as sio\ndef f(p):\n    return sio.load(p, trusted=True)\n",
        "import numpy as np\ndef f(p):\n    return np.load(p, allow_pickle=True)\n",
    ],
)
def test_the_scan_catches_each_unsafe_form(tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "models"
    pkg.mkdir()
    (pkg / "bad.py").write_text(source)
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert findings(pkg / "bad.py"), source


def test_the_guarded_loader_verifies_before_unpickling(tmp_path: Path) -> None:
    from models.persist import SignatureError, dump_signed, load_signed

    key = b"k" * 32
    data, signature = dump_signed({"a": 1}, key)
    assert load_signed(data, signature, key) == {"a": 1}
    with pytest.raises(SignatureError):
        load_signed(data + b"tampered", signature, key)
    with pytest.raises(SignatureError):
        load_signed(data, signature, b"other" * 8)
