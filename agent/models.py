"""Every pydantic model of the agent side: tool arguments and results, budget, trace events, db."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

TRACE_VERSION = 1
STAGES = ("torch", "tensor", "loop", "tile", "kernel", "cuda")
Stage = Literal["torch", "tensor", "loop", "tile", "kernel", "cuda"]
Verdict = Literal["illegal", "compile_error", "incorrect", "crash", "timeout", "ok"]
Method = Literal["measured", "modeled"]


class Strict(BaseModel):
    """Base of tool arguments: unknown fields are refused (OpenAI strict mode)."""

    model_config = ConfigDict(extra="forbid")


# --- tool arguments ---------------------------------------------------------------------------

class NoArgs(Strict):
    """No arguments."""


class KernelArgs(Strict):
    kernel: str = Field(description="kernel name, as list_kernels gives it")


class ReadIrArgs(Strict):
    kernel: str = Field(description="kernel name, as list_kernels gives it")
    stage: Stage = Field(description="IR stage to print")


class RowArgs(Strict):
    kernel: str = Field(description="kernel name, as list_kernels gives it")
    row: str = Field(description="canonical schedule row, e.g. `WORK=block:256 TILE=v4x1`")


class HistoryArgs(Strict):
    kernel: str | None = Field(description="only this kernel's evaluations; null for all")


class FinishArgs(Strict):
    summary: str = Field(description="what you found and why the best rows are fast")


# --- tool results -----------------------------------------------------------------------------

class Timing(BaseModel):
    method: Method
    median_us: float
    p10_us: float | None = None
    p90_us: float | None = None
    n: int = 1


class BudgetState(BaseModel):
    evaluations_used: int
    evaluations_limit: int
    turns_used: int
    turns_limit: int | None
    tokens_used: int
    tokens_limit: int | None
    seconds_used: float
    seconds_limit: float | None


class KernelSummary(BaseModel):
    name: str
    kind: str
    identity: str
    keys: list[str]
    legal_rows: int
    default_row: str


class WorkloadInfo(BaseModel):
    workload: str
    target: str
    device: str
    timing_method: str
    source: str
    kernels: list[KernelSummary]
    budget: BudgetState


class KernelList(BaseModel):
    kernels: list[KernelSummary]


class IrText(BaseModel):
    kernel: str
    stage: str
    text: str


class DecisionPoint(BaseModel):
    key: str
    grammar: str
    options: list[str]


class SpaceInfo(BaseModel):
    kernel: str
    legal_rows: int
    default_row: str
    decision_points: list[DecisionPoint]
    examples: list[str]


class CheckResult(BaseModel):
    kernel: str
    row: str
    legal: bool
    reasons: list[str]


class EvaluationResult(BaseModel):
    kernel: str
    row: str
    verdict: Verdict
    reasons: list[str] = []
    kernel_hash: str = ""
    resources: dict[str, Any] | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    timing: Timing | None = None
    baselines: dict[str, Timing] = {}
    speedup_vs_default: float | None = None
    speedup_vs_baselines: dict[str, float] = {}
    seconds: float = 0.0
    cached: bool = False
    same_program_as: str | None = None   # "kernel: row" evaluated before whose program this is
                                         # (its check and time reused; no evaluation spent)
    new_best: bool = False
    evaluations_left: int = 0


class CudaText(BaseModel):
    kernel: str
    row: str
    source: str


class HistoryEntry(BaseModel):
    index: int
    kernel: str
    row: str
    verdict: Verdict
    median_us: float | None
    method: Method | None
    speedup_vs_default: float | None


class History(BaseModel):
    evaluations: list[HistoryEntry]


class BestEntry(BaseModel):
    kernel: str
    row: str | None
    median_us: float | None
    method: Method | None
    speedup_vs_default: float | None
    speedup_vs_baselines: dict[str, float] = {}
    evaluations: int
    note: str = ""


class BestRows(BaseModel):
    kernels: list[BestEntry]
    budget: BudgetState


class FinishResult(BaseModel):
    finished: bool
    best: BestRows


class ToolError(BaseModel):
    error: str
    kind: str
    hint: str = ""


# --- trace events -----------------------------------------------------------------------------

class Event(BaseModel):
    v: int = TRACE_VERSION
    time: str = ""           # UTC, ISO 8601
    elapsed: float = 0.0     # seconds since the run started (continues across --resume)


class WorkloadRecord(BaseModel):
    name: str
    path: str
    source: str
    sha256: str
    sets: list[str] = []


class HeaderEvent(Event):
    type: Literal["header"] = "header"
    command: str
    args: dict[str, Any]
    workload: WorkloadRecord
    target: str
    device: str
    gpu: str
    policy: str
    model: str | None = None
    base_url: str | None = None
    versions: dict[str, str]
    kernels: list[KernelSummary]
    budget: BudgetState


class ResumeEvent(Event):
    type: Literal["resume"] = "resume"
    command: str
    args: dict[str, Any]
    evaluations_recovered: int


class ChatToolCall(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any] | None = None
    raw_arguments: str | None = None   # kept only when the model's text is not a JSON object


class LlmRequestEvent(Event):
    type: Literal["llm_request"] = "llm_request"
    turn: int
    reset: bool = False                # True: `messages` is the whole context (start, compaction)
    messages: list[dict[str, Any]]     # messages added since the previous request
    n_messages: int


class LlmResponseEvent(Event):
    type: Literal["llm_response"] = "llm_response"
    turn: int
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ChatToolCall] = []
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    replayed: bool = False             # served from a recorded trace (replay, --resume)


class LlmErrorEvent(Event):
    type: Literal["llm_error"] = "llm_error"
    turn: int
    kind: str                          # timeout | rate_limit | server_error | connection | fatal
    status: int | None = None
    message: str
    attempt: int
    retry_in_s: float | None = None


class AgentErrorEvent(Event):
    type: Literal["agent_error"] = "agent_error"
    kind: str   # malformed_json | unknown_tool | bad_arguments | bad_row | illegal_row | text_reply
    detail: str #   | refusal | unknown_kernel | budget_exhausted | stalled | ...


class ToolCallEvent(Event):
    type: Literal["tool_call"] = "tool_call"
    call_id: str
    name: str
    arguments: dict[str, Any] | None = None
    raw_arguments: str | None = None
    source: str                        # llm | search | random | human | replay


class ToolResultEvent(Event):
    type: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    ok: bool
    result: dict[str, Any]


class EvaluationEvent(Event):
    type: Literal["evaluation"] = "evaluation"
    index: int
    source: str
    result: EvaluationResult


class NoteEvent(Event):
    type: Literal["note"] = "note"
    text: str


class SummaryEvent(Event):
    type: Literal["summary"] = "summary"
    reason: str
    summary: str
    best: list[BestEntry]
    budget: BudgetState
    errors: dict[str, int]


TraceEvent = Annotated[Union[HeaderEvent, ResumeEvent, LlmRequestEvent, LlmResponseEvent,
                             LlmErrorEvent, AgentErrorEvent, ToolCallEvent, ToolResultEvent,
                             EvaluationEvent, NoteEvent, SummaryEvent], Field(discriminator="type")]


# --- schedule database ------------------------------------------------------------------------

class DbEntry(BaseModel):
    identity: str
    target: str
    kernel: str
    workload: str
    row: str
    median_us: float
    method: Method
    trace: str | None
    time: str


class Db(BaseModel):
    version: int = 1
    entries: dict[str, DbEntry] = {}
