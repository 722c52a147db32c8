"""A validator for the part of JSON Schema that ``kiln/trace_schema.json`` uses: ``type``,
``enum``, ``const``, ``properties``, ``required``, ``additionalProperties``, ``items``,
``allOf`` and ``if``/``then``. A keyword it does not know fails loudly, so that the schema
cannot grow a rule these tests silently skip."""
from __future__ import annotations

import json

from kiln import trace

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
_IGNORED = {"$schema", "$id", "title", "description"}
_KNOWN = _IGNORED | {"type", "enum", "const", "properties", "required", "additionalProperties", "items",
                     "allOf", "if", "then"}


def load_schema() -> dict:
    with open(trace.SCHEMA_FILE, encoding="utf-8") as f:
        return json.load(f)


def _is_type(value, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name])


def errors(value, schema: dict, path: str = "$") -> list[str]:
    unknown = set(schema) - _KNOWN
    if unknown:
        raise ValueError(f"schema keyword(s) {sorted(unknown)} at {path}: not supported by this validator")
    out: list[str] = []
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(value, n) for n in names):
            return [f"{path}: {value!r:.60} is not of type {names}"]
    if "const" in schema and value != schema["const"]:
        out.append(f"{path}: {value!r:.60} is not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r:.60} is not one of {schema['enum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                out.append(f"{path}: required property {key!r} missing")
        for key, v in value.items():
            if key in props:
                out += errors(v, props[key], f"{path}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                out += errors(v, schema["additionalProperties"], f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                out.append(f"{path}: property {key!r} not allowed")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            out += errors(v, schema["items"], f"{path}[{i}]")
    for sub in schema.get("allOf", []):
        out += errors(value, sub, path)
    if "if" in schema and not errors(value, schema["if"], path) and "then" in schema:
        out += errors(value, schema["then"], path)
    return out
