"""Our engine's decode step vs the bare captured forward of the same shape (a GPU check).

A random-weight Llama of a 7B shape (hidden 4096, 32 layers, 32 heads, MLP 11008, vocab 32000)
in fp16: --rows requests with --prompt-token prompts are prefilled, then --steps decode steps run
through the step engine with CUDA graphs at bucketed rows (hf_compile.GraphedDecode; --inductor
to compile the graphed pass too). The reference is the same padded decode pass replayed from its
captured graph with nothing around it (no plan building, hand-off or stamping). Target: engine
step / graph replay <= 1.1 at 64 rows. Needs CUDA; `--device cpu` only smoke-tests the script
(eager pass as the reference, with --layers 1 --hidden 256 to keep it small).
Usage: python benchmarks/decode_graph_gpu.py [--rows 64] [--prompt 128] [--steps 50] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from batchlab.backends import hf_compile as hcomp
from batchlab.backends.hf_engine import StepEngine
from batchlab.backends.hf_slots import ATTN_NAME, attention
from batchlab.core.clock import RealClock
from batchlab.core.request import Request
from batchlab.core.work import Step


def model_of_7b_shape(args):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.hidden * 11008 // 4096,
                      num_hidden_layers=args.layers, num_attention_heads=args.hidden // 128,
                      num_key_value_heads=args.hidden // 128, vocab_size=32000, max_position_embeddings=4096,
                      eos_token_id=2)
    dtype = torch.float16 if args.device == "cuda" else torch.float32
    torch.set_default_dtype(dtype)
    with torch.device(args.device):
        model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    return model


def engine_for(model, args) -> StepEngine:
    """The step engine with CUDA graphs at bucketed rows (or compiled, with --inductor); on CPU the
    bucketed path with the eager pass, to smoke-test the script."""
    engine = StepEngine(model, None, args.device, compile=args.inductor)
    if args.device == "cuda" and not args.inductor:
        engine.decode = hcomp.GraphedDecode(engine.forward, engine.suppress)
    elif args.device != "cuda":
        engine.decode = engine._eager
    return engine


def engine_steps(engine: StepEngine, reqs: list[Request], args) -> list[float]:
    """Prefill every request, then --steps decode steps; the durations of all but the first five."""
    clock = RealClock()

    async def run() -> list[float]:
        t0 = time.perf_counter()
        await engine.step(Step([(r, args.prompt) for r in reqs]), clock)
        for r in reqs:
            r.num_computed_tokens = args.prompt
        print(f"prefill {time.perf_counter() - t0:.2f} s", flush=True)
        for _ in range(args.steps):
            await engine.step(Step([(r, 1) for r in reqs]), clock)
            for r in reqs:
                r.num_computed_tokens += 1
        return [s.duration for s in engine.step_log[-(args.steps - 5):]]
    t0 = time.perf_counter()
    steps = clock.run(run())
    print(f"engine: {args.steps} decode steps in {time.perf_counter() - t0:.1f} s (captures/compiles included)")
    return steps


def bare_replays(engine: StepEngine, model, reqs: list[Request], n: int) -> list[float]:
    """The reference: the last step's padded plan, replayed alone n times (seconds each)."""
    with torch.inference_mode():
        plan = engine._plan([(r, 1) for r in reqs])
        hcomp.pad_rows(plan, hcomp.bucket(len(plan.emit)))
    replay = []
    with torch.inference_mode(), attention(model, ATTN_NAME):
        for _ in range(n):
            t0 = time.perf_counter()
            engine.decode(plan).tolist()                   # .tolist() syncs the device
            replay.append(time.perf_counter() - t0)
    return replay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--inductor", action="store_true", help="torch.compile the pass inside the graphs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model = model_of_7b_shape(args)
    engine = engine_for(model, args)
    g = torch.Generator().manual_seed(0)
    reqs = [Request(f"r{i}", args.prompt, args.steps + 8, 0.0, index=i,
                    prompt_token_ids=torch.randint(10, 32000, (args.prompt,), generator=g).tolist())
            for i in range(args.rows)]
    steps = engine_steps(engine, reqs, args)
    replay = bare_replays(engine, model, reqs, args.steps)
    out = {"rows": args.rows, "prompt": args.prompt, "layers": args.layers, "hidden": args.hidden, "device": args.device,
           "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None, "inductor": args.inductor,
           "engine_step_ms": 1e3 * statistics.median(steps), "graph_replay_ms": 1e3 * statistics.median(replay[5:]),
           "torch": torch.__version__}
    out["ratio"] = out["engine_step_ms"] / out["graph_replay_ms"]
    print(f"engine decode step {out['engine_step_ms']:.2f} ms, bare replay {out['graph_replay_ms']:.2f} ms: "
          f"{out['ratio']:.2f}x (target <= 1.1: {'met' if out['ratio'] <= 1.1 else 'NOT met'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
