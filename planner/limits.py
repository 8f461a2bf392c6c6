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

# A description file (cluster, model, plan, config, workload, placement): 4 MiB. The largest
# example cluster is 597 bytes and the largest realistic one (a TOML line per node of a 10,000-node
# machine, ~120 bytes each) is ~1.2 MiB; a 50 MB "cluster" parsed for minutes before this bound.
MAX_INPUT_BYTES = 4 * 2**20

# A table of rows (job trace, serving replay, measured runs, speed table, discovery snapshot):
# 256 MiB. The Philly trace (117k jobs) is ~12 MiB as CSV; a serving replay of MAX_REQUESTS rows at
# ~40 bytes a row is ~200 MiB. Beyond that a file is not one meshplan was meant to read.
MAX_TABLE_BYTES = 256 * 2**20

# Figures of a device or link (cluster files, discovery snapshots). Each bound is far above any
# part made, so only a typo or a generated file meets it; beyond it the cost model's sums lose the
# other terms (1e30 FLOP/s prices every layer at 0 s) and DuckDB stores what no later read can use.
# Link bandwidth per device per direction: NVLink 5 is 900 GB/s; 10 TB/s is 11x that.
MAX_LINK_BYTES_PER_S = 1e13
# Dense peak of one device: a B200's fp8 is 4.5 PFLOP/s; 100 PFLOP/s is 22x that.
MAX_FLOP_PER_S = 1e17
# Memory of one device (a CPU rank may hold a whole host's RAM): 64 TiB, 8x the largest hosts' 8 TiB.
MAX_DEVICE_MEMORY_BYTES = 2**46
# Memory bandwidth of one device: HBM3e parts reach 8 TB/s; 100 TB/s is 12x that.
MAX_MEMORY_BYTES_PER_S = 1e14
# An inline figure overriding a catalog GPU's (a measured usable memory, a power-capped clock)
# is at most this multiple of the datasheet's: a measurement never exceeds the part it measured,
# so 2x leaves room for a datasheet's rounding and refuses 1e15 bytes "of" an 80 GiB A100.
MAX_OVER_CATALOG = 2.0

# Serving workloads. Requests a workload or trace may hold: the simulator keeps a few numpy arrays
# and one Python record per request, ~1 KiB each, so 5M requests is ~5 GiB and minutes of
# simulation; a day of 1e7 requests/s (8.6e11) would need TiBs.
MAX_REQUESTS = 5_000_000
# Mean requests per second of one model: 100k/s is beyond the busiest public inference endpoints
# per model replica set; with a day's duration MAX_REQUESTS refuses far less already.
MAX_RATE = 100_000.0
# Coefficient of variation of inter-arrival times: published bursty serving traces (AlpaServe,
# Azure Functions) reach CV 8, `serve-simulate --plot` sweeps to 8; beyond ~10 the Gamma shape
# 1/cv^2 underflows to inter-arrivals of 0.0 and the horizon is never covered.
MAX_CV = 10.0
# A trace's arrival times and a workload's duration: one day (Workload.duration_s's bound).
MAX_TRACE_S = 86_400.0

# Learning rate: published transformer recipes use 1e-5..1e-2 (Adam) and at most ~1 (SGD); 10 is
# headroom for an experiment. A larger one diverges at the first step: a wasted run.
MAX_LR = 10.0

# Rows `meshplan db` prints or returns: a table is for reading; a larger result is cut with a note
# (use COPY ... TO 'file.parquet' for exports). Rows beyond it are never fetched.
MAX_DB_ROWS = 10_000
# Seconds one `meshplan db` statement may run: it holds the DuckDB file's lock (every other
# command waits on it), and a query over this long is an export, not an inspection.
MAX_DB_QUERY_S = 60.0

# Parameters of one model: 10^13 is 5x the largest published (~2T, mixture-of-experts counted
# whole). Its training state (16 B a parameter, ZeRO's count) is 160 TB, more than 2,000 80 GB GPUs
# hold; `submit` cannot see the cluster a job will run on, so this is the check it shares with `plan`.
MAX_PARAMS = 10**13
