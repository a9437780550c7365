"""Service configuration: one pydantic-settings class, read from `MT_*` environment variables or
from `python -m service --flag value` (flags win), never at import time."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

Device = Literal["auto", "cpu", "cuda"]  # ONNX Runtime's device: "auto" takes CUDA when it can


ENV_PREFIX = "MT_"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        frozen=True,
        cli_prog_name="python -m service",
        cli_kebab_case=True,
        cli_implicit_flags=True,
    )

    # --- Models --------------------------------------------------------------------------------
    bundle: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="bundle directory, one per language pair (repeat the flag; comma-separated "
        "in the environment); none: the shipped model, built on first start",
    )
    model: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="a transformers checkpoint directory (Marian, M2M100, NLLB: what "
        "save_pretrained writes or a hub download holds), imported and exported into "
        "model_cache on first start (repeat the flag; comma-separated in the environment); "
        "served with the bundles",
    )
    model_cache: Path = Field(
        Path("bundles/imported"),
        description="where --model's bundles are kept, one per checkpoint content hash",
    )
    checkpoint: Annotated[list[Path], NoDecode] = Field(
        default_factory=lambda: [
            Path("checkpoints/multi30k-en-de"),
            Path("checkpoints/multi30k-de-en"),
        ],
        description="the shipped checkpoints, each exported to its bundle and served when no "
        "bundle or model is given (comma-separated in the environment)",
    )
    shipped_bundles: Path = Field(
        Path("bundles"),
        description="where the shipped checkpoints' bundles live, each under its checkpoint's name",
    )
    prefer_multilingual: bool = Field(
        False,
        description="when a bilingual and a multilingual (M2M100, NLLB) bundle serve the same "
        "pair, route it to the multilingual one (off: the bilingual one)",
    )
    device: Device = Field("auto", description="ONNX Runtime device")
    device_id: int = Field(0, ge=0, description="CUDA device index")
    intra_op_threads: int | None = Field(
        None,
        ge=1,
        description="ONNX Runtime intra-op threads (none: the physical cores the process may "
        "use, under its cgroup's CPU quota; one fewer where the step's threads do not spin; at "
        "least 1)",
    )
    intra_op_spinning: bool = Field(
        True,
        description="let the decoder step's intra-op threads spin between kernels instead of "
        "sleeping; unset, on for a process that serves one model under no cgroup CPU quota, off "
        "for one that serves several (their threads would take each other's cores) or has a "
        "quota (spinning would spend it)",
    )
    cuda_graphs: bool = Field(
        False,
        description="capture each decoder-step shape as a CUDA graph and replay it (CUDA only: "
        "on an H100 a lone request's latency halves; GPU memory grows with each shape "
        "captured, see docs/operations.md)",
    )
    max_cuda_graphs: int = Field(
        64,
        ge=1,
        description="decoder-step shapes captured as CUDA graphs per model, in the order they "
        "come; later shapes run without one (each holds GPU memory for the process's life)",
    )

    # --- HTTP ----------------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="address uvicorn binds")
    port: int = Field(8000, ge=0, le=65535, description="port uvicorn binds")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="uvicorn's and the service's log level"
    )
    max_body_bytes: int = Field(1 << 20, ge=1, description="larger request bodies get 413")
    max_texts: int = Field(128, ge=1, description="texts per request")
    max_characters: int = Field(
        100_000,
        ge=1,
        description="characters in all the texts of one request, checked before any work",
    )
    max_segment_characters: int = Field(
        4000,
        ge=1,
        description="characters per sentence, checked before tokenizing (the model's token limit "
        "per sentence is checked after)",
    )
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="accepted API keys (comma-separated in the environment); none: no key needed",
    )
    glossary_dir: Path | None = Field(
        None,
        description="where glossaries are kept, one JSON file each (survives restarts; share it "
        "between --workers); unset: in the process's memory, gone at a restart",
    )
    max_glossary_entries: int = Field(
        1000, ge=1, description="entries per glossary, a request's inline glossary too"
    )
    max_glossaries_per_key: int = Field(100, ge=1, description="glossaries each API key may keep")
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="origins allowed by CORS (comma-separated); none: off"
    )
    libretranslate_prefix: str = Field(
        "/libretranslate", description="path of the LibreTranslate-compatible API; empty: off"
    )
    deepl: bool = Field(
        True, description="DeepL's API (its /v2 paths) under deepl_prefix; off: 404"
    )
    deepl_prefix: str = Field(
        "", description="path DeepL's API is under; empty: DeepL's own paths (/v2/translate)"
    )
    web_ui: bool = Field(
        True, description="the web page at / and its files under /web/; off: both are 404"
    )

    # --- Connections (uvicorn) -----------------------------------------------------------------
    keep_alive_timeout_s: int = Field(
        75,
        ge=1,
        description="an idle keep-alive connection is closed after this; keep it longer than "
        "the idle timeout of every client pool and proxy in front (nginx upstream 60 s, AWS ALB "
        "60 s; GCP load balancers 600 s: use 620), so that they, not the server, close idle "
        "connections: a server that closes one just as a request is sent on it loses that "
        "request (a connection error, or a 502 from the proxy)",
    )
    workers: int = Field(
        1,
        ge=1,
        description="server processes on the one port, each with its own models, batcher and "
        "event loop (the kernel hands each connection to one): past one core's worth of the "
        "service's Python (HTTP, tokenizing, the search), which bounds a GPU host's requests/s; "
        "the decoder step's default threads are shared out among them and sleep between kernels",
    )
    backlog: int = Field(
        2048,
        ge=1,
        description="connections the kernel queues before they are accepted (capped by "
        "net.core.somaxconn)",
    )
    limit_concurrency: int | None = Field(
        None,
        ge=1,
        description="open connections (idle keep-alive ones included) or requests above which "
        "uvicorn answers 503 before the app sees the request, health probes included; none: no "
        "limit (the queue bound, max_queue_segments, is the admission control)",
    )
    max_connections: int = Field(
        1024,
        ge=1,
        description="open connections; one more closes the open one that has waited longest "
        "for its client, or gets 503 at once when every one has a request being answered (the "
        "open-file limit is raised to fit, or this is lowered to fit it, at start)",
    )
    max_header_bytes: int = Field(
        16384,
        ge=1024,
        description="request line and headers; a larger head gets 400 and the connection closed",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0.0,
        description="the request line and headers must arrive within this, counted from the "
        "connection's opening (or the first byte of the next request on a kept-alive one); else "
        "408 and the connection closed (closed silently if nothing was sent)",
    )
    body_timeout_s: float = Field(
        10.0,
        gt=0.0,
        description="longest pause between two reads of a request body, or of a client in "
        "reading an answer; then the connection is closed",
    )
    forwarded_allow_ips: str = Field(
        "127.0.0.1,::1",
        description="comma-separated addresses (or *) of proxies whose X-Forwarded-For and "
        "X-Forwarded-Proto are trusted",
    )

    # --- Decoding defaults and limits ----------------------------------------------------------
    default_beam_size: int = Field(4, ge=1, description="beam size when a request names none")
    max_beam_size: int = Field(8, ge=1, description="largest beam size a request may ask for")
    default_length_penalty: float = Field(
        1.0,
        ge=0.0,
        le=10.0,
        description="length penalty when a request names none (1.0: the shipped model's card)",
    )
    default_max_decoding_length: int = Field(
        256, ge=1, description="capped by the model's maximum positions"
    )
    max_length_a: float = Field(
        3.0,
        ge=0.0,
        description="a sentence of L source tokens (</s> included) gets at most floor(a * L + b) "
        "target tokens, within max_decoding_length (3: Marian's max-length-factor): a "
        "degenerate input cannot run to the cap",
    )
    max_length_b: int = Field(10, ge=0, description="b of max_length_a's a * L + b")
    default_no_repeat_ngram_size: int = Field(
        0,
        ge=0,
        description="when a request names none: no n-gram of this many tokens twice in a "
        "sentence's translation (0: off)",
    )

    # --- Batching ------------------------------------------------------------------------------
    scheduler: Literal["batch", "step"] = Field(
        "batch",
        description="batch: each batch runs to its end; step: segments join and leave the "
        "running batch between decoder steps (CPU bundles; others run whole batches)",
    )
    max_batch_size: int = Field(
        32, ge=1, description="segments per engine call (step: per running batch, a beam size)"
    )
    max_batch_tokens: int = Field(
        4096,
        ge=1,
        description="padded source tokens per engine call, batch size x longest (step: of the "
        "running batch)",
    )
    max_wait_ms: float = Field(
        0.0,
        ge=0.0,
        description="how long the oldest queued segment waits for company; 0: an idle engine "
        "starts at once, batches form from what queues while it is busy",
    )
    max_queue_segments: int = Field(1024, ge=1, description="queued segments; beyond: 429")
    request_timeout_s: float = Field(
        60.0,
        gt=0.0,
        description="a whole request's deadline: queued past it, 503; decoded past it, its "
        "sentences leave their batch and it gets 504",
    )
    retry_after_s: int = Field(1, ge=0, description="Retry-After on 429 and 503")
    drain_timeout_s: float = Field(
        30.0,
        ge=0.0,
        description="on SIGTERM, how long accepted requests may take to finish; on SIGINT, how "
        "long uvicorn waits for open requests",
    )

    # --- Shared state: the translation cache, API keys, quotas, glossaries, document jobs ----
    redis_url: SecretStr | None = Field(
        None,
        description="Redis (redis://[:password@]host:port/db, rediss:// for TLS) that every "
        "replica shares: the translation cache, the quotas' counts, glossaries and document jobs "
        "live there (and the keys with key_store redis); none: in this process (glossary_dir, "
        "documents_dir)",
    )
    redis_timeout_s: float = Field(
        0.5,
        gt=0.0,
        description="longest wait for one Redis call (connecting included); past it the call "
        "counts as failed: the cache is skipped, quotas fail open or closed (quota_fail_open)",
    )
    redis_retry_s: float = Field(
        2.0,
        gt=0.0,
        description="after a failed Redis call, requests skip Redis for this long (no request "
        "waits on a Redis that is down), then one call tries it again",
    )
    cache: bool = Field(
        True, description="cache each sentence's translation (a request may opt out: cache false)"
    )
    cache_bytes: int = Field(
        256 << 20,
        ge=0,
        description="the in-process cache's size (least recently used entries go first); with "
        "redis_url, the entries this process read or wrote, in front of Redis's",
    )
    cache_ttl_s: int = Field(
        7 * 24 * 3600,
        ge=1,
        description="how long a sentence's translation stays in Redis's cache (with redis_url)",
    )
    key_store: Literal["none", "sqlite", "redis"] = Field(
        "none",
        description="where API keys with limits live (python -m service.keys manages them): "
        "sqlite (keys_db, one host), redis (redis_url, every replica); none: only api_keys. With "
        "a store, every request needs a key, from the store or api_keys",
    )
    keys_db: Path = Field(Path("keys.sqlite3"), description="the SQLite key store's file")
    keys_reload_s: float = Field(
        2.0,
        gt=0.0,
        description="how often a running service checks the key store for changes (a version "
        "number: one cheap read)",
    )
    quota_fail_open: bool = Field(
        True,
        description="when Redis cannot count a request against its key's limits: serve it "
        "(true) or answer 503 (false); logged and counted either way",
    )
    # --- Documents -----------------------------------------------------------------------------
    documents_dir: Path | None = Field(
        None,
        description="where document jobs live (sent file, state, result); they survive a "
        "restart there. Unset: a temporary directory removed at exit",
    )
    max_document_bytes: int = Field(
        20 << 20, ge=1, description="largest document file accepted; larger: 413"
    )
    max_document_characters: int = Field(
        2_000_000, ge=1, description="text a document may hold (all its paragraphs); more: 413"
    )
    max_documents: int = Field(
        100, ge=1, description="jobs kept at once (queued, translating or done); beyond: 429"
    )
    max_documents_bytes: int = Field(
        1 << 30, ge=1, description="bytes of sent files and results kept at once; beyond: 429"
    )
    document_ttl_s: float = Field(
        3600.0, gt=0.0, description="how long a job and its result are kept after it ends"
    )
    document_lease_s: float = Field(
        30.0,
        gt=0.0,
        description="with redis_url: a job's lease, renewed by the replica translating it; a "
        "replica that dies leaves its job to another this long after its last renewal",
    )
    document_workers: int = Field(
        1, ge=1, description="documents translated at once (each behind interactive requests)"
    )
    document_batch_size: int = Field(
        96,
        ge=1,
        description="a document's sentences running at once, in a batch of their own that "
        "pauses for interactive requests at its next decoder step (CPU bundles), so it may be "
        "larger than max_batch_size; elsewhere per batch, preempted",
    )

    @field_validator("bundle", "model", "checkpoint", "api_keys", "cors_origins", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            parts = [part.strip() for part in value.split(",") if part.strip()]
            if value and not parts:
                # " , " is a mistake, not "no value": for api_keys it would turn auth off.
                raise ValueError(f"{value!r} names nothing; leave it empty for none")
            return parts
        return value

    @field_validator("api_keys")
    @classmethod
    def _keys_not_blank(cls, value: list[SecretStr]) -> list[SecretStr]:
        if any(not key.get_secret_value().strip() for key in value):
            raise ValueError("an API key is empty or only whitespace")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value  # INFO as well as info

    @field_validator("libretranslate_prefix", "deepl_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        value = value.rstrip("/")
        if value and not value.startswith("/"):
            raise ValueError("must be empty or start with '/'")
        return value

    @model_validator(mode="after")
    def _default_beam_within_limit(self) -> Self:
        if self.default_beam_size > self.max_beam_size:
            raise ValueError(
                f"default_beam_size {self.default_beam_size} exceeds max_beam_size "
                f"{self.max_beam_size}"
            )
        return self

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            scheme = value.get_secret_value().partition("://")[0]
            if scheme not in ("redis", "rediss", "unix"):
                raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @model_validator(mode="after")
    def _redis_for_redis_keys(self) -> Self:
        if self.key_store == "redis" and self.redis_url is None:
            raise ValueError("key_store redis needs redis_url")
        return self


def invalid_settings(error: ValidationError) -> str:
    """What is wrong with the settings, each by its flag and variable: "--port (MT_PORT): Input
    should be less than or equal to 65535"."""
    problems = []
    for problem in error.errors():
        name = str(problem["loc"][0]) if problem["loc"] else ""
        where = f"--{name.replace('_', '-')} (MT_{name.upper()})" if name else "settings"
        problems.append(f"{where}: {problem['msg']}")
    return "invalid settings: " + "; ".join(problems)
