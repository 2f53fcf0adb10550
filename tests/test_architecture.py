"""The layering of docs/ARCHITECTURE.md, checked on the import graph of minitorch/.

Layers, top to bottom: generation -> models -> core -> backends (minitorch.cpu, minitorch.cuda, below the
backend interface tensor_ops). Rules:
- the import-time graph (module-level imports, not `if TYPE_CHECKING:`) has no cycle;
- no core module imports a backend package (only minitorch/__init__.py, which assembles them, does);
- a backend does not need the core's Tensor side at import time: importing minitorch.cpu or
  minitorch.cuda loads none of tensor, tensor_functions, tensor_creation, nn, module, optim; their kernel
  modules load nothing of minitorch but leaf data modules;
- counting imports inside functions too, there is no cycle at all (core, models, generation, backends),
  and nothing imports a higher layer;
- no module of minitorch/ imports a program of project/ (the CLIs, benchmarks, the draft head's trainer).
The graph is read twice: statically (ast, every import statement) and by importing each backend package
in a fresh interpreter whose `minitorch` parent package is an empty stub (so minitorch/__init__.py does
not load everything first). Each rule is also run on a copy of the tree with a violating import written
in, and must fail there.
"""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "minitorch"

BACKENDS = ("minitorch.cpu", "minitorch.cuda")
# the core modules that hold or build Tensor objects: a backend may not load them at import time
TENSOR_SIDE = {f"minitorch.{m}" for m in ("tensor", "tensor_functions", "tensor_creation", "nn", "module", "optim")}
# kernel modules may load, of minitorch, only their own package and these leaf data modules
KERNEL_MODULES = {
    "minitorch.cpu.kernels": set(), "minitorch.cpu.fused": set(), "minitorch.cpu.matmul": set(),
    "minitorch.cpu.packed": {"minitorch.packed", "minitorch.tensor_data"},
    "minitorch.cuda.runtime": set(), "minitorch.cuda.launch": set(), "minitorch.cuda.blas": set(),
    "minitorch.cuda.pdl": set(), "minitorch.cuda.decoder": set(),
}
LAYER = {"minitorch.generation": 3, "minitorch.models": 2}
# below: the core's Tensor side (1, with minitorch/__init__.py), the backends (0), and what backends build on (-1):
# the slot-table interface tensor_ops, tensor_data, operators, autodiff, packed

Graph = Dict[str, Set[Tuple[str, bool]]]  # module -> {(imported module, at import time?)}


# ---- the static graph ----

