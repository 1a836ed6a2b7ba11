"""Command-line options made from SimConfig's knob declarations (simulator/fleet/knobs.py), so that
a knob is typed once: a command says which groups it takes (`Options(KVCache)`, or `only` some of
a group's fields, with its own defaults where they differ), and `takes` gives the command one typer
option per field: the name is the field's in kebab case (or its declared flag), the help its
description (a Literal's choices added), the default the field's, the type its annotation (a
Literal or the SLOs' dict as text, which SimConfig checks with a one-line message; a bool as
--x/--no-x; a file as a path). The command gets the values as `knobs`, field name -> value.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional, Union, get_args, get_origin

import typer
from pydantic_core import PydanticUndefined

from simulator.fleet.knobs import GROUPS, knob_extra


@dataclass(frozen=True)
class Options:
    """A group's fields as one command's options. only: these fields (default: every one, and any
    field added to the group later); defaults, names (flags, kebab case): where the command's differ
    from the declaration (validate's 512 KV blocks, the engine's --num-blocks); notes: words the
    command adds to a field's help (after a semicolon)."""

    group: type
    only: tuple[str, ...] = ()
    defaults: Mapping = field(default_factory=dict)
    names: Mapping = field(default_factory=dict)
    notes: Mapping = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.only) | set(self.defaults) | set(self.names) | set(self.notes)
        unknown -= set(self.group.model_fields)
        if unknown:
            raise TypeError(f"{self.group.__name__} has no field {', '.join(sorted(unknown))}")

    @property
    def fields(self) -> tuple[str, ...]:
        return self.only or tuple(self.group.model_fields)

    def flag(self, name: str) -> str:
        """The field's option name, without the dashes."""
        return self.names.get(name) or knob_extra(self.group.model_fields[name]).get("flag") or name.replace("_", "-")

    def parameter(self, name: str) -> inspect.Parameter:
        info = self.group.model_fields[name]
        kind, choices = option_type(info.annotation)
        if knob_extra(info).get("path"):
            kind = Path
        default = self.defaults.get(name, info.default)
        if default is PydanticUndefined and info.default_factory is not None:
            default = ""  # the SLOs: none, as text
        flag = self.flag(name)
        decls = [f"--{flag}/--no-{flag}"] if kind is bool else [f"--{flag}"]
        note = self.notes.get(name)
        option = typer.Option(... if default is PydanticUndefined else default, *decls,
                              help=help_text(info, choices) + (f"; {note}" if note else ""))
        annotation = Optional[kind] if default is None else kind
        return inspect.Parameter(flag.replace("-", "_"), inspect.Parameter.KEYWORD_ONLY, default=option,
                                 annotation=annotation)


def option_type(annotation) -> tuple[type, tuple]:
    """(the option's type, the Literal's choices or ()) of a field's annotation, None dropped."""
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    if get_origin(annotation) is Literal:
        return str, get_args(annotation)
    if get_origin(annotation) is dict:
        return str, ()
    return annotation, ()


def help_text(info, choices: tuple = ()) -> str:
    """A field's description, and its choices where it is a Literal."""
    words = info.description or ""
    return f"{words}: {', '.join(map(str, choices))}" if choices else words


def declared(name: str):
    """The FieldInfo of a SimConfig knob (its default, description, checks), from its group."""
    return next(group.model_fields[name] for group in GROUPS if name in group.model_fields)


class Knobs(dict):
    """The knobs a command was given: field -> value (a file as a string, as SimConfig takes it).
    params: field -> its option's parameter name (--chunked-prefill: chunked_prefill)."""

    def __init__(self, values: dict, params: dict[str, str]):
        super().__init__(values)
        self.params = params

    def changed(self) -> dict:
        """The knobs whose values are not their declared defaults."""
        return {k: v for k, v in self.items() if v != declared(k).get_default(call_default_factory=True)}

    def of(self, group: type):
        """The group's fields as a group object (those not taken: the declared defaults), checked by
        its declarations; pydantic's ValidationError for a bad value."""
        return group(**{k: v for k, v in self.items() if k in group.model_fields})


def takes(*option_sets: Options):
    """A command whose `knobs` parameter stands for the option sets' options: typer sees one option
    per field (inspect.signature, made here), the command gets `knobs`, a Knobs of their values."""
    def decorate(command):
        own = inspect.signature(command, eval_str=True).parameters
        made, params = [], {}  # the options; field -> parameter name
        for options in option_sets:
            for name in options.fields:
                made.append(options.parameter(name))
                params.setdefault(name, made[-1].name)
        parameters = []
        for p in own.values():
            parameters.extend(made if p.name == "knobs" else [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)])
        names = [p.name for p in parameters]
        if "knobs" not in own or len(set(names)) != len(names) or len(params) != len(made):
            raise TypeError(f"{command.__name__}: a `knobs` parameter, and no option or knob twice: {names}")

        @functools.wraps(command)
        def run(**kwargs):
            values = {name: kwargs.pop(param) for name, param in params.items()}
            values = {name: str(v) if isinstance(v, Path) else v for name, v in values.items()}
            return command(**kwargs, knobs=Knobs(values, params))

        del run.__wrapped__  # typer reads the signature below, not the command's
        run.__signature__ = inspect.Signature(parameters)
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        run.option_sets = option_sets
        return run
    return decorate
