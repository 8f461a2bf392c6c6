"""Export a Plan for users who train with torchtitan or Megatron-LM.

Both express one homogeneous layout, so what they cannot say is reported, not silently dropped:
torchtitan takes arbitrary split points but one batch size per replica; Megatron-LM takes uneven
layers only on the first and last stage (`--decoder-first/last-pipeline-num-layers`). Each export
returns (text, warnings). The Megatron-LM export turns on the overlap planner.cost.overlap.MEGATRON
prices (`--overlap-grad-reduce`, and `--overlap-param-gather` with the distributed optimizer), so
`estimate(plan, ..., runtime=MEGATRON)` prices the run the exported arguments launch.
"""

from __future__ import annotations

from planner.specs.model import ModelSpec
from planner.specs.plan import Plan

_TT_SCHEDULE = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}


def _uneven_shares(plan: Plan) -> list[str]:
    if len(set(plan.batch_shares)) > 1:
        return [
            f"replicas take unequal batch shares {list(plan.batch_shares)}; this format gives every replica the same"
        ]
    return []


def _sharding(plan: Plan) -> str:
    levels = {s.sharding for s in plan.stages}
    return max(levels, key=["none", "zero1", "zero2", "zero3"].index)


def _recompute(plan: Plan) -> tuple[str, list[str]]:
    modes = {s.recompute for s in plan.stages}
    if len(modes) > 1:
        return "full", [f"per-stage recompute {[s.recompute for s in plan.stages]} exported as 'full' everywhere"]
    return modes.pop(), []


def to_torchtitan(plan: Plan) -> tuple[str, list[str]]:
    """A torchtitan job-config fragment: [parallelism], [training], [activation_checkpoint]."""
    warnings = _uneven_shares(plan)
    tps = {s.tp for s in plan.stages}
    if len(tps) > 1:
        warnings.append(f"per-stage tp {sorted(tps)} exported as tp={max(tps)}")
    ac, w = _recompute(plan)
    warnings += w
    shard = _sharding(plan)
    splits = [f'"layers.{s.layer_start}"' for s in plan.stages[1:]]
    local = plan.global_batch_size // plan.dp
    lines = [
        "[parallelism]",
        f"data_parallel_replicate_degree = {1 if shard != 'none' else plan.dp}",
        f"data_parallel_shard_degree = {plan.dp if shard != 'none' else 1}",
        f'fsdp_reshard_after_forward = "{"always" if shard == "zero3" else "never"}"',
        f"tensor_parallel_degree = {max(tps)}",
        f"pipeline_parallel_degree = {plan.pp}",
        f'pipeline_parallel_schedule = "{_TT_SCHEDULE[plan.schedule]}"',
        f"pipeline_parallel_split_points = [{', '.join(splits)}]",
        f"pipeline_parallel_microbatch_size = {plan.micro_batch_size}",
        # context parallelism with K/V all-gathered per attention layer, as planner.cost prices it
        # (torchtitan shards FSDP over dp_shard × cp, as the plan's gradients sum over dp × cp)
        *(
            [f"context_parallel_degree = {plan.cp}", 'context_parallel_rotate_method = "allgather"']
            if plan.cp > 1
            else []
        ),
        "",
        "[training]",
        f"local_batch_size = {local}",
        f"global_batch_size = {plan.global_batch_size}",
        f"seq_len = {plan.seq_len}",
        f'mixed_precision_param = "{"bfloat16" if plan.dtype == "bf16" else "float32"}"',
        "",
        "[activation_checkpoint]",
        f'mode = "{ac}"',
    ]
    every = {s.recompute_every for s in plan.stages}
    if ac == "full" and max(every) > 1:
        # torchtitan's layer-wise selective AC checkpoints every k-th block
        lines[-1] = 'mode = "selective"'
        lines.append(f'selective_ac_option = "{max(every)}"')
        if len(every) > 1:
            warnings.append(f"per-stage recompute_every {sorted(every)} exported as {max(every)}")
    if max(tps) > 1 and not all(s.sequence_parallel for s in plan.stages):
        warnings.append("torchtitan's tensor parallel always shards norms over the sequence (sequence parallel)")
    if plan.attention == "eager" or plan.dropout or plan.loss == "vocab-parallel":
        warnings.append("torchtitan runs SDPA attention without dropout; the plan's attention/dropout/loss differ")
    if plan.fp8:
        # torchao Float8Linear (tensorwise dynamic scaling) on the blocks' linears; the LM head
        # ("output") stays in the working dtype, as planner.cost prices it
        lines += ["", "[model]", 'converters = ["float8"]', "", "[float8]", 'filter_fqns = ["output"]']
    return "\n".join(lines) + "\n", warnings


