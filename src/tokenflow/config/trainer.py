"""The ``trainer`` config section: model loading, optimizer, schedule, batching, precision."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tokenflow.config.algorithm import AlgorithmConfig
from tokenflow.config.base import ConfigModel
from tokenflow.precision import native_dtype


class TrainerConfig(ConfigModel):
    """How the policy is optimized; what it optimizes is the ``algorithm`` section."""

    lr: float = Field(default=1e-6, ge=0)
    """Peak AdamW learning rate (after warmup)."""

    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW β1, β2."""

    adam_eps: float = Field(default=1e-8, gt=0)
    """AdamW ε."""

    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW decoupled weight decay, applied to matrices only (not to biases or norm scales)."""

    warmup_steps: int = Field(default=0, ge=0)
    """Batches (policy versions) of linear warmup; the first batch runs at lr / warmup_steps. The
    schedule steps once per batch: every optimizer step of a batch (``mini_batches`` ×
    ``epochs``) uses that batch's lr."""

    schedule: Literal["constant", "cosine"] = "constant"
    """After warmup: stay at lr, or decay along a cosine to lr × min_lr_ratio at total_steps."""

    total_steps: int | None = Field(default=None, ge=1)
    """Batches (policy versions) of the whole run; required by the cosine schedule."""

    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Cosine floor as a fraction of lr."""

    staleness_lr: bool = True
    """Staleness-aware learning rate (Zhang et al. 2016, staleness-aware async-SGD): a batch
    whose trained tokens are on average ā versions old (trainer version − token version) takes
    its optimizer steps at the schedule's lr × min(1, (1 + staleness_lr_ref) / (1 + ā)). Batches
    no staler than the reference train at the full lr (synchronous runs, two thirds of the default
    K = 1 run's; the rest take 0.7–0.99 of it); deep asynchrony (K = 4, 8) trains old data with
    shorter steps, which is what kept the default workload from collapsing there
    (docs/algorithms.md, "A learning rate that follows staleness"). ``optim/staleness_lr_scale``
    reports the factor."""

    staleness_lr_ref: float = Field(default=1.0, ge=0)
    """The mean token age up to which a batch trains at the full lr (see staleness_lr)."""

    grad_clip: float | None = Field(default=1.0, gt=0)
    """Clip the global gradient norm to this; None disables clipping (the norm is still logged)."""

    rollouts_per_step: int = Field(default=64, ge=1)
    """Batch size in rollouts per policy version: what the runtime hands to each train_step.
    The trainer accumulates gradients over as many micro-batches as those rollouts need."""

    mini_batches: int = Field(default=1, ge=1)
    """PPO mini-batches per rollout batch (verl's and OpenRLHF's ``ppo_mini_batch_size``, given
    as a count): the batch's trained sequences are split in order into this many parts and each
    part is one optimizer step, its loss normalised over the part. π_prox (the decoupled
    objective's anchor) and V_old (the value clip's) are the policy before the batch's first
    step, so the clip around them binds from the second step on; with one step per batch the
    decoupled objective clips nothing (docs/algorithms.md, "One batch, several optimizer
    steps"). The policy version still counts batches (one weight push each)."""

    epochs: int = Field(default=1, ge=1)
    """Passes over the batch's mini-batches (PPO epochs; TRL's ``num_iterations``, verl's
    ``ppo_epochs``): ``mini_batches × epochs`` optimizer steps per batch, logged as
    ``optim/steps``."""

    micro_batch_tokens: int = Field(default=8192, ge=1)
    """Token budget of one micro-batch: packed rows stacked up to rows × widest row ≤ this."""

    pack_row_tokens: int = Field(default=512, ge=1)
    """Longest packed row. Attention over a packed row uses a block-diagonal mask whose cost
    grows with the square of the row length, so rows of a few hundred tokens are fastest unless
    a flash-attention kernel handles packing natively (then raise it to micro_batch_tokens)."""

    logprob_chunk_tokens: int = Field(default=4096, ge=1)
    """Apply the output head and log-softmax to this many target tokens at a time, recomputing
    each chunk's logits in the backward pass: a micro-batch then holds at most this × vocabulary
    logits instead of all of them (8k tokens × a 150k vocabulary is ~5 GB in float32, and the
    log-softmax doubles it). A micro-batch with fewer targets runs as one piece, unchanged.
    Sharded (FSDP) trainers and models that post-process logits run unchunked."""

    skip_zero_advantage: bool = True
    """Leave out of the forward and backward passes every sequence whose advantage is 0 on all
    its loss tokens (a GRPO group whose samples got equal rewards), when nothing else in the loss
    needs it: no KL-to-reference loss, no entropy bonus, no value head, and a policy loss that
    vanishes with the advantage (``AlgorithmConfig.zero_advantage_is_inert``). The gradient is
    unchanged (the normaliser still counts those sequences); token-averaged diagnostics
    (``policy/entropy``, ``policy/approx_kl``, ``offpolicy/*``) then cover the trained sequences
    only. ``perf/skipped_sequences`` and ``perf/skipped_tokens`` count what was left out."""

    share_prompts: bool = True
    """Forward a group's prompt once for all its samples (the engine prefills it once too): a row
    holds the prompt, then each sample's completion, under a mask that keeps each completion to
    the prompt and itself, so the logits and gradients are those of separate rows up to float
    rounding. With prompts longer than completions this is most of the trainer's work saved
    (docs/performance.md, "Shared prompts"). Applies where the model's attention takes an
    explicit mask (``attn_implementation`` eager or sdpa, no sliding window) and not to
    sequences with a Keep Routing record; elsewhere the trainer says why it is off.
    ``perf/shared_prompt_tokens`` counts the tokens not forwarded."""

    pack_sequences: bool = True
    """Pack several sequences per forward row (position ids restart per sequence). Turn off for
    models whose attention does not honour packed position ids: one sequence per row then."""

    dtype: Literal["float32", "bfloat16", "native"] = "float32"
    """Compute dtype: float32, or bfloat16 autocast over float32 master weights. "native":
    bfloat16 where the device multiplies it in hardware (CUDA; CPUs with AMX or AVX-512 BF16,
    Arm BF16), else float32 (`tokenflow.precision`); resolved when the config is read."""

    fp32_lm_head: bool = False
    """Compute the output projection (logits) in float32 even under bfloat16 autocast."""

    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""

    lean_activations: bool = True
    """Llama-family RMSNorms and gated MLPs (Llama, Mistral, Qwen2, Qwen3) keep less for the
    backward pass and recompute the elementwise rest (`tokenflow.trainer.model.lean_layers`): the
    forward is bit-identical, the gradients agree to rounding. Off: transformers' own modules."""

    compile_layers: bool = False
    """Run each decoder layer through ``torch.compile`` (dynamic shapes), forward and backward:
    the elementwise work around the matrix products (casts, norms, rotary, SiLU, softmax) becomes
    fused kernels. Compiling takes tens of seconds when the trainer starts (paid while the engines
    generate the first batch); a model without a decoder layer list, a CPU without a C++ compiler
    or a failed compile falls back to the eager layers with a warning
    (`tokenflow.trainer.model.compiled`). Numerics move by rounding only. The policy's layers
    only (a KL reference copy runs eagerly). Not with ``world_size > 1``, ``keep_routing`` or
    ``routing_probe`` (sharded layers; hooks inside the layers)."""

    memory_budget_gb: float | None = Field(default=None, gt=0)
    """The most host memory the trainer process may use, in GB (1e9 bytes). Before any process
    starts, ``tokenflow train`` estimates a CPU trainer's peak (weights, gradients and AdamW
    state, activations of a full micro-batch of ``micro_batch_tokens``, the logits of one
    ``logprob_chunk_tokens`` chunk; ``tokenflow.runtime.run.memory_estimate``) and refuses a run
    whose trainer would not fit, naming the estimate, the budget and the settings that would
    fit (the largest ``micro_batch_tokens``, ``gradient_checkpointing``, a smaller
    ``logprob_chunk_tokens``). None: the memory available when the run starts (the least of
    /proc/meminfo's MemAvailable and the cgroup's limit less its use) less the other workers'
    estimates. ``tokenflow train --dry-run`` prints the estimate and the budget;
    ``runtime.check_memory = false`` turns the refusal into a warning. A trainer on a GPU is
    not checked (its tensors live in GPU memory)."""

    fused_optimizer: bool = True
    """AdamW's fused kernel (one pass over each parameter, where the default implementation
    makes several): on one CPU thread, SmolLM2-135M's step takes 0.08 s instead of 0.33–0.49 s
    (docs/performance.md). Used where torch has it for the parameters' device and dtype, else the
    default implementation; off: always the default (the two agree to rounding)."""

    keep_host_memory: bool = True
    """On a CPU trainer, keep the memory a step frees for the next step instead of giving it back
    to the operating system (glibc's malloc: no trimming, no mmap for large blocks;
    `tokenflow.host_memory.keep_freed_memory`). Steps then stop paying a page fault for every fresh 4 KB of
    activations; the process holds a step's peak memory. Off: memory goes back after each step,
    the free holes inside the heap too (glibc's ``malloc_trim``, `tokenflow.host_memory`), so the
    process holds one step's need rather than what fragments of differently sized micro-batches
    add up to; steps then pay page faults for fresh memory (SmolLM2-135M on examples/laptop_math's
    batches, one thread: 178-187 tokens/s against 198-213 with it on, which that example keeps)."""

    keep_host_memory_gb: float | None = Field(default=None, gt=0)
    """With ``keep_host_memory``, the most a CPU trainer process keeps resident between steps, in
    GB (1e9 bytes): after a step that leaves it holding more, the heap's free pages go back
    (`tokenflow.host_memory.release_freed_memory`; ``perf/host_memory_released`` is 1 for that
    step). A kept heap grows as micro-batches of varied sizes leave holes the next ones do not
    fit: SmolLM2-135M on examples/laptop_math with 2,048-token micro-batches went from 4.2 GB
    resident after its second step to 5.5 GB by its eighteenth, and a bound of 4.5 took the
    whole run's peak from 6.29 to 5.86 GB for 9% of the trainer's speed (docs/howto/laptop.md).
    The step after a release pays page faults for its fresh memory again, so set this above
    what one step needs. None: no bound."""

    onednn_cache_capacity: int | None = Field(default=16, ge=0)
    """A CPU trainer: the most compiled oneDNN kernels its process keeps (oneDNN's
    ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, 1,024 by its own default; set in the environment, that
    wins). Each holds memory, and micro-batches of varied lengths make new shapes all run long:
    SmolLM2-135M on examples/laptop_math peaked at 6.8 GB by its fifth step with oneDNN's default
    and 5.7 GB with 128; in the whole run the trainer ended at 4.5-4.7 GB with 16 against 4.8-5.0
    with 128, at the same tokens/s (`tokenflow.host_memory.limit_onednn_cache`). None: oneDNN's
    default."""

    attn_implementation: str = "sdpa"
    """transformers attention implementation for models loaded from a path."""

    trust_remote_code: bool = False
    """Allow model code from the checkpoint's repository; off unless asked."""

    device: Literal["cpu", "cuda", "auto"] = "auto"
    """Where to train; "auto" picks cuda when available."""

    threads: int | None = Field(default=None, ge=1)
    """torch.set_num_threads for CPU work; None leaves torch's default."""

    seed: int = 0
    """Seeds torch (value-head init and any sampling in the trainer process)."""

    value_head: bool = False
    """Train a scalar value head beside the policy (required by an estimator that needs values,
    such as algorithm.advantage = "gae")."""

    value_lr: float | None = Field(default=None, ge=0)
    """Learning rate of the value head; None uses lr."""

    lora_rank: int | None = Field(default=None, ge=1)
    """Train LoRA adapters of this rank (peft) on ``lora_target_modules`` instead of every
    weight; None trains the full model. Engines get the merged weights W + (alpha/r)·B·A under
    the Hugging Face names, so they need nothing LoRA-specific. Needs ``pip install
    "tokenflow-rl[lora]"``."""

    lora_alpha: float = Field(default=16.0, gt=0)
    """LoRA scaling numerator: the update is (lora_alpha / lora_rank)·B·A."""

    lora_dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the LoRA branch's input while training (0: the trainer's log-probs stay exactly
    the engine's on-policy)."""

    lora_target_modules: list[str] = Field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    """Module names that get adapters (peft's ``target_modules``)."""

    keep_routing: bool = False
    """Mixture-of-experts policies: route every token to the experts the engine recorded for
    it (`Rollout.routed_experts`), weighting them by the trainer's own live gate scores, so the
    trainer scores the network that sampled and the router still learns ("Keep Routing",
    rollout routing replay). Off, the trainer routes by itself; the router disagreement is
    logged either way (``routing/disagreement``)."""

    routing_probe: bool = False
    """Mixture-of-experts policies: also score each micro-batch, without a gradient, under the
    other routing (the trainer's own when ``keep_routing`` is on, the engine's record when it is
    off) and log that log-prob mismatch beside the real one
    (``offpolicy/mismatch_abs_logprob_{unreplayed,replayed}``). One extra forward per
    micro-batch; one trainer process only."""

    world_size: int = Field(default=1, ge=1)
    """Trainer ranks. Above 1 the policy is sharded with PyTorch FSDP2 (``fully_shard``) over
    that many processes (local backend) or Ray actors; gloo on CPU, NCCL on GPU. Every rank
    sees the whole batch and trains on its share of the sequences (balanced by tokens)."""

    collective_timeout_s: float = Field(default=300.0, gt=0)
    """Longest wait for any trainer-rank collective (joining the group, the barrier that opens
    each command, FSDP gathers and reductions) before the run fails naming the late rank."""

    @model_validator(mode="after")
    def _check(self) -> "TrainerConfig":
        if self.dtype == "native":  # written past validation: the resolved value is a valid one
            self.__dict__["dtype"] = native_dtype(self.device)
        if self.schedule == "cosine" and self.total_steps is None:
            raise ValueError('trainer.schedule = "cosine" needs trainer.total_steps')
        if self.total_steps is not None and self.warmup_steps > self.total_steps:
            raise ValueError(f"trainer.warmup_steps ({self.warmup_steps}) exceeds "
                             f"trainer.total_steps ({self.total_steps})")
        if self.value_lr is not None and not self.value_head:
            raise ValueError("trainer.value_lr is set but trainer.value_head is false")
        if self.routing_probe and self.world_size > 1:
            raise ValueError("trainer.routing_probe with trainer.world_size > 1: the probe's extra forward "
                             "would unbalance the ranks' collectives; drop one of them")
        if self.compile_layers and (self.world_size > 1 or self.keep_routing or self.routing_probe):
            raise ValueError("trainer.compile_layers with world_size > 1, keep_routing or routing_probe: the "
                             "sharded layers and the routers' hooks run eagerly only; set compile_layers = false")
        if self.lora_rank is not None and self.world_size > 1:
            raise ValueError("trainer.lora_rank with trainer.world_size > 1: LoRA trains on one trainer "
                             "process; drop world_size or train the full model")
        return self


def check_compatible(trainer: TrainerConfig, algorithm: AlgorithmConfig) -> None:
    """Refuse trainer/algorithm combinations that cannot work, naming the fields to change."""
    if algorithm.uses_values and not trainer.value_head:
        raise ValueError(f'algorithm.advantage = "{algorithm.advantage}" needs a value head: '
                         'set trainer.value_head = true')
    if trainer.value_head and not algorithm.uses_values:
        raise ValueError(f'trainer.value_head = true but algorithm.advantage = "{algorithm.advantage}" '
                         f"uses no values; set advantage to one that does "
                         f"({', '.join(algorithm.value_estimators())}) or value_head = false")
