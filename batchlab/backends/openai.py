"""The `openai` backend kind: any OpenAI-compatible server (vLLM, SGLang, transformers serve,
batchlab serve), a load target measured from the client side.

The server batches for itself, so its runs are recorded under the strategy `server` and no
scheduler section applies. The client (backends/openai_client.py) is imported only when
the backend is built or checked. The API key never sits in a config: it is read from
OPENAI_API_KEY or the variable `api_key_env` names, and masked in every recorded error.
"""
from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator

from batchlab.backends.base import TARGET, BackendOptions, Holds
from batchlab.core.config import NO_EFFECT, identity_role
from batchlab.core.limits import MAX_BATCH
from batchlab.errors import ConfigError

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class OpenAIOptions(BackendOptions):
    """An OpenAI-compatible server, sent the trace through `/v1/completions` with streaming."""
    kind: Literal["openai"] = "openai"
    """An OpenAI-compatible server."""
    role = TARGET
    extra = "serve"
    model: str | None = None
    """The served model's name (as the server's /v1/models lists it)."""
    base_url: str | None = None
    """The server, e.g. http://127.0.0.1:8000/v1."""
    api_key_env: str | None = identity_role(NO_EFFECT)
    """The environment variable holding the API key (unset: OPENAI_API_KEY if set, else no key).
    NOTE: the key itself never goes in a config: config.yaml is written next to results."""
    timeout_s: Annotated[float, Field(gt=0, le=86_400)] = 600.0
    """Per-request timeout, seconds."""
    prompt_format: Literal["tokens", "text"] = "tokens"
    """Prompts as token ids (exact lengths) or as text (lengths from the server's usage report)."""
    length_control: Literal["ignore_eos", "generation_config", "none"] = "ignore_eos"
    """How exact output lengths are asked for: vLLM's ignore_eos, transformers serve's generation_config, or not at all."""
    max_connections: Annotated[int, Field(gt=0, le=MAX_BATCH)] | None = None
    """HTTP connection pool size (unset: sized from the trace)."""
    client: Literal["lean", "httpx"] = "lean"
    """The HTTP client: batchlab's lean HTTP/1.1 stream reader (about a third of httpx's CPU per
    streamed request; plain http:// only, https:// always goes through httpx), or httpx."""

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_NAME.fullmatch(v):
            raise ValueError("must name an environment variable (letters, digits, _), not hold the key itself")
        return v

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        m = re.fullmatch(r"https?://([^/@\s]+@)?[^/@\s]+(/\S*)?", v)
        if not m:
            raise ValueError("expected http://HOST[:PORT]/PATH, e.g. http://127.0.0.1:8000/v1")
        if m.group(1):
            raise ValueError("credentials in the URL would be written to config.yaml; put the key in "
                             "OPENAI_API_KEY (or the variable backend.api_key_env names)")
        return v

    def build(self, cfg):
        from batchlab.backends.openai_client import OpenAIBackend, api_key
        if not self.base_url or not self.model:
            raise ConfigError("backend.kind 'openai' needs backend.base_url (e.g. http://127.0.0.1:8000/v1) "
                              "and backend.model (the served model name)")
        return OpenAIBackend(self.base_url, self.model, api_key(self.api_key_env), self.timeout_s, self.prompt_format,
                             self.length_control, self.max_connections, client=self.client)

    def holds(self, gpus_on_node: int, node_cpus: int) -> Holds:
        """One point at a time per server: two would measure each other."""
        return Holds(1, server=self.base_url or "")

    def preflight(self, cfg) -> list[str]:
        """Before anything is written: the URL, the key's variable, and the model, checked live."""
        from batchlab.backends.openai_client import api_key, check_server
        if not self.base_url:
            raise ConfigError("backend.kind 'openai' needs backend.base_url (e.g. http://127.0.0.1:8000/v1)")
        return check_server(self.base_url, self.model, api_key(self.api_key_env))