def to_megatron(plan: Plan, model: ModelSpec) -> tuple[str, list[str]]:
    """Megatron-LM `pretrain_gpt.py` arguments for the plan's layout and the model's dimensions."""
    warnings = _uneven_shares(plan)
    tps = {s.tp for s in plan.stages}
    if len(tps) > 1:
        warnings.append(f"per-stage tp {sorted(tps)} exported as tp={max(tps)}")
    args = [
        f"--num-layers {model.num_layers}",
        f"--hidden-size {model.hidden}",
        f"--num-attention-heads {model.num_heads}",
        f"--ffn-hidden-size {model.ffn}",
        f"--seq-length {plan.seq_len}",
        f"--max-position-embeddings {plan.seq_len}",
        f"--tensor-model-parallel-size {max(tps)}",
        f"--pipeline-model-parallel-size {plan.pp}",
        # Megatron-core's all-gather CP (cp_comm_type all_gather), the exchange planner.cost prices
        *([f"--context-parallel-size {plan.cp}", "--cp-comm-type all_gather"] if plan.cp > 1 else []),
        f"--micro-batch-size {plan.micro_batch_size}",
        f"--global-batch-size {plan.global_batch_size}",
    ]
    if model.kv_heads != model.num_heads:
        args += ["--group-query-attention", f"--num-query-groups {model.kv_heads}"]
    if model.family == "llama":
        args += ["--swiglu", "--normalization RMSNorm", "--position-embedding-type rope", "--disable-bias-linear"]
    args.append("--bf16" if plan.dtype == "bf16" else ("--fp16" if plan.dtype == "fp16" else ""))
    if plan.schedule == "interleaved-1f1b":
        args.append(f"--num-layers-per-virtual-pipeline-stage {plan.stages[0].num_layers}")
    sizes = [s.num_layers for s in plan.stages[: plan.pp]]
    if plan.pp > 1 and len(set(sizes)) > 1:
        middle = sizes[1:-1]
        if len(set(middle)) <= 1:
            args += [
                f"--decoder-first-pipeline-num-layers {sizes[0]}",
                f"--decoder-last-pipeline-num-layers {sizes[-1]}",
            ]
        else:
            warnings.append(f"uneven middle stages {sizes}: Megatron-LM sets only first/last stage sizes")
    ac, w = _recompute(plan)
    warnings += w
    if ac == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    elif ac == "selective":
        args.append("--recompute-granularity selective")
    every = max(s.recompute_every for s in plan.stages)
    if ac == "full" and every > 1:
        # Megatron recomputes the first N blocks of each stage (--recompute-method block): the same
        # count as every k-th, not the same blocks
        n = max(1, min(s.num_layers for s in plan.stages) // every)
        args[-2:] = ["--recompute-method block", f"--recompute-num-layers {n}"]
    if any(s.sequence_parallel for s in plan.stages):
        args.append("--sequence-parallel")
    if plan.attention == "flash":
        args.append("--use-flash-attn")
    if plan.fp8:
        # Transformer Engine's fp8 GEMMs: E4M3 forward, E5M2 gradients
        args += ["--transformer-impl transformer_engine", "--fp8-format hybrid"]
    if not plan.dropout:
        args += ["--attention-dropout 0", "--hidden-dropout 0"]
    shard = _sharding(plan)
    if shard != "none":
        args.append("--use-distributed-optimizer")
        if shard != "zero1":
            warnings.append(f"{shard} exported as Megatron's distributed optimizer (ZeRO-1)")
    if plan.dp > 1 or any(s.dp > 1 for s in plan.stages):
        # gradient buckets reduced during the last backward; updated shards gathered during the
        # next forward (planner.cost.overlap.MEGATRON)
        args.append("--overlap-grad-reduce")
        if shard != "none":
            args.append("--overlap-param-gather")
    return " \\\n  ".join(a for a in args if a) + "\n", warnings
