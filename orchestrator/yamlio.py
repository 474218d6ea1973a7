"""Reading the YAML files people write (jobs, config.yaml, clouds.yaml), safely.

`load_yaml(path)` refuses, as an `InputError` naming the file and the fix, and before any
of it is used: a path that is a directory or missing, a file larger than `max_bytes`, bytes
that are not UTF-8, invalid YAML (with its line), a mapping that names one key twice (YAML
would silently keep the last), more than `MAX_ALIASES` aliases, and aliases that expand to
more than `MAX_NODES` values (an "anchor bomb" of a few hundred bytes stands for billions).
Only plain data is built (``yaml.SafeLoader``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.errors import InputError

MAX_BYTES: Final = 8 << 20
MAX_ALIASES: Final = 100
MAX_NODES: Final = 200_000  # values a document may stand for once its aliases are expanded


class _Loader(yaml.SafeLoader):
    aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_ALIASES} aliases")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the base class says so
                break
            if duplicate:
                raise yaml.YAMLError(
                    f"key {key!r} appears twice (line {key_node.start_mark.line + 1})"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: Path, *, what: str, fix: str, max_bytes: int = MAX_BYTES) -> Any:
    """The plain data in `path` (a `what`, e.g. "a jobs file"); `fix` says where the format
    is documented."""
    where = str(path)
    if path.is_dir():
        raise InputError(where, "", what, got="a directory", fix=fix)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise InputError(where, "", what, got="no such file", fix=fix) from None
    except OSError as exc:
        raise InputError(where, "", what, got=exc.strerror or type(exc).__name__, fix=fix) from None
    if size > max_bytes:
        raise InputError(
            where,
            "",
            f"{what} of at most {max_bytes:,} bytes",
            got=f"{size:,} bytes",
            fix="split it into several files",
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            where,
            f"byte {exc.start}",
            "UTF-8 text",
            got="other bytes",
            fix="save the file as UTF-8",
        ) from None
    except OSError as exc:
        raise InputError(where, "", what, got=exc.strerror or type(exc).__name__, fix=fix) from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {})
        if size > MAX_NODES:
            raise yaml.YAMLError(f"its aliases expand to {size:,} values (at most {MAX_NODES:,})")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(where, line, "valid YAML", got=str(problem)[:200], fix=fix) from None
    finally:
        loader.dispose()


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], raw: Any, *, source: str, expected: str, at: str = "") -> M:
    """`raw` as a `model`, or the InputError that names the first wrong field (under `at`,
    e.g. ``clouds``) in `source` and what was `expected` there; nothing is half-applied."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in (*([at] if at else []), *first.get("loc", ()))]
        raise InputError(
            source, ".".join(loc) or "(file)", expected, got=str(first.get("msg", ""))[:200]
        ) from exc


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many nodes `node` stands for once every alias is expanded (shared nodes counted
    each time they are used, computed once each)."""
    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = 1  # a recursive alias counts once
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(_expanded_size(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    memo[id(node)] = total
    return total