def module_name(path: Path, pkg: Path) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, at_import: bool = True) -> Iterable[Tuple[ast.stmt, bool]]:
    """Every import statement with whether it runs when the module is imported (not inside a function)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, at_import
        elif isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), at_import)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _imports(node, False)
        else:
            yield from _imports(node, at_import)


def import_graph(pkg: Path = PKG) -> Graph:
    files = {module_name(p, pkg): p for p in pkg.rglob("*.py") if "__pycache__" not in p.parts}
    known = set(files)
    graph: Graph = {}
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        edges: Set[Tuple[str, bool]] = set()
        for node, at_import in _imports(ast.parse(path.read_text(), str(path))):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                for a in node.names:  # `from pkg import submodule` imports the submodule
                    targets.append(f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod)
            for t in targets:
                while t and t not in known and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in known and t != name:
                    edges.add((t, at_import))
        graph[name] = edges
    return graph


def cycles(graph: Graph, import_time_only: bool) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    adj = {m: sorted(t for t, at in es if at or not import_time_only) for m, es in graph.items()}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(adj):
        if v not in index:
            visit(v)
    return out


def closure(graph: Graph, start: str) -> Set[str]:
    seen, todo = set(), [start]
    while todo:
        for t, at in graph.get(todo.pop(), ()):
            if at and t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def in_backend(name: str) -> bool:
    return any(name == b or name.startswith(b + ".") for b in BACKENDS)


def layer(name: str) -> int:
    for prefix, rank in LAYER.items():
        if name == prefix or name.startswith(prefix + "."):
            return rank
    if in_backend(name):
        return 0
    return 1 if name in TENSOR_SIDE or name == "minitorch" else -1


def violations(graph: Graph) -> List[str]:
    """Every broken rule of the module docstring, as one line each (empty: the layering holds)."""
    bad = [f"import-time cycle: {' <-> '.join(c)}" for c in cycles(graph, import_time_only=True)]
    bad += [f"import cycle (imports inside functions counted): {' <-> '.join(c)}"
            for c in cycles(graph, import_time_only=False)]
    for mod, edges in sorted(graph.items()):
        for t, at in sorted(edges):
            if not in_backend(mod) and layer(mod) < 2 and mod != "minitorch" and in_backend(t):
                bad.append(f"core module {mod} imports backend module {t}")
            if in_backend(mod) and t in TENSOR_SIDE | {"minitorch"}:
                bad.append(f"backend module {mod} imports {t} (it gets Tensors as arguments)")
            # upward at import time is never allowed; inside a function, only within the core and backends
            if layer(t) > layer(mod) and (at or layer(t) >= 2):
                bad.append(f"{mod} imports {t}, a higher layer" + ("" if at else " (inside a function)"))
        if in_backend(mod):
            loaded = closure(graph, mod) & (TENSOR_SIDE | {"minitorch"})
            if loaded:
                bad.append(f"backend module {mod} loads {sorted(loaded)} at import time")
        if mod in KERNEL_MODULES:
            own = mod.rsplit(".", 1)[0]
            extra = {m for m in closure(graph, mod) if not (m == own or m.startswith(own + "."))} - KERNEL_MODULES[mod]
            if extra:
                bad.append(f"kernel module {mod} loads {sorted(extra)} at import time")
    return bad


def test_static_import_graph_keeps_the_layering():
    graph = import_graph()
    assert {"minitorch.cpu.ops", "minitorch.cuda.ops", "minitorch.tensor", "minitorch.models.qwen2"} <= set(graph)
    assert violations(graph) == []


# ---- nothing in minitorch/ imports the programs above it (project/: the CLIs, the trainer, benchmarks) ----

def program_names(project: Path = ROOT / "project") -> Set[str]:
    """Top-level names a program under project/ is imported by: its modules and packages, and project itself."""
    names = {p.stem for p in project.glob("*.py")} | {"project"}
    return names | {p.name for p in project.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def program_imports(pkg: Path = PKG) -> List[str]:
    """minitorch modules importing a program module (absolute imports, in functions too), one line each."""
    names, bad = program_names(), []
    for path in sorted(pkg.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        for node, _ in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                mods = [node.module] if node.level == 0 and node.module else []
            bad += [f"{module_name(path, pkg)} imports {m} (project/)" for m in mods if m.split(".")[0] in names]
    return bad


def test_the_library_imports_no_program():
    """The draft head's model and files live in minitorch/models; its losses and training-time test in
    project/training (a program built on the core's autodiff): the model never reaches up for them."""
    assert {"training", "cli_common", "project"} <= program_names()
    assert program_imports() == []


def test_program_import_check_fails_on_a_model_importing_the_trainer(tmp_path):
    pkg = _copy_tree(tmp_path)
    _edit(pkg / "models" / "draft_head.py", "class _FC(Module):",
          "def _loss():\n    from training.objective import head_loss\n\n\nclass _FC(Module):")
    assert program_imports(pkg) != []


# ---- the same rules on a real interpreter ----

PROBE = r"""
import importlib, json, sys, types
root, targets = sys.argv[1], sys.argv[2:]
result = {}
for target in targets:
    for k in [k for k in sys.modules if k == "minitorch" or k.startswith("minitorch.")]:
        del sys.modules[k]
    parts = target.split(".")
    for i in range(1, len(parts)):  # stub the parent packages: their __init__ must not run first
        name = ".".join(parts[:i])
        stub = types.ModuleType(name)
        stub.__path__ = [root + "/" + "/".join(parts[:i])]
        sys.modules[name] = stub
    importlib.import_module(target)
    result[target] = sorted(k for k in sys.modules if k.startswith("minitorch."))
result["cupy"] = "cupy" in sys.modules
print(json.dumps(result))
"""


def probe(root: Path, targets: List[str]) -> Dict[str, object]:
    """Import each target in turn in one fresh interpreter (parents stubbed), what of minitorch it loaded."""
    proc = subprocess.run([sys.executable, "-c", PROBE, str(root)] + targets, capture_output=True, text=True,
                          timeout=300, cwd=root)
    if proc.returncode != 0:  # e.g. "cannot import name ... from partially initialized module": a cycle
        return {"error": proc.stderr.strip().splitlines()[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def loaded_violations(loaded: Dict[str, object]) -> List[str]:
    if "error" in loaded:
        return [f"importing the backend alone failed: {loaded['error']}"]
    bad = []
    for target, mods in loaded.items():
        if target == "cupy":
            continue
        if in_backend(target) and TENSOR_SIDE & set(mods):
            bad.append(f"importing {target} loaded {sorted(TENSOR_SIDE & set(mods))}")
        if target in KERNEL_MODULES:
            own = target.rsplit(".", 1)[0]
            extra = {m for m in mods if not (m == own or m.startswith(own + "."))} - KERNEL_MODULES[target]
            if extra:
                bad.append(f"importing {target} loaded {sorted(extra)}")
    if loaded.get("cupy"):
        bad.append("importing the backends imported cupy")
    return bad


def backend_targets(pkg: Path = PKG) -> List[str]:
    names = sorted(n for n in import_graph(pkg) if in_backend(n))
    assert "minitorch.cpu" in names and "minitorch.cuda.decoder" in names
    return names


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_imports_alone_in_a_fresh_interpreter(backend):
    targets = [n for n in backend_targets() if n == backend or n.startswith(backend + ".")]
    loaded = probe(ROOT, targets)
    assert set(targets) <= set(loaded)
    assert loaded_violations(loaded) == []


def test_the_package_assembles_core_and_default_backend():
    """import minitorch gives the same API: FastBackend is the default backend, tensors build on the CPU."""
    import minitorch
    from minitorch import tensor_ops
    t = minitorch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert t.backend is minitorch.FastBackend and type(t) is minitorch.Tensor
    assert tensor_ops._tensor_class is minitorch.Tensor
    assert (t @ t).to_numpy().tolist() == [[7.0, 10.0], [15.0, 22.0]]
    s = minitorch.zeros((2,), backend=minitorch.SimpleBackend) + 1
    assert s.backend is minitorch.SimpleBackend and s.to_numpy().tolist() == [1.0, 1.0]


# ---- each rule fails on a tree that breaks it ----

def _copy_tree(tmp_path: Path) -> Path:
    dst = tmp_path / "minitorch"
    shutil.copytree(PKG, dst, ignore=shutil.ignore_patterns("__pycache__", "cuda_kernels", "*.pyc"))
    return dst


def _edit(path: Path, old: str, new: str) -> None:
    src = path.read_text()
    assert old in src, f"{path.name} changed: {old!r} not found"
    path.write_text(src.replace(old, new, 1))


BREAKS = {
    # the cycle this layout removed: the core's creation functions importing the CPU backend for a default
    "core imports backend": ("tensor_creation.py", "def _default_backend() -> \"TensorBackend\":\n",
                             "def _default_backend() -> \"TensorBackend\":\n    from .cpu import FastBackend\n"),
    # a backend importing the Tensor class at module level (as fast_ops and cuda_ops did)
    "backend imports Tensor": ("cpu/ops.py", "from .. import operators\n", "from .. import operators\nfrom ..tensor import Tensor\n"),
    # the backend interface importing the core (as tensor_ops did: Tensor and from_numpy)
    "tensor_ops imports the core": ("tensor_ops.py", "from . import operators\n",
                                    "from . import operators\nfrom .tensor_creation import from_numpy\n"),
    # a kernel module reaching into the core
    "kernel imports core": ("cuda/launch.py", "from .runtime import get_cupy, kernels\n",
                            "from .runtime import get_cupy, kernels\nfrom ..tensor_data import TensorData\n"),
    # the core's loops this layout removed (imports inside functions): cat through nn, packed_linear through tensor,
    # and in models gguf_io's tokenizer files through tokenizer
    "function-level loop in the core": ("tensor_functions.py", "def where(cond",
                                        "def _cat_via_nn():\n    from .nn import linear\n\n\ndef where(cond"),
    "function-level loop through packed": ("packed.py", "def packed_linear_reference(",
                                           "def _t():\n    from .tensor import Tensor\n\n\ndef packed_linear_reference("),
    "function-level loop in models": ("models/gguf_io.py", "def cache_key(",
                                      "def _tok():\n    from .tokenizer import load_tokenizer\n\n\ndef cache_key("),
    # the head's model reaching for its file I/O (head_io imports the model: a loop)
    "model imports its file I/O": ("models/draft_head.py", "class _FC(Module):",
                                   "def _save():\n    from .head_io import save_head\n\n\nclass _FC(Module):"),
    # the GPU decoder importing the model classes (a higher layer)
    "backend imports models": ("cuda/decoder.py", "import numpy as np\n",
                               "import numpy as np\n\n\ndef _cfg():\n    from ..models import Qwen2Config\n"),
}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_static_check_fails_on_a_violating_import(tmp_path, case):
    pkg = _copy_tree(tmp_path)
    rel, old, new = BREAKS[case]
    _edit(pkg / rel, old, new)
    assert violations(import_graph(pkg)) != []


@pytest.mark.parametrize("case", ["backend imports Tensor", "tensor_ops imports the core", "kernel imports core"])
def test_fresh_interpreter_check_fails_on_a_violating_import(tmp_path, case):
    pkg = _copy_tree(tmp_path)
    rel, old, new = BREAKS[case]
    _edit(pkg / rel, old, new)
    backend = "minitorch.cuda" if rel.startswith("cuda/") else "minitorch.cpu"
    targets = [n for n in backend_targets(pkg) if n == backend or n.startswith(backend + ".")]
    assert loaded_violations(probe(tmp_path, targets)) != []


# ---- paths the moves must keep ----

def test_cuda_runtime_finds_the_build_and_sources_where_the_tools_put_them():
    """minitorch/cuda/runtime.py loads fatbins from the folder compile_cuda.sh writes and setup.py packages
    (minitorch/cuda_kernels/), and NVRTC sources from kernels/."""
    import os
    env = {k: v for k, v in os.environ.items() if k != "MINITORCH_CUDA_BUILD_DIR"}
    code = "from minitorch.cuda.runtime import BUILD_DIR, SRC_DIR; print(BUILD_DIR); print(SRC_DIR)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    build, src = (Path(line) for line in proc.stdout.split())
    assert 'OUT="${MINITORCH_CUDA_BUILD_DIR:-$ROOT/minitorch/cuda_kernels}"' in (ROOT / "compile_cuda.sh").read_text()
    assert build == ROOT / "minitorch" / "cuda_kernels"
    assert '"minitorch": ["cuda_kernels/*"]' in (ROOT / "setup.py").read_text()
    assert src == ROOT / "kernels" and (src / "includes").is_dir() and list(src.glob("*.cu"))
