"""Every public name of the package is documented: each public class, function, method and
property of `oxccl`, `oxccl.errors` and `oxccl.torch` has a docstring, and a callable's
docstring names each of its parameters (so the text and the signature cannot drift apart:
`broadcast` once spoke of `buf` while its parameters were `send` and `recv`)."""

import inspect
import re

import oxccl
import oxccl.errors


def _public(obj):
    return [(n, getattr(obj, n)) for n in dir(obj) if not n.startswith("_")]


def _params(fn):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return [p.name for p in sig.parameters.values()
            if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _problems(qual, fn, doc_of=None):
    # The object's own text (inspect.getdoc would lend a method torch's base class's).
    doc = inspect.cleandoc((doc_of or fn).__doc__ or "")
    if not doc.strip():
        return [f"{qual}: no docstring"]
    params = _params(fn)
    if params is None:
        return [f"{qual}: no signature to check (inspect.signature fails)"]
    return [f"{qual}: the docstring does not name parameter {p!r}"
            for p in params if not re.search(rf"\b{re.escape(p)}\b", doc)]


def _check_class(qual, cls, out):
    if not (cls.__doc__ or "").strip():
        out.append(f"{qual}: no docstring")
    # The constructor's parameters, named in the class's docstring.
    init = cls if "__text_signature__" in dir(cls) and cls.__text_signature__ else None
    if init is not None:
        out += _problems(f"{qual}()", init, doc_of=cls)
    for name, member in _public(cls):
        owner = next((k for k in cls.__mro__ if name in k.__dict__), None)
        if owner is None or not owner.__module__.startswith("oxccl"):
            continue  # inherited from Python's or torch's own classes
        raw = inspect.getattr_static(cls, name)
        if isinstance(member, type):
            continue
        if isinstance(raw, property) or type(raw).__name__ == "getset_descriptor":
            if not (raw.__doc__ or "").strip():
                out.append(f"{qual}.{name}: no docstring (property)")
        elif callable(member):
            out += _problems(f"{qual}.{name}", member)


def test_every_public_name_of_oxccl_is_documented_with_its_parameters():
    import oxccl.torch

    out = []
    for mod in (oxccl, oxccl.errors, oxccl.torch):
        names = getattr(mod, "__all__", None) or [n for n, _ in _public(mod)]
        for name in names:
            obj = getattr(mod, name)
            qual = f"{mod.__name__}.{name}"
            if inspect.ismodule(obj) or isinstance(obj, str):
                continue
            if isinstance(obj, type):
                if obj.__module__.startswith("torch"):
                    continue
                _check_class(qual, obj, out)
            elif callable(obj):
                out += _problems(qual, obj)
    assert not out, "undocumented:\n" + "\n".join(out)
