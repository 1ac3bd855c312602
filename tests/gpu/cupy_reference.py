"""Gradwire's uses of CuPy, found by walking client/, and real CuPy's signatures to bind them to.

The walk finds attribute chains rooted at the array module: a name that the same function (or an
enclosing one, or the module) assigned from a function returning the module (``array_module``,
``cupy_or_none``; functions returning what those return, such as ``module_for``, ``_cupy`` and
``real_step_inputs``'s tuple, are found by the walk, matched by name), a name spelled ``cupy``,
``cp`` or ``xp``, or such a call itself (``array_module(a).where``). ``getattr(xp, name)`` is
followed when ``name`` can only be literals; ``fn = xp.f if c else xp.g`` and ``fn(...)`` count as
calls of both. Signatures come from ``inspect.signature``, else from the first docstring line,
where CuPy's Cython functions state theirs; CuPy ufuncs get one built from ``nin`` and ``nout``.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Use", "walk", "package_sources", "signature", "resolve", "bind_problem"]

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "client"
SEED_GETTERS = frozenset({"array_module", "cupy_or_none", "get_array_module"})
LITERAL_ROOTS = frozenset({"cupy", "cp", "xp"})  # lambda and method parameters too
UFUNC_KEYWORDS = frozenset({"out", "dtype", "casting"})  # the floor; the docstring adds more


@dataclass(frozen=True)
class Use:
    """One attribute chain rooted at the array module; ``args`` is set when it is called."""

    file: str
    line: int
    path: str
    source: str
    args: tuple[int, bool, tuple[str, ...], bool] | None  # npos, *args, keywords, **kwargs

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


# --- the walk -------------------------------------------------------------------------------

_Scope = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """Nodes of ``scope`` outside nested functions and lambdas (class bodies included)."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, _Scope):
            todo.extend(ast.iter_child_nodes(node))


def _callee_name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


