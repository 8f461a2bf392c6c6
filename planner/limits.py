"""The largest numbers meshplan accepts from a user, each with the reason it is the bound.

Checked at the edge (the CLI's options, the config's fields), so a number the stack cannot hold is
refused naming the flag the user typed, never found later as an overflow in DuckDB, numpy or the
cost model. Plain constants: the command modules import this at top level (`meshplan --help`
stays fast), so it imports nothing.
"""

from __future__ import annotations

# DuckDB INTEGER (jobs.global_batch, seq, priority): a larger number is a ConversionException there.
INT32_MAX = 2**31 - 1

# Samples per optimizer step. 512x the largest published runs (Llama 3 405B: 2,048 sequences of
# 8k tokens = 16M tokens a step); the search's water-fill sizes arrays by micro-batches, so 10^8
# already takes GiBs and 10^20 cannot be allocated. Also far below INT32_MAX (the jobs table).
MAX_GLOBAL_BATCH = 2**20

# Sequence length: ModelSpec.seq_len's own bound (10M tokens, beyond any published context).
MAX_SEQ = 10_000_000

# Steps or iterations of one run/job: 10^9 steps at 1 ms each is 11 days of nothing but steps;
# jobs.iterations is BIGINT, step numbers are int64 in telemetry.
MAX_STEPS = 10**9

# Seconds (deadlines, budgets, rounds, injected delays): ten years. Also refuses inf.
MAX_SECONDS = 10 * 365 * 86400.0

# Ranks on one node / per probe: the largest node (8-16 GPUs, or CPU cores) times 64 headroom.
MAX_RANKS = 1024

# Ranked plans a search keeps: each is priced and stored; the table is meant for reading.
MAX_TOP = 1000

# Scheduling priority (jobs.priority is INTEGER).
MAX_PRIORITY = INT32_MAX

# Seeds: numpy's generators take at most 2**32 - 1.
MAX_SEED = 2**32 - 1

# Injected compute slowdown factor (fault injection): 1000x already stalls a run for hours.
MAX_SLOWDOWN = 1000.0
