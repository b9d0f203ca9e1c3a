"""What a serving backend is: the rules one engine applies to a deployment, and the constants
fitted for it.

A backend is one subclass of :class:`Backend` in its own module (``vllm``, ``sglang``,
``trtllm``), registered in :data:`modperf.serving.BACKENDS`. It owns, from the backend's
documentation or source (docs/serving.md cites each):

* its per-step token budget (``chunk_tokens``, :meth:`Backend.step_budget`);
* its scheduler (``"mixed"``: prefill chunks ride in the decode steps; ``"prefill_first"``:
  a prefill step runs alone and stalls the decodes);
* its memory rule (:meth:`Backend.kv_budget_bytes`) and running-request cap (``max_running``);
* its KV dtype rule (:meth:`Backend.kv_element_bytes`) and reserve rule
  (:meth:`Backend.reserved_tokens`: the whole sequence or as it grows), and its admission and
  preemption as the request-level simulation plays them (``kv_admission``);
* the largest decode batch it replays as a CUDA graph (:meth:`Backend.graph_max_batch`);
* its fitted constants (``fitted``: :class:`Fitted`, written by ``bench/silicon.py --fit``
  from calibration rows only).

A backend without a class is refused by name (:func:`modperf.serving.backend_of`), never
given another backend's rules.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from ..specs.roofline import gpu_spec
from .model import Constants

GiB = 2**30
MiB = 2**20

#: GPU generations by the major compute capability the system file states (``gpu.sm_version``):
#: the unit the step scales are fitted per (docs/serving.md, "Constants").
GENERATIONS = {9: "hopper", 10: "blackwell"}
#: The key of a fitted set that holds for every generation without its own set.
ANY_GENERATION = "*"


def generation_of(system: str) -> str | None:
    """The GPU generation of ``system`` (``hopper``, ``blackwell``), None where its file gives
    no compute capability of a generation modperf names."""
    sm = gpu_spec(system).sm_version
    return GENERATIONS.get(sm // 10) if sm else None


@dataclass(frozen=True)
class Fitted:
    """The constants fitted for one backend on calibration rows: per ``(mode, generation)``
    (``generation`` may be :data:`ANY_GENERATION`), and for each set how many calibration
    rows and groups stand behind it and what was fitted (``what``: ``"step and frontend"``,
    or ``"frontend; physics-only step"`` where the calibration half holds no rows of the
    backend on that generation)."""

    sets: Mapping[tuple[str, str], Constants]
    what: Mapping[tuple[str, str], str]
    date: str = ""

    def lookup(self, mode: str, generation: str | None) -> tuple[Constants, str] | None:
        for key in ((mode, generation or ""), (mode, ANY_GENERATION)):
            if key in self.sets:
                return self.sets[key], self.what.get(key, "")
        return None


NOTHING_FITTED = Fitted({}, {})


class Backend(ABC):
    """One serving backend's rules (module doc). Subclasses set the class attributes and
    implement the abstract methods; nothing here is fitted except ``fitted``."""

    name: ClassVar[str]
    #: Per-step token budget (vLLM max_num_batched_tokens, TRT-LLM max_num_tokens, SGLang
    #: chunked_prefill_size), below and from :data:`LARGE_GPU_BYTES` of GPU memory.
    chunk_tokens: ClassVar[int]
    chunk_tokens_large_gpu: ClassVar[int]
    #: "mixed" or "prefill_first" (module doc).
    scheduler: ClassVar[str]
    #: Most requests running at once per rank.
    max_running: ClassVar[int]
    #: KV blocks reserved per request: the whole sequence, or as it grows.
    reserves_whole_sequence: ClassVar[bool]
    #: When the scheduler admits a request and what it does when the cache runs out, as the
    #: request-level simulation plays it (:data:`modperf.simulate.ADMISSIONS`): "as_needed"
    #: (the tokens scheduled now must fit; the newest running request is preempted and
    #: recomputed), "whole_sequence" (isl + osl reserved up front; nothing evicted) or
    #: "new_token_ratio" (SGLang's reservation of a decaying share of the tokens still to
    #: come; the newest is retracted).
    kv_admission: ClassVar[str]
    fitted: ClassVar[Fitted] = NOTHING_FITTED

    def step_budget(self, mem_capacity: float) -> int:
        """Tokens one engine step may carry on a GPU of ``mem_capacity`` bytes."""
        return self.chunk_tokens_large_gpu if mem_capacity >= LARGE_GPU_BYTES else self.chunk_tokens

    @abstractmethod
    def kv_budget_bytes(self, *, mem_capacity: float, weights: float, other: float, chunk: int,
                        gpus: int) -> float:
        """Bytes of one GPU the backend's default memory rule leaves for the KV cache.
        ``other`` is the system file's ``misc.other_mem``; ``gpus`` the worker's tp."""

    def kv_element_bytes(self, gemm_dtype: str | None) -> float:
        """Bytes one KV-cache element takes by default: the model's bfloat16."""
        return KV_BYTES

    def reserved_tokens(self, isl: int, osl: int) -> int:
        """KV tokens one running request holds on average: the whole sequence where the
        backend reserves it up front, else the prompt and half the output."""
        return isl + (osl if self.reserves_whole_sequence else osl // 2)

    @abstractmethod
    def graph_max_batch(self, mem_capacity: float, tp: int) -> int:
        """The largest decode batch the backend replays as a CUDA graph by default."""

    def constants(self, mode: str, system: str, fitted: bool = True) -> tuple[Constants, str]:
        """The fitted constants of this backend for ``mode`` on ``system``'s generation, and
        where they come from; the physics-only ones where none are fitted or ``fitted`` is
        False."""
        if not fitted:
            return Constants(), "physics only: no fitted constants"
        generation = generation_of(system)
        found = self.fitted.lookup(mode, generation)
        if found is None:
            return Constants(), (f"physics only: no constants fitted for {self.name} {mode} "
                                 f"(no calibration rows)")
        constants, what = found
        on = generation or "an unnamed GPU generation"
        return constants, f"fitted {self.fitted.date} on calibration rows: {self.name} {mode} on {on}: {what}"


#: SGLang's chunk doubles on GPUs with at least this much memory (server_args: >= 160 GB).
LARGE_GPU_BYTES = 160e9
#: Bytes of a KV-cache element in the model's dtype (bfloat16).
KV_BYTES = 2.0

__all__ = ["ANY_GENERATION", "GENERATIONS", "KV_BYTES", "LARGE_GPU_BYTES", "Backend", "Fitted", "GiB", "MiB",
           "generation_of"]
