"""The fused pass (backends/hf_fused.py) against the model's own modules: the same logits to the
bit, the same tokens as generate(), and a clear refusal for a model it does not cover."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

from batchlab.backends.hf_engine import StepEngine  # noqa: E402
from batchlab.backends.hf_fused import FusedPass, forward_for, supported  # noqa: E402
from batchlab.backends.hf_slots import ATTN_NAME, attention  # noqa: E402
from batchlab.core.request import Request  # noqa: E402
from batchlab.schedulers import ContinuousConfig  # noqa: E402
from batchlab.schedulers.continuous import ContinuousScheduler  # noqa: E402
from tests.backends.test_hf_engine import MIX, make, reference, step_by_hand  # noqa: E402

CPU = torch.device("cpu")


def two_passes(model, fused: bool) -> list[torch.Tensor]:
    """Logits of a mixed pass (three prompts of different lengths) and of the decode pass after it."""
    engine = StepEngine(model, fused=fused)
    g = torch.Generator().manual_seed(3)
    reqs = [Request(f"r{i}", p, 4, 0.0, index=i, prompt_token_ids=torch.randint(10, 300, (p,), generator=g).tolist())
            for i, p in enumerate((7, 19, 4))]
    out = []
    with torch.inference_mode(), attention(model, ATTN_NAME):
        plan = engine._plan([(r, r.prompt_len) for r in reqs])
        logits = engine.forward(plan)
        out.append(logits)
        for r, token in zip(reqs, logits.argmax(-1).tolist()):
            r.num_computed_tokens = r.prompt_len
            r.output_token_ids.append(token)
        out.append(engine.forward(engine._plan([(r, 1) for r in reqs])))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_logits_equal_the_modules_to_the_bit(tiny_model_dir, dtype):
    """Every op is the modules' and a stacked product's columns are the separate products', so
    even float32 logits are equal, not close (on this CPU's matrix kernels)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype).eval()
    assert isinstance(StepEngine(model).forward, FusedPass)           # the default on a CPU
    for fused, modules in zip(two_passes(model, True), two_passes(model, False)):
        assert fused.shape == modules.shape and torch.equal(fused, modules)


@pytest.mark.parametrize("fused", [True, False])
def test_both_passes_match_generate_through_windows_and_chunks(lm, fused):
    reqs = make(MIX, seed=11)
    engine = StepEngine(lm[0], lm[1], fused=fused)
    sched = ContinuousScheduler(ContinuousConfig(block_size=4, max_num_batched_tokens=24), num_kv_blocks=1000)
    step_by_hand(engine, sched, reqs, [a for *_, a in MIX], windows=True)
    assert isinstance(engine.forward, FusedPass) is fused
    assert [r.output_token_ids for r in reqs] == [reference(lm, r) for r in reqs]


def small(kind: str, **extra):
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(kind, vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8, **extra)
    return AutoModelForCausalLM.from_config(cfg).eval().to(torch.float64)


def test_qwen2s_biased_qkv_runs_fused_and_equals_its_modules():
    model = small("qwen2")
    assert supported(model) is None and model.model.layers[0].self_attn.q_proj.bias is not None
    for fused, modules in zip(two_passes(model, True), two_passes(model, False)):
        assert torch.equal(fused, modules)


def test_a_model_it_does_not_cover_keeps_the_modules_or_is_refused_by_name():
    qwen3, gelu = small("qwen3"), small("llama", hidden_act="gelu")
    assert "model type 'qwen3'" in supported(qwen3) and "gated SiLU" in supported(gelu)
    assert not isinstance(forward_for(qwen3, None, CPU), FusedPass)   # unset: the modules, silently
    assert not isinstance(forward_for(small("llama"), None, torch.device("cuda")), FusedPass)
    with pytest.raises(ValueError, match="backend.fused: no fused pass for model type 'qwen3'"):
        forward_for(qwen3, True, CPU)


def test_backend_fused_validates_and_stays_out_of_identities_at_its_default():
    from batchlab.errors import ConfigError
    from batchlab.run.config import load_config
    from batchlab.run.experiment import identity
    unset, off = load_config(None, ["backend.kind=hf"]), load_config(None, ["backend.kind=hf", "backend.fused=false"])
    assert unset.backend.fused is None and off.backend.fused is False
    assert "fused" not in identity(unset)["backend"] and identity(off)["backend"]["fused"] is False
    with pytest.raises(ConfigError):
        load_config(None, ["backend.kind=hf", "backend.fused=sometimes"])


def test_fused_true_on_a_model_it_does_not_cover_is_refused_before_anything_is_written(tmp_path, tiny_model_dir):
    """The refusal comes from the model's config at preflight: one line, exit 2, no directory,
    not a sweep whose every request fails."""
    import subprocess
    import sys

    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel
    model_dir = tmp_path / "tiny-gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=128, n_embd=32, n_layer=1, n_head=2, bos_token_id=1,
                               eos_token_id=2)).save_pretrained(model_dir)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(model_dir)
    out = tmp_path / "r"
    res = subprocess.run([sys.executable, "-m", "batchlab.cli", "run", "--quiet", "--out", str(out),
                          "--set", "backend.kind=hf", "--set", f"backend.model={model_dir}", "--set", "backend.fused=true",
                          "--set", "strategies=[continuous]", "--set", "traffic.rates=[2]", "--set", "report=false"],
                         capture_output=True, text=True, timeout=300)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and lines == ["error: backend.fused: no fused pass for model type 'gpt2' (fused pass: "
                                             "llama, mistral, qwen2); set it to false or leave it unset"], res.stderr
    assert not out.exists()
