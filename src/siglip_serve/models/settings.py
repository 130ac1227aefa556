"""Typed settings for building an encoder: which model, which weights, which backend and buckets.

Knows nothing of Ray or HTTP; `siglip_serve.serve.plan.config.ServiceConfig` embeds it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from siglip_serve.core.backends import BACKENDS, backend_record, load
from siglip_serve.models.naflex import MAX_BUDGET
from siglip_serve.models.source import TRANSFORMERS, ModelSource, model_source

DEFAULT_MODEL = "ViT-SO400M-14-SigLIP-384"
DEFAULT_PRETRAINED = "webli"
TINY_MODEL = "tiny-siglip"
# The tiny models always run with random weights and a bundled tokenizer (models/configs/): tiny-siglip
# has SigLIP's architecture, tiny-siglip2 SigLIP 2's (tanh GELU in the text tower, Gemma's special
# tokens), so the suite runs both towers' real paths for both generations.
TINY_SIGLIP2 = "tiny-siglip2"
TINY_MODELS: tuple[str, ...] = (TINY_MODEL, TINY_SIGLIP2)
MAX_BUCKET = 256


class ModelSettings(BaseModel):
    """What to load and how to run it. Validated once, at start."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(DEFAULT_MODEL, description="open_clip SigLIP or SigLIP 2 config; a Hugging Face transformers "
                                                  "SigLIP repository id (ORG/NAME); an open_clip hub id "
                                                  "(hf-hub:ORG/NAME); tiny-siglip / tiny-siglip2 (random weights) "
                                                  "for tests")
    pretrained: str | None = Field(DEFAULT_PRETRAINED, description="open_clip pretrained tag, downloaded once "
                                                                   "(a hub id names its own weights)")
    revision: str | None = Field(None, description="a hub id's revision to load (a commit hash; default: the "
                                                   "repository's main branch)")
    checkpoint: Path | None = Field(None, description="state dict saved with torch.save(model.state_dict())")
    random_weights: bool = Field(False, description="seeded random weights: embeddings mean nothing (tests, plumbing)")
    # Random weights are seeded so every replica of a random-weight model gives the same embeddings.
    seed: int = Field(0, description="seed of the random weights")
    # A name of core/backends.py's BUILTIN (the CLI's choices) or of a backend registered at run time.
    backend: str = Field("cpu", description="where the model runs", json_schema_extra={"enum": list(BACKENDS)})
    buckets: tuple[int, ...] = Field((1, 2, 4, 8), description="batch sizes (compiled ones on neuron), e.g. 1,2,4,8")
    # None: the backend decides (CPU: the cores this process may use). Ray sets OMP_NUM_THREADS=1 in
    # workers, so leaving torch to its own default would run a CPU replica on one core.
    torch_threads: int | None = Field(default=None, ge=1,
                                      description="cpu: torch threads per encoder (default: the usable cores "
                                                  "split across the encoder replicas)")
    artifact_dir: Path | None = Field(None, description="neuron: compiled artifact directory (siglip-serve compile)")
    cuda_dtype: Literal["bf16", "fp16", "fp32"] = Field("bf16", description="cuda: autocast dtype")
    # On: without graphs the encoder replica's one Python thread launching kernels, not the GPU, sets the
    # served rate (models/backends/cuda.py; docs/dev/benchmark-log.md, "On a GPU").
    cuda_graphs: bool = Field(True, description="cuda: capture one CUDA graph per bucket (false: eager at each "
                                                "batch's real size)")
    # None: tiny-siglip's bundled tokenizer, else open_clip's tokenizer for the model (from the
    # Hugging Face cache or hub). See models/text.py.
    tokenizer: Path | None = Field(None, description="text tower: a local directory with the model's HF tokenizer "
                                                     "files (tokenizer.json, tokenizer_config.json)")
    # A NaFlex model's buckets are (batch, budget): its processor's budget and these, each a static shape.
    patch_budgets: tuple[int, ...] = Field((), description="SigLIP 2 NaFlex: patch budgets served beside the "
                                                           "model's own (max_num_patches), e.g. 256,576,1024")
    text_buckets: tuple[int, ...] = Field((1, 2, 4, 8, 16, 32),
                                          description="text batch sizes (texts per forward pass), e.g. 1,2,4,8,16,32")
    # Validated against the pydantic model its record names (BackendRecord.backend_options), so a backend
    # with options of its own declares them in its module and needs no field here.
    backend_options: dict[str, Any] = Field(default_factory=dict, validate_default=True,  # its model's defaults
                                            description="the backend's own options, as its record's model has them")
    # A row's arithmetic depends on the shape of the batch it rides in and, on cpu, on how many threads split
    # that batch (docs/reproducibility.md): one shape and one thread make a vector independent of its neighbours.
    deterministic: bool = Field(False, description="every forward pass at the largest bucket's shape (padded), and "
                                                   "on cpu one torch thread per tower, so an input's vector never "
                                                   "depends on what it is batched with (costs throughput)")

    @model_validator(mode="before")
    @classmethod
    def _one_thread_when_deterministic(cls, data: Any) -> Any:
        # Two threads split a batch's rows between them, and a row's last bits depend on which thread ran it.
        if not isinstance(data, dict) or not data.get("deterministic"):
            return data
        threads = data.get("torch_threads")
        if threads is None:
            return {**data, "torch_threads": 1}
        if int(threads) != 1:
            raise ValueError(f"deterministic: true runs one torch thread per tower (with more, a vector depends on "
                             f"which thread ran its row); torch_threads {threads} contradicts it: leave it unset or 1")
        return data

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        backend_record(value)  # ValueError naming the choices
        return value

    @field_validator("backend_options")
    @classmethod
    def _check_backend_options(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "backend" not in info.data:  # an unknown backend: refused by its own field
            return value
        record = backend_record(info.data["backend"])
        if record.backend_options is None:
            if value:
                raise ValueError(f"the {record.name!r} backend takes no backend_options, got {sorted(value)}")
            return value
        options: type[BaseModel] = load(record.backend_options)
        return options.model_validate(value).model_dump()

    @field_validator("buckets", "text_buckets", "patch_budgets", mode="before")
    @classmethod
    def _parse_buckets(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(int(part) for part in value.replace(" ", "").split(",") if part)
        if isinstance(value, int) and not isinstance(value, bool):  # one bucket, e.g. `--set buckets=4`
            return (value,)
        return value

    @field_validator("buckets", "text_buckets")
    @classmethod
    def _check_buckets(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value:
            raise ValueError("at least one batch bucket is needed")
        if any(b < 1 or b > MAX_BUCKET for b in value):
            raise ValueError(f"batch buckets must be between 1 and {MAX_BUCKET}, got {list(value)}")
        if len(set(value)) != len(value):
            raise ValueError(f"batch buckets must be distinct, got {list(value)}")
        return tuple(sorted(value))

    @field_validator("patch_budgets")
    @classmethod
    def _check_budgets(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(b < 1 or b > MAX_BUDGET for b in value) or len(set(value)) != len(value):
            raise ValueError(f"patch budgets must be distinct and between 1 and {MAX_BUDGET}, got {list(value)}")
        return tuple(sorted(value))

    @model_validator(mode="after")
    def _check_weights(self) -> ModelSettings:
        if self.checkpoint is not None and self.random_weights:
            raise ValueError("choose one weights source: --checkpoint or --random-weights, not both")
        source = model_source(self.model, self.revision)  # ValueError: a malformed id
        if self.patch_budgets and source.kind != TRANSFORMERS:  # a hub repository's kind is read where it loads
            raise ValueError(f"patch_budgets {list(self.patch_budgets)} are for SigLIP 2 NaFlex models; {self.model} "
                             "takes one fixed image size")
        if self.checkpoint is not None and source.on_hub:
            raise ValueError(f"{self.model} names its weights on the hub; --checkpoint is for open_clip config names")
        if self.checkpoint is not None and self.model in TINY_MODELS:
            raise ValueError(f"{self.model} always runs with random weights; --checkpoint is for real SigLIP models")
        # Whether `checkpoint` and `tokenizer` exist is checked where they are read (serve/plan/model_checks.py,
        # models/text.py): a Serve config is validated on the Ray head too, which need not mount them.
        return self

    @property
    def source(self) -> ModelSource:
        """Where the model comes from (models/source.py), decided from `model` and `revision` alone."""
        return model_source(self.model, self.revision)

    @property
    def uses_random_weights(self) -> bool:
        return self.random_weights or self.model in TINY_MODELS

    @property
    def needs_weights(self) -> bool:
        """Whether weights must be loaded or downloaded: not for random weights, nor for no model at all, nor
        for a backend that reads a compiled artifact (the artifact holds them)."""
        record = backend_record(self.backend)
        return not self.uses_random_weights and record.runs_model and not record.reads_artifact

    @property
    def weights_source(self) -> str:
        """A short human/machine label: 'random', 'checkpoint:<path>', 'pretrained:<tag>', 'hub:<repo>[@<revision>]'
        or 'none'."""
        if not backend_record(self.backend).runs_model:
            return f"none ({self.backend}: zero vectors, no model runs)"
        if self.uses_random_weights:
            return f"random(seed={self.seed})"
        if self.checkpoint is not None:
            return f"checkpoint:{self.checkpoint}"
        if self.source.on_hub:
            return self.source.label
        return f"pretrained:{self.pretrained}"

    @property
    def max_batch_size(self) -> int:
        return self.buckets[-1]

    def model_settings(self) -> ModelSettings:
        """The plain ModelSettings inside any subclass (the service's config), for pickling to workers and for the
        plan."""
        return ModelSettings(**{name: getattr(self, name) for name in ModelSettings.model_fields})
