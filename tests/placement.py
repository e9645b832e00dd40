"""Where the lessons put their models and tensors: a static reading of the rank code.

With the GPU backend string "cpu:gloo,cuda:nccl", a CPU tensor still goes through gloo. A lesson
that wraps a CPU model in DDP, or all-reduces a CPU tensor, would run over gloo on a machine with
a GPU per rank, and the student would believe they watched nccl. `unplaced(code)` reads the rank
code (the `%%ranks` and `%%torchrun` cells of a notebook, in order, and the scripts handed to
`launch`) and lists each wrapper or collective call whose module or tensor is neither built on
`device()` nor moved there.

What counts as placed (the vocabulary of this module):

| expression | placed when |
|---|---|
| `e.to(d)` | `d` names a device: `device()`, `torch.device(...)` but "cpu", `x.device`, |
| | or a name or parameter bound to one |
| `e.cuda()` | always |
| any call with `device=d` | `d` names a device: `torch.zeros(3, device=device())` |
| `DDP(m)`, `fully_shard(m)`, `torch.cat([...])` | `m` is; the elements are |
| `e.method(...)`, `e.attr`, `e[i]` | `e` is |
| `f(a, ...)` | `f` is (a placed module called), or an argument is, or `f` is the |
| | notebook's own function and all it returns is |
| `a + b`, `a < b` | either side is |
| a name | one of its bindings in the same cell is; if the cell does not bind it, one |
| | in the nearest earlier cell that does |
| a function's parameter | every call that passes it passes a placed argument |

Checked calls: `DDP(m)` / `DistributedDataParallel(m)`, `fully_shard(m)`,
`ZeroRedundancyOptimizer(params)`, the kit's by-hand `broadcast_parameters(m)` /
`average_gradients(m)`, the tensor of every `dist.*` collective and point-to-point call, and the
inputs of a model that DDP or fully_shard returned. Never placed: `x.cpu()`, `x.item()`,
`x.to("cpu")`, `float(...)`, and `torch.tensor(...)`, `torch.zeros(...)` and the other
constructors without `device=`. Known limits: the order of bindings within a cell is not read
(one placed binding suffices), and collectives imported under other names are not seen. A cell
whose comment says "on the CPU on purpose" is exempt (the tests keep those cells in an
allow-list with the reason).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

ON_PURPOSE = "on the CPU on purpose"
WRAPPERS = {"DDP", "DistributedDataParallel", "fully_shard", "ZeroRedundancyOptimizer",
            "broadcast_parameters", "average_gradients"}
COLLECTIVES = {"all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all",
               "all_to_all_single", "isend", "irecv", "send", "recv"}
# Calls whose result is placed when their first argument is (besides methods of placed values).
# Calls that leave the device or give plain Python values, and constructors that build on the
# CPU unless given device=: never placed, whatever their arguments.
OFF_DEVICE_METHODS = {"cpu", "numpy", "item", "tolist"}
PYTHON_VALUES = {"float", "int", "len", "bool", "str", "round"}
CONSTRUCTORS = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "randn", "rand",
                "randint", "arange", "linspace", "eye"}
MODEL_WRAPPERS = {"DDP", "DistributedDataParallel", "fully_shard"}
PASS_THROUGH = WRAPPERS | {"cat", "stack", "empty_like", "zeros_like", "ones_like", "full_like",
                           "randn_like", "convert_sync_batchnorm", "deepcopy", "list", "tuple"}


@dataclass
class Cell:
    """One piece of rank code: where it comes from and its source (magic line removed)."""

    where: str
    source: str
    tree: ast.Module = field(init=False)
    exempt: bool = field(init=False)

    def __post_init__(self) -> None:
        self.tree = ast.parse(self.source)
        self.exempt = ON_PURPOSE in self.source


@dataclass(frozen=True)
class Param:
    """A binding made by a call: parameter `name` of the function or lambda `owner`."""

    owner: ast.AST
    name: str


@dataclass(frozen=True)
class Finding:
    where: str
    line: int
    call: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}, line {self.line}: {self.call}: {self.what} not on device()"


def notebook_cells(path: Path, notebook: dict | None = None) -> list[Cell]:
    """The rank code of a notebook (read from `path`, or given), in order: `%%ranks` /
    `%%torchrun` cells, and every string in a kernel cell that is itself a script with
    `init_process_group` (code for `launch`)."""
    cells = []
    notebook = json.loads(path.read_text()) if notebook is None else notebook
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        where = f"{path.name} cell {index}"
        first, _, body = source.partition("\n")
        if first.startswith(("%%ranks", "%%torchrun")):
            cells.append(Cell(where, body))
            continue
        kernel = "\n".join("" if line.startswith(("%", "!")) else line
                           for line in source.splitlines())
        for node in ast.walk(ast.parse(kernel)):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and "init_process_group" in node.value):
                cells.append(Cell(f"{where} (script)", node.value))
    return cells


def script_cells(path: Path) -> list[Cell]:
    return [Cell(path.name, path.read_text())]


def _name(func: ast.expr) -> str:
    """The called name: `f` for f(...), `attr` for x.attr(...)."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _key(node: ast.expr) -> str | None:
    """The binding key of a name or of `self.attr`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


class Reading:
    """The bindings of every cell, then whether an expression is placed (to a fixpoint)."""

    def __init__(self, cells: list[Cell]) -> None:
        self.cells = cells
        # per cell: key -> the expressions bound to it there (None: bound, value unknown)
        self.bound: list[dict[str, list]] = []  # per cell: key -> expressions or Params
        self.functions: dict[str, ast.FunctionDef | ast.Lambda] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.placed_params: set[Param] = set()
        self.device_params: set[Param] = set()  # parameters every call gives a device
        for index, cell in enumerate(cells):
            bound: dict[str, list[ast.expr | None]] = {}
            for node in ast.walk(cell.tree):
                self._collect(node, bound, index)
            self.bound.append(bound)
        self._settle()

    # -- bindings ---------------------------------------------------------------------------
    def _bind(self, target: ast.expr, value: ast.expr | None, bound: dict) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            values = (value.elts if isinstance(value, (ast.Tuple, ast.List))
                      and len(value.elts) == len(target.elts) else [value] * len(target.elts))
            for t, v in zip(target.elts, values, strict=True):
                self._bind(t, v, bound)
        elif isinstance(target, ast.Starred):
            self._bind(target.value, value, bound)
        elif (key := _key(target)) is not None:
            bound.setdefault(key, []).append(value)

    def _collect(self, node: ast.AST, bound: dict, index: int) -> None:
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and _name(node.value.func) in {"to", "cuda"}
                and isinstance(node.value.func, ast.Attribute)):
            self._bind(node.value.func.value, node.value, bound)  # net.to(device()): in place
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._bind(target, node.value, bound)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            self._bind(node.target, node.value, bound)
        elif isinstance(node, (ast.For, ast.comprehension)):
            self._bind(node.target, node.iter, bound)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            self._bind(node.optional_vars, node.context_expr, bound)
        elif isinstance(node, ast.NamedExpr):
            self._bind(node.target, node.value, bound)
        elif isinstance(node, (ast.FunctionDef, ast.Lambda)):
            if isinstance(node, ast.FunctionDef):
                self.functions.setdefault(node.name, node)
            for arg in node.args.args + node.args.kwonlyargs:
                bound.setdefault(arg.arg, []).append(Param(node, arg.arg))
        elif isinstance(node, ast.ClassDef):
            self.classes[node.name] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound.setdefault((alias.asname or alias.name).split(".")[0], []).append(None)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.functions[target.id] = node.value

    def _parameters(self, callee: str, method: str = "__init__") -> list[Param]:
        """The parameters a call of `callee` binds, in order (a class: its __init__'s, or
        with method="__call__" those of its instances' calls)."""
        if callee in self.functions and method == "__init__":
            owner = self.functions[callee]
            return [Param(owner, a.arg) for a in owner.args.args]
        if callee in self.classes:
            for item in self.classes[callee].body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return [Param(item, a.arg) for a in item.args.args[1:]]
        return []

    def _callees(self, callee: str, index: int, aliases: dict[str, set[str]]) -> list[list[Param]]:
        """The parameter lists a call of the name `callee` may bind: a function's, a class's
        __init__, through a parameter bound to either, or an instance's __call__."""
        named = [self._parameters(n) for n in {callee} | aliases.get(callee, set())]
        for _, value in self._bindings(callee, index):
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                made = value.func.id
                named += [self._parameters(n, "__call__")
                          for n in {made} | aliases.get(made, set())]
        return [params for params in named if params]

    def _settle(self) -> None:
        """A parameter is placed when every call that passes it passes a placed argument (at
        least one call): from none placed, repeat until stable. A parameter bound to a function
        or class at a call site stands for it in the calls made through it."""
        aliases: dict[str, set[str]] = {}
        while True:
            before = (set(self.placed_params), set(self.device_params),
                      {k: set(v) for k, v in aliases.items()})
            passed: dict[Param, list[ast.expr]] = {}
            for index, cell in enumerate(self.cells):
                for node in ast.walk(cell.tree):
                    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                        continue
                    for params in self._callees(node.func.id, index, aliases):
                        for param, arg in zip(params, node.args, strict=False):
                            if isinstance(arg, ast.Name) and (
                                    arg.id in self.functions or arg.id in self.classes):
                                aliases.setdefault(param.name, set()).add(arg.id)
                            passed.setdefault(param, []).append((index, arg))
                        for keyword in node.keywords:
                            for param in params:
                                if param.name == keyword.arg:
                                    passed.setdefault(param, []).append((index, keyword.value))
            self.placed_params = {param for param, args in passed.items()
                                  if all(self.placed(a, i) for i, a in args)}
            self.device_params = {param for param, args in passed.items()
                                  if all(self.names_device(a, i) for i, a in args)}
            if before == (self.placed_params, self.device_params, aliases):
                return

    # -- placement ----------------------------------------------------------------------------
    def names_device(self, node: ast.expr, index: int, depth: int = 0) -> bool:
        """Whether `node` is a device: device(), x.device, "cuda...", or a name bound to one."""
        if isinstance(node, ast.Call) and _name(node.func) == "device":
            cpu = [a for a in node.args if isinstance(a, ast.Constant) and a.value == "cpu"]
            return not cpu  # ddp_kit.worker.device(), torch.device(f"cuda:{i}"), not "cpu"
        if isinstance(node, ast.Attribute) and node.attr == "device":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value.startswith("cuda")
        key = _key(node)
        if key is not None and depth < 8:
            return any(v in self.device_params if isinstance(v, Param)
                       else v is not None and self.names_device(v, i, depth + 1)
                       for i, v in self._bindings(key, index))
        return False

    def _bindings(self, key: str, index: int) -> list[tuple[int, ast.expr | Param | None]]:
        """The bindings of `key` that reach cell `index`: its own, or the nearest earlier cell's."""
        for i in range(index, -1, -1):
            if key in self.bound[i]:
                return [(i, v) for v in self.bound[i][key]]
        return []

    def placed(self, node: ast.expr | Param | None, index: int, depth: int = 0) -> bool:
        if isinstance(node, Param):
            return node in self.placed_params
        if node is None or depth > 12:
            return False
        deeper = depth + 1
        if isinstance(node, ast.Call):
            name = _name(node.func)
            if name == "cuda" or (name == "to" and any(
                    self.names_device(a, index) for a in node.args)):
                return True
            if any(k.arg == "device" and self.names_device(k.value, index)
                   for k in node.keywords):
                return True
            method = isinstance(node.func, ast.Attribute)
            if name == "to" or (method and name in OFF_DEVICE_METHODS) or name in CONSTRUCTORS or (
                    not method and name in PYTHON_VALUES):
                return False  # x.to("cpu"), x.cpu(), x.item(), torch.tensor(...), float(...)
            if name == "buffer" and isinstance(node.func, ast.Attribute):
                return True  # a comm hook's bucket.buffer(): DDP's bucket, on the model's device
            if name in PASS_THROUGH and node.args:
                return self.placed(node.args[0], index, deeper)
            if isinstance(node.func, ast.Attribute) and self.placed(node.func.value, index, deeper):
                return True  # a placed value's method: x.clone(), model.parameters()
            if isinstance(node.func, ast.Name) and self.placed(node.func, index, deeper):
                return True  # a placed module called
            if any(self.placed(a, index, deeper) for a in node.args):
                return True  # an operation on a placed tensor: mse_loss(model(x), y)
            function = self.functions.get(name) if isinstance(node.func, ast.Name) else None
            if isinstance(function, ast.FunctionDef):
                returned = [r.value for r in ast.walk(function)
                            if isinstance(r, ast.Return) and r.value is not None]
                return bool(returned) and all(self.placed(r, index, deeper) for r in returned)
            return False
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
            key = _key(node)
            if key is not None and "." in key and any(
                    self.placed(v, i, deeper) for i, v in self._bindings(key, index)):
                return True  # self.flat = [...] bound placed
            return self.placed(node.value, index, deeper)
        if isinstance(node, ast.Compare):
            return any(self.placed(e, index, deeper) for e in [node.left, *node.comparators])
        if isinstance(node, ast.BinOp):
            return self.placed(node.left, index, deeper) or self.placed(node.right, index, deeper)
        if isinstance(node, ast.UnaryOp):
            return self.placed(node.operand, index, deeper)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return bool(node.elts) and all(self.placed(e, index, deeper) for e in node.elts)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            return self.placed(node.elt, index, deeper)
        if isinstance(node, ast.IfExp):
            return self.placed(node.body, index, deeper) and self.placed(node.orelse, index, deeper)
        if isinstance(node, ast.Name):
            return any(self.placed(v, i, deeper) for i, v in self._bindings(node.id, index))
        return False


def _collective(node: ast.Call) -> bool:
    """`dist.all_reduce(...)`, `torch.distributed.broadcast(...)`, ... (not a method `x.send`)."""
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr in COLLECTIVES
            and isinstance(func.value, (ast.Name, ast.Attribute))
            and ast.unparse(func.value) in {"dist", "torch.distributed"})