class _Walker:
    """One parsed file: which names hold the array module, or a function of it, in which scope,
    and the chains rooted at them."""

    def __init__(
        self, rel: str, trees: dict[str, ast.Module], getters: dict[str, int | None]
    ) -> None:
        self.rel, self.tree, self.trees, self.getters = rel, trees[rel], trees, getters
        self.parent = {c: p for p in ast.walk(self.tree) for c in ast.iter_child_nodes(p)}
        self.bound: dict[ast.AST, frozenset[str]] = {}
        self.aliases: dict[ast.AST, dict[str, list[ast.expr]]] = {}
        self.ambiguous: list[str] = []
        self._bind(self.tree, frozenset(), {})

    def is_module(self, node: ast.AST, bound: frozenset[str]) -> bool:
        if isinstance(node, ast.Name):
            return node.id in bound or node.id in LITERAL_ROOTS
        if isinstance(node, ast.IfExp):  # xp = cp if on_gpu else np
            return self.is_module(node.body, bound) or self.is_module(node.orelse, bound)
        if isinstance(node, ast.Call):
            name = _callee_name(node)
            if name == "import_module":
                return [ast.unparse(a) for a in node.args] == ["'cupy'"]
            return name in self.getters and self.getters[name] is None
        return False

    def _bind(
        self, scope: ast.AST, inherited: frozenset[str], outer: dict[str, list[ast.expr]]
    ) -> None:
        args = scope.args if isinstance(scope, _Scope[1:]) else None
        params = {a.arg for a in ast.walk(args) if isinstance(a, ast.arg)} if args else set()
        assigns = [
            (t, node.value)
            for node in _own_nodes(scope)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        ]
        bound, other = set(inherited - params), set[str]()
        for _ in range(3):  # a few rounds for xp2 = xp chains
            other = set()
            for node in _own_nodes(scope):
                if isinstance(node, ast.Import):
                    bound.update(a.asname or "cupy" for a in node.names if a.name == "cupy")
            for t, value in assigns:
                self._note(t, value, frozenset(bound), bound, other)
        self.bound[scope] = frozenset(bound)
        where = f"{self.rel}:{getattr(scope, 'lineno', 1)}"
        for name in sorted(other & (bound | LITERAL_ROOTS)):
            self.ambiguous.append(f"{where}: {name!r} is assigned the array module and more")
        # fn = xp.argmax, ufunc = getattr(xp, name): names holding a function of the module
        skip = params | {t.id for t, _ in assigns if isinstance(t, ast.Name)}
        aliases = self.aliases[scope] = {k: v for k, v in outer.items() if k not in skip}
        plain = set()
        for t, value in assigns:
            if isinstance(t, ast.Name) and t.id not in bound:
                if self._paths(value) is not None:
                    aliases.setdefault(t.id, []).append(value)
                elif not (isinstance(value, ast.Constant) and value.value is None):
                    plain.add(t.id)
        for name in sorted(plain & aliases.keys()):
            self.ambiguous.append(f"{where}: {name!r} is assigned a CuPy function and more")
        for node in _own_nodes(scope):
            if isinstance(node, _Scope):
                self._bind(node, frozenset(bound), aliases)

    def _note(
        self, t: ast.AST, value: ast.AST, now: frozenset[str], bound: set[str], other: set[str]
    ) -> None:
        if isinstance(t, ast.Name):
            if self.is_module(value, now):
                bound.add(t.id)
            elif not (isinstance(value, ast.Constant) and value.value is None):
                other.add(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            at = (
                self.getters.get(_callee_name(value) or "") if isinstance(value, ast.Call) else None
            )
            for i, elt in enumerate(t.elts):
                if isinstance(elt, ast.Name):
                    (bound if at == i else other).add(elt.id)

    def scope_of(self, node: ast.AST) -> ast.AST:
        node = self.parent[node]
        while not isinstance(node, _Scope):
            node = self.parent[node]
        return node

    def returns_module(self) -> dict[str, int | None]:
        """Functions of this file that return the module (None) or a tuple holding it (index)."""
        found: dict[str, int | None] = {}
        for fn in ast.walk(self.tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in _own_nodes(fn):
                if isinstance(node, ast.Return) and node.value is not None:
                    if self.is_module(node.value, self.bound[fn]):
                        found[fn.name] = None
                    elif isinstance(node.value, ast.Tuple):
                        for i, elt in enumerate(node.value.elts):
                            if self.is_module(elt, self.bound[fn]):
                                found.setdefault(fn.name, i)
        return found

    def uses(self) -> Iterator[Use | str]:
        """Each longest chain rooted at the module, or a message when its name is dynamic."""
        for node in ast.walk(self.tree):
            up = self.parent.get(node)
            if isinstance(node, ast.Attribute) or (
                isinstance(node, ast.Call) and _callee_name(node) == "getattr"
            ):
                if isinstance(up, ast.Attribute):
                    continue  # part of a longer chain
            elif not (isinstance(node, ast.Name) and isinstance(up, ast.Call) and up.func is node):
                continue  # a called name counts when it is an alias: fn(...) after fn = xp.f
            paths = self._paths(node)
            if paths is None or paths == [""]:
                continue
            if isinstance(paths, str):
                yield f"{self.rel}:{node.lineno}: {ast.unparse(node)[:90]}: {paths}"
                continue
            call = self._call_of(node)
            for path in paths:
                text = ast.unparse(call if call is not None else node)[:90]
                yield Use(self.rel, node.lineno, path, text, _arg_shape(call))

    def _call_of(self, node: ast.AST) -> ast.Call | None:
        """The call of a chain: ``xp.f(...)`` or ``(xp.f if c else xp.g)(...)``."""
        up = self.parent.get(node)
        if isinstance(up, ast.IfExp) and node is not up.test:
            node, up = up, self.parent.get(up)
        return up if isinstance(up, ast.Call) and up.func is node else None

    def _paths(self, node: ast.AST) -> list[str] | str | None:
        """Dotted paths after the module; a str explains a name that cannot be resolved."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.insert(0, node.attr)
            node = node.value
        scope = self.scope_of(node)
        if isinstance(node, ast.Call) and _callee_name(node) == "getattr" and len(node.args) >= 2:
            base, names = self._paths(node.args[0]), self._getattr_names(node.args[1], node)
            if base is None or isinstance(base, str):
                return base
            if isinstance(names, str):
                return names
            heads = [".".join(p for p in (b, n) if p) for b in base for n in names]
        elif isinstance(node, ast.IfExp):  # (xp.argmax if largest else xp.argmin)
            found = [self._paths(b) for b in (node.body, node.orelse)]
            if any(isinstance(f, str) for f in found):
                return next(f for f in found if isinstance(f, str))
            if all(f is None for f in found):
                return None
            heads = [p for f in found if isinstance(f, list) for p in f]
        elif isinstance(node, ast.Name) and node.id in self.aliases.get(scope, {}):
            found = [self._paths(v) for v in self.aliases[scope][node.id]]
            heads = [p for f in found if isinstance(f, list) for p in f]
        elif self.is_module(node, self.bound[scope]):
            heads = [""]
        else:
            return None
        return [".".join(p for p in (h, *parts) if p) for h in heads]

    def _getattr_names(self, arg: ast.AST, at: ast.AST) -> list[str] | str:
        """The literal names a getattr's name can be: a constant, a parameter of an enclosing
        function called with literals only, or the values of a class-level dict."""
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return [arg.value]
        if isinstance(arg, ast.Name):
            fn: ast.AST | None = at
            while fn is not None:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
                    names = names[1:] if names[:1] in (["self"], ["cls"]) else names
                    if arg.id in names:
                        return self._literal_args(fn.name, names.index(arg.id), arg.id)
                fn = self.parent.get(fn)
        if isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Attribute):
            cls: ast.AST | None = at
            while cls is not None and not isinstance(cls, ast.ClassDef):
                cls = self.parent.get(cls)
            for stmt in cls.body if cls is not None else []:
                if (
                    isinstance(stmt, ast.Assign)
                    and ast.unparse(stmt.targets[0]) == arg.value.attr
                    and isinstance(stmt.value, ast.Dict)
                ):
                    vals = [v.value for v in stmt.value.values if isinstance(v, ast.Constant)]
                    if len(vals) == len(stmt.value.values):
                        return [str(v) for v in vals]
        return f"getattr name {ast.unparse(arg)!r} cannot be resolved statically"

    def _literal_args(self, fn: str, pos: int, param: str) -> list[str] | str:
        """What every call of ``fn`` in the package passes as ``param``, when all are literal."""
        found: list[str] = []
        for rel, tree in self.trees.items():
            for call in ast.walk(tree):
                if not isinstance(call, ast.Call) or _callee_name(call) != fn:
                    continue
                given = [kw.value for kw in call.keywords if kw.arg == param]
                given += call.args[pos : pos + 1]
                if not (given and isinstance(given[0], ast.Constant)):
                    return f"{fn}() gets a non-literal {param!r} at {rel}:{call.lineno}"
                found.append(str(given[0].value))
        return sorted(set(found)) or f"no call of {fn}() gives {param!r} as a literal"


def _arg_shape(call: ast.Call | None) -> tuple[int, bool, tuple[str, ...], bool] | None:
    if call is None:
        return None
    star = [i for i, a in enumerate(call.args) if isinstance(a, ast.Starred)]
    npos = star[0] if star else len(call.args)  # positions after a *args are unknown
    kws = tuple(kw.arg for kw in call.keywords if kw.arg is not None)
    return npos, bool(star), kws, any(kw.arg is None for kw in call.keywords)


def walk(sources: dict[str, str]) -> tuple[list[Use], list[str], list[str]]:
    """Uses, dynamic names and ambiguous bindings in ``{relative path: source}``."""
    trees = {rel: ast.parse(src, rel) for rel, src in sources.items()}
    getters: dict[str, int | None] = dict.fromkeys(SEED_GETTERS)
    while True:  # functions returning the module, to a fixed point
        walkers = [_Walker(rel, trees, getters) for rel in trees]
        more = {k: v for w in walkers for k, v in w.returns_module().items()}
        if more.keys() <= getters.keys():
            break
        getters.update({k: v for k, v in more.items() if k not in getters})
    uses: list[Use] = []
    dynamic: list[str] = []
    for w in walkers:
        for u in w.uses():
            if isinstance(u, Use):
                uses.append(u)
            else:
                dynamic.append(u)
    return uses, dynamic, [m for w in walkers for m in w.ambiguous]


def package_sources() -> dict[str, str]:
    """``{'client/x.py': source}`` for the gradwire package (generated protobuf left out)."""
    return {
        p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(PACKAGE.rglob("*.py"))
        if "_proto" not in p.relative_to(PACKAGE).parts
    }


# --- real CuPy's signatures -----------------------------------------------------------------

_SIG_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+)\((.*)\)\s*(?:->.*)?$")
_P = inspect.Parameter


def _split(params: str) -> list[str] | None:
    out, depth, quote, cur = [], 0, "", ""
    for ch in params:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    out.append(cur.strip())
    return None if depth or quote else [p for p in out if p]


def doc_signature(doc: str | None, names: set[str]) -> inspect.Signature | None:
    """The signature on a docstring's first line (``ufunc.at(self, a, indices, b=None)``,
    ``memcpyAsync(intptr_t dst, ...)``) when it names one of ``names``; C types are dropped."""
    first = (doc or "").strip().split("\n", 1)[0].replace("\\*", "*")
    m = _SIG_LINE.match(first)
    parts = _split(m.group(2)) if m and m.group(1) in names else None
    if parts is None:
        return None
    params: list[inspect.Parameter] = []
    kind: inspect._ParameterKind = _P.POSITIONAL_OR_KEYWORD
    for raw in parts:
        if raw == "/":
            params = [p.replace(kind=_P.POSITIONAL_ONLY) for p in params]
            continue
        if raw == "*":
            kind = _P.KEYWORD_ONLY
            continue
        lhs, eq, default = raw.partition("=")
        lhs = re.sub(r"\s+(not|or)\s+None$", "", lhs.split(":")[0].strip())
        name = lhs.split()[-1] if lhs.split() else ""
        if name.startswith("**"):
            params.append(_P(name[2:], _P.VAR_KEYWORD))
        elif name.startswith("*"):
            params.append(_P(name[1:], _P.VAR_POSITIONAL))
            kind = _P.KEYWORD_ONLY
        elif name.isidentifier():
            params.append(_P(name, kind, default=default.strip() if eq else _P.empty))
        else:
            return None
    if params and params[0].name == "self":
        params = params[1:]
    try:
        return inspect.Signature(params)
    except ValueError:  # e.g. a required parameter after a default: not a signature line
        return None


def _is_cupy_ufunc(obj: Any) -> bool:
    return type(obj).__name__ == "ufunc" and type(obj).__module__.startswith("cupy")


def ufunc_signature(uf: Any) -> inspect.Signature:
    """``nin`` inputs, then the outputs positionally or as ``out``, then the keywords CuPy's
    ufunc call takes (its docstring's keyword-only part, at least out, dtype and casting)."""
    first = (uf.__doc__ or "").split("\n", 1)[0].replace("\\*", "*")
    kw_part = first.partition(" *,")[2] if " *," in first else ""
    keywords = (set(re.findall(r"(\w+)=", kw_part)) | UFUNC_KEYWORDS) - {"out"}
    ins = [_P(f"x{i + 1}", _P.POSITIONAL_ONLY) for i in range(uf.nin)]
    if uf.nout == 1:
        outs = [_P("out", _P.POSITIONAL_OR_KEYWORD, default=None)]
    else:
        outs = [_P(f"out{i + 1}", _P.POSITIONAL_ONLY, default=None) for i in range(uf.nout)]
        outs.append(_P("out", _P.KEYWORD_ONLY, default=None))
    kws = [_P(k, _P.KEYWORD_ONLY, default=None) for k in sorted(keywords)]
    return inspect.Signature(ins + outs + kws)


def signature(obj: Any, attr: str) -> inspect.Signature | None:
    """Real CuPy's signature for calling ``obj`` (reached as attribute ``attr``)."""
    if _is_cupy_ufunc(obj):
        return ufunc_signature(obj)
    names = {attr, getattr(obj, "__name__", attr), "__init__"}
    init_doc = obj.__init__.__doc__ if isinstance(obj, type) else None  # type: ignore[misc]
    docs = [obj.__doc__, init_doc]
    from_doc = next((s for d in docs if (s := doc_signature(d, names)) is not None), None)
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):  # Cython builtins
        return from_doc
    kinds = {p.kind for p in sig.parameters.values()}
    catch_all = {_P.VAR_POSITIONAL, _P.VAR_KEYWORD} <= kinds  # ndarray's (*args, **kwargs)
    return from_doc if catch_all and from_doc is not None else sig


def resolve(cupy: Any, path: str) -> Any:
    obj = cupy
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def bind_problem(cupy: Any, use: Use) -> str | None:
    """Why real CuPy would reject ``use`` as a call, or None."""
    assert use.args is not None
    obj = resolve(cupy, use.path)
    if not callable(obj):
        return f"cupy.{use.path} is a {type(obj).__name__}, not callable"
    sig = signature(obj, use.path.rsplit(".", 1)[-1])
    if sig is None:
        return f"no signature for cupy.{use.path} (neither inspect nor its docstring)"
    npos, star, kws, starstar = use.args
    bind = sig.bind_partial if star or starstar else sig.bind  # bind only what is literal
    try:
        bind(*[object()] * npos, **{k: object() for k in kws})
    except TypeError as exc:
        return f"cupy.{use.path}{sig}: {exc}"
    return None
