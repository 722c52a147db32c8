"""A generated program: a tree of statements that renders to Python source, and the plan of
calls the runner makes. The tree is what the minimizer cuts."""
from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass, field

INDENT = "    "

HEADER = '''\
import collections
import dataclasses
import io
import math
import sys
import torch
import torch.nn as nn
import torch.nn.functional as F
from kiln import comptime

LOG = io.StringIO()
STATE = {"calls": 0, "hist": []}
'''


@dataclass
class Node:
    """One statement. ``lines`` come first; then each block is ``(header, children)``
    (a header of ``None`` puts the children at the same indentation); then ``after``."""
    lines: list = field(default_factory=list)
    blocks: list = field(default_factory=list)
    after: list = field(default_factory=list)
    tags: frozenset = frozenset()

    def render(self, depth: int) -> list:
        pad = INDENT * depth
        out = [pad + line for line in self.lines]
        for header, children in self.blocks:
            if header is None:
                out += render_body(children, depth)
            else:
                out.append(pad + header)
                out += render_body(children, depth + 1) or [INDENT * (depth + 1) + "pass"]
        out += [pad + line for line in self.after]
        return out

    def all_tags(self) -> set:
        tags = set(self.tags)
        for _, children in self.blocks:
            for c in children:
                tags |= c.all_tags()
        return tags


def render_body(nodes, depth) -> list:
    out = []
    for n in nodes:
        out += n.render(depth)
    return out


@dataclass
class Call:
    """One call the runner makes: inputs from ``make_inputs(seed, n, k, s, flag)``, made with
    grad mode ``grad`` around the call."""
    seed: int
    n: int
    k: int
    s: float
    flag: bool
    grad: bool = True
    kw: bool = False          # pass the arguments by keyword


@dataclass
class Program:
    seed: int
    prelude: list            # top-level Nodes: classes, helpers
    make_inputs: list        # lines of make_inputs' body
    params: list             # parameter names of fn
    body: list               # Nodes of fn's body
    calls: list              # Call
    tags: frozenset = frozenset()

    def source(self) -> str:
        lines = HEADER.splitlines()
        for node in self.prelude:
            lines.append("")
            lines += node.render(0)
        lines += ["", "", "def make_inputs(seed, n, k, s, flag):"]
        lines += [INDENT + line for line in self.make_inputs]
        lines += ["", "", f"def fn({', '.join(self.params)}):"]
        lines += render_body(self.body, 1) or [INDENT + "pass"]
        return "\n".join(lines) + "\n"

    def all_tags(self) -> set:
        tags = set(self.tags)
        for n in self.prelude + self.body:
            tags |= n.all_tags()
        return tags

    def replace(self, **kw) -> "Program":
        return dataclasses.replace(self, **kw)


@dataclass
class SourceProgram:
    """A program as text, with its plan of calls (what ``run_program`` needs)."""
    seed: int
    text: str
    params: list
    calls: list

    def source(self) -> str:
        return self.text

    def replace(self, **kw) -> "SourceProgram":
        return dataclasses.replace(self, **kw)

    @classmethod
    def from_file(cls, path: str) -> "SourceProgram":
        text = open(path).read()
        m = re.search(r"^# calls: (\[.*\])$", text, re.M)
        calls = eval(m.group(1), {"Call": Call}) if m else []  # noqa: S307 - our own file format
        m = re.search(r"seed_(\d+)", path)
        return cls(int(m.group(1)) if m else 0, text, params_of(text), calls)


def params_of(text: str) -> list:
    """The parameter names of the program's ``fn``."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == "fn":
            return [a.arg for a in node.args.args]
    return []
