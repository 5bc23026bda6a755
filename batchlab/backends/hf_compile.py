"""Compiled decode for the step engine (backends/hf_engine.py): decode-only passes at bucketed shapes.

A decode-only pass whose rows are exactly slots 0..R-1 (the common case) is padded to a bucket of
rows (powers of two, as vLLM and nano-vllm capture decode): padding rows feed token 0 at position
0 of free slots R..Rb-1, see only that key, and their tokens are dropped. Then
  - `CompiledDecode` runs the pass through `torch.compile` (inductor): one graph per rows bucket,
    with the context length a dynamic dimension; `compiles` counts graphs as they are built, and
    `warm()` builds them before any measured window;
  - `GraphedDecode` (CUDA only) also captures each (rows bucket, context bucket) in a CUDA graph
    and replays it, the context padded to a power of two so captures stay few.
Mixed steps (any prefill) run eagerly. Tokens are the eager pass's: the same model, the same
masks (padding keys are -inf, so they weigh exactly zero).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from batchlab.backends.hf_slots import StepPlan

NEG_INF = float("-inf")


def bucket(n: int, smallest: int = 1) -> int:
    """The power of two at or above n (at least `smallest`)."""
    return max(smallest, 1 << max(0, n - 1).bit_length())


def decodes_densely(plan: StepPlan) -> bool:
    """Every row decodes one token and the rows are slots 0..R-1 in order: paddable."""
    return not plan.multi and plan.single_slots is not None and plan.single_dense


def pad_rows(plan: StepPlan, rows: int) -> None:
    """Pad a dense decode plan to `rows` rows in place (see the module docstring); the cache
    gets the slots the padding rows write into (free slots: the plan's rows are 0..R-1)."""
    extra = rows - len(plan.input_ids)
    if extra <= 0:
        return
    plan.cache.ensure_slots(rows)
    dev = plan.input_ids.device
    plan.input_ids = F.pad(plan.input_ids, (0, extra))
    plan.positions = plan.write_pos = F.pad(plan.positions, (0, extra))
    # NOTE: two tensors, as _plan makes them: compiled graphs guard on which inputs alias
    plan.write_slot, plan.single_slots = torch.arange(rows, device=dev), torch.arange(rows, device=dev)
    mask = F.pad(plan.single_mask, (0, 0, 0, 0, 0, 0, 0, extra), value=NEG_INF)
    mask[-extra:, 0, 0, 0] = 0.0                                 # a padding row sees its own key only
    plan.single_mask = mask
    plan.pad = extra


def greedy(forward, plan: StepPlan, suppress: torch.Tensor) -> torch.Tensor:
    """One pass (`forward`: a plan -> its kept rows' logits, backends/hf_fused.py): the greedy
    token of every kept row, EOS suppressed (what generate() does)."""
    return forward(plan).index_fill(1, suppress, NEG_INF).argmax(-1)


class CompiledDecode:
    """`greedy` through torch.compile for padded dense decode plans; counts its graphs."""

    def __init__(self, forward, suppress: torch.Tensor):
        self.forward, self.suppress = forward, suppress
        self.compiles = 0                       # graphs inductor built (each bucket, each regrowth)
        self.fn = torch.compile(self._greedy, backend=self._backend)

    def _greedy(self, plan: StepPlan) -> torch.Tensor:
        return greedy(self.forward, plan, self.suppress)

    def _backend(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx
        self.compiles += 1
        # NOTE: freezing folds the weights in as constants, so on CPU inductor prepacks them for
        # oneDNN's matmul: measured 1.17x vs 1.06x over eager at 64 rows (weights never change here)
        return compile_fx(gm, example_inputs, config_patches={"freezing": True})

    def __call__(self, plan: StepPlan) -> torch.Tensor:
        # NOTE: context length, slots and cache capacity are dynamic dimensions (one graph serves
        # them all; the engine keeps capacity above the context, so they never compare equal);
        # rows come in buckets: a graph for 1 row, one for the rest, measured 3 with the warm-up.
        torch._dynamo.mark_dynamic(plan.single_mask, 3)
        for kv in (plan.cache.k, plan.cache.v):
            for t in kv:
                torch._dynamo.mark_dynamic(t, 0)
                torch._dynamo.mark_dynamic(t, 2)
        return self.fn(plan)


class GraphedDecode:
    """CUDA graphs over padded dense decode plans, one per (rows, context) bucket, captured on
    first use (`captures` counts them) and replayed with the plan's tensors copied in."""

    def __init__(self, forward, suppress: torch.Tensor, run=None):
        self.suppress = suppress
        self.run = run or (lambda plan: greedy(forward, plan, suppress))   # eager or compiled pass
        self.graphs: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, StepPlan, torch.Tensor]] = {}
        self.pool = None
        self.captures = 0

    def __call__(self, plan: StepPlan) -> torch.Tensor:
        rows, L = plan.single_mask.shape[0], plan.single_mask.shape[-1]
        Lb = min(bucket(L, 64), plan.cache.capacity)
        key = (rows, Lb, plan.cache.generation)        # a regrown cache is new memory: recapture
        if key not in self.graphs:
            self.graphs = {k: v for k, v in self.graphs.items() if k[2] == key[2]}
            self.graphs[key] = self._capture(plan, rows, Lb)
        graph, static, out = self.graphs[key]
        for name in ("input_ids", "positions", "write_slot"):
            getattr(static, name).copy_(getattr(plan, name))
        static.single_mask[..., :L].copy_(plan.single_mask)
        static.single_mask[..., L:].fill_(NEG_INF)
        graph.replay()
        return out

    def _capture(self, plan: StepPlan, rows: int, Lb: int):
        dev = plan.input_ids.device
        mask = torch.full((rows, 1, 1, Lb), NEG_INF, dtype=plan.single_mask.dtype, device=dev)
        mask[..., 0] = 0.0
        # NOTE: capturing runs the pass; its writes go to the cache's last position, at or past
        # every slot's length, so nothing cached is touched (a later step overwrites it first).
        positions = torch.full((rows,), plan.cache.capacity - 1, dtype=torch.long, device=dev)
        static = StepPlan(plan.cache, torch.zeros(rows, dtype=torch.long, device=dev), positions,
                          torch.arange(rows, device=dev), positions, torch.arange(rows, device=dev), mask, True)
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):                 # warm the kernels (and any compile) first
            for _ in range(2):
                self.run(static)
        torch.cuda.current_stream(dev).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.run(static)
        self.pool = graph.pool()
        self.captures += 1
        return graph, static, out
