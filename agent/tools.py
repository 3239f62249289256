"""The tool table: each tool's argument model and description, and OpenAI strict schemas."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agent.models import FinishArgs, HistoryArgs, KernelArgs, NoArgs, ReadIrArgs, RowArgs

PROMPTS = Path(__file__).resolve().parent.parent / "prompts"


@dataclass(frozen=True)
class Tool:
    name: str
    args: type[BaseModel]
    spends: bool = False   # True: a fresh call costs one evaluation of the budget


TOOLS: tuple[Tool, ...] = (
    Tool("describe_workload", NoArgs),
    Tool("list_kernels", NoArgs),
    Tool("read_ir", ReadIrArgs),
    Tool("schedule_space", KernelArgs),
    Tool("check_row", RowArgs),
    Tool("evaluate_row", RowArgs, spends=True),
    Tool("show_cuda", RowArgs),
    Tool("history", HistoryArgs),
    Tool("best", NoArgs),
    Tool("finish", FinishArgs),
)
TOOL_NAMES = tuple(t.name for t in TOOLS)


def tool(name: str) -> Tool | None:
    return next((t for t in TOOLS if t.name == name), None)


@lru_cache(maxsize=None)
def description(name: str) -> str:
    """The tool's description, from prompts/tools/<name>.txt."""
    path = PROMPTS / "tools" / f"{name}.txt"
    return path.read_text().strip() if path.is_file() else name.replace("_", " ")


def strict_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema in OpenAI strict form: every field required, no extras, no titles."""
    return _strict(model.model_json_schema())


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items() if k not in ("title", "default")}
    if out.get("type") == "object" or "properties" in out:
        out["type"] = "object"
        out.setdefault("properties", {})
        out["required"] = list(out["properties"])
        out["additionalProperties"] = False
    return out


def openai_tools() -> list[dict[str, Any]]:
    """Every tool as an OpenAI chat-completions function tool, strict."""
    return [{"type": "function",
             "function": {"name": t.name, "description": description(t.name),
                          "parameters": strict_schema(t.args), "strict": True}}
            for t in TOOLS]