def _wrapped_model(reading: Reading, func: ast.expr, index: int) -> bool:
    """Whether `func` is a model that DDP or fully_shard returned (so its inputs are checked)."""
    key = _key(func)
    if key is None:
        return False
    return any(isinstance(v, ast.Call) and _name(v.func) in MODEL_WRAPPERS
               for _, v in reading._bindings(key, index))


def unplaced(cells: list[Cell]) -> list[Finding]:
    """Every checked call in `cells` whose module, tensor or input is not placed on device()."""
    reading, found = Reading(cells), []
    for index, cell in enumerate(cells):
        if cell.exempt:
            continue
        for node in ast.walk(cell.tree):
            if not isinstance(node, ast.Call):
                continue
            name = _name(node.func)
            keywords = {k.arg: k.value for k in node.keywords}
            if isinstance(node.func, ast.Name) and name in WRAPPERS:
                what = "the parameters are" if "Optimizer" in name else "the module is"
                arguments = node.args[:1] or [keywords.get(k) for k in ("module", "params")]
            elif _collective(node):
                what = "the tensor is"
                arguments = node.args[:1] or [keywords.get("tensor")]
                if name in {"all_gather", "gather"}:
                    arguments = node.args[1:2] or [keywords.get("tensor")]  # this rank's
            elif _wrapped_model(reading, node.func, index):
                what, arguments = "the input is", node.args
            else:
                continue
            for argument in arguments:
                if argument is not None and not reading.placed(argument, index):
                    call = re.sub(r"\s+", " ", ast.unparse(node))
                    found.append(Finding(cell.where, node.lineno, call[:90], what))
                    break
    return found
